"""Request cancellation (Triton ``request_cancellation.md``): a request whose client goes
away while it is still queued is taken off its stream, never executed, and counted as a
failure with reason CANCELED; one an instance already runs completes as before.

``slow_queue`` has one instance and ``max_queue_size: 1``: a slow request keeps the
instance busy, the next one waits on the stream, and a third is refused at once unless
the one waiting was taken off (e2e_support ``SLOW_VARIANTS``).
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import read_http_responses
from metrics_support import scrape

from sluice.broker.keys import WORKER_GROUP, KeySchema

pytestmark = pytest.mark.e2e

REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
#: statistics and metrics deltas of two requests answered and two cancelled while queued
#: (the cancelled ones never ran: two executions)
TWO_RAN_TWO_CANCELLED = {
    "execution_count": 2,
    "inference_count": 2,
    "success": 2,
    "queue": 2,
    "fail": 2,
    **dict.fromkeys(REASONS, 0),
    "CANCELED": 2,
}


@pytest.fixture
def broker(server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.redis_url, socket_timeout=5)
    yield client
    client.close()


def _streams(server: Any, model: str) -> list[str]:
    """The model's streams: one, or one per queue shard (``*_sharded``: two)."""
    shards = 2 if model.endswith("_sharded") else 1
    return [KeySchema(server.key_prefix).queue(model, 1, 0, k, shards) for k in range(shards)]


def _length(broker: redis.Redis, server: Any, model: str) -> int:
    return sum(int(broker.xlen(stream)) for stream in _streams(server, model))


def _queued(broker: redis.Redis, server: Any, model: str) -> int:
    """Entries on the model's streams that no instance has taken yet."""
    return _length(broker, server, model) - _taken(broker, server, model)


def _taken(broker: redis.Redis, server: Any, model: str) -> int:
    """Entries an instance has taken and not finished."""
    taken = 0
    for stream in _streams(server, model):
        with contextlib.suppress(redis.ResponseError):  # no group yet
            taken += int(broker.xpending(stream, WORKER_GROUP)["pending"])
    return taken


def _until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never: {what}")


def _counts(server: Any, model: str) -> dict[str, int]:
    """The model's statistics (tritonclient) and failure metrics, flattened."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    inference = stats["inference_stats"]
    counts = {
        "execution_count": stats["execution_count"],
        "inference_count": stats["inference_count"],
        "success": inference["success"]["count"],
        "fail": inference["fail"]["count"],
        "queue": inference["queue"]["count"],
    }
    metrics = scrape(server.metrics_url)
    for reason in REASONS:
        counts[reason] = int(metrics.model("nv_inference_request_failure", model, reason=reason))
    return counts


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def _grpc_input(value: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    return [tensor]


def _http_request(value: float, model: str, chunked: bool = False, sleep_ms: int = 0) -> bytes:
    """A JSON infer request; ``chunked`` sends the body chunked, which takes the ASGI path
    (``handle_infer``) instead of the task-free one."""
    body = json.dumps(
        {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [value]}],
            "parameters": {"sleep_ms": sleep_ms},
        }
    ).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    )
    if chunked:
        return (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + (
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        )
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def _reset(sock: socket.socket) -> None:
    """Close abortively (RST), as a client killed with unread data or SO_LINGER 0 does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Results:
    """tritonclient.grpc callbacks, by name."""

    def __init__(self) -> None:
        self.done: queue.Queue[tuple[str, Any, Any]] = queue.Queue()

    def callback(self, name: str) -> Callable[[Any, Any], None]:
        return lambda result, error: self.done.put((name, result, error))

    def wait(self, count: int) -> dict[str, tuple[Any, Any]]:
        return {
            name: (result, error)
            for name, result, error in (self.done.get(timeout=30) for _ in range(count))
        }


@pytest.mark.parametrize("model", ["slow_queue", "slow_queue_sharded"])
def test_grpc_cancel_and_deadline_take_a_queued_request_off(server, broker, model: str) -> None:
    """Also on a queue split over two shards (slow_queue_sharded), whose shard streams
    are in slots of their own: the entry is taken off, then counted."""
    before = _counts(server, model)
    log_before = len(server.log())
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = _Results()
    client.async_infer(
        model, _grpc_input(1.0), results.callback("running"), parameters={"sleep_ms": 2500}
    )
    _until(lambda: _taken(broker, server, model) == 1, "the instance takes the first request")

    # cancelled by the client while queued
    call = client.async_infer(model, _grpc_input(2.0), results.callback("cancelled"))
    _until(lambda: _queued(broker, server, model) == 1, "the second request is queued")
    call.cancel()
    # at once, long before the instance is free (2.5 s)
    _until(lambda: _queued(broker, server, model) == 0, "the cancelled one is taken off", 1.5)

    # its deadline (client_timeout) passes while queued: the queue had room for it again
    client.async_infer(model, _grpc_input(3.0), results.callback("expired"), client_timeout=0.6)
    _until(lambda: _queued(broker, server, model) == 1, "the third request is queued")
    _until(lambda: _queued(broker, server, model) == 0, "the expired one is taken off", 1.5)

    # a later request is queued (not refused: max_queue_size 1) and served
    client.async_infer(model, _grpc_input(4.0), results.callback("later"))
    done = results.wait(4)
    client.close()

    assert done["running"][1] is None and done["running"][0].as_numpy("OUT").tolist() == [[1.0]]
    assert done["later"][1] is None and done["later"][0].as_numpy("OUT").tolist() == [[4.0]]
    assert done["cancelled"][1].status() == "StatusCode.CANCELLED"
    assert done["expired"][1].status() == "StatusCode.DEADLINE_EXCEEDED"
    # the instance deletes a run entry with its next Redis round trip, after the answer
    _until(lambda: _length(broker, server, model) == 0, "the streams are empty")
    _until(lambda: _counts(server, model)["success"] == before["success"] + 2, "two answered")
    _until(lambda: _counts(server, model)["fail"] == before["fail"] + 2, "two counted failed")
    assert _delta(_counts(server, model), before) == TWO_RAN_TWO_CANCELLED
    assert "Traceback" not in server.log()[log_before:]


def test_http_connection_reset_takes_a_queued_request_off(server, broker) -> None:
    """A client whose connection is reset is gone; one that half-closed (sent EOF, still
    reading) is answered, and its request counts as before."""
    model = "slow_queue"
    before = _counts(server, model)
    log_before = len(server.log())
    first = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    first.sendall(_http_request(1.0, model, sleep_ms=2500))
    _until(lambda: _taken(broker, server, model) == 1, "the instance takes the first request")

    for chunked in (False, True):  # the task-free path, then the ASGI path
        sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
        sock.sendall(_http_request(2.0, model, chunked=chunked))
        _until(lambda: _queued(broker, server, model) == 1, "a request is queued")
        _reset(sock)
        _until(lambda: _queued(broker, server, model) == 0, "the reset one is taken off", 1.0)

    half_closed = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    half_closed.sendall(_http_request(5.0, model))
    _until(lambda: _queued(broker, server, model) == 1, "the half-closed one is queued")
    half_closed.shutdown(socket.SHUT_WR)

    [(status, _, answer)] = read_http_responses(first, 1)
    assert status == b"HTTP/1.1 200 OK", answer
    [(status, _, answer)] = read_http_responses(half_closed, 1)
    assert status == b"HTTP/1.1 200 OK", answer
    assert json.loads(answer)["outputs"][0]["data"] == [5.0]
    first.close()
    half_closed.close()

    # the instance deletes a run entry with its next Redis round trip, after the answer
    _until(lambda: _length(broker, server, model) == 0, "the stream is empty")
    _until(lambda: _counts(server, model)["success"] == before["success"] + 2, "two answered")
    assert _delta(_counts(server, model), before) == TWO_RAN_TWO_CANCELLED
    assert "Traceback" not in server.log()[log_before:]


def test_a_request_already_running_when_cancelled_completes(server, broker) -> None:
    """Triton cancels only what waits in the scheduler queue: a request an instance runs
    finishes and counts as a success (its answer finds nobody waiting)."""
    model = "slow_pair"  # two instances: both requests run at once
    before = _counts(server, model)
    log_before = len(server.log())
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = _Results()
    call = client.async_infer(
        model, _grpc_input(1.0), results.callback("grpc"), parameters={"sleep_ms": 1000}
    )
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.sendall(_http_request(2.0, model, sleep_ms=1000))
    _until(lambda: _taken(broker, server, model) == 2, "both requests run")
    call.cancel()
    _reset(sock)
    assert results.wait(1)["grpc"][1].status() == "StatusCode.CANCELLED"
    client.close()

    _until(lambda: _counts(server, model)["success"] == before["success"] + 2, "both complete")
    # the instance deletes a run entry with its next Redis round trip, after the answer
    _until(lambda: _length(broker, server, model) == 0, "the stream is empty")
    got = _delta(_counts(server, model), before)
    assert got.pop("execution_count") in (1, 2)  # one batch of two, or one each
    assert got == {
        "success": 2,
        "inference_count": 2,
        "queue": 2,
        "fail": 0,
        **dict.fromkeys(REASONS, 0),
    }
    assert "Traceback" not in server.log()[log_before:]


def test_a_sharded_instance_takes_about_a_batch_so_the_rest_can_be_cancelled(
    server, broker
) -> None:
    """slow_batch4_sharded: max_batch_size 4, queue split over 4 shards, one instance.
    While it runs a 1 s request, 12 more (1 s each) queue, 3 per shard; it then takes
    one per shard (a batch of 4), not a batch per shard, so the last 8, cancelled while
    that batch runs, are still queued: taken off, never run, counted CANCELED."""
    model = "slow_batch4_sharded"
    shards = 4
    streams = [KeySchema(server.key_prefix).queue(model, 1, 0, k, shards) for k in range(shards)]
    before = _counts(server, model)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = _Results()
    client.async_infer(model, _grpc_input(0.0), results.callback("first"),
                       parameters={"sleep_ms": 1000})  # fmt: skip
    _until(lambda: _taken_on(broker, streams) == 1, "the instance takes the first request")
    calls = []
    for i in range(1, 13):
        calls.append(
            client.async_infer(
                model,
                _grpc_input(float(i)),
                results.callback(str(i)),
                parameters={"sleep_ms": 1000},
            )
        )
        time.sleep(0.01)
    # the first request ends; the instance takes its next batch: one entry per shard
    _until(lambda: _taken_on(broker, streams) == 4, "the instance takes a batch of 4", 5.0)
    assert sum(int(broker.xlen(s)) for s in streams) == 4 + 8  # 8 still queued
    for call in calls[4:]:
        call.cancel()
    done = results.wait(13)
    client.close()
    for i in range(5):
        result, error = done["first" if i == 0 else str(i)]
        assert error is None and result.as_numpy("OUT").tolist() == [[float(i)]]
    assert {done[str(i)][1].status() for i in range(5, 13)} == {"StatusCode.CANCELLED"}
    _until(lambda: _counts(server, model)["CANCELED"] == before["CANCELED"] + 8, "8 counted")
    _until(lambda: _counts(server, model)["success"] == before["success"] + 5, "5 answered")
    assert _counts(server, model)["execution_count"] - before["execution_count"] == 2


def _taken_on(broker: redis.Redis, streams: list[str]) -> int:
    taken = 0
    for stream in streams:
        with contextlib.suppress(redis.ResponseError):  # no group yet
            taken += int(broker.xpending(stream, WORKER_GROUP)["pending"])
    return taken
