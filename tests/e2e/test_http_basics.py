"""HTTP front end driven by the unmodified tritonclient.http: health, metadata, config, index."""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest
import requests
from e2e_support import read_http_responses

from sluice.api.cuda_shared_memory import cuda_runtime

pytestmark = pytest.mark.e2e


def test_live_and_ready(http_client) -> None:
    assert http_client.is_server_live() is True
    assert http_client.is_server_ready() is True


def test_model_ready(http_client) -> None:
    assert http_client.is_model_ready("add_sub") is True
    assert http_client.is_model_ready("add_sub", "1") is True
    assert http_client.is_model_ready("nope") is False
    assert http_client.is_model_ready("versioned", "3") is False


def test_server_metadata(http_client) -> None:
    meta = http_client.get_server_metadata()
    assert meta["name"] == "triton"
    # what is implemented, in Triton's order (CUDA shared memory only with a CUDA device)
    cuda = ["cuda_shared_memory"] if cuda_runtime() is not None else []
    assert meta["extensions"] == [
        "classification",
        "sequence",
        "model_repository",
        "model_repository(unload_dependents)",
        "schedule_policy",
        "model_configuration",
        "system_shared_memory",
        *cuda,
        "binary_tensor_data",
        "parameters",
        "statistics",
        "logging",
        "trace",
    ]


def test_model_metadata(http_client) -> None:
    meta = http_client.get_model_metadata("add_sub")
    assert meta == {
        "name": "add_sub",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "FP32", "shape": [-1, 16]},
        ],
    }
    assert http_client.get_model_metadata("nobatch")["inputs"][0]["shape"] == [-1]
    assert http_client.get_model_metadata("versioned")["versions"] == ["1", "2"]
    assert http_client.get_model_metadata("versioned", "1")["versions"] == ["1"]


def test_model_config_shape(http_client) -> None:
    cfg = http_client.get_model_config("add_sub")
    assert cfg["name"] == "add_sub"
    assert cfg["max_batch_size"] == 8
    assert cfg["input"][0]["dims"] == [16]
    assert cfg["input"][0]["data_type"] == "TYPE_FP32"
    assert cfg["backend"] == "onnxruntime"
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}
    assert "sequence_batching" not in cfg
    assert "dynamic_batching" not in cfg
    assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    assert cfg["instance_group"][0]["count"] == 1
    assert cfg["optimization"]["input_pinned_memory"] == {"enable": True}
    digits = http_client.get_model_config("digits")
    assert digits["dynamic_batching"]["preferred_batch_size"] == [64]
    assert digits["dynamic_batching"]["max_queue_delay_microseconds"] == 500


def test_autocomplete_config(http_client) -> None:
    cfg = http_client.get_model_config("auto_onnx")
    assert cfg["max_batch_size"] == 4
    assert cfg["platform"] == "onnxruntime_onnx"
    assert sorted(t["name"] for t in cfg["input"]) == ["A", "B"]
    assert all(t["dims"] == [16] and t["data_type"] == "TYPE_INT32" for t in cfg["input"])
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [4]
    assert cfg["instance_group"] == [
        {
            "name": "auto_onnx",
            "kind": "KIND_CPU",
            "count": 2,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ]


def test_repository_index(http_client) -> None:
    index = http_client.get_model_repository_index()
    by_name = {(e["name"], e.get("version")): e for e in index}
    assert by_name[("add_sub", "1")]["state"] == "READY"
    assert by_name[("versioned", "1")]["state"] == "READY"
    assert by_name[("versioned", "2")]["state"] == "READY"
    assert ("versioned", "3") not in by_name
    assert [e["name"] for e in index] == sorted(e["name"] for e in index)


def test_unknown_model_endpoints(server) -> None:
    for path in ("/v2/models/nope", "/v2/models/nope/config"):
        response = requests.get(server.base + path, timeout=5)
        assert response.status_code == 404, path
        assert response.json() == {"error": "Request for unknown model: 'nope' is not found"}
    # readiness of an unknown model is "not ready", not an error (Triton's ModelIsReady
    # succeeds with ready=false; http_server.cc HandleModelReady answers 400)
    response = requests.get(server.base + "/v2/models/nope/ready", timeout=5)
    assert (response.status_code, response.json()) == (400, {"error": "Model version not ready"})
    response = requests.get(server.base + "/v2/models/versioned/versions/3", timeout=5)
    assert response.status_code == 404
    assert response.json()["error"] == (
        "Request for unknown model: 'versioned' version 3 is not found"
    )


def test_unknown_route_and_method(server) -> None:
    response = requests.get(server.base + "/v3/whatever", timeout=5)
    assert (response.status_code, response.json()) == (404, {"error": "Not Found"})
    response = requests.delete(server.base + "/v2/models/add_sub/infer", timeout=5)
    assert (response.status_code, response.json()) == (405, {"error": "Method Not Allowed"})


def test_health_bodies_are_empty(server) -> None:
    ready = requests.get(server.base + "/v2/health/ready", timeout=5)
    assert (ready.status_code, ready.content) == (200, b"")


def test_load_refused_in_none_mode(http_client) -> None:
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as info:
        http_client.load_model("add_sub")
    assert info.value.status() == "503"
    assert "explicit model load / unload is not allowed" in info.value.message()


def _infer_bytes(value: float, sleep_ms: int) -> bytes:
    body = json.dumps(
        {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32", "data": [value]}],
            "outputs": [{"name": "OUT"}],
            "parameters": {"sleep_ms": sleep_ms},
        }
    ).encode()
    return (
        b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _read_until_eof(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_half_closed_client_gets_its_answers(server) -> None:
    """A client that shuts down its sending side after its requests (nc -N) still gets
    every answer, pipelined ones in order, then the server closes the connection."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(_infer_bytes(1.5, 200) + _infer_bytes(2.5, 0))
        sock.shutdown(socket.SHUT_WR)  # EOF reaches the server while the first one sleeps
        responses = read_http_responses(sock, 2)
        assert _read_until_eof(sock) == b""  # then the server closes
    assert [(status, headers.get("connection")) for status, headers, _ in responses] == [
        (b"HTTP/1.1 200 OK", None),
        (b"HTTP/1.1 200 OK", "close"),
    ]
    assert [json.loads(body)["outputs"][0]["data"] for _, _, body in responses] == [[1.5], [2.5]]


def test_half_close_mid_body_closes_without_an_answer(server) -> None:
    request = _infer_bytes(1.0, 0)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(request[:-5])
        sock.shutdown(socket.SHUT_WR)
        assert _read_until_eof(sock) == b""


def test_half_close_racing_the_answer_still_gets_it(server) -> None:
    """The EOF of a client that half-closes at about the moment its answer is ready
    (here: after a random delay around the round trip) may be read in the same loop
    iteration as the answer is written; the answer still arrives whole before the
    close. (An answer left waiting for the end of the iteration would be dropped when
    the transport closes for the EOF first.)"""
    lost: list[str] = []
    answered = [0]
    lock = threading.Lock()

    def client(seed: int) -> None:
        rng = random.Random(seed)
        typical_s = 0.002
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            value = float(rng.randrange(1000))
            with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                started = time.monotonic()
                sock.sendall(_infer_bytes(value, 0))
                time.sleep(rng.uniform(0, 1.5 * typical_s))
                sock.shutdown(socket.SHUT_WR)
                raw = _read_until_eof(sock)
                typical_s = 0.9 * typical_s + 0.1 * (time.monotonic() - started)
            head, _, body = raw.partition(b"\r\n\r\n")
            with lock:
                if head.startswith(b"HTTP/1.1 200 OK") and json.loads(body)["outputs"][0][
                    "data"
                ] == [value]:
                    answered[0] += 1
                else:
                    lost.append(f"{value}: {raw[:80]!r}")

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not lost, f"{len(lost)} of {len(lost) + answered[0]} answers lost: {lost[:3]}"
    assert answered[0] > 200
