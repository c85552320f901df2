"""``sluice serve`` as a process: Ctrl-C leaves nothing behind; broken models are reported."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import (
    children_of,
    grpc_health_status,
    start_gateway,
    start_server,
    stop_server,
    wait_server_ready,
    write_scale_model,
)
from tritonclient.utils import InferenceServerException

from sluice.broker.redis_server import delete_prefix, free_port, start_private_redis
from sluice.gpu_workers.processes import EXIT_GRACE_S

pytestmark = pytest.mark.e2e


def _small_repo(model_repository: Path, tmp_path: Path, broken: bool) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(model_repository / "add_sub", repo / "add_sub")
    if broken:
        (repo / "broken/1").mkdir(parents=True)
        (repo / "broken/1/model.onnx").write_bytes(b"this is not an onnx file")
        (repo / "broken/config.pbtxt").write_text(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 2\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        )
        shutil.copytree(model_repository / "add_sub", repo / "mismatch")
        config = (repo / "mismatch/config.pbtxt").read_text().replace('"add_sub"', '"mismatch"')
        (repo / "mismatch/config.pbtxt").write_text(config.replace("dims: [ 16 ]", "dims: [ 3 ]"))
        # a config that leaves out one of the graph's two inputs (Triton refuses it at load)
        shutil.copytree(model_repository / "add_sub", repo / "partial")
        config = (repo / "partial/config.pbtxt").read_text().replace('"add_sub"', '"partial"')
        head, _, rest = config.partition('  },\n  {\n    name: "INPUT1"')
        (repo / "partial/config.pbtxt").write_text(head + "  }\n]" + rest.split("]", 2)[2])
        (repo / "badconfig/1").mkdir(parents=True)
        (repo / "badconfig/config.pbtxt").write_text('platform: "onnxruntime_onnx"\nbogus: 1\n')
        # a batching config on a graph whose first dimension is fixed (1): Triton refuses
        # it at load, instead of failing every batch but those of 1
        write_scale_model(repo / "fixedbatch/1/model.onnx", 2.0, [1, 4])
        (repo / "fixedbatch/config.pbtxt").write_text(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
            "dynamic_batching { }\n"
        )
    return repo


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_ctrl_c_stops_every_process(model_repository, redis_url, tmp_path) -> None:
    server = start_server(
        _small_repo(model_repository, tmp_path, False), redis_url, tmp_path / "serve.log"
    )
    children = children_of(server.process.pid)
    assert len(children) >= 2  # gateway + one add_sub instance
    started = time.monotonic()
    assert stop_server(server) == 0, server.log()
    assert time.monotonic() - started < 20
    assert not _left_alive(children, 5), server.log()


def _left_alive(pids: list[int], within_s: float) -> list[int]:
    """Those of ``pids`` still alive after waiting up to ``within_s`` s for all to exit."""
    deadline = time.monotonic() + within_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if _alive(pid)]


def _descendants(pid: int) -> list[int]:
    """``pid``'s children and theirs (the instances' heartbeat processes)."""
    found = children_of(pid)
    for child in list(found):
        found += children_of(child)
    return found


def _ctrl_c_leaves_nothing(server) -> None:
    """SIGINT to the server's process group, as a terminal's Ctrl-C: it exits 0 within 30
    s and every process it had started (children and theirs) is gone within 5 s more."""
    descendants = _descendants(server.process.pid)
    os.killpg(server.process.pid, signal.SIGINT)
    assert server.process.wait(30) == 0, server.log()
    assert not _left_alive(descendants, 5), server.log()


def test_ctrl_c_to_the_process_group_stops_everything_without_restarts(
    model_repository, redis_url, tmp_path
) -> None:
    """Ctrl-C in a terminal signals the whole process group, the instances' heartbeat
    processes included: they stop with their instances and are not started again (no
    'heartbeat process exited (-2); starting it again' in the log)."""
    server = start_server(
        _small_repo(model_repository, tmp_path, False),
        redis_url,
        tmp_path / "serve.log",
        new_session=True,
    )
    time.sleep(1.5)  # the heartbeat processes start beside READY
    _ctrl_c_leaves_nothing(server)
    assert "heartbeat process exited" not in server.log()
    stop_server(server)  # the key prefix's clean-up


_SLOW_INIT_MODEL = """
import pathlib
import time


class TritonPythonModel:
    def initialize(self, args):
        pathlib.Path(__file__).with_name("initializing").touch()
        time.sleep(20)

    def execute(self, requests):
        return []
"""


def _slow_loading_repo(model_repository: Path, tmp_path: Path) -> tuple[Path, Path]:
    """add_sub and a Python model whose ``initialize`` takes 20 s; the file it touches
    when that begins."""
    repo = _small_repo(model_repository, tmp_path, False)
    (repo / "slow_init/1").mkdir(parents=True)
    (repo / "slow_init/1/model.py").write_text(_SLOW_INIT_MODEL)
    (repo / "slow_init/config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 2 } ]\n"
    )
    return repo, repo / "slow_init/1/initializing"


def test_ctrl_c_while_models_load_exits_quietly(model_repository, redis_url, tmp_path) -> None:
    """A Ctrl-C to the process group while the instances still load (the gateway up, a
    model in its ``initialize``) stops everything with exit 0 and no traceback: no child
    dies of its own ``KeyboardInterrupt`` (a traceback per process), and the cut-short
    loads are not reported as failures ('load failed ... server exiting', exit 1)."""
    repo, initializing = _slow_loading_repo(model_repository, tmp_path)
    server = start_server(
        repo, redis_url, tmp_path / "serve.log", new_session=True, wait_ready=False
    )
    deadline = time.monotonic() + 60
    while not initializing.exists() and time.monotonic() < deadline:
        assert server.process.poll() is None, server.log()
        time.sleep(0.05)
    assert initializing.exists(), server.log()
    _ctrl_c_leaves_nothing(server)
    log = server.log()
    for text in ("Traceback", "KeyboardInterrupt", "failed to load", "load failed"):
        assert text not in log, log
    assert "stopped while starting; exiting" in log, log
    stop_server(server)  # the key prefix's clean-up


@pytest.mark.parametrize("ignored", [False, True], ids=["", "SIGINT-ignored-by-parent"])
@pytest.mark.parametrize("delay_s", [0.1, 0.4, 0.8])
def test_ctrl_c_while_the_command_starts_exits_without_a_traceback(
    model_repository, redis_url, tmp_path, delay_s, ignored
) -> None:
    """``sluice`` (the console script) Ctrl-C'd within its first second, while it imports
    or sets Redis up: no traceback, exit 130 (stopped before its handler was set) or 0;
    also when it was started with SIGINT ignored (a background job of a script, nohup)."""
    script = Path(sys.executable).with_name("sluice")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    repo = _small_repo(model_repository, tmp_path, False)
    log_path = tmp_path / "serve.log"
    prefix = f"sluice-e2e-{uuid.uuid4().hex[:8]}:"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(script), "serve", "--model-repository", str(repo), "--redis-url", redis_url,
             "--key-prefix", prefix, "--http-port", str(free_port()),
             "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
             "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
        )  # fmt: skip
        time.sleep(delay_s)
        os.killpg(process.pid, signal.SIGINT)
        code = process.wait(30)
    delete_prefix(redis_url, prefix)
    text = log_path.read_text()
    assert code in (0, 130), (code, text)
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "failed to load" not in text, text


def test_broken_models_reported_while_others_serve(model_repository, redis_url, tmp_path) -> None:
    server = start_server(
        _small_repo(model_repository, tmp_path, True),
        redis_url,
        tmp_path / "serve.log",
        "--exit-on-error",
        "false",
        wait_ready=False,
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        deadline = time.monotonic() + 60
        index: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            try:
                index = client.get_model_repository_index()
                if index and all(e.get("state") in ("READY", "UNAVAILABLE") for e in index):
                    break
            except Exception:
                pass
            time.sleep(0.2)
        states = {e["name"]: e for e in index}
        assert states["add_sub"]["state"] == "READY"
        assert states["broken"]["state"] == "UNAVAILABLE"
        assert (
            "INVALID_PROTOBUF" in states["broken"]["reason"]
            or "protobuf" in states["broken"]["reason"].lower()
        ), states["broken"]
        assert states["mismatch"]["state"] == "UNAVAILABLE"
        assert (
            "input 'INPUT0' has shape [-1,16] in the ONNX model but the configuration "
            "specifies [-1,3]" in states["mismatch"]["reason"]
        ), states["mismatch"]
        assert states["partial"]["state"] == "UNAVAILABLE"
        assert (
            "unable to load model 'partial', configuration expects 1 inputs, model provides 2"
            in states["partial"]["reason"]
        ), states["partial"]
        assert states["fixedbatch"]["state"] == "UNAVAILABLE"
        assert (
            "model 'fixedbatch', tensor 'INPUT0': for the model to support batching the shape "
            "should have at least 1 dimension and the first dimension must be -1; but shape "
            "expected by the model is [1,4]" in states["fixedbatch"]["reason"]
        ), states["fixedbatch"]
        assert states["badconfig"]["state"] == "UNAVAILABLE"
        assert "bogus" in states["badconfig"]["reason"]
        # each refusal is one line of the log, as Triton's 'failed to load', no traceback
        log = server.log()
        assert "Traceback" not in log, log
        assert (
            "instance mismatch_0_0 of model 'mismatch' failed to load: unable to load model" in log
        ), log
        assert client.is_server_live()
        assert not client.is_server_ready()
        raw = requests.get(f"{server.base}/v2/health/ready", timeout=5)
        assert (raw.status_code, raw.content) == (400, b"")
        # the standard gRPC health service says the same (Triton: SERVING iff ready)
        assert grpc_health_status(server.grpc_url) == "NOT_SERVING"
        assert client.is_model_ready("add_sub")
        assert not client.is_model_ready("broken")
        # Triton's HTTP model ready: 400 "Model version not ready" for any model that is not
        # ready, unknown ones included (http_server.cc HandleModelReady)
        for path in ("broken", "broken/versions/1", "nosuch"):
            raw = requests.get(f"{server.base}/v2/models/{path}/ready", timeout=5)
            assert (raw.status_code, raw.json()) == (
                400,
                {"error": "Model version not ready"},
            ), path
        client.close()  # tritonclient.http is gevent-based: never leave one to the GC
    finally:
        assert stop_server(server) == 0, server.log()


def test_exit_on_error_stops_the_server(model_repository, redis_url, tmp_path) -> None:
    server = start_server(
        _small_repo(model_repository, tmp_path, True),
        redis_url,
        tmp_path / "serve.log",
        wait_ready=False,
    )
    try:
        server.process.wait(60)
    finally:
        stop_server(server)
    assert server.process.returncode == 1
    assert "load failed for model 'broken'" in server.log()


def test_private_redis_when_none_answers(model_repository, tmp_path) -> None:
    """The fallback of ``sluice serve`` and of the tests: a private redis-server, reached
    over a Unix socket that only this user may open (and on a free loopback port)."""
    process, url = start_private_redis()
    try:
        assert url.startswith("unix:///") and url.endswith("/redis.sock?db=0")
        socket_path = Path(url[len("unix://") : -len("?db=0")])
        assert stat.S_IMODE(socket_path.stat().st_mode) == 0o700
        server = start_server(
            _small_repo(model_repository, tmp_path, False), url, tmp_path / "serve.log"
        )
        client = httpclient.InferenceServerClient(server.http_url, concurrency=16)
        assert client.is_model_ready("add_sub")
        # The instance reads with a receive low-water mark on a Unix socket: a request
        # after idle gaps past its 200 ms heartbeat (a read that timed out after the
        # previous batch's acknowledgements) is answered at once, and concurrent ones
        # each get their own sums.
        for gap_s in (0.0, 0.5, 0.25, 0.9):
            time.sleep(gap_s)
            a = np.full((1, 16), gap_s, np.float32)
            started = time.monotonic()
            out = client.infer("add_sub", _add_sub(a, a))
            assert time.monotonic() - started < 2.0, gap_s
            np.testing.assert_array_equal(out.as_numpy("OUTPUT0"), a + a)
        pending = [
            (i, client.async_infer("add_sub", _add_sub(np.full((1, 16), i, np.float32),
                                                        np.ones((1, 16), np.float32))))
            for i in range(64)
        ]  # fmt: skip
        for i, request in pending:
            result = request.get_result(timeout=30)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), i + 1))
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.full((1, 16), i - 1))
        client.close()
        assert stop_server(server) == 0
    finally:
        process.terminate()
        process.wait(10)


def _add_sub(a: np.ndarray, b: np.ndarray) -> list[httpclient.InferInput]:
    """add_sub's two inputs (FP32 [1, 16]), binary."""
    inputs = [httpclient.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _add_sub_once_served(
    client: httpclient.InferenceServerClient, timeout_s: float, never: str | None = None
) -> np.ndarray:
    """OUTPUT0 of add_sub (ones + ones) once the server answers it again, trying every
    0.1 s for up to ``timeout_s``; an error text holding ``never`` fails at once."""
    a = np.ones((1, 16), np.float32)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.infer("add_sub", _add_sub(a, a)).as_numpy("OUTPUT0")
        except InferenceServerException as exc:
            assert never is None or never not in str(exc), str(exc)
            assert time.monotonic() < deadline, str(exc)
            time.sleep(0.1)


CRASHER = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x == 5).any():
                os._exit(3)  # stands in for a segfault in user code
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""


def _crasher_repo(tmp_path: Path) -> Path:
    """A repository with the ``crasher`` model (:data:`CRASHER`, one instance)."""
    repo = tmp_path / "repo"
    (repo / "crasher/1").mkdir(parents=True)
    (repo / "crasher/1/model.py").write_text(CRASHER)
    (repo / "crasher/config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
    return repo


def _crasher_input(value: int) -> list[httpclient.InferInput]:
    """``X`` = [[value]] (INT32); 5 kills the instance."""
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return [tensor]


def test_request_that_kills_its_instance_is_failed_not_retried_forever(
    model_repository, redis_url, tmp_path
) -> None:
    server = start_server(_crasher_repo(tmp_path), redis_url, tmp_path / "serve.log")
    try:
        client = httpclient.InferenceServerClient(
            server.http_url, network_timeout=60, concurrency=4
        )

        started = time.monotonic()
        poison = client.async_infer("crasher", _crasher_input(5))
        time.sleep(1.0)
        normal = [client.async_infer("crasher", _crasher_input(v)) for v in (1, 2, 3)]
        with pytest.raises(InferenceServerException) as info:
            poison.get_result(timeout=60)
        assert info.value.status() == "500"
        assert "an instance exited while running this request" in info.value.message()
        for value, request in zip((1, 2, 3), normal, strict=True):
            assert request.get_result(timeout=60).as_numpy("Y").tolist() == [[value]]
        assert time.monotonic() - started < 40  # well before the 60 s request deadline
        client.close()
    finally:
        assert stop_server(server) == 0, server.log()


#: holds the GIL for SECONDS (whole seconds): libc's sleep through ``ctypes.PyDLL``, as a
#: C extension that does not release it would
GIL_HOLDER = """
import ctypes
import numpy as np
import triton_python_backend_utils as pb_utils

_sleep = ctypes.PyDLL(None).sleep


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            _sleep(ctypes.c_uint(int(seconds[0])))
            out = pb_utils.Tensor("OUT", seconds.astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def test_an_execution_holding_the_gil_is_not_taken_for_a_dead_instance(redis_url, tmp_path) -> None:
    """An execute that holds the GIL for 8 s (past the 5 s stale bound) stopped its
    instance's heartbeat thread: a peer instance claimed the request and ran it again,
    and a model with one instance went not ready (and so did the server). The pulse
    process keeps the heartbeat while the instance process lives, as Triton's Python
    backend judges its stub by the process."""
    repo = tmp_path / "repo"
    for name, count in (("gil_two", 2), ("gil_one", 1)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1/model.py").write_text(GIL_HOLDER)
        (repo / name / "config.pbtxt").write_text(
            'backend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            f"instance_group [ {{ kind: KIND_CPU count: {count} }} ]\n"
        )
    server = start_server(repo, redis_url, tmp_path / "serve.log")
    try:
        client = httpclient.InferenceServerClient(
            server.http_url, network_timeout=60, concurrency=2
        )
        seconds = httpclient.InferInput("SECONDS", [1], "FP32")
        seconds.set_data_from_numpy(np.array([8.0], np.float32))
        started = time.monotonic()
        pending = {name: client.async_infer(name, [seconds]) for name in ("gil_two", "gil_one")}
        time.sleep(6.5)  # both executions hold the GIL; every heartbeat thread is 6 s late
        assert requests.get(f"{server.base}/v2/health/ready", timeout=5).status_code == 200
        assert requests.get(f"{server.base}/v2/models/gil_one/ready", timeout=5).status_code == 200
        for name, request in pending.items():
            assert request.get_result(timeout=30).as_numpy("OUT").tolist() == [8.0], name
        assert time.monotonic() - started < 12
        time.sleep(2.0)  # a claim by the peer would have come at 5-7 s
        assert "claimed" not in server.log()
        stats = client.get_inference_statistics("gil_two")["model_stats"][0]
        assert (stats["execution_count"], stats["inference_count"]) == (1, 1)
        client.close()
    finally:
        assert stop_server(server) == 0, server.log()


def test_an_instance_that_dies_running_requests_is_restarted_without_backoff(
    model_repository, redis_url, tmp_path
) -> None:
    """Each poison request kills its instance twice (it is run again once, then failed).
    An instance that reported READY and died holding requests is started again at once:
    with the restart backoff (0.5 s doubled per death of an instance that ran under
    10 s), six deaths in a row would hold the poison requests, and a normal request
    behind them, for half a minute."""
    server = start_server(_crasher_repo(tmp_path), redis_url, tmp_path / "serve.log")
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)

        started = time.monotonic()
        for _ in range(3):
            with pytest.raises(InferenceServerException) as info:
                client.infer("crasher", _crasher_input(5))
            assert "an instance exited while running this request" in info.value.message()
        poisoned_s = time.monotonic() - started
        answered = time.monotonic()
        assert client.infer("crasher", _crasher_input(7)).as_numpy("Y").tolist() == [[7]]
        normal_s = time.monotonic() - answered
        # six restarts of a python model take ~1 s each here; with the backoff they took
        # 0.5 + 1 + 2 + 4 + 8 + 16 s more, and the normal request waited up to 30 s
        assert poisoned_s < 20, f"three poison requests took {poisoned_s:.1f} s"
        assert normal_s < 5, f"the normal request behind them took {normal_s:.1f} s"
        client.close()
    finally:
        assert stop_server(server) == 0, server.log()


def test_requests_during_ctrl_c_are_answered_or_refused_at_once(
    model_repository, redis_url, tmp_path
) -> None:
    """After SIGINT to ``sluice serve`` nothing is queued for stopping instances: 200 or an
    immediate refusal, 503 "shutting down" from a stopping gateway (the gateways are told
    before the instances stop, so never the 404 of an unloaded model) or a closed socket.
    """
    import signal
    import threading

    server = start_server(
        _small_repo(model_repository, tmp_path, False), redis_url, tmp_path / "serve.log"
    )
    url = f"http://127.0.0.1:{server.http_port}/v2/models/add_sub/infer"
    outcomes: list[tuple[str, float]] = []
    stop = threading.Event()

    def client() -> None:
        session = requests.Session()  # keep-alive, as real clients
        n = 0
        while not stop.is_set():
            n += 1
            body = {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [n] * 16},
                    {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1] * 16},
                ]
            }
            started = time.monotonic()
            try:
                reply = session.post(url, json=body, timeout=20)
            except requests.RequestException:
                outcomes.append(("closed", time.monotonic() - started))
                session = requests.Session()
                time.sleep(0.02)
                continue
            took = time.monotonic() - started
            if reply.status_code == 200:
                out = {o["name"]: o["data"] for o in reply.json()["outputs"]}
                outcomes.append(("ok" if out["OUTPUT0"] == [n + 1] * 16 else "WRONG", took))
            else:
                outcomes.append((f"{reply.status_code}:{reply.json()['error']}", took))
            time.sleep(0.02)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    time.sleep(1.0)
    stopped_at = time.monotonic()
    server.process.send_signal(signal.SIGINT)
    try:
        server.process.wait(20)
    finally:
        stop.set()
        thread.join(25)
        stop_server(server)  # exited already (else killed); its keys go
    exit_s = time.monotonic() - stopped_at
    assert server.process.returncode == 0, server.log()
    assert exit_s < 6, server.log()
    kinds = {kind.split(":")[0] for kind, _ in outcomes}
    assert "ok" in kinds
    assert kinds <= {"ok", "503", "closed"}, outcomes
    assert max(took for _, took in outcomes) < 3, outcomes
    refused = [kind for kind, _ in outcomes if kind.startswith("503")]
    assert all("shutting down" in kind for kind in refused), refused


def test_an_idle_grpc_stream_does_not_hold_up_the_exit(
    model_repository, redis_url, tmp_path
) -> None:
    """A client that keeps a gRPC stream open after its answers came does not hold
    ``sluice serve``'s exit up for the whole exit timeout (10 s here): once every request
    it sent is answered, the stream ends at once with UNAVAILABLE "Server exiting", and
    the server exits in well under the timeout."""
    import queue
    import signal

    import tritonclient.grpc as grpcclient

    server = start_server(
        _small_repo(model_repository, tmp_path, False), redis_url, tmp_path / "serve.log"
    )
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.full((1, 16), 2.0, np.float32))
        client.async_stream_infer("add_sub", inputs, request_id="one")
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [[4.0] * 16]
        time.sleep(0.5)  # the stream is idle
        stopping = time.monotonic()
        server.process.send_signal(signal.SIGINT)
        result, error = results.get(timeout=30)
        assert result is None and error is not None
        assert error.status() == "StatusCode.UNAVAILABLE", error
        assert "Server exiting" in error.message()
        assert server.process.wait(30) == 0, server.log()
        exit_s = time.monotonic() - stopping
        assert exit_s < 5, f"the server took {exit_s:.1f} s to exit (exit timeout 10 s)"
    finally:
        client.stop_stream()
        client.close()
        stop_server(server)


def test_a_stopped_deployment_answers_shutting_down_over_both_protocols(
    model_repository, redis_url, tmp_path
) -> None:
    """Requests that reach a gateway after its deployment began to stop get 503 /
    UNAVAILABLE "Server is shutting down", over HTTP and gRPC alike (unary and stream),
    not the 404 / NOT_FOUND of the versions the stopping server unloaded (a stream
    request sent after SIGTERM must not get "... has no available versions"): gRPC makes
    the check that tells the two apart before it resolves the model."""
    import signal

    import tritonclient.grpc as grpcclient

    server = start_server(
        _small_repo(model_repository, tmp_path, False), redis_url, tmp_path / "serve.log"
    )
    gateway, port, grpc_port = start_gateway(
        server.redis_url, server.key_prefix, tmp_path / "gateway.log"
    )
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        wait_server_ready(http)
        server.process.send_signal(signal.SIGINT)  # the gateway started apart keeps running
        assert server.process.wait(30) == 0, server.log()
        x = np.ones((1, 16), np.float32)
        grpc_inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in grpc_inputs:
            tensor.set_data_from_numpy(x)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        with pytest.raises(InferenceServerException) as info:
            grpc.infer("add_sub", grpc_inputs)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        assert "Server is shutting down" in info.value.message()
        answers: list[object] = []
        grpc.start_stream(callback=lambda result, error: answers.append(error or result))
        grpc.async_stream_infer("add_sub", grpc_inputs)
        deadline = time.monotonic() + 10
        while not answers and time.monotonic() < deadline:
            time.sleep(0.05)
        grpc.stop_stream()
        assert len(answers) == 1 and isinstance(answers[0], InferenceServerException)
        assert "Server is shutting down" in answers[0].message(), answers[0].message()
        http_inputs = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for tensor in http_inputs:
            tensor.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as info:
            http.infer("add_sub", http_inputs)
        assert info.value.status() == "503"
        assert "Server is shutting down" in info.value.message()
        http.close()
        grpc.close()
    finally:
        gateway.terminate()
        gateway.wait(10)
        stop_server(server)


def test_gateway_is_not_ready_when_no_instance_lives(model_repository, redis_url, tmp_path) -> None:
    """A gateway left running after its deployment was SIGKILLed stops claiming readiness."""
    import tritonclient.grpc as grpcclient

    server = start_server(
        _small_repo(model_repository, tmp_path, False), redis_url, tmp_path / "serve.log"
    )
    gateway, port, grpc_port = start_gateway(
        server.redis_url, server.key_prefix, tmp_path / "gateway.log"
    )
    try:
        http = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        wait_server_ready(http)
        assert http.is_server_ready() and http.is_model_ready("add_sub")
        children = children_of(server.process.pid)
        server.process.kill()  # the supervisor; its children die with it
        server.process.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        deadline = time.monotonic() + 15  # heartbeats go stale after 5 s
        while http.is_model_ready("add_sub") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not http.is_model_ready("add_sub")
        assert not http.is_server_ready()
        reply = requests.get(f"http://127.0.0.1:{port}/v2/models/add_sub/ready", timeout=5)
        assert (reply.status_code, reply.json()) == (400, {"error": "Model version not ready"})
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert grpc.is_model_ready("add_sub") is False
        http.close()
        grpc.close()
    finally:
        gateway.terminate()
        gateway.wait(20)
        stop_server(server)  # killed above; its keys go


def _add_sub_sum(server) -> list[float]:
    """OUTPUT0 of ``add_sub`` for INPUT0 = INPUT1 = ones (JSON over HTTP)."""
    ones = {"shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}
    body = {"inputs": [{"name": "INPUT0", **ones}, {"name": "INPUT1", **ones}]}
    reply = requests.post(f"{server.base}/v2/models/add_sub/infer", json=body, timeout=20)
    assert reply.status_code == 200, reply.text
    return {o["name"]: o["data"] for o in reply.json()["outputs"]}["OUTPUT0"]


def _held_port() -> tuple[socket.socket, int]:
    """A port another server listens on with SO_REUSEPORT (as ``--gateway-processes`` 2)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("port taken", "is in use by another process"),
        ("one port twice", "the HTTP and gRPC ports are both"),
        ("bad flag", "invalid gateway settings: request_timeout_s: Input should be greater than 0"),
        ("no repository", "failed to open model repository"),
        ("no redis", "cannot use Redis at redis://127.0.0.1:"),
        ("gateway cannot start", "exited with code 1 within 10 s of each of 3 starts"),
    ],
)
def test_start_up_failure_exits_with_one_line(
    case, expected, model_repository, redis_url, tmp_path
) -> None:
    """What would fail every gateway start (or every start) ends ``sluice serve`` with exit
    code 1 and one error line, instead of a traceback or a gateway restarted forever; two
    servers never share a port (one of them with ``--gateway-processes 2``)."""
    repo = _small_repo(model_repository, tmp_path, False)
    held, port = _held_port()
    extra = {
        "port taken": ["--http-port", str(port), "--gateway-processes", "2"],
        "one port twice": ["--http-port", str(port + 1), "--grpc-port", str(port + 1)],
        "bad flag": ["--request-timeout-secs", "-5"],
        "no repository": [],
        "no redis": [],
        "gateway cannot start": [
            "--grpc-use-ssl", "true",
            "--grpc-server-cert", str(tmp_path / "missing.crt"),
            "--grpc-server-key", str(tmp_path / "missing.key"),
        ],
    }[case]  # fmt: skip
    if case == "no repository":
        repo = tmp_path / "missing"
    url = redis_url
    if case == "no redis":
        held.close()  # nothing listens there any more
        url = f"redis://127.0.0.1:{port}/0"
    try:
        server = start_server(repo, url, tmp_path / "serve.log", *extra, wait_ready=False)
        try:
            server.process.wait(45)
        finally:
            stop_server(server)
    finally:
        held.close()
    log = server.log()
    assert server.process.returncode == 1, log
    assert expected in log, log
    if case != "gateway cannot start":  # there the gateway's own error is logged too
        assert "Traceback" not in log, log


def test_second_serve_on_the_same_key_prefix_is_refused(
    model_repository, redis_url, tmp_path
) -> None:
    """A second ``sluice serve`` on another port but the same key prefix exits with one line
    and leaves the first untouched (its start does not wipe the first's state, nor its
    exit mark the first's models unloaded); the prefix is free again once the first stops."""
    repo = _small_repo(model_repository, tmp_path, False)
    first = start_server(repo, redis_url, tmp_path / "first.log")
    try:
        second = start_server(
            repo, redis_url, tmp_path / "second.log", key_prefix=first.key_prefix,
            wait_ready=False,
        )  # fmt: skip
        try:
            second.process.wait(45)
        finally:
            stop_server(second)
        log = second.log()
        assert second.process.returncode == 1, log
        assert f"another sluice serve (host {socket.gethostname()} pid " in log, log
        assert f"HTTP port {first.http_port}) runs with key prefix '{first.key_prefix}'" in log, log
        assert "Traceback" not in log, log
        assert requests.get(f"{first.base}/v2/health/ready", timeout=5).status_code == 200
        assert _add_sub_sum(first) == [2.0] * 16
    finally:
        stop_server(first)
    third = start_server(repo, redis_url, tmp_path / "third.log", key_prefix=first.key_prefix)
    third.owns_prefix = True  # first's made-up prefix: its keys go when third stops
    try:
        assert _add_sub_sum(third) == [2.0] * 16
    finally:
        stop_server(third)


def test_a_serve_started_right_after_a_killed_one_waits_for_its_lease(
    model_repository, redis_url, tmp_path
) -> None:
    """``sluice serve`` SIGKILLed leaves its lease to lapse (5 s); one started on the same
    host and key prefix at once waits for that, since the holder's process is gone, and
    serves, instead of refusing with 'another sluice serve … runs' about a dead one."""
    repo = _small_repo(model_repository, tmp_path, False)
    first = start_server(repo, redis_url, tmp_path / "first.log")
    first.process.kill()
    first.process.wait(10)
    started = time.monotonic()
    second = start_server(repo, redis_url, tmp_path / "second.log", key_prefix=first.key_prefix)
    second.owns_prefix = True
    try:
        assert time.monotonic() - started < 30
        log = second.log()
        assert f"pid {first.process.pid} HTTP port {first.http_port}, which exited" in log, log
        assert _add_sub_sum(second) == [2.0] * 16
    finally:
        stop_server(second)


def _slow_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "slow_repo"
    shutil.copytree(Path(__file__).parents[1] / "assets/python_models/slow", repo / "slow")
    return repo


def _slow_call(server, sleep_ms: int, value: float, protocol: str) -> tuple[str, object]:
    """One request to ``slow`` that sleeps ``sleep_ms``: ("ok", OUT) or ("error", text)."""
    data = np.array([[value]], np.float32)
    try:
        if protocol == "grpc":
            import tritonclient.grpc as grpcclient

            client = grpcclient.InferenceServerClient(server.grpc_url)
            tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer("slow", [tensor], parameters={"sleep_ms": sleep_ms}, timeout=60)
        else:
            client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
            tensor = httpclient.InferInput("IN", [1, 1], "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer("slow", [tensor], parameters={"sleep_ms": sleep_ms})
        return "ok", float(result.as_numpy("OUT")[0, 0])
    except InferenceServerException as exc:
        return "error", f"{exc.status()} {exc.message()}"


def _run_during_ctrl_c(server, calls: list[tuple[int, float, str]]) -> list[tuple[str, object]]:
    """Start ``calls`` one after another (so they queue in that order), SIGINT the server
    while the first runs, and return each call's outcome once the server exited."""
    import signal
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = []
        for sleep_ms, value, protocol in calls:
            futures.append(pool.submit(_slow_call, server, sleep_ms, value, protocol))
            time.sleep(0.3)
        server.process.send_signal(signal.SIGINT)
        server.process.wait(60)
        return [f.result(timeout=60) for f in futures]


def _queued(server, model: str) -> int:
    import redis

    from sluice.broker.keys import KeySchema

    client = redis.Redis.from_url(server.redis_url)
    try:
        return int(client.xlen(KeySchema(server.key_prefix).queue(model, 1, 0)))
    finally:
        client.close()


def test_ctrl_c_runs_what_is_queued_within_the_exit_timeout(redis_url, tmp_path) -> None:
    """Triton finishes in-flight and queued requests before it exits, within
    ``--exit-timeout-secs``: the request running at SIGINT and the two queued behind it
    at the one instance (3.4 s of work) all succeed, over HTTP and gRPC."""
    server = start_server(
        _slow_repo(tmp_path), redis_url, tmp_path / "serve.log", "--exit-timeout-secs", "20"
    )
    try:
        outcomes = _run_during_ctrl_c(
            server, [(2000, 1.5, "http"), (700, 2.5, "grpc"), (700, 3.5, "http")]
        )
        assert outcomes == [("ok", 1.5), ("ok", 2.5), ("ok", 3.5)], server.log()
        assert server.process.returncode == 0, server.log()
        assert _queued(server, "slow") == 0
        assert "Traceback" not in server.log()
    finally:
        stop_server(server)


def test_what_outlives_the_exit_timeout_is_refused_and_never_run_later(redis_url, tmp_path) -> None:
    """With ``--exit-timeout-secs 2`` a 6 s request and the two queued behind it cannot
    finish: each client gets 503 / UNAVAILABLE (no 500, no traceback), the requests are
    taken off the queue, and a server started later on the same Redis runs none of them."""
    repo = _slow_repo(tmp_path)
    server = start_server(repo, redis_url, tmp_path / "serve.log", "--exit-timeout-secs", "2")
    try:
        outcomes = _run_during_ctrl_c(
            server, [(6000, 1.0, "http"), (500, 2.0, "http"), (500, 3.0, "grpc")]
        )
        assert [kind for kind, _ in outcomes] == ["error"] * 3, outcomes
        assert all(text.startswith(("503 ", "StatusCode.UNAVAILABLE ")) for _, text in outcomes), (
            outcomes
        )
        assert "Traceback" not in server.log()
        assert "exit timeout reached: HTTP requests still in flight are answered 503" in (
            server.log()
        ), server.log()
        assert "Cancel " not in server.log()  # uvicorn's ERROR line, reworded as a warning
        assert _queued(server, "slow") == 0
        later = start_server(repo, redis_url, tmp_path / "later.log", key_prefix=server.key_prefix)
        try:
            time.sleep(1.5)
            stats = httpclient.InferenceServerClient(later.http_url).get_inference_statistics(
                "slow"
            )
            assert stats["model_stats"][0]["inference_count"] == 0, stats
        finally:
            stop_server(later)
    finally:
        stop_server(server)


def test_a_gateway_that_cannot_bind_its_shared_port_says_so_in_one_line(redis_url: str) -> None:
    """With ``SO_REUSEPORT`` (``--gateway-processes`` > 1) each gateway binds the shared
    HTTP port itself; when another socket holds it (here a listener without
    ``SO_REUSEPORT``; a connection's local port does the same) the
    gateway exits 1 with one error line, before it starts anything, not a traceback."""
    import os
    import subprocess
    import sys

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sluice.cli", "gateway", "--http-address", "127.0.0.1",
             "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
             "--redis-url", redis_url, "--key-prefix", "sluice-e2e-bind:"],
            env={**os.environ, "SLUICE_REUSE_PORT": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    finally:
        holder.close()
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"cannot listen on the HTTP port 127.0.0.1:{port}" in output
    assert "Address already in use" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1, output


@contextlib.contextmanager
def _serving_on_own_redis(
    model_repository: Path, tmp_path: Path, *flags: str, stalled: bool = False
) -> Iterator[tuple[Any, subprocess.Popen[bytes]]]:
    """``sluice serve`` with ``flags`` on a private redis-server of the test's own (which
    the test may stop with SIGSTOP): (server, redis process). Both are gone afterwards.
    ``stalled``: the redis-server is stopped (SIGSTOP) before the server starts, which
    is then not waited for."""
    process, url = start_private_redis()
    server = None
    try:
        if stalled:
            os.kill(process.pid, signal.SIGSTOP)
        server = start_server(
            _small_repo(model_repository, tmp_path, False),
            url,
            tmp_path / "serve.log",
            *flags,
            wait_ready=not stalled,
        )
        yield server, process
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        process.wait(10)
        if server is not None and server.process.poll() is None:
            server.process.kill()


def test_sigterm_while_redis_is_stalled_exits_by_the_exit_deadline(
    model_repository, tmp_path
) -> None:
    """A Redis that holds its connections open and answers nothing (SIGSTOP) cannot hold
    up the exit: SIGTERM stops the gateways at once, and what is left is killed and
    ``sluice serve`` exits 1 the exit timeout and EXIT_GRACE_S after the signal, not when
    its Redis calls reach their 30 s socket timeout."""
    with _serving_on_own_redis(model_repository, tmp_path, "--exit-timeout-secs", "2") as (
        server,
        process,
    ):
        descendants = _descendants(server.process.pid)
        assert descendants
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(0.5)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(2 + EXIT_GRACE_S + 5) == 1, server.log()
        took = time.monotonic() - started
        assert 2 <= took < 2 + EXIT_GRACE_S + 2, took
        assert not _left_alive(descendants, 5), server.log()
        assert "the shutdown did not finish within the exit timeout" in server.log()


def test_sigterm_during_start_up_while_redis_is_stalled_exits_by_the_exit_deadline(
    model_repository, tmp_path
) -> None:
    """SIGTERM while ``sluice serve`` is still setting up on a Redis that accepts
    connections and answers nothing (SIGSTOP): it exits 1 the exit timeout and
    EXIT_GRACE_S after the signal, naming why, instead of when its Redis calls time out
    (the 30 s socket timeout)."""
    with _serving_on_own_redis(
        model_repository, tmp_path, "--exit-timeout-secs", "1", stalled=True
    ) as (server, _):
        time.sleep(2.0)  # in its first Redis call
        assert server.process.poll() is None, server.log()
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(1 + EXIT_GRACE_S + 10) == 1, server.log()
        took = time.monotonic() - started
        assert 1 <= took < 1 + EXIT_GRACE_S + 2, took
        assert "stopped while starting, and setting up did not finish" in server.log()


def _infer_error(call: Callable[[], object]) -> tuple[str, float]:
    """The error text of ``call`` (which must fail) and how long it took, in s."""
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        call()
    return str(caught.value), time.monotonic() - started


def test_requests_arriving_while_redis_is_stalled_end_at_their_deadline(
    model_repository, tmp_path
) -> None:
    """A request that arrives while Redis answers nothing (its model's view not cached:
    the gateway must read Redis) gets "Request timeout expired" at its deadline over
    HTTP and gRPC, not after the 15 s socket timeout, and is not run and answered 200
    once Redis answers again."""
    with _serving_on_own_redis(model_repository, tmp_path, "--request-timeout-secs", "2") as (
        server,
        process,
    ):
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        a = np.ones((1, 16), np.float32)
        assert client.infer("add_sub", _add_sub(a, a)).as_numpy("OUTPUT0")[0, 0] == 2
        os.kill(process.pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # past the gateway's 0.5 s view cache
            text, took = _infer_error(lambda: client.infer("add_sub", _add_sub(a, a)))
            assert "Request timeout expired" in text and 1.5 < took < 4, (text, took)
            grpc_inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for tensor in grpc_inputs:
                tensor.set_data_from_numpy(a)
            text, took = _infer_error(lambda: grpc.infer("add_sub", grpc_inputs))
            assert "Request timeout expired" in text and 1.5 < took < 4, (text, took)
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert client.infer("add_sub", _add_sub(a, a)).as_numpy("OUTPUT0")[0, 0] == 2
        client.close()
        grpc.close()
        assert stop_server(server) == 0


def test_a_redis_that_lost_its_data_gives_503_not_404_until_republished(
    model_repository, redis_url, tmp_path
) -> None:
    """Redis restarted without its data: until ``sluice serve`` publishes the models
    again, an inference gets 503 / UNAVAILABLE naming the missing state, not the final
    404 of an unknown model; then it is served again. The supervisor is held (SIGSTOP)
    so that the window stays open; a model that never existed still gets 404."""
    server = start_server(
        _small_repo(model_repository, tmp_path, False), redis_url, tmp_path / "serve.log"
    )
    client = httpclient.InferenceServerClient(server.http_url)
    a = np.ones((1, 16), np.float32)
    try:
        assert client.infer("add_sub", _add_sub(a, a)).as_numpy("OUTPUT0")[0, 0] == 2
        broker = redis.Redis.from_url(redis_url)
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            for key in broker.scan_iter(match=f"{server.key_prefix}*", count=1000):
                broker.delete(key)  # what a restart without data leaves of this deployment
            time.sleep(0.7)  # past the gateway's view cache
            text, _ = _infer_error(lambda: client.infer("add_sub", _add_sub(a, a)))
            assert "[503]" in text or "503" in text, text
            assert "state is missing from Redis" in text, text
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert _add_sub_once_served(client, 15, never="not found")[0, 0] == 2
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("nosuch", _add_sub(a, a))
        broker.close()
    finally:
        client.close()
        stop_server(server)


def test_instances_outlive_a_flushall_under_their_blocked_reads(model_repository, tmp_path) -> None:
    """A FLUSHALL deletes the stream under an idle instance's blocked read (Redis answers it
    ``UNBLOCKED the stream key no longer exists``): the instance creates its group again
    and goes on, as for NOGROUP, rather than exit with a traceback and, restarted before
    the models are published again, fail to load with its restarts backing off."""
    with _serving_on_own_redis(model_repository, tmp_path) as (server, _):
        client = httpclient.InferenceServerClient(server.http_url)
        a = np.ones((1, 16), np.float32)
        broker = redis.Redis.from_url(server.redis_url)
        for _ in range(3):
            assert client.infer("add_sub", _add_sub(a, a)).as_numpy("OUTPUT0")[0, 0] == 2
            time.sleep(0.5)  # the instance blocks in its read again
            broker.flushall()
            assert _add_sub_once_served(client, 10)[0, 0] == 2
        log = server.log()
        assert "exited with code" not in log, log
        assert "UNBLOCKED" not in log, log
        broker.close()
        client.close()
        assert stop_server(server) == 0


def test_instances_of_a_killed_serve_exit_while_redis_is_stalled(
    model_repository, tmp_path
) -> None:
    """``sluice serve`` SIGKILLed while Redis answers nothing: its instances (told to stop
    as their parent dies) exit by their own deadline, the drain timeout and 3 s after,
    though their drain waits in Redis calls (they do not live on until Redis answers)."""
    with _serving_on_own_redis(model_repository, tmp_path, "--exit-timeout-secs", "2") as (
        server,
        process,
    ):
        descendants = _descendants(server.process.pid)
        assert len(descendants) >= 2
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(0.3)
        server.process.kill()
        server.process.wait(10)
        # the drain timeout (1.5 s), the grace, slack
        assert not _left_alive(descendants, 1.5 + EXIT_GRACE_S + 4), server.log()
