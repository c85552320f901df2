"""Decoupled streams across an instance's life: a graceful shutdown and a reload let the
streams in flight finish; a client that goes away, or a deadline that passes, stops the
model's work."""

from __future__ import annotations

import json
import queue
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from e2e_support import ROOT, start_server, stop_server

MODEL = "decoupled_repeat"
SOURCE = ROOT / "tests" / "assets" / "python_models" / MODEL


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(SOURCE, repo / MODEL)
    return repo


def _stream(url: str, n: int, delay_ms: int, cancel_file: str) -> tuple[Any, queue.Queue]:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[n]], dtype=np.int32))
    client.async_stream_infer(
        MODEL,
        [tensor],
        request_id="s",
        parameters={"delay_ms": delay_ms, "cancel_file": cancel_file},
    )
    return client, results


def _outs(results: queue.Queue, count: int) -> list[Any]:
    got = []
    for _ in range(count):
        item = results.get(timeout=30)
        got.append(item if isinstance(item, Exception) else int(item.as_numpy("OUT").item()))
    return got


def test_a_graceful_stop_lets_the_streams_in_flight_finish(redis_url: str, tmp_path: Path) -> None:
    server = start_server(_repo(tmp_path), redis_url, tmp_path / "serve.log")
    try:
        client, results = _stream(server.grpc_url, 12, 100, "/dev/null")
        assert _outs(results, 2) == [0, 1]
        server.process.send_signal(signal.SIGTERM)
        assert _outs(results, 10) == list(range(2, 12))
        client.stop_stream()
        client.close()
        assert server.process.wait(30) == 0
    finally:
        stop_server(server)


def test_a_reload_lets_the_old_instance_finish_its_streams(redis_url: str, tmp_path: Path) -> None:
    server = start_server(
        _repo(tmp_path), redis_url, tmp_path / "serve.log",
        "--model-control-mode", "explicit", "--load-model", MODEL,
    )  # fmt: skip
    try:
        client, results = _stream(server.grpc_url, 15, 100, "/dev/null")
        assert _outs(results, 2) == [0, 1]
        config = (SOURCE / "config.pbtxt").read_text().replace("count: 2", "count: 1")
        control = grpcclient.InferenceServerClient(server.grpc_url)
        control.load_model(MODEL, config=json.dumps(_config_json(config)))
        assert _outs(results, 13) == list(range(2, 15))
        control.close()
        client.stop_stream()
        client.close()
    finally:
        stop_server(server)


def _config_json(pbtxt: str) -> dict:
    from google.protobuf import json_format, text_format
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    return json_format.MessageToDict(
        text_format.Parse(pbtxt, ModelConfig()), preserving_proto_field_name=True
    )


def _wait_for(path: Path, timeout_s: float = 10) -> int:
    deadline = time.monotonic() + timeout_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), "the model never saw the cancellation"
    return int(path.read_text() or 0)


def test_a_generate_client_that_leaves_and_a_deadline_stop_the_model(
    redis_url: str, tmp_path: Path
) -> None:
    server = start_server(
        _repo(tmp_path), redis_url, tmp_path / "serve.log", "--request-timeout-secs", "1"
    )
    try:
        # generate (not streaming): the client closes its connection after 0.5 s
        left = tmp_path / "left"
        body = json.dumps(
            {"IN": 10000, "parameters": {"delay_ms": 20, "cancel_file": str(left)}}
        ).encode()
        with socket.create_connection(("127.0.0.1", server.http_port)) as sock:
            sock.sendall(
                f"POST /v2/models/{MODEL}/generate HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(0.5)
        assert _wait_for(left) < 200
        # the request's deadline (1 s) passes while the model streams: it is told to stop
        expired = tmp_path / "expired"
        client, results = _stream(server.grpc_url, 10000, 20, str(expired))
        assert _wait_for(expired) < 200
        got = results.get(timeout=10)
        while not isinstance(got, Exception):
            got = results.get(timeout=10)
        assert "Request timeout expired" in got.message()
        client.stop_stream()
        client.close()
    finally:
        stop_server(server)
