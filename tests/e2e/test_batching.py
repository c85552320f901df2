"""Dynamic batching, queue policies and crash safety, driven by tritonclient.http."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e_support import instance_records, load_while, wait_machine_quiet
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e


def _stats(client: httpclient.InferenceServerClient, model: str) -> dict:
    return client.get_inference_statistics(model)["model_stats"][0]


def _slow_input(value: float) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    return [tensor]


def test_eight_concurrent_requests_make_one_batch(server) -> None:
    """Eight requests sent at once share one execution of the 100 ms window. This test
    runs first, while the session's server may still start its instances' heartbeat
    processes (~0.4 s of CPU each, on two cores): it waits for a quiet machine, and
    takes up to three rounds, as a request held up past the window runs apart; every
    round's answers must be right."""
    wait_machine_quiet()
    client = httpclient.InferenceServerClient(server.http_url, concurrency=8)
    inputs = []
    for i in range(8):
        a = httpclient.InferInput("A", [1, 4], "FP32")
        a.set_data_from_numpy(np.full((1, 4), i, np.float32))
        b = httpclient.InferInput("B", [1, 4], "FP32")
        b.set_data_from_numpy(np.full((1, 4), 10 * i, np.float32))
        inputs.append([a, b])
    for _ in range(3):
        before = _stats(client, "add")
        pending = [client.async_infer("add", pair) for pair in inputs]
        results = [p.get_result(timeout=30) for p in pending]
        for i, result in enumerate(results):
            assert result.as_numpy("SUM").tolist() == [[11.0 * i] * 4]
        after = _stats(client, "add")
        assert after["inference_count"] - before["inference_count"] == 8
        if all(r.as_numpy("EXEC_SIZE").tolist() == [[8]] for r in results):
            break
    assert [r.as_numpy("EXEC_SIZE").tolist() for r in results] == [[[8]]] * 8
    assert after["execution_count"] - before["execution_count"] == 1
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sizes.get(8, 0) >= 1
    client.close()


def test_64_concurrent_clients_get_their_own_outputs(server) -> None:
    stats_client = httpclient.InferenceServerClient(server.http_url)
    before = _stats(stats_client, "batch_scale")

    def one(i: int) -> list[float]:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4) + 100 * i)
            return client.infer("batch_scale", [tensor]).as_numpy("OUTPUT0").ravel().tolist()
        finally:
            client.close()

    with ThreadPoolExecutor(64) as pool:
        outputs = list(pool.map(one, range(64)))
    for i, out in enumerate(outputs):
        assert out == [3.0 * (100 * i + k) for k in range(4)]
    after = _stats(stats_client, "batch_scale")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 64
    assert executions < inferences  # batches of more than one request were formed
    assert max(b["batch_size"] for b in after["batch_stats"]) > 1
    stats_client.close()


def test_statistics_shape(http_client) -> None:
    stats = http_client.get_inference_statistics("batch_scale")["model_stats"][0]
    assert stats["name"] == "batch_scale" and stats["version"] == "1"
    for key in (
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    ):
        assert set(stats["inference_stats"][key]) == {"count", "ns"}
    assert (
        stats["inference_stats"]["success"]["count"] == stats["inference_stats"]["queue"]["count"]
    )
    with pytest.raises(InferenceServerException) as info:
        http_client.get_inference_statistics("nope")
    assert info.value.status() == "400"
    assert "requested model 'nope' is not available" in info.value.message()


@pytest.mark.parametrize("model", ["slow_queue", "slow_queue_sharded"])
def test_queue_full_rejects_at_once(server, model: str) -> None:
    """max_queue_size 1 (slow_queue); 2 split over 2 queue shards, one each
    (slow_queue_sharded): with the only instance busy, one request per shard waits and the
    next is refused at once."""
    shards = 2 if model.endswith("sharded") else 1
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    first = client.async_infer(model, _slow_input(1.0), parameters={"sleep_ms": 1500})
    time.sleep(0.5)  # the instance has taken the first request
    queued = [
        client.async_infer(model, _slow_input(2.0 + i), parameters={"sleep_ms": 1})
        for i in range(shards)
    ]
    time.sleep(0.2)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, _slow_input(9.0))
    assert time.monotonic() - started < 1.0  # refused without waiting
    assert info.value.status() == "503"
    assert "Exceeds maximum queue size" in info.value.message()
    assert first.get_result(timeout=30).as_numpy("OUT").tolist() == [[1.0]]
    for i, waiting in enumerate(queued):
        assert waiting.get_result(timeout=30).as_numpy("OUT").tolist() == [[2.0 + i]]
    client.close()


def test_queue_timeout_rejects_and_override_shortens(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    busy = client.async_infer("slow_timeout", _slow_input(1.0), parameters={"sleep_ms": 800})
    time.sleep(0.2)
    waiting = client.async_infer("slow_timeout", _slow_input(2.0))
    with pytest.raises(InferenceServerException) as info:
        waiting.get_result(timeout=30)
    assert info.value.status() == "503"
    assert "Request timeout expired" in info.value.message()
    assert busy.get_result(timeout=30).as_numpy("OUT").tolist() == [[1.0]]
    # no queueing: the default 300 ms timeout is not reached
    assert client.infer("slow_timeout", _slow_input(5.0)).as_numpy("OUT").tolist() == [[5.0]]
    # a request timeout of 50 ms (override allowed) expires behind a 400 ms request
    busy = client.async_infer("slow_timeout", _slow_input(1.0), parameters={"sleep_ms": 400})
    time.sleep(0.1)
    with pytest.raises(InferenceServerException) as info:
        client.infer("slow_timeout", _slow_input(6.0), timeout=50_000)
    assert "Request timeout expired" in info.value.message()
    busy.get_result(timeout=30)
    client.close()


def test_queue_timeouts_fire_while_the_only_instance_is_busy(server) -> None:
    """One request keeps slow_timeout's only instance busy for 2 s; two requests queued
    behind it with a 200 ms timeout (HTTP and gRPC) are refused with 503 /
    UNAVAILABLE at their timeout, not when the instance frees up, and never run."""
    import tritonclient.grpc as grpcclient

    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    before = _stats(client, "slow_timeout")
    busy = client.async_infer("slow_timeout", _slow_input(1.0), parameters={"sleep_ms": 2000})
    time.sleep(0.3)  # the instance runs it
    started = time.monotonic()
    refused: dict[str, tuple[float, str]] = {}

    def grpc_done(result, error) -> None:
        refused["grpc"] = (time.monotonic() - started, error.status() if error else "ok")

    tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[3.0]], np.float32))
    grpc.async_infer("slow_timeout", [tensor], grpc_done, timeout=200_000)
    with pytest.raises(InferenceServerException) as info:
        client.infer("slow_timeout", _slow_input(2.0), timeout=200_000)
    refused["http"] = (time.monotonic() - started, info.value.status())
    deadline = time.monotonic() + 5
    while "grpc" not in refused and time.monotonic() < deadline:
        time.sleep(0.01)
    assert refused["http"][1] == "503" and "Request timeout expired" in info.value.message()
    assert refused["grpc"][1] == "StatusCode.UNAVAILABLE"
    assert 0.2 <= refused["http"][0] < 0.3 + 0.1, refused  # + 0.1: sending it
    assert 0.2 <= refused["grpc"][0] < 0.3 + 0.1, refused
    assert busy.get_result(timeout=30).as_numpy("OUT").tolist() == [[1.0]]
    counts = before["inference_stats"]
    expected = (counts["success"]["count"] + 1, counts["fail"]["count"] + 2)
    deadline = time.monotonic() + 5
    while True:  # the instance writes its statistics with its next Redis round trip
        now = _stats(client, "slow_timeout")["inference_stats"]
        got = (now["success"]["count"], now["fail"]["count"])
        if got == expected or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got == expected
    grpc.close()
    client.close()


def test_delay_action_still_serves(server) -> None:
    client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    busy = client.async_infer("slow_delay", _slow_input(1.0), parameters={"sleep_ms": 500})
    time.sleep(0.2)
    late = client.async_infer("slow_delay", _slow_input(2.0))
    assert late.get_result(timeout=30).as_numpy("OUT").tolist() == [[2.0]]
    assert busy.get_result(timeout=30).as_numpy("OUT").tolist() == [[1.0]]
    client.close()


@pytest.mark.parametrize(
    ("queued", "expected"),
    [
        # a priority-1 request queued after priority-2 ones runs first
        ([(1.0, 2), (2.0, 2), (3.0, 2), (9.0, 1)], [0.0, 9.0, 1.0, 2.0, 3.0]),
        # a priority-2 request queued after priority-1 ones waits for all of them, also
        # once the instance holds it (it reads each level's stream)
        ([(1.0, 1), (2.0, 1), (3.0, 1), (9.0, 2)], [0.0, 1.0, 2.0, 3.0, 9.0]),
    ],
)
@pytest.mark.parametrize("model", ["slow_priority", "slow_priority_sharded"])
def test_priority_order(
    server, queued: list[tuple[float, int]], expected: list[float], model: str
) -> None:
    """With the instance busy (max_batch_size 1), queued requests run by priority level,
    in arrival order within a level (Triton: one priority queue per model), also when
    the queue is split over three shards (slow_priority_sharded)."""
    finished: list[float] = []
    lock = threading.Lock()

    def send(value: float, priority: int, sleep_ms: int) -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            out = client.infer(
                model,
                _slow_input(value),
                priority=priority,
                parameters={"sleep_ms": sleep_ms},
            )
            assert out.as_numpy("OUT").tolist() == [[value]]
            with lock:
                finished.append(value)
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(0.0, 2, 700))]
    threads[0].start()
    time.sleep(0.3)  # the instance is busy with the first request
    for value, priority in queued:
        threads.append(threading.Thread(target=send, args=(value, priority, 30)))
        threads[-1].start()
        time.sleep(0.03)
    for thread in threads:
        thread.join(30)
    assert finished == expected


@pytest.mark.parametrize("model", ["slow_pair", "slow_pair_sharded"])
def test_killed_instance_loses_no_request(server, model: str) -> None:
    """Two instances under steady load; one is SIGKILLed mid-run; every request is
    answered (slow_pair_sharded: the queue split over three shards, whose entries the
    killed instance held are claimed from each)."""
    instances = instance_records(server, model)
    assert len(instances) == 2
    victim = next(iter(instances.values()))["pid"]

    def infer(client: httpclient.InferenceServerClient, value: int) -> float:
        out = client.infer(model, _slow_input(float(value)), parameters={"sleep_ms": 40}).as_numpy(
            "OUT"
        )
        return float(out[0][0])

    results = load_while(server.http_url, infer, lambda: os.kill(victim, signal.SIGKILL), 6.0)
    assert len(results) > 20
    errors = [(v, a) for v, a in results.items() if not isinstance(a, float)]
    assert not errors, errors[:3]
    assert all(value == answer for value, answer in results.items())
