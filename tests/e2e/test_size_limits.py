"""Request size limits: ``--http-max-input-size`` (413 naming the limit, on every route,
for a declared, a chunked and a decompressed body) and ``--grpc-max-input-size``
(RESOURCE_EXHAUSTED), with the server serving on afterwards."""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from e2e_support import Server, repository_of, start_server, stop_server

LIMIT = 65536
TEXT = f"exceeds the limit of {LIMIT} bytes (--http-max-input-size)"


@pytest.fixture(scope="module")
def limited(
    model_repository: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    where = tmp_path_factory.mktemp("limits")
    server = start_server(
        repository_of(model_repository, where / "repo", "add_sub"),
        redis_url,
        where / "serve.log",
        "--http-max-input-size",
        str(LIMIT),
        "--grpc-max-input-size",
        str(LIMIT),
    )
    yield server
    assert stop_server(server) == 0, server.log()


def _add_sub(server: Server) -> None:
    """One add_sub request over HTTP answers exactly (the server serves on)."""
    body = {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "FP32", "data": [2.0] * 16}
            for n in ("INPUT0", "INPUT1")
        ]
    }
    reply = requests.post(f"{server.base}/v2/models/add_sub/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [4.0] * 16


def _big_json(size: int) -> bytes:
    return json.dumps({"inputs": [], "pad": "x" * size}).encode()


@pytest.mark.parametrize("path", ["/v2/models/add_sub/infer", "/v2/models/add_sub/jobs",
                                  "/v2/repository/models/add_sub/load"])  # fmt: skip
def test_declared_body_over_the_limit_is_413_before_it_is_read(limited: Server, path: str) -> None:
    """The answer comes after the head alone: the client sends no body byte."""
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=10) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {LIMIT + 1}\r\n\r\n".encode()
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), answer
    assert json.loads(body) == {"error": f"request body of {LIMIT + 1} bytes {TEXT}"}
    _add_sub(limited)


def test_body_at_the_limit_is_read(limited: Server) -> None:
    body = _big_json(LIMIT - 40)
    body += b" " * (LIMIT - len(body))
    reply = requests.post(f"{limited.base}/v2/models/add_sub/infer", data=body, timeout=30)
    assert reply.status_code == 400, reply.text  # read and checked: no inputs
    assert "exceeds the limit" not in reply.text


def test_chunked_body_over_the_limit_is_413(limited: Server) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(4):
            yield b" " * (LIMIT // 2)

    reply = requests.post(f"{limited.base}/v2/models/add_sub/infer", data=chunks(), timeout=30)
    assert reply.status_code == 413, reply.text
    assert reply.json() == {"error": f"request body {TEXT}"}
    _add_sub(limited)


def test_decompressed_body_over_the_limit_is_413(limited: Server) -> None:
    body = gzip.compress(_big_json(4 * LIMIT))
    assert len(body) < LIMIT
    reply = requests.post(
        f"{limited.base}/v2/models/add_sub/infer",
        data=body,
        headers={"Content-Encoding": "gzip"},
        timeout=30,
    )
    assert reply.status_code == 413, reply.text
    assert reply.json() == {"error": f"decompressed request body {TEXT}"}


def test_grpc_message_over_the_limit_is_resource_exhausted(limited: Server) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(limited.grpc_url)
    try:
        big = np.zeros((1, LIMIT // 4 + 16), np.float32)
        inputs = [grpcclient.InferInput(n, list(big.shape), "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(big)
        with pytest.raises(InferenceServerException) as info:
            client.infer("add_sub", inputs)
        assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert str(LIMIT) in info.value.message()
        small = np.ones((1, 16), np.float32)
        inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(small)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), small * 2)
    finally:
        client.close()
