"""Slow and vanishing clients: a connection that trickles its body, or goes away in the
middle of it, holds only itself up. Other clients are answered as usual meanwhile, the
slow request is answered correctly once its body is complete, and the server keeps
serving after the ones that vanished."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e_support import Server

pytestmark = pytest.mark.e2e

#: slow connections held open at once (more than a thread pool would hide)
SLOW = 24


def _body(value: float) -> bytes:
    data = [value] * 16
    inputs = [
        {"name": name, "shape": [1, 16], "datatype": "FP32", "data": data}
        for name in ("INPUT0", "INPUT1")
    ]
    return json.dumps({"inputs": inputs}).encode()


def _head(server: Server, length: int) -> bytes:
    return (
        f"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: 127.0.0.1:{server.http_port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.settimeout(30)
    return sock


def _response(sock: socket.socket) -> tuple[int, dict[str, object]]:
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {raw!r}"
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the response body"
        rest += chunk
    return status, json.loads(rest[:length])


def _fast_infer(server: Server, value: float) -> float:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    try:
        tensors = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in tensors:
            tensor.set_data_from_numpy(np.full((1, 16), value, np.float32))
        started = time.monotonic()
        result = client.infer("add_sub", tensors)
        assert result.as_numpy("OUTPUT0").tolist() == [[2 * value] * 16]
        return time.monotonic() - started
    finally:
        client.close()


def test_trickled_bodies_hold_up_only_themselves(server: Server) -> None:
    """24 connections send half a body, then wait; 20 ordinary requests meanwhile are
    answered promptly; then each slow body is finished and answered exactly."""
    slow: list[tuple[socket.socket, bytes]] = []
    try:
        for k in range(SLOW):
            body = _body(float(k))
            sock = _connect(server)
            sock.sendall(_head(server, len(body)) + body[: len(body) // 2])
            slow.append((sock, body))
        latencies = [_fast_infer(server, float(v)) for v in range(20)]
        assert max(latencies) < 5.0, latencies
        for sock, body in slow:
            half = len(body) // 2
            for start in range(half, len(body), 64):  # the rest in small pieces
                sock.sendall(body[start : start + 64])
        for k, (sock, _) in enumerate(slow):
            status, answer = _response(sock)
            assert status == 200, answer
            outputs = {o["name"]: o["data"] for o in answer["outputs"]}  # type: ignore[index]
            assert outputs["OUTPUT0"] == [2.0 * k] * 16
            assert outputs["OUTPUT1"] == [0.0] * 16
    finally:
        for sock, _ in slow:
            sock.close()


def test_clients_that_vanish_mid_body_leave_the_server_serving(server: Server) -> None:
    """Connections closed after half a body, or after the headers only, from several
    threads at once: the server answers the next requests as before."""

    def vanish(k: int) -> None:
        body = _body(float(k))
        sock = _connect(server)
        try:
            cut = len(body) // 2 if k % 2 else 0
            sock.sendall(_head(server, len(body)) + body[:cut])
            time.sleep(0.05)
        finally:
            sock.close()

    threads = [threading.Thread(target=vanish, args=(k,)) for k in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    for value in (1.0, 2.5, -3.0):
        assert _fast_infer(server, value) < 5.0
    assert server.process.poll() is None
