"""Triton's logging flags on ``sluice serve``, the logging extension, request ids in log lines."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from e2e_support import ROOT, start_server, stop_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

ISO_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ (gateway|serve|jobs|worker \S+) "
)


def _fail(client: httpclient.InferenceServerClient, request_id: str) -> None:
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[-1]], np.int32))
    with pytest.raises(InferenceServerException, match="negative input"):
        client.infer("raiser", [tensor], request_id=request_id)


def _lines(path: Path, needle: str, timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [line for line in path.read_text().splitlines() if needle in line]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_log_flags_reach_gateway_and_workers(redis_url: str, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(ROOT / "tests/assets/python_models/raiser", repo / "raiser")
    log_file = tmp_path / "sluice.log"
    server = start_server(
        repo,
        redis_url,
        tmp_path / "serve.out",
        "--log-verbose",
        "1",
        "--log-format",
        "ISO8601",
        "--log-file",
        str(log_file),
        "--http-read-timeout-secs",
        "1",
    )
    try:
        base = server.base
        settings = requests.get(f"{base}/v2/logging", timeout=5).json()
        assert settings == {
            "log_file": str(log_file),
            "log_info": True,
            "log_warning": True,
            "log_error": True,
            "log_verbose_level": 1,
            "log_format": "ISO8601",
        }
        client = httpclient.InferenceServerClient(server.http_url)
        _fail(client, "req-fail-1")
        gateway = _lines(log_file, "client id 'req-fail-1'")
        assert any(" gateway sluice.api.handlers.submission]" in line for line in gateway), gateway
        line = next(line for line in gateway if " gateway " in line)
        assert "model 'raiser'" in line and "INVALID_ARG: negative input" in line
        sluice_id = re.search(r"request ([0-9a-f]+-[0-9a-f]+) ", line).group(1)
        # the worker's lines carry the same request id (and the client's)
        worker = _lines(log_file, sluice_id)
        assert any(" worker raiser_" in w and "req-fail-1" in w for w in worker), worker
        # the job worker logs once Celery has started, which may come later on a busy machine
        assert _lines(log_file, " jobs sluice.job_workers", timeout_s=60)
        text = log_file.read_text().splitlines()
        assert text and all(ISO_LINE.match(t) for t in text if t[:2] == "20"), text[:5]
        assert {m.group(1).split()[0] for t in text if (m := ISO_LINE.match(t))} >= {
            "gateway",
            "serve",
            "worker",
            "jobs",
        }

        # uvicorn's lines share the format and the file: an access line per HTTP request
        access = _lines(log_file, '"POST /v2/models/raiser/infer HTTP/1.1" 400')
        assert access and all(
            ISO_LINE.match(a) and " gateway uvicorn.access] 127.0.0.1:" in a for a in access
        ), access
        assert "uvicorn" not in server.log(), server.log()  # nothing on stdout/stderr
        # ... and so do the answers the HTTP protocol gives itself: 400, 431, 408
        for raw in (
            b"GARBAGE\r\n\r\n",
            b"GET /v2 HTTP/1.1\r\nX-Big: " + b"a" * (1 << 21),
            b"POST /v2/models/raiser/infer HTTP/1.1\r\nContent-Length: 10\r\n\r\n{",
        ):
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
                with contextlib.suppress(OSError):
                    sock.sendall(raw)
                with contextlib.suppress(OSError):
                    while sock.recv(65536):
                        pass
        # an infer refused before it is queued (bad JSON, unknown model) gets its line too
        for path, body in (("raiser", b"{"), ("nope", b"{}")):
            refused = requests.post(
                f"{base}/v2/models/{path}/infer", data=body, timeout=5,
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            assert refused.status_code in (400, 404)
            found = _lines(log_file, f"(client id '') to model '{path}' version - failed:")
            assert found and " gateway sluice.api.handlers.submission]" in found[0], path
        # libraries' info/debug chatter stays out at level 1 (grpcio wrote a line per call)
        import tritonclient.grpc as grpcclient

        grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
        assert grpc_client.is_server_live() and grpc_client.is_model_ready("raiser")
        grpc_client.close()
        for line in (
            '"- - HTTP/1.1" 400',
            '"- - HTTP/1.1" 431',
            '"POST /v2/models/raiser/infer HTTP/1.1" 408',
        ):
            found = _lines(log_file, line)
            assert found and " gateway uvicorn.access] 127.0.0.1:" in found[0], line
        chatter = [t for t in log_file.read_text().splitlines() if "grpc._cython" in t]
        assert not chatter and "MAINT_NOTIFICATIONS" not in log_file.read_text(), chatter[:3]

        # the logging extension changes the gateway's logging at run time
        answer = requests.post(
            f"{base}/v2/logging", json={"log_info": False, "log_verbose_level": 0}, timeout=5
        ).json()
        assert answer["log_info"] is False and answer["log_verbose_level"] == 0
        _fail(client, "req-fail-2")
        requests.post(f"{base}/v2/logging", json={"log_info": True}, timeout=5)
        _fail(client, "req-fail-3")
        assert _lines(log_file, "client id 'req-fail-3'")
        assert not [t for t in _lines(log_file, "req-fail-2", 0) if " gateway " in t]
        assert (
            requests.post(f"{base}/v2/logging", json={"log_file": "/tmp/x"}, timeout=5).status_code
            == 501
        )
        client.close()
    finally:
        assert stop_server(server) == 0, server.log()
