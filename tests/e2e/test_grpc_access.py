"""Restricted API groups on both protocols, and gRPC over TLS with a throwaway certificate."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import Server, children_of, repository_of, start_server, stop_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

ADMIN = "model-repository,statistics,logging:admin-key=s3cret"
INFER = "inference:infer-key=let-me-in"


@pytest.fixture(scope="module")
def restricted_server(
    model_repository: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    where = tmp_path_factory.mktemp("restricted")
    log_path = where / "serve.log"
    server = start_server(
        repository_of(model_repository, where / "repo", "add_sub"),
        redis_url,
        log_path,
        "--http-restricted-api",
        ADMIN,
        "--http-restricted-api",
        INFER,
        "--grpc-restricted-protocol",
        ADMIN,
        "--grpc-restricted-protocol",
        INFER,
    )
    yield server
    assert stop_server(server) == 0, server.log()


def _add_sub(module: object) -> list[object]:
    a = np.ones((1, 16), np.float32)
    inputs = [module.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    return inputs


def test_restricted_header_values_are_on_no_child_command_line(
    restricted_server: Server,
) -> None:
    """The gateway gets the restricted-API specs in its environment: their header values
    are credentials, and a command line is shown to every user of the machine."""
    children = children_of(restricted_server.process.pid)
    lines = [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in children]
    gateways = [line for line in lines if b"sluice.api.gateway" in line]
    assert len(gateways) == 1, lines
    assert not [line for line in lines if b"s3cret" in line or b"let-me-in" in line], lines


def test_http_restricted_groups(restricted_server: Server) -> None:
    base = restricted_server.base
    refused = requests.post(f"{base}/v2/repository/index", timeout=10)
    assert refused.status_code == 403
    assert refused.json() == {"error": "This API is restricted, expecting header 'admin-key'"}
    wrong = requests.get(
        f"{base}/v2/models/add_sub/stats", headers={"admin-key": "nope"}, timeout=10
    )
    assert wrong.status_code == 403
    ok = requests.post(f"{base}/v2/repository/index", headers={"admin-key": "s3cret"}, timeout=10)
    assert ok.status_code == 200
    # unrestricted groups stay open
    assert requests.get(f"{base}/v2/health/ready", timeout=10).status_code == 200
    assert requests.get(f"{base}/v2/models/add_sub", timeout=10).status_code == 200

    client = httpclient.InferenceServerClient(restricted_server.http_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", _add_sub(httpclient))
        assert info.value.status() == "403"
        assert info.value.message() == "This API is restricted, expecting header 'infer-key'"
        result = client.infer("add_sub", _add_sub(httpclient), headers={"infer-key": "let-me-in"})
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
    finally:
        client.close()


def test_http_refused_logging_update_does_nothing(restricted_server: Server) -> None:
    url = f"{restricted_server.base}/v2/logging"
    refused = requests.post(url, json={"log_verbose_level": 3}, timeout=10)
    assert refused.status_code == 403
    current = requests.get(url, headers={"admin-key": "s3cret"}, timeout=10).json()
    assert current["log_verbose_level"] == 0


def test_grpc_restricted_groups(restricted_server: Server) -> None:
    client = grpcclient.InferenceServerClient(restricted_server.grpc_url)
    admin = {"triton-grpc-protocol-admin-key": "s3cret"}
    try:
        with pytest.raises(InferenceServerException) as info:
            client.get_model_repository_index()
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert info.value.message() == (
            "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
        )
        with pytest.raises(InferenceServerException) as info:
            client.get_inference_statistics("add_sub", headers={"admin-key": "s3cret"})
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"  # key lacks the prefix
        with pytest.raises(InferenceServerException) as info:
            client.update_log_settings({"log_verbose_level": 2})
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        assert (
            client.get_log_settings(headers=admin).settings["log_verbose_level"].uint32_param == 0
        )
        assert client.get_model_repository_index(headers=admin).models
        assert client.get_inference_statistics("add_sub", headers=admin).model_stats

        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", _add_sub(grpcclient))
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
        result = client.infer(
            "add_sub",
            _add_sub(grpcclient),
            headers={"triton-grpc-protocol-infer-key": "let-me-in"},
        )
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
        assert client.is_server_ready()  # health stays open
        assert client.get_model_metadata("add_sub").name == "add_sub"
    finally:
        client.close()


def test_grpc_restricted_stream(restricted_server: Server) -> None:
    import queue

    client = grpcclient.InferenceServerClient(restricted_server.grpc_url)
    results: queue.Queue = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        # The server refuses the stream when it opens; the client may already know when
        # the request is written, and reports the status through the callback either way.
        with contextlib.suppress(InferenceServerException):
            client.async_stream_infer("add_sub", _add_sub(grpcclient))
        result, error = results.get(timeout=30)
        assert result is None
        assert "This protocol is restricted" in error.message()
        client.stop_stream()
        client.start_stream(
            callback=lambda result, error: results.put((result, error)),
            headers={"triton-grpc-protocol-infer-key": "let-me-in"},
        )
        client.async_stream_infer("add_sub", _add_sub(grpcclient))
        result, error = results.get(timeout=30)
        assert error is None
        assert result.as_numpy("OUTPUT1").tolist() == [[0.0] * 16]
    finally:
        client.stop_stream()
        client.close()


# ------------------------------------------------------------------------------- TLS


def _self_signed(directory: Path) -> tuple[Path, Path]:
    key, cert = directory / "server.key", directory / "server.crt"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    return key, cert


def test_grpc_tls(model_repository: Path, redis_url: str, tmp_path: Path) -> None:
    key, cert = _self_signed(tmp_path)
    server = start_server(
        repository_of(model_repository, tmp_path / "repo", "add_sub"),
        redis_url,
        tmp_path / "serve.log",
        "--grpc-use-ssl",
        "true",
        "--grpc-server-cert",
        str(cert),
        "--grpc-server-key",
        str(key),
        "--grpc-infer-response-compression-level",
        "high",
        "--grpc-keepalive-time",
        "60000",
        "--grpc-infer-allocation-pool-size",
        "8",
    )
    try:
        client = grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=str(cert)
        )
        try:
            assert client.is_server_live()
            result = client.infer("add_sub", _add_sub(grpcclient))
            assert result.as_numpy("OUTPUT0").tolist() == [[2.0] * 16]
        finally:
            client.close()
        plain = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            with pytest.raises(InferenceServerException):
                plain.is_server_live(client_timeout=5)
        finally:
            plain.close()
    finally:
        assert stop_server(server) == 0, server.log()
