"""Decoupled models end to end: a Python model that answers each request with 0..n
responses, over tritonclient's gRPC streaming."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import ROOT, Server, start_server, stop_server
from tritonclient.utils import InferenceServerException

MODEL = "decoupled_repeat"


@pytest.fixture(scope="module")
def server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("decoupled-repo")
    shutil.copytree(ROOT / "tests" / "assets" / "python_models" / MODEL, repo / MODEL)
    shutil.copytree(ROOT / "examples" / "model_repository" / "add_sub", repo / "add_sub")
    shutil.copytree(
        ROOT / "tests" / "assets" / "python_models" / "bls_decoupled", repo / "bls_decoupled"
    )
    started = start_server(repo, redis_url, repo.parent / "decoupled.log")
    try:
        yield started
    finally:
        stop_server(started)


def _input(n: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[n]], dtype=np.int32))
    return [tensor]


class Stream:
    """One tritonclient gRPC stream and what came back on it."""

    def __init__(self, server: Server) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.results: queue.Queue[Any] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put(error or result))

    def send(self, request_id: str, n: int, **parameters: Any) -> None:
        empty = parameters.pop("empty_final", False)
        self.client.async_stream_infer(
            MODEL, _input(n), request_id=request_id, parameters=parameters or None,
            enable_empty_final_response=empty,
        )  # fmt: skip

    def take(self, count: int, timeout_s: float = 30) -> list[Any]:
        return [self.results.get(timeout=timeout_s) for _ in range(count)]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def _summary(item: Any) -> tuple[str, int | None, bool]:
    """(request id, OUT or None for an empty response, triton_final_response)."""
    response = item.get_response()
    out = item.as_numpy("OUT")
    final = response.parameters["triton_final_response"].bool_param
    return response.id, None if out is None else int(out.item()), final


def test_zero_one_and_many_responses_with_their_final_flags(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send("none", 0)
        stream.send("one", 1)
        stream.send("many", 5)
        stream.send("last", 3, last_final=True)
        stream.send("none-empty", 0, empty_final=True)
        stream.send("two-empty", 2, empty_final=True)
        got = [_summary(item) for item in stream.take(1 + 5 + 3 + 1 + 3)]
        time.sleep(0.5)
        assert stream.results.empty()  # nothing more: no empty final unless asked
    finally:
        stream.close()
    by_id: dict[str, list[tuple[int | None, bool]]] = {}
    for request_id, out, final in got:
        by_id.setdefault(request_id, []).append((out, final))
    assert by_id == {
        "one": [(0, False)],
        "many": [(i, False) for i in range(5)],
        "last": [(0, False), (1, False), (2, True)],
        "none-empty": [(None, True)],
        "two-empty": [(0, False), (1, False), (None, True)],
    }


def test_an_error_response_ends_its_request_and_the_stream_goes_on(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send("bad", 5, error_at=2)
        items = stream.take(3)
        assert [_summary(i)[1] for i in items[:2]] == [0, 1]
        assert isinstance(items[2], InferenceServerException)
        assert "failed at response 2" in items[2].message()
        stream.send("after", 2, last_final=True)
        assert [_summary(i)[1:] for i in stream.take(2)] == [(0, False), (1, True)]
    finally:
        stream.close()


def test_responses_sent_from_a_thread_after_execute_returned(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send("threaded", 40, thread=True, last_final=True)
        outs = [_summary(i)[1] for i in stream.take(40)]
        assert outs == list(range(40))
    finally:
        stream.close()


def test_many_streams_at_once_keep_their_responses_apart(server: Server) -> None:
    errors: list[str] = []

    def run(index: int) -> None:
        stream = Stream(server)
        try:
            for k in range(3):
                stream.send(f"s{index}-r{k}", 10 + index + k, last_final=True)
            got: dict[str, list[int]] = {}
            for item in stream.take(sum(10 + index + k for k in range(3))):
                request_id, out, _ = _summary(item)
                got.setdefault(request_id, []).append(out)  # type: ignore[arg-type]
            expected = {f"s{index}-r{k}": list(range(10 + index + k)) for k in range(3)}
            if got != expected:
                errors.append(f"stream {index}: {got}")
        except Exception as exc:  # the test asserts there were none
            errors.append(f"stream {index}: {exc!r}")
        finally:
            stream.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []


def test_a_cancelled_stream_stops_the_model(server: Server, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    stream = Stream(server)
    stream.send("long", 1000, delay_ms=20, cancel_file=str(marker))
    assert [_summary(i)[1] for i in stream.take(5)] == [0, 1, 2, 3, 4]
    stream.close(cancel=True)
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the model never saw the cancellation"
    assert 5 <= int(marker.read_text() or 0) < 100


def test_non_streaming_calls_to_a_decoupled_model_are_refused(server: Server) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        http.infer(MODEL, [tensor])
    assert info.value.status() == "501"
    assert "doesn't support models with decoupled transaction policy" in info.value.message()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        grpc.infer(MODEL, _input(1))
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled" in info.value.message()


def test_the_instance_sending_a_stream_dies_and_the_client_is_told_at_once(
    server: Server,
) -> None:
    stream = Stream(server)
    try:
        stream.send("doomed", 1000, delay_ms=20, cancel_file="/dev/null")
        first = stream.take(1)[0]
        pid = int(first.as_numpy("PID").item())
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        while True:
            item = stream.results.get(timeout=10)
            if isinstance(item, InferenceServerException):
                break
        assert time.monotonic() - killed < 3
        assert "exited while it was sending this request's responses" in item.message()
    finally:
        stream.close()
    # the model serves new streams on the instances left (and the restarted one)
    again = Stream(server)
    try:
        again.send("after", 3, last_final=True)
        assert [_summary(i)[1] for i in again.take(3)] == [0, 1, 2]
    finally:
        again.close()


def _events(response: requests.Response) -> Iterator[tuple[float, dict]]:
    """(arrival time, JSON) of each Server-Sent Event of ``response``."""
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            yield time.monotonic(), json.loads(line[6:])


def test_generate_stream_sends_each_response_as_an_event(server: Server) -> None:
    url = f"{server.base}/v2/models/{MODEL}/generate_stream"
    started = time.monotonic()
    body = {"IN": 5, "id": "g1", "parameters": {"delay_ms": 100, "cancel_file": "/dev/null"}}
    with requests.post(url, json=body, stream=True, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = list(_events(response))
    assert [body["OUT"] for _, body in events] == [0, 1, 2, 3, 4]
    assert {body["model_name"] for _, body in events} == {MODEL}
    assert {body["id"] for _, body in events} == {"g1"}
    assert {body["model_version"] for _, body in events} == {"1"}
    # streamed: the first event came about 0.4 s before the last
    assert events[-1][0] - events[0][0] > 0.25
    assert events[0][0] - started < events[-1][0] - started - 0.25


def test_generate_stream_error_after_the_first_response_is_an_event(server: Server) -> None:
    url = f"{server.base}/v2/models/{MODEL}/generate_stream"
    with requests.post(url, json={"IN": 4, "parameters": {"error_at": 2}}, stream=True,
                       timeout=30) as response:  # fmt: skip
        assert response.status_code == 200
        bodies = [body for _, body in _events(response)]
    assert [b.get("OUT") for b in bodies[:2]] == [0, 1]
    assert bodies[2] == {"error": "failed at response 2"}
    # an error before any response: a plain JSON error with its status
    response = requests.post(url, json={"IN": 3, "parameters": {"error_at": 0}}, timeout=30)
    assert response.status_code == 500 and response.json() == {"error": "failed at response 0"}
    response = requests.post(url, json={"IN": 3, "NOPE": 1}, timeout=30)
    assert response.status_code == 400 and "unexpected key 'NOPE'" in response.json()["error"]


def test_generate_answers_one_json_object(server: Server) -> None:
    response = requests.post(f"{server.base}/v2/models/{MODEL}/generate", json={"IN": 1},
                             timeout=30)  # fmt: skip
    assert response.status_code == 200
    body = response.json()
    assert (body["model_name"], body["model_version"], body["OUT"]) == (MODEL, "1", 0)
    many = requests.post(f"{server.base}/v2/models/{MODEL}/generate", json={"IN": 3}, timeout=30)
    assert many.status_code == 500 and "use generate_stream" in many.json()["error"]
    # a model that is not decoupled: its one answer, lists by input name
    a = list(range(16))
    plain = requests.post(
        f"{server.base}/v2/models/add_sub/generate",
        json={"INPUT0": a, "INPUT1": [1.0] * 16}, timeout=30,
    ).json()  # fmt: skip
    assert plain["OUTPUT0"] == [x + 1.0 for x in a] and plain["OUTPUT1"] == [x - 1.0 for x in a]


def test_a_closed_sse_connection_stops_the_model(server: Server, tmp_path: Path) -> None:
    marker = tmp_path / "sse-cancelled"
    url = f"{server.base}/v2/models/{MODEL}/generate_stream"
    body = {"IN": 1000, "parameters": {"delay_ms": 20, "cancel_file": str(marker)}}
    with requests.post(url, json=body, stream=True, timeout=30) as response:
        events = _events(response)
        assert [next(events)[1]["OUT"] for _ in range(3)] == [0, 1, 2]
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the model never saw the closed connection"
    assert int(marker.read_text() or 0) < 200


def test_bls_iterates_over_a_decoupled_models_responses(server: Server) -> None:
    """exec(decoupled=True) yields every response, the last one empty (the final flag
    sent alone, as python_backend's iterator gives it); a plain exec() of a decoupled
    model is an error response. 150 responses: past the flow-control window."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([150], dtype=np.int32))
    result = client.infer("bls_decoupled", [tensor])
    assert result.as_numpy("OUTS").tolist() == list(range(150))
    assert result.as_numpy("EMPTY_FINAL").tolist() == [1]
    assert b"the model is decoupled" in result.as_numpy("PLAIN_ERROR")[0]
