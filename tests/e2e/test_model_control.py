"""Model control: explicit load/unload (HTTP and gRPC), overrides, reload under load, poll mode."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import (
    Server,
    build_batch_scale,
    instance_records,
    start_gateway,
    start_server,
    stop_server,
    wait_server_live,
)
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e


def _scale_input(value: float, batch: int = 1) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("INPUT0", [batch, 4], "FP32")
    tensor.set_data_from_numpy(np.full((batch, 4), value, np.float32))
    return [tensor]


def _ready_instances(server: Server, model: str, version: int = 1) -> int:
    records = instance_records(server, model, version).values()
    return sum(1 for info in records if info.get("state") == "READY")


def _index(client: httpclient.InferenceServerClient) -> dict[tuple[str, str | None], dict]:
    return {(e["name"], e.get("version")): e for e in client.get_model_repository_index()}


@pytest.fixture(scope="module")
def control_repo(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("control-repo")
    for name in ("add_sub", "slow_pair", "versioned"):
        shutil.copytree(model_repository / name, repo / name)
    # slow_pair's model under a name of its own, for a test that reloads it
    shutil.copytree(model_repository / "slow_pair", repo / "reload_echo")
    config = (repo / "reload_echo/config.pbtxt").read_text()
    (repo / "reload_echo/config.pbtxt").write_text(config.replace("slow_pair", "reload_echo"))
    build_batch_scale(repo)
    (repo / "broken/1").mkdir(parents=True)
    (repo / "broken/1/model.onnx").write_bytes(b"not onnx")
    (repo / "broken/config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 1\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    return repo


@pytest.fixture(scope="module")
def explicit_server(
    control_repo: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("control-logs") / "serve.log"
    server = start_server(
        control_repo, redis_url, log, "--model-control-mode", "explicit", "--load-model", "add_sub"
    )
    yield server
    assert stop_server(server) == 0, server.log()


def test_explicit_start_loads_only_named_models(explicit_server: Server) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url)
    index = _index(client)
    assert index[("add_sub", "1")]["state"] == "READY"
    assert ("batch_scale", None) in index  # never loaded: name only
    assert index[("batch_scale", None)] == {"name": "batch_scale"}
    assert not client.is_model_ready("batch_scale")
    assert client.is_server_ready()


def test_http_load_and_unload(explicit_server: Server) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("batch_scale")
    assert client.is_model_ready("batch_scale")
    out = client.infer("batch_scale", _scale_input(2.0)).as_numpy("OUTPUT0")
    assert out.tolist() == [[6.0] * 4]
    assert _ready_instances(explicit_server, "batch_scale") == 2
    client.unload_model("batch_scale")
    assert not client.is_model_ready("batch_scale")
    entry = _index(client)[("batch_scale", "1")]
    assert (entry["state"], entry["reason"]) == ("UNAVAILABLE", "unloaded")
    with pytest.raises(InferenceServerException) as info:
        client.infer("batch_scale", _scale_input(1.0))
    assert info.value.status() == "404"
    assert info.value.message() == (
        "Request for unknown model: 'batch_scale' has no available versions"
    )
    # the unloaded version itself is known and not ready: 503, as Triton's
    # ModelLifeCycle::GetModel answers a version in its map that is not READY
    with pytest.raises(InferenceServerException) as info:
        client.infer("batch_scale", _scale_input(1.0), model_version="1")
    assert info.value.status() == "503"
    assert info.value.message() == (
        "Request for unknown model: 'batch_scale' version 1 is not at ready state"
    )
    ready = requests.get(
        f"http://{explicit_server.http_url}/v2/models/batch_scale/versions/1/ready", timeout=10
    )
    assert (ready.status_code, ready.json()) == (400, {"error": "Model version not ready"})
    # a version the model never had is still not found
    with pytest.raises(InferenceServerException) as info:
        client.infer("batch_scale", _scale_input(1.0), model_version="7")
    assert info.value.status() == "404"
    # loaded again, it starts from zero, as Triton's new model (statistics and metrics)
    client.load_model("batch_scale")
    stats = client.get_inference_statistics("batch_scale")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 0
    assert (stats["inference_count"], stats["execution_count"]) == (0, 0)
    client.infer("batch_scale", _scale_input(1.0))
    stats = client.get_inference_statistics("batch_scale")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 1
    client.unload_model("batch_scale")


def test_grpc_load_and_unload(explicit_server: Server) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    client.load_model("versioned")
    assert client.is_model_ready("versioned")
    assert client.get_model_metadata("versioned").versions == ["1", "2"]
    client.unload_model("versioned")
    index = _index(httpclient.InferenceServerClient(explicit_server.http_url))
    assert index[("versioned", "1")] == {
        "name": "versioned",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "unloaded",
    }
    with pytest.raises(InferenceServerException) as info:
        client.load_model("nope")
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "failed to load 'nope', failed to poll from model repository" in info.value.message()


def _batch_scale_config(max_batch_size: int, **parameters: str) -> dict:
    """A config override of ``batch_scale`` (JSON of ModelConfig): one CPU instance, the
    given ``max_batch_size`` and string ``parameters``."""
    config: dict = {
        "name": "batch_scale",
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    if parameters:
        config["parameters"] = {k: {"string_value": v} for k, v in parameters.items()}
    return config


def test_load_with_config_override(explicit_server: Server) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("batch_scale")
    assert client.get_model_config("batch_scale")["max_batch_size"] == 16
    client.load_model("batch_scale", config=json.dumps(_batch_scale_config(4)))
    config = client.get_model_config("batch_scale")
    assert config["max_batch_size"] == 4
    assert config["instance_group"][0]["count"] == 1
    assert _ready_instances(explicit_server, "batch_scale") == 1
    with pytest.raises(InferenceServerException) as info:
        client.infer("batch_scale", _scale_input(1.0, batch=5))
    assert "batch-size must be <= 4" in info.value.message()
    assert client.infer("batch_scale", _scale_input(1.0, 4)).as_numpy("OUTPUT0").shape == (4, 4)
    client.unload_model("batch_scale")


def test_a_kept_header_is_checked_again_against_a_reloaded_config(explicit_server: Server) -> None:
    """A request header that passed the model's checks is not checked again while the
    model's config stays the same (api/http/header_cache.py); a reload with a smaller
    max_batch_size refuses the same header's next request."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("batch_scale")  # max_batch_size 16
    try:
        for _ in range(3):
            out = client.infer("batch_scale", _scale_input(1.5, batch=5)).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.full((5, 4), 4.5, np.float32))
        client.load_model("batch_scale", config=json.dumps(_batch_scale_config(4)))
        for _ in range(2):
            with pytest.raises(InferenceServerException) as info:
                client.infer("batch_scale", _scale_input(1.5, batch=5))
            assert "inference request batch-size must be <= 4 for 'batch_scale'" in (
                info.value.message()
            )
    finally:
        client.unload_model("batch_scale")


def test_a_reload_never_runs_a_request_under_a_config_it_was_not_checked_against(
    explicit_server: Server,
) -> None:
    """A reload that changes a tensor's datatype under load: each request is answered by
    the config it was checked against, or refused with the new config's text. An
    instance re-checks a request that a gateway checked against another load (its view,
    cached briefly, is older than the new instances), so FP32 requests of the old config
    never run on the INT32 model and come back 200 with INT32 outputs."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("reload_echo")
    int32 = {
        "name": "reload_echo",
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [
            {"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]},
            {"name": "REQUEST_ID", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "PARAMS", "data_type": "TYPE_STRING", "dims": [1]},
        ],
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
        "dynamic_batching": {},
    }
    stop = threading.Event()
    seen: list[tuple[str, object]] = []
    errors: list[BaseException] = []

    def send(seed: int) -> None:
        c = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=60)
        value = float(seed)  # integer-valued: an INT32 model could answer it unchanged
        tensor = httpclient.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.full((1, 1), value, np.float32))
        try:
            while not stop.is_set():
                try:
                    out = c.infer("reload_echo", [tensor]).as_numpy("OUT")
                    seen.append(("ok", out))
                    assert out.dtype == np.float32 and out.tolist() == [[value]], out
                except InferenceServerException as exc:
                    seen.append(("refused", exc.message()))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=send, args=(i + 2,)) for i in range(6)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        client.load_model("reload_echo", config=json.dumps(int32))
        time.sleep(1.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
        client.unload_model("reload_echo")
    assert not errors, errors[:3]
    refusals = {text for kind, text in seen if kind == "refused"}
    assert refusals == {
        "inference input 'IN' data-type is 'FP32', but model 'reload_echo' expects 'INT32'"
    }, refusals
    assert sum(1 for kind, _ in seen if kind == "ok") > 10


def _idle_threads(pid: int) -> int:
    """How many threads of process ``pid`` run at ``SCHED_IDLE``."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            count += os.sched_getscheduler(int(tid)) == os.SCHED_IDLE
        except ProcessLookupError:
            continue
    return count


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling policies only")
def test_ort_helper_threads_run_at_idle_priority(explicit_server: Server) -> None:
    """ORT's intra-op helper threads (not the instance's own threads) run at SCHED_IDLE,
    unless ``intra_op_thread_priority`` is ``normal`` or the execution mode is parallel
    (the calling thread waits for the inter-op pool); answers are the same each way."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    try:
        cases = (({}, 2), ({"intra_op_thread_priority": "normal"}, 0),
                 ({"execution_mode": "1", "inter_op_thread_count": "2"}, 0))  # fmt: skip
        for extra, idle in cases:
            config = _batch_scale_config(4, intra_op_thread_count="3", **extra)
            client.load_model("batch_scale", config=json.dumps(config))
            (record,) = [
                r
                for r in instance_records(explicit_server, "batch_scale").values()
                if r.get("state") == "READY"
            ]
            assert _idle_threads(record["pid"]) == idle, extra
            out = client.infer("batch_scale", _scale_input(2.0, 3)).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.full((3, 4), 6.0, np.float32))
    finally:
        client.unload_model("batch_scale")


def test_load_with_files(explicit_server: Server, control_repo: Path) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    onnx_bytes = (control_repo / "batch_scale/1/model.onnx").read_bytes()
    config = {
        "name": "uploaded",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    client.load_model(
        "uploaded", config=json.dumps(config), files={"file:1/model.onnx": onnx_bytes}
    )
    out = client.infer("uploaded", _scale_input(5.0)).as_numpy("OUTPUT0")
    assert out.tolist() == [[15.0] * 4]
    raw = requests.post(
        f"{explicit_server.base}/v2/repository/models/other/load",
        json={"parameters": {"file:1/model.onnx": base64.b64encode(onnx_bytes).decode()}},
        timeout=30,
    )
    assert raw.status_code == 400
    assert "'file:' parameters need the 'config' parameter" in raw.json()["error"]
    client.unload_model("uploaded")


def test_load_failure_reports_reason(explicit_server: Server) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("broken")
    assert info.value.status() == "400"
    assert info.value.message().startswith("load failed for model 'broken':")
    entry = _index(client)[("broken", "1")]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"]
    assert client.is_model_ready("add_sub")
    # what Triton 2.51 answers about a model whose load failed, and one that does not exist
    assert not client.is_model_ready("broken")
    for path, method in (("infer", "post"), ("", "get"), ("config", "get")):
        answer = getattr(requests, method)(
            f"{explicit_server.base}/v2/models/broken{'/' + path if path else ''}",
            json={"inputs": []}, timeout=30,
        )  # fmt: skip
        assert answer.status_code == 404
        assert answer.json() == {
            "error": "Request for unknown model: 'broken' has no available versions"
        }
    missing = requests.post(f"{explicit_server.base}/v2/repository/models/nosuch/load", timeout=30)
    assert missing.status_code == 500
    assert missing.json() == {
        "error": "failed to load 'nosuch', failed to poll from model repository"
    }


def test_unload_while_32_requests_in_flight(explicit_server: Server) -> None:
    client = httpclient.InferenceServerClient(
        explicit_server.http_url, network_timeout=120, concurrency=32
    )
    client.load_model("slow_pair")
    pending = []
    for i in range(32):
        tensor = httpclient.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[float(i)]], np.float32))
        pending.append(client.async_infer("slow_pair", [tensor], parameters={"sleep_ms": 50}))
    time.sleep(0.1)
    control = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    control.unload_model("slow_pair")
    values = [p.get_result(timeout=60).as_numpy("OUT")[0][0] for p in pending]
    assert values == [float(i) for i in range(32)]
    assert not control.is_model_ready("slow_pair")


def test_unload_runs_the_requests_of_instances_killed_meanwhile(explicit_server: Server) -> None:
    """Every instance SIGKILLed with requests held and queued, then an unload: the dead
    instances are started again to drain the queue (their own pending requests included),
    so every request is answered with its output, none fails at the drain's end."""
    client = httpclient.InferenceServerClient(
        explicit_server.http_url, network_timeout=120, concurrency=16
    )
    client.load_model("slow_pair")
    pids = [info["pid"] for info in instance_records(explicit_server, "slow_pair").values()]
    assert len(pids) == 2
    pending = []
    for i in range(16):
        tensor = httpclient.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[float(i)]], np.float32))
        pending.append(client.async_infer("slow_pair", [tensor], parameters={"sleep_ms": 200}))
    time.sleep(0.1)  # both instances hold a batch, the rest is queued
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    control = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    control.unload_model("slow_pair")
    values = [p.get_result(timeout=60).as_numpy("OUT")[0][0] for p in pending]
    assert values == [float(i) for i in range(16)]
    assert not control.is_model_ready("slow_pair")


RAISE_IN_INIT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("this version cannot start")

    def execute(self, requests):
        return []
"""


def test_records_of_instances_killed_while_unloading_do_not_answer_for_the_next_load(
    explicit_server: Server,
) -> None:
    """Instances SIGKILLed while their version unloads leave READY records behind: the
    next load under the same instance names waits for its own processes (a load whose
    instances fail is refused, not published READY at once)."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("slow_pair")
    config = client.get_model_config("slow_pair")
    pids = [info["pid"] for info in instance_records(explicit_server, "slow_pair").values()]

    def kill_soon() -> None:
        time.sleep(0.2)  # the unload has begun (it lets admissions settle for 1 s)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    client.unload_model("slow_pair")
    killer.join(10)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.load_model(
            "slow_pair",
            config=json.dumps(config),
            files={"file:1/model.py": RAISE_IN_INIT.encode()},
        )
    assert "this version cannot start" in info.value.message()
    assert not client.is_model_ready("slow_pair")
    client.load_model("slow_pair")  # the repository's model loads again, for real
    assert client.is_model_ready("slow_pair")
    tensor = httpclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[4.0]], np.float32))
    assert client.infer("slow_pair", [tensor]).as_numpy("OUT").tolist() == [[4.0]]
    assert time.monotonic() - started < 60
    client.unload_model("slow_pair")


def test_reload_under_load_fails_no_request(explicit_server: Server, control_repo: Path) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    shutil.rmtree(control_repo / "batch_scale/2", ignore_errors=True)
    client.load_model("batch_scale")
    stop = threading.Event()
    results: list[object] = []
    lock = threading.Lock()

    def load_loop() -> None:
        c = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=60)
        while not stop.is_set():
            try:
                out = c.infer("batch_scale", _scale_input(1.0))
                value: object = (out.get_response()["model_version"], out.as_numpy("OUTPUT0")[0][0])
            except InferenceServerException as exc:
                value = exc
            with lock:
                results.append(value)

    threads = [threading.Thread(target=load_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    shutil.copytree(control_repo / "batch_scale/1", control_repo / "batch_scale/2")
    client.load_model("batch_scale")  # new version 2 (latest 1): v2 up, then v1 retired
    time.sleep(1.5)
    stop.set()
    for thread in threads:
        thread.join(60)
    failures = [r for r in results if isinstance(r, Exception)]
    assert not failures, failures[:3]
    versions = {r[0] for r in results}  # type: ignore[index]
    assert versions == {"1", "2"}
    assert results[-1][0] == "2"  # type: ignore[index]
    index = _index(client)
    assert index[("batch_scale", "2")]["state"] == "READY"
    assert index[("batch_scale", "1")]["state"] == "UNAVAILABLE"
    client.unload_model("batch_scale")
    shutil.rmtree(control_repo / "batch_scale/2")


def test_second_gateway_sees_the_same_models(explicit_server: Server, tmp_path: Path) -> None:
    process, port, grpc_port = start_gateway(
        explicit_server.redis_url, explicit_server.key_prefix, tmp_path / "gateway.log"
    )
    try:
        second = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        # live, not ready: earlier tests may leave the shared explicit server not ready
        # (a failed load under strict readiness), and waiting for ready cost 30 s then
        wait_server_live(second)
        first = httpclient.InferenceServerClient(explicit_server.http_url)
        assert second.get_model_repository_index() == first.get_model_repository_index()
        a = np.ones((1, 16), np.float32)
        for client in (first, second):
            inputs = [
                httpclient.InferInput("INPUT0", [1, 16], "FP32"),
                httpclient.InferInput("INPUT1", [1, 16], "FP32"),
            ]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(a * 2)
            assert client.infer("add_sub", inputs).as_numpy("OUTPUT0").tolist() == [[3.0] * 16]
        grpc_second = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert grpc_second.is_model_ready("add_sub")
    finally:
        process.terminate()
        process.wait(20)


def test_poll_mode_follows_the_repository(
    model_repository: Path, redis_url: str, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "add_sub", repo / "add_sub")
    build_batch_scale(repo)
    server = start_server(
        repo,
        redis_url,
        tmp_path / "serve.log",
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        with pytest.raises(InferenceServerException) as info:
            client.load_model("add_sub")
        assert info.value.status() == "503"
        assert client.get_model_metadata("batch_scale")["versions"] == ["1"]
        shutil.copytree(repo / "batch_scale/1", repo / "batch_scale/2")
        shutil.rmtree(repo / "add_sub")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            index = _index(client)
            # a removed model leaves the index (its directory is gone), as in Triton
            if (
                index.get(("batch_scale", "2"), {}).get("state") == "READY"
                and index.get(("batch_scale", "1"), {}).get("state") == "UNAVAILABLE"
                and index.get(("add_sub", "1"), {}).get("state") != "READY"
            ):
                break
            time.sleep(0.3)
        index = _index(client)
        assert index[("batch_scale", "2")]["state"] == "READY"
        assert index[("batch_scale", "1")]["state"] == "UNAVAILABLE"
        assert not client.is_model_ready("add_sub")
        assert client.infer("batch_scale", _scale_input(1.0)).get_response()["model_version"] == "2"
    finally:
        assert stop_server(server) == 0, server.log()


def _wait_index(
    client: httpclient.InferenceServerClient, key: tuple[str, str], done, timeout_s: float = 60
) -> dict:
    """Poll the repository index until ``done(entry)`` holds for ``key``'s entry ({}
    when it is not listed); fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        entry = _index(client).get(key, {})
        if done(entry):
            return entry
        assert time.monotonic() < deadline, f"index entry {key} still {entry}"
        time.sleep(0.3)


def test_poll_mode_forgets_the_failure_of_a_removed_version(
    model_repository: Path, redis_url: str, tmp_path: Path
) -> None:
    """add_sub/2 holding a broken ONNX file fails to load (version 1 keeps serving and
    the server is not ready); once the folder is removed, version 2 is UNAVAILABLE
    ``unloaded`` (no longer the load's error) and the server is ready again."""
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "add_sub", repo / "add_sub")
    server = start_server(
        repo,
        redis_url,
        tmp_path / "serve.log",
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        "1",
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        assert client.is_server_ready()
        (repo / "add_sub/2").mkdir()
        (repo / "add_sub/2/model.onnx").write_bytes(b"not an ONNX model")
        failed = _wait_index(client, ("add_sub", "2"), lambda e: e.get("state") == "UNAVAILABLE")
        assert failed["reason"] not in ("", "unloaded")
        assert _index(client)[("add_sub", "1")]["state"] == "READY"
        assert not client.is_server_ready()
        shutil.rmtree(repo / "add_sub/2")
        gone = _wait_index(client, ("add_sub", "2"), lambda e: e.get("reason") == "unloaded")
        assert gone["state"] == "UNAVAILABLE"
        assert _index(client)[("add_sub", "1")]["state"] == "READY"
        assert client.is_server_ready()
        a = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        a.set_data_from_numpy(np.full((1, 16), 2.0, np.float32))
        b = httpclient.InferInput("INPUT1", [1, 16], "FP32")
        b.set_data_from_numpy(np.ones((1, 16), np.float32))
        result = client.infer("add_sub", [a, b])
        assert result.get_response()["model_version"] == "1"
        assert result.as_numpy("OUTPUT0").tolist() == [[3.0] * 16]
    finally:
        assert stop_server(server) == 0, server.log()


def test_failed_reload_keeps_the_old_model(explicit_server: Server) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("batch_scale")
    bad = {
        "name": "batch_scale",
        "backend": "onnxruntime",
        "max_batch_size": 4,
        "input": [{"name": "NOPE", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    with pytest.raises(InferenceServerException) as info:
        client.load_model("batch_scale", config=json.dumps(bad))
    assert info.value.status() == "400"
    assert "load failed for model 'batch_scale'" in info.value.message()
    assert "NOPE" in info.value.message()
    assert client.get_model_config("batch_scale")["max_batch_size"] == 16  # the old config
    assert client.infer("batch_scale", _scale_input(2.0)).as_numpy("OUTPUT0").tolist() == [
        [6.0] * 4
    ]
    assert _index(client)[("batch_scale", "1")]["state"] == "READY"
    # the next reload starts instances under the failed ones' names: their failure is
    # theirs, not the new instances'
    good = {**bad, "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}
    client.load_model("batch_scale", config=json.dumps(good))
    assert client.get_model_config("batch_scale")["max_batch_size"] == 4
    assert client.infer("batch_scale", _scale_input(2.0)).as_numpy("OUTPUT0").tolist() == [
        [6.0] * 4
    ]
    client.unload_model("batch_scale")


TRIPLE_FAILING_SECOND = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Triton's name, also for a reload's instance (Sluice's consumer is slow_pair_0_1_g2)
        if args["model_instance_name"] == "slow_pair_0_1":
            time.sleep(2)
            raise RuntimeError("the second instance fails to initialize")

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 3),
            ])
            for r in requests
        ]
"""


def test_a_failed_reload_answers_no_request(explicit_server: Server) -> None:
    """The new instances of a reload take requests only once the whole reload is
    published: one that fails (a second instance fails to initialize while the first is
    READY) answers nothing with the new model, the old keeps serving (Triton: a load
    that fails serves nothing)."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("slow_pair")
    config = client.get_model_config("slow_pair")
    seen: dict[str, int] = {"old": 0, "new": 0, "error": 0}
    stop = threading.Event()

    def load() -> None:
        worker = httpclient.InferenceServerClient(explicit_server.http_url)
        try:
            while not stop.is_set():
                tensor = httpclient.InferInput("IN", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[7.0]], np.float32))
                try:
                    out = worker.infer("slow_pair", [tensor]).as_numpy("OUT").tolist()
                except InferenceServerException:
                    seen["error"] += 1
                    continue
                seen["old" if out == [[7.0]] else "new" if out == [[21.0]] else "error"] += 1
        finally:
            worker.close()

    thread = threading.Thread(target=load)
    thread.start()
    try:
        time.sleep(0.5)
        with pytest.raises(InferenceServerException) as info:
            client.load_model(
                "slow_pair",
                config=json.dumps(config),
                files={"file:1/model.py": TRIPLE_FAILING_SECOND.encode()},
            )
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(30)
    assert "the second instance fails to initialize" in info.value.message()
    assert seen["new"] == 0 and seen["error"] == 0, seen
    assert seen["old"] > 20, seen
    assert _index(client)[("slow_pair", "1")]["state"] == "READY"
    client.unload_model("slow_pair")


ECHO_SLOW_INIT = """
import json
import os
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        sleep_ms = max(float(json.loads(r.parameters()).get("sleep_ms", 0)) for r in requests)
        time.sleep(sleep_ms / 1000.0)
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()),
            ])
            for r in requests
        ]
"""


def test_an_old_instance_killed_during_a_reload_loses_no_request(
    explicit_server: Server,
) -> None:
    """An old instance SIGKILLed while it holds requests, during a reload: after the
    reload its requests are run by the new instances at once, not left pending until
    their deadline (the manager keeps its record STOPPED until they are claimed)."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("slow_pair")
    config = client.get_model_config("slow_pair")
    victim = min(info["pid"] for info in instance_records(explicit_server, "slow_pair").values())
    results: list[tuple[float, float, float]] = []  # (sent, answer, seconds)
    errors: list[str] = []
    stop = threading.Event()

    def load(offset: int) -> None:
        worker = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
        try:
            value = float(offset)
            while not stop.is_set():
                tensor = httpclient.InferInput("IN", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[value]], np.float32))
                started = time.monotonic()
                try:
                    out = worker.infer("slow_pair", [tensor], parameters={"sleep_ms": 150})
                    answer = out.as_numpy("OUT").tolist()[0][0]
                    results.append((value, answer, time.monotonic() - started))
                except InferenceServerException as exc:
                    errors.append(exc.message())
                value += 100.0
        finally:
            worker.close()

    threads = [threading.Thread(target=load, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)

        def reload() -> None:  # its own client: tritonclient.http's is per thread
            admin = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
            try:
                admin.load_model(
                    "slow_pair",
                    config=json.dumps(config),
                    files={"file:1/model.py": ECHO_SLOW_INIT.encode()},
                )
            finally:
                admin.close()

        loader = threading.Thread(target=reload)
        loader.start()
        time.sleep(1.0)  # the new instances initialize for 3 s; the old ones serve
        os.kill(victim, signal.SIGKILL)
        loader.join(60)
        time.sleep(2.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, errors[:3]
    assert len(results) > 20
    assert all(sent == answer for sent, answer, _ in results)
    # without the recovery the victim's requests waited for their deadline (60 s)
    assert max(seconds for _, _, seconds in results) < 15, max(s for *_, s in results)
    client.unload_model("slow_pair")


SLOW_INIT = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(4)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""


def test_not_ready_while_startup_models_load(
    model_repository: Path, redis_url: str, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "add_sub", repo / "add_sub")
    (repo / "slow_init/1").mkdir(parents=True)
    (repo / "slow_init/1/model.py").write_text(SLOW_INIT)
    (repo / "slow_init/config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    server = start_server(repo, redis_url, tmp_path / "serve.log", wait_ready=False)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        seen_live_not_ready = False
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                live, ready = client.is_server_live(), client.is_server_ready()
            except Exception:
                time.sleep(0.1)
                continue
            if live and not ready:
                seen_live_not_ready = True
            if ready:
                break
            time.sleep(0.1)
        assert seen_live_not_ready, "readiness was never false while slow_init loaded"
        assert client.is_server_ready()
        assert client.is_model_ready("slow_init")
    finally:
        assert stop_server(server) == 0, server.log()


def _scale_twice(step_input: str = "INPUT0") -> str:
    """An ensemble running ``batch_scale`` twice (OUT = 9 × IN), as a load's config."""
    step = {"model_name": "batch_scale", "model_version": -1}
    return json.dumps(
        {
            "name": "scale_twice",
            "max_batch_size": 8,
            "platform": "ensemble",
            "ensemble_scheduling": {
                "step": [
                    {**step, "input_map": {step_input: "IN"}, "output_map": {"OUTPUT0": "mid"}},
                    {**step, "input_map": {"INPUT0": "mid"}, "output_map": {"OUTPUT0": "OUT"}},
                ]
            },
            "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
        }
    )


def _ensemble_input(value: float) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
    return [tensor]


def test_ensemble_loads_its_steps_and_unloads_with_dependents(explicit_server: Server) -> None:
    """Explicit mode (Triton): loading an ensemble loads its composing models;
    ``unload_dependents`` unloads the ensembles of a model, and after an ensemble the
    composing models that were loaded only for it."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    files = {"file:1/.keep": b""}
    client.unload_model("batch_scale")
    client.load_model("scale_twice", config=_scale_twice(), files=files)
    assert client.is_model_ready("scale_twice")
    assert client.is_model_ready("batch_scale")  # loaded with it
    out = client.infer("scale_twice", _ensemble_input(2.0)).as_numpy("OUT")
    assert out.tolist() == [[18.0] * 4]
    client.unload_model("scale_twice", unload_dependents=True)
    assert not client.is_model_ready("scale_twice")
    assert not client.is_model_ready("batch_scale")  # it was loaded only for the ensemble

    client.load_model("scale_twice", config=_scale_twice(), files=files)
    client.unload_model("batch_scale", unload_dependents=True)
    assert not client.is_model_ready("scale_twice")
    assert client.is_model_ready("add_sub")
    client.close()


def test_ensemble_load_error_names_step_and_tensor(explicit_server: Server) -> None:
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("scale_twice", config=_scale_twice("WRONG"), files={"file:1/.keep": b""})
    assert info.value.status() == "400"
    assert info.value.message() == (
        "load failed for model 'scale_twice': in ensemble 'scale_twice', ensemble tensor "
        "'IN' is mapping to non-existing input 'WRONG' in model 'batch_scale' "
        "(step 0 (model 'batch_scale'))"
    )
    assert client.is_model_ready("add_sub")
    client.close()


def test_statistics_add_up_across_reloads_and_instance_shards_do_not_pile_up(
    explicit_server: Server,
) -> None:
    """Each instance counts in a hash of its own; a reload starts instances under new
    names, and the stopped ones hand their counts to the version's hash: the statistics
    keep every inference once, and only the running instances keep a shard."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("batch_scale")
    before = client.get_inference_statistics("batch_scale", "1")["model_stats"][0]
    override = {
        "name": "batch_scale",
        "backend": "onnxruntime",
        "max_batch_size": 16,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "instance_group": [{"kind": "KIND_CPU", "count": 3}],
    }
    rounds = [(None, 5), (override, 7), (None, 3)]  # 2, then 3, then 2 instances
    for config, count in rounds:
        client.load_model("batch_scale", config=json.dumps(config) if config else None)
        for _ in range(count):
            out = client.infer("batch_scale", _scale_input(2.0, batch=2))
            assert out.as_numpy("OUTPUT0").tolist() == [[6.0] * 4] * 2
    after = client.get_inference_statistics("batch_scale", "1")["model_stats"][0]
    requests_made = sum(count for _, count in rounds)
    success = after["inference_stats"]["success"]["count"]
    assert success - before["inference_stats"]["success"]["count"] == requests_made
    assert after["inference_count"] - before["inference_count"] == 2 * requests_made
    metrics = requests.get(explicit_server.metrics_url, timeout=10).text
    line = next(
        x
        for x in metrics.splitlines()
        if x.startswith('nv_inference_count{model="batch_scale",version="1"}')
    )
    assert int(float(line.split()[-1])) == after["inference_count"]
    shards = redis.Redis.from_url(explicit_server.redis_url)
    try:
        prefix = f"{explicit_server.key_prefix}{{batch_scale}}:stats:1"
        kept = sorted(k.decode() for k in shards.smembers(f"{prefix}:shards"))
        on_redis = sorted(k.decode() for k in shards.scan_iter(f"{prefix}:i:*"))
    finally:
        shards.close()
    assert len(kept) <= 2 and kept == on_redis  # the two running instances at most
    client.unload_model("batch_scale")
    after_unload = redis.Redis.from_url(explicit_server.redis_url)
    try:
        assert list(after_unload.scan_iter(f"{prefix}:i:*")) == []
    finally:
        after_unload.close()


def test_a_reload_under_steady_load_hands_the_queue_to_the_new_instances_at_once(
    explicit_server: Server,
) -> None:
    """The replaced instances of a kept version finish what they hold and leave the
    shared stream to the new ones: were they to take new requests until the stream stayed
    empty, which under steady load it never does, the reload would take the whole drain
    timeout (9 s here) while the old model answered."""
    client = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=120)
    client.load_model("batch_scale")
    override = {
        "name": "batch_scale",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 1000},
        "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    }
    stop = threading.Event()
    failures: list[Exception] = []
    answered = [0]

    def load_loop() -> None:
        c = httpclient.InferenceServerClient(explicit_server.http_url, network_timeout=60)
        while not stop.is_set():
            try:
                out = c.infer("batch_scale", _scale_input(1.0))
                assert out.as_numpy("OUTPUT0").tolist() == [[3.0] * 4]
                answered[0] += 1
            except (InferenceServerException, AssertionError) as exc:
                failures.append(exc)

    threads = [threading.Thread(target=load_loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        started = time.monotonic()
        client.load_model("batch_scale", config=json.dumps(override))
        took = time.monotonic() - started
        before = answered[0]
        time.sleep(0.5)
        assert answered[0] > before  # the new instance serves
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures[:3]
    assert took < 5.0, f"the reload took {took:.1f} s"
    assert client.get_model_config("batch_scale")["max_batch_size"] == 8
    assert _ready_instances(explicit_server, "batch_scale") == 1
    client.unload_model("batch_scale")
