"""The gateway's task-free infer path (``api/http/protocol.py``) as a client sees it.

Infer requests with a ``Content-Length`` are queued and answered from callbacks,
without an ASGI task; chunked bodies, ``Expect`` and models whose view is not cached
take the ASGI call. Both must answer alike: bodies beyond uvicorn's read buffer,
pipelined requests in order, errors in the middle of a pipeline, ``Connection:
close`` and HTTP/1.0, and clients that leave before their answer. The protocol's
limits: an endless head (431) and a request that stops arriving (408, read timeout).
"""

from __future__ import annotations

import json
import shutil
import socket
import time

import numpy as np
import pytest
from e2e_support import ROOT, build_nobatch, read_http_responses, start_server, stop_server

pytestmark = pytest.mark.e2e


def _json_request(model: str, values: list[float], extra_headers: str = "") -> bytes:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]}
    ).encode()
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\n{extra_headers}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _outputs(body: bytes) -> list[float]:
    return json.loads(body)["outputs"][0]["data"]


def test_binary_body_larger_than_the_read_buffer(http_client) -> None:
    """4 MB of binary tensor data (uvicorn pauses reading past 64 KiB until ASGI
    ``receive``; the task-free path must keep reading)."""
    import tritonclient.http as httpclient

    data = np.arange(1_000_000, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
    result = http_client.infer("nobatch", [tensor], outputs=[out])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)


def test_pipelined_requests_answered_in_order_with_an_error_between(server) -> None:
    requests = [
        _json_request("nobatch", [1.0, 2.0]),
        _json_request("nobatch", [3.0]),
        _json_request("nobatch", [1.0, "x"]),  # type: ignore[list-item]
        _json_request("nope", [1.0]),
        _json_request("nobatch", [5.0, 6.0, 7.0]),
    ]
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(b"".join(requests))
        responses = read_http_responses(sock, len(requests))
    assert [status for status, _, _ in responses] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 400 Bad Request",
        b"HTTP/1.1 404 Not Found",
        b"HTTP/1.1 200 OK",
    ]
    assert _outputs(responses[0][2]) == [2.0, 4.0]
    assert _outputs(responses[1][2]) == [6.0]
    assert "INPUT0" in json.loads(responses[2][2])["error"]
    assert json.loads(responses[3][2]) == {
        "error": "Request for unknown model: 'nope' is not found"
    }
    assert _outputs(responses[4][2]) == [10.0, 12.0, 14.0]


def test_chunked_body_takes_the_asgi_call(server) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [4.0, 0.5]}]}
    ).encode()
    half = len(body) // 2
    chunked = (
        b"".join(
            f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:half], body[half:])
        )
        + b"0\r\n\r\n"
    )
    request = (
        b"POST /v2/models/nobatch/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked
    )
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(request + _json_request("nobatch", [1.0]))
        responses = read_http_responses(sock, 2)
    assert [status for status, _, _ in responses] == [b"HTTP/1.1 200 OK"] * 2
    assert _outputs(responses[0][2]) == [8.0, 1.0]
    assert _outputs(responses[1][2]) == [2.0]


def test_connection_close_and_http_1_0_end_the_connection(server) -> None:
    for request in (
        _json_request("nobatch", [2.0], extra_headers="Connection: close\r\n"),
        _json_request("nobatch", [2.0]).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    ):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
            sock.sendall(request)
            ((status, headers, body),) = read_http_responses(sock, 1)
            assert sock.recv(1) == b""  # closed after the answer
        assert status.endswith(b"200 OK")
        assert headers["connection"] == "close"
        assert _outputs(body) == [4.0]


def test_client_leaving_before_its_answer_harms_nobody(server, http_client) -> None:
    """A client that closes while its request sleeps in the model: the answer has nowhere
    to go and is dropped; the next clients are served."""
    body = json.dumps(
        {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [7.0]}],
            "parameters": {"sleep_ms": 300},
        }
    ).encode()
    request = (
        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    log_before = len(server.log())
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
            sock.sendall(request)
    time.sleep(1.2)  # the three answers come back to closed connections
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(_json_request("nobatch", [8.0]))
        ((status, _, response),) = read_http_responses(sock, 1)
    assert status == b"HTTP/1.1 200 OK"
    assert _outputs(response) == [16.0]
    assert "Traceback" not in server.log()[log_before:]


def test_upgrade_headers_are_ignored_as_triton_does(server) -> None:
    """``curl --http2`` on plain HTTP sends ``Upgrade: h2c``; a WebSocket handshake asks
    for ``websocket``. Neither is taken up: each request is answered over HTTP/1.1, its
    body read whole, and the requests pipelined after it are answered too."""
    upgrade = (
        "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
    )
    websocket = (
        "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    )
    requests = [
        _json_request("nobatch", [1.0, 2.0], extra_headers=upgrade),
        _json_request("nobatch", [3.0]),
        f"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n{websocket}\r\n".encode(),
        _json_request("nobatch", [4.0], extra_headers=websocket),
    ]
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(b"".join(requests))
        responses = read_http_responses(sock, len(requests))
    assert [status for status, _, _ in responses] == [b"HTTP/1.1 200 OK"] * 4
    assert _outputs(responses[0][2]) == [2.0, 4.0]
    assert _outputs(responses[1][2]) == [6.0]
    assert responses[2][2] == b""
    assert _outputs(responses[3][2]) == [8.0]
    # the body of an upgrade request split across writes is still read whole
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        request = _json_request("nobatch", [5.0], extra_headers=upgrade)
        head_end = request.index(b"\r\n\r\n") + 4
        sock.sendall(request[: head_end + 3])
        time.sleep(0.2)
        sock.sendall(request[head_end + 3 :])
        ((status, _, body),) = read_http_responses(sock, 1)
    assert status == b"HTTP/1.1 200 OK"
    assert _outputs(body) == [10.0]


def test_an_endless_head_is_refused_with_431(server) -> None:
    """A header that never ends is not buffered without bound: past 1 MiB of request line
    and headers the gateway answers 431 and closes; the server goes on serving."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/nobatch/infer HTTP/1.1\r\nHost: x\r\nX-Big: ")
        raw = b""
        try:
            for _ in range(40):
                sock.sendall(b"a" * 65536)
        except OSError:
            pass  # closed by the server while sending
        while chunk := sock.recv(65536):
            raw += chunk
    assert raw.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), raw[:200]
    assert b"exceed 1048576 bytes" in raw
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(_json_request("nobatch", [1.0]))
        ((status, _, body),) = read_http_responses(sock, 1)
    assert status == b"HTTP/1.1 200 OK"
    assert _outputs(body) == [2.0]


@pytest.fixture(scope="module")
def impatient_server(redis_url, tmp_path_factory):
    """A server with a 1 s HTTP read timeout (``--http-read-timeout-secs 1``)."""
    repo = tmp_path_factory.mktemp("read-timeout-models")
    build_nobatch(repo)
    shutil.copytree(ROOT / "tests/assets/python_models/slow", repo / "slow")
    log = tmp_path_factory.mktemp("read-timeout-logs") / "serve.log"
    srv = start_server(repo, redis_url, log, "--http-read-timeout-secs", "1")
    yield srv
    assert stop_server(srv) == 0, srv.log()


def _read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took, in s."""
    start, raw = time.monotonic(), b""
    while chunk := sock.recv(65536):
        raw += chunk
    return raw, time.monotonic() - start


@pytest.mark.parametrize("cut", ["head", "body"])
def test_a_request_that_stops_arriving_gets_408(impatient_server, cut: str) -> None:
    """Every wait has a deadline: a client that sends part of a request's head or body
    and then nothing is answered 408 after the read timeout, and the connection closed
    (it was held open without end)."""
    request = _json_request("nobatch", [1.0, 2.0])
    part = request[:30] if cut == "head" else request[:-5]
    with socket.create_connection(("127.0.0.1", impatient_server.http_port), timeout=10) as sock:
        sock.sendall(part)
        raw, waited = _read_until_closed(sock)
    assert raw.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), raw[:200]
    assert b"connection: close" in raw
    assert json.loads(raw.split(b"\r\n\r\n", 1)[1]) == {
        "error": "request not received whole: no bytes for 1 s"
    }
    assert 0.9 <= waited < 5


def test_a_connection_that_sends_nothing_is_closed(impatient_server) -> None:
    with socket.create_connection(("127.0.0.1", impatient_server.http_port), timeout=10) as sock:
        raw, waited = _read_until_closed(sock)
    assert raw == b""
    assert 0.9 <= waited < 5


def test_a_slow_request_that_keeps_arriving_is_answered(impatient_server) -> None:
    """The read timeout bounds each pause, not the whole request: a body sent in pieces
    0.4 s apart over 2 s is answered, and keep-alive goes on after it."""
    request = _json_request("nobatch", [1.0, 2.0])
    with socket.create_connection(("127.0.0.1", impatient_server.http_port), timeout=10) as sock:
        step = len(request) // 5 + 1
        for offset in range(0, len(request), step):
            sock.sendall(request[offset : offset + step])
            time.sleep(0.4)
        ((status, _, body),) = read_http_responses(sock, 1)
        assert status == b"HTTP/1.1 200 OK"
        assert _outputs(body) == [2.0, 4.0]
        sock.sendall(_json_request("nobatch", [3.0]))
        ((status, _, body),) = read_http_responses(sock, 1)
    assert status == b"HTTP/1.1 200 OK"
    assert _outputs(body) == [6.0]


def _slow_request(sleep_ms: int) -> bytes:
    body = json.dumps(
        {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [3.0]}],
            "outputs": [{"name": "OUT"}],
            "parameters": {"sleep_ms": sleep_ms},
        }
    ).encode()
    return (
        "POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _chunked(request: bytes) -> bytes:
    """``request`` with its body sent chunked (the ASGI path, whose body reads resume
    reading the connection)."""
    head, _, body = request.partition(b"\r\n\r\n")
    head = b"\r\n".join(
        line for line in head.split(b"\r\n") if not line.lower().startswith(b"content-length")
    )
    return head + b"\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        len(body),
        body,
    )


@pytest.mark.parametrize("framing", ["length", "chunked"])
@pytest.mark.parametrize("cut", ["head", "body"])
def test_a_stalled_request_pipelined_behind_a_slow_one_waits_for_its_answer(
    impatient_server, framing: str, cut: str
) -> None:
    """Answers go out in order, and the read clock does not run while one is owed: a
    request pipelined behind one the model works on for 2 s (twice the 1 s read timeout)
    and left unfinished gets its 408 a whole read timeout after the first request's 200,
    not instead of it, whether the head or the body stalls, and whether the first request
    takes the fast path or (chunked) the ASGI path."""
    first = _slow_request(2000)
    if framing == "chunked":
        first = _chunked(first)
    second = _json_request("nobatch", [1.0])
    second = second[:40] if cut == "head" else second[:-5]
    with socket.create_connection(("127.0.0.1", impatient_server.http_port), timeout=10) as sock:
        start = time.monotonic()
        sock.sendall(first + second)
        arrivals: list[tuple[float, bytes]] = []
        while chunk := sock.recv(65536):
            arrivals.append((time.monotonic() - start, chunk))
    raw = b"".join(chunk for _, chunk in arrivals)
    answer, _, refusal = raw.partition(b"HTTP/1.1 408 Request Timeout\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), raw[:300]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"] == [3.0]
    assert b"no bytes for 1 s" in refusal
    answered = next(t for t, chunk in arrivals if b"200 OK" in chunk)
    refused = next(t for t, chunk in arrivals if b"408" in chunk)
    assert 1.9 <= answered < 4
    assert 0.9 <= refused - answered < 3, arrivals


def test_a_stalled_head_after_an_answered_request_gets_408(impatient_server) -> None:
    """On a kept-alive connection the next request's head that stops arriving gets its
    408 too (it was closed without an answer)."""
    with socket.create_connection(("127.0.0.1", impatient_server.http_port), timeout=10) as sock:
        sock.sendall(_json_request("nobatch", [1.0]))
        ((status, _, _),) = read_http_responses(sock, 1)
        assert status == b"HTTP/1.1 200 OK"
        sock.sendall(_json_request("nobatch", [2.0])[:25])
        raw, waited = _read_until_closed(sock)
    assert raw.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), raw[:200]
    assert 0.9 <= waited < 5
