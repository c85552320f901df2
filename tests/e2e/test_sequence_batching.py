"""The sequence batcher end to end: tritonclient over HTTP, gRPC and gRPC streaming against
``sluice serve`` with stateful Python and ONNX models (implicit state kept in Redis)."""

from __future__ import annotations

import queue
import shutil
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import pytest
import redis
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import ROOT, Server, start_server, stop_server
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

ASSETS = ROOT / "tests" / "assets" / "sequence_models"

ONNX_CONFIG = """
name: "seq_onnx"
backend: "onnxruntime"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 2000000
  oldest { max_candidate_sequences: 8 max_queue_delay_microseconds: 500 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
  state [
    {
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_FP32
      dims: [ 2 ]
      initial_state { data_type: TYPE_FP32 dims: [ 2 ] data_file: "start.bin" name: "start" }
    }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def _build_onnx(model_dir: Path) -> None:
    """OUTPUT = INPUT + STATE_IN * (1 - START) + 100 * START; the state is OUTPUT. The
    initial state (1000, 1000) is fed on START and multiplied away: START is seen."""
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Cast", ["START"], ["start_f"], to=f),
        helper.make_node("Sub", ["one", "start_f"], ["keep"]),
        helper.make_node("Mul", ["STATE_IN", "keep"], ["kept"]),
        helper.make_node("Mul", ["start_f", "hundred"], ["bonus"]),
        helper.make_node("Add", ["INPUT", "kept"], ["partial"]),
        helper.make_node("Add", ["partial", "bonus"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "seq",
        [
            helper.make_tensor_value_info("INPUT", f, ["b", 2]),
            helper.make_tensor_value_info("STATE_IN", f, ["b", 2]),
            helper.make_tensor_value_info("START", TensorProto.INT32, ["b", 1]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", f, ["b", 2]),
            helper.make_tensor_value_info("STATE_OUT", f, ["b", 2]),
        ],
        [helper.make_tensor("one", f, [], [1.0]), helper.make_tensor("hundred", f, [], [100.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))
    (model_dir / "config.pbtxt").write_text(ONNX_CONFIG)
    (model_dir / "initial_state").mkdir()
    np.array([1000, 1000], dtype=np.float32).tofile(model_dir / "initial_state" / "start.bin")


@pytest.fixture(scope="module")
def seq_server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("seq-repo")
    for name in ("seq_py", "seq_str"):
        shutil.copytree(ASSETS / name, repo / name)
    _build_onnx(repo / "seq_onnx")
    server = start_server(repo, redis_url, repo.parent / "seq-server.log")
    try:
        yield server
    finally:
        stop_server(server)


def _client(server: Server, protocol: str) -> object:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, concurrency=4)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _py_step(client: object, sid: int | str, x: int, model: str = "seq_py", **flags: bool):
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[x]], dtype=np.int32))
    return client.infer(model, [tensor], sequence_id=sid, **flags)  # type: ignore[attr-defined]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_keep_separate_state_and_see_every_control(
    seq_server: Server, protocol: str
) -> None:
    """Eight sequences of six steps sent from eight threads at once: every running sum is
    exact, and START / END / READY / CORRID reach the model with Triton's values."""
    values = {sid: [sid * 10 + k for k in range(6)] for sid in range(101, 109)}
    got: dict[int, list[tuple[int, list[int]]]] = {}

    def run(sid: int) -> None:
        client = _client(seq_server, protocol)
        out = []
        for k, x in enumerate(values[sid]):
            r = _py_step(client, sid, x, sequence_start=k == 0, sequence_end=k == 5)
            out.append((int(r.as_numpy("OUTPUT").item()), r.as_numpy("CONTROLS")[0].tolist()))
        got[sid] = out
        client.close()  # type: ignore[attr-defined]

    threads = [threading.Thread(target=run, args=(sid,)) for sid in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for sid, xs in values.items():
        sums = list(np.cumsum(xs))
        assert [o for o, _ in got[sid]] == sums
        controls = [c for _, c in got[sid]]
        assert controls == [[int(k == 0), int(k == 5), 1, sid] for k in range(6)]


def test_grpc_stream_keeps_each_sequence_in_order(seq_server: Server) -> None:
    """Steps of 4 sequences interleaved on one gRPC stream, sent without waiting."""
    results: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(seq_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    try:
        for k in range(5):
            for sid in (201, 202, 203, 204):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.array([[sid + k]], dtype=np.int32))
                client.async_stream_infer(
                    "seq_py", [tensor], request_id=f"{sid}-{k}", sequence_id=sid,
                    sequence_start=k == 0, sequence_end=k == 4,
                )  # fmt: skip
        answers: dict[str, int] = {}
        for _ in range(20):
            item = results.get(timeout=30)
            assert not isinstance(item, InferenceServerException), (item.status(), str(item))
            response = item.get_response()  # type: ignore[attr-defined]
            answers[response.id] = int(item.as_numpy("OUTPUT").item())  # type: ignore[attr-defined]
    finally:
        client.stop_stream()
        client.close()
    for sid in (201, 202, 203, 204):
        assert [answers[f"{sid}-{k}"] for k in range(5)] == list(
            np.cumsum([sid + k for k in range(5)])
        )


def test_string_ids_reach_a_model_that_keeps_state_itself(seq_server: Server) -> None:
    """Direct strategy, string correlation ids, state kept by the model per id: every
    step of a sequence reaches the same instance; the CORRID control carries the string."""
    client = httpclient.InferenceServerClient(seq_server.http_url)
    for k, x in enumerate([4, 5, 6]):
        r = _py_step(client, "alpha", x, model="seq_str", sequence_start=k == 0)
        r2 = _py_step(client, "beta", x * 100, model="seq_str", sequence_start=k == 0)
        assert int(r.as_numpy("OUTPUT").item()) == sum([4, 5, 6][: k + 1])
        assert int(r2.as_numpy("OUTPUT").item()) == 100 * sum([4, 5, 6][: k + 1])
        assert r.as_numpy("CORRID_OUT").tolist() == [[b"alpha"]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_rules_refuse_bad_sequence_requests(seq_server: Server, protocol: str) -> None:
    client = _client(seq_server, protocol)
    cases = [
        (partial(_py_step, client, 3030, 1), "inference request for sequence 3030 to model "
         "'seq_py' must specify the START flag on the first request of the sequence"),
        (partial(_py_step, client, 0, 1, sequence_start=True), "inference request to model "
         "'seq_py' must specify a non-zero or non-empty correlation ID"),
        (partial(_py_step, client, "abc", 1, sequence_start=True), "inference request for "
         "sequence abc to model 'seq_py': the correlation ID is a string but the model's "
         "CONTROL_SEQUENCE_CORRID is TYPE_UINT64"),
        (partial(_py_step, client, 12, 1, model="seq_str", sequence_start=True), "inference "
         "request for sequence 12 to model 'seq_str': the correlation ID is an integer but "
         "the model's CONTROL_SEQUENCE_CORRID is TYPE_STRING"),
    ]  # fmt: skip
    for call, text in cases:
        with pytest.raises(InferenceServerException) as info:
            call()
        assert text in info.value.message()
        assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("INPUT", [2, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1 due to"):
        client.infer("seq_py", [tensor], sequence_id=77, sequence_start=True)  # type: ignore[attr-defined]
    client.close()  # type: ignore[attr-defined]


def test_start_on_a_live_sequence_starts_it_fresh(seq_server: Server) -> None:
    client = httpclient.InferenceServerClient(seq_server.http_url)
    assert _py_step(client, 404, 5, sequence_start=True).as_numpy("OUTPUT").item() == 5
    assert _py_step(client, 404, 5).as_numpy("OUTPUT").item() == 10
    assert _py_step(client, 404, 7, sequence_start=True).as_numpy("OUTPUT").item() == 7
    assert _py_step(client, 404, 1, sequence_end=True).as_numpy("OUTPUT").item() == 8
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _py_step(client, 404, 1)


def _onnx_step(client: httpclient.InferenceServerClient, sid: int, x: list[float], **flags: bool):
    tensor = httpclient.InferInput("INPUT", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([x], dtype=np.float32))
    return client.infer("seq_onnx", [tensor], sequence_id=sid, **flags).as_numpy("OUTPUT")


def test_onnx_implicit_state_and_idle_release(seq_server: Server) -> None:
    """The ONNX model's state input gets its initial state on START and its previous
    output after; a sequence idle past max_sequence_idle_microseconds (2 s) is
    released: a continuation gets the START error, a new START works, and its key
    leaves Redis by itself."""
    client = httpclient.InferenceServerClient(seq_server.http_url)
    assert _onnx_step(client, 9, [1, 2], sequence_start=True).tolist() == [[101, 102]]
    assert _onnx_step(client, 9, [1, 1]).tolist() == [[102, 103]]
    assert _onnx_step(client, 9, [0.5, 0]).tolist() == [[102.5, 103]]
    time.sleep(2.5)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _onnx_step(client, 9, [1, 1])
    assert _onnx_step(client, 9, [2, 2], sequence_start=True).tolist() == [[102, 102]]
    keys = redis.Redis.from_url(seq_server.redis_url)
    key = f"{seq_server.key_prefix}{{seq_onnx}}:seq:1:u:9"
    assert keys.exists(key)
    time.sleep(2.5)
    assert not keys.exists(key)
    keys.close()


def test_statistics_count_sequence_requests(seq_server: Server) -> None:
    client = httpclient.InferenceServerClient(seq_server.http_url)
    before = client.get_inference_statistics("seq_str")["model_stats"][0]["inference_count"]
    for k in range(3):
        _py_step(client, "stats", 1, model="seq_str", sequence_start=k == 0, sequence_end=k == 2)
    deadline = time.monotonic() + 5
    while True:
        stats = client.get_inference_statistics("seq_str")["model_stats"][0]
        if stats["inference_count"] == before + 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert stats["inference_count"] == before + 3
    config = client.get_model_config("seq_onnx")
    assert config["sequence_batching"]["max_sequence_idle_microseconds"] == 2000000
    assert config["sequence_batching"]["oldest"]["preferred_batch_size"] == [4]
