"""End-to-end support: test models built by code and ``sluice serve`` processes on free ports.

Models are built by code (onnx helper API, scikit-learn's bundled digits), never
downloaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import redis
import requests
from onnx import TensorProto, helper

from sluice.broker.cluster import sync_client
from sluice.broker.redis_server import delete_prefix, free_port

ROOT = Path(__file__).resolve().parents[2]
OPSET = [helper.make_opsetid("", 17)]

IDENTITY_TYPES = {
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "FP16": TensorProto.FLOAT16,
    "INT8": TensorProto.INT8,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "UINT8": TensorProto.UINT8,
    "BOOL": TensorProto.BOOL,
    "BYTES": TensorProto.STRING,
}
CONFIG_TYPES = {"BYTES": "TYPE_STRING"}


def tritonclient_body(
    arrays: dict[str, tuple[np.ndarray, str, bool]],
    outputs: list | None = None,
    **kwargs: object,
) -> tuple[bytes, int | None]:
    """An HTTP inference request body exactly as ``tritonclient.http`` builds it, and its
    ``Inference-Header-Content-Length`` (None: all JSON).

    Args:
        arrays: input name -> (array, protocol datatype, sent as binary data).
        outputs: ``tritonclient.http.InferRequestedOutput`` objects (None: every output).
        kwargs: ``request_id``, ``priority``, ``timeout``, ... as the client passes them.
    """
    import tritonclient.http as httpclient
    from tritonclient.http._utils import _get_inference_request

    inputs = []
    for name, (array, datatype, binary) in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    params: dict[str, object] = {
        "request_id": "",
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "custom_parameters": None,
    }
    params.update(kwargs)
    return _get_inference_request(inputs=inputs, outputs=outputs, **params)


def _save(model: onnx.ModelProto, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def build_identity_types(repo: Path) -> None:
    """``identity_types``: one Identity per datatype, inputs ``IN_<T>`` [-1, 4] (BYTES [-1, -1])."""
    nodes, inputs, outputs, cfg_in, cfg_out = [], [], [], [], []
    for name, onnx_type in IDENTITY_TYPES.items():
        dims = ["b", "n"] if name == "BYTES" else ["b", 4]
        inputs.append(helper.make_tensor_value_info(f"IN_{name}", onnx_type, dims))
        outputs.append(helper.make_tensor_value_info(f"OUT_{name}", onnx_type, dims))
        nodes.append(helper.make_node("Identity", [f"IN_{name}"], [f"OUT_{name}"]))
        data_type = CONFIG_TYPES.get(name, f"TYPE_{name}")
        item_dims = "[ -1 ]" if name == "BYTES" else "[ 4 ]"
        cfg_in.append(f'{{ name: "IN_{name}" data_type: {data_type} dims: {item_dims} }}')
        cfg_out.append(f'{{ name: "OUT_{name}" data_type: {data_type} dims: {item_dims} }}')
    graph = helper.make_graph(nodes, "identity_types", inputs, outputs)
    _save(helper.make_model(graph, opset_imports=OPSET), repo / "identity_types/1/model.onnx")
    (repo / "identity_types/config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        f"input [ {', '.join(cfg_in)} ]\noutput [ {', '.join(cfg_out)} ]\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )


def _scale_model(factor: float, dims: list[object]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, dims)
    k = helper.make_tensor("k", TensorProto.FLOAT, [], [factor])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "k"], ["OUTPUT0"])], "scale", [x], [y], initializer=[k]
    )
    return helper.make_model(graph, opset_imports=OPSET)


def write_scale_model(path: Path, factor: float, dims: list[object] | None = None) -> None:
    """An ONNX file computing OUTPUT0 = factor × INPUT0 (FP32 ``dims``, default [-1, 4])."""
    _save(_scale_model(factor, ["b", 4] if dims is None else dims), path)


def build_versioned(repo: Path) -> None:
    """``versioned``: versions 1, 2, 3 multiply by their number; policy keeps 1 and 2."""
    for version in (1, 2, 3):
        _save(_scale_model(float(version), ["b", 4]), repo / f"versioned/{version}/model.onnx")
    (repo / "versioned/config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "version_policy: { specific: { versions: [ 1, 2 ] } }\n"
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )


def build_nobatch(repo: Path) -> None:
    """``nobatch``: max_batch_size 0, INPUT0 FP32 [-1] doubled."""
    _save(_scale_model(2.0, ["n"]), repo / "nobatch/1/model.onnx")
    (repo / "nobatch/config.pbtxt").write_text(
        'name: "nobatch"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )


def build_autocomplete(repo: Path) -> None:
    """``auto_onnx``: no config.pbtxt; two INT32 [-1, 16] inputs -> sum and difference."""
    a = helper.make_tensor_value_info("A", TensorProto.INT32, ["b", 16])
    b = helper.make_tensor_value_info("B", TensorProto.INT32, ["b", 16])
    s = helper.make_tensor_value_info("SUM", TensorProto.INT32, ["b", 16])
    d = helper.make_tensor_value_info("DIFF", TensorProto.INT32, ["b", 16])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["A", "B"], ["SUM"]),
            helper.make_node("Sub", ["A", "B"], ["DIFF"]),
        ],
        "auto",
        [a, b],
        [s, d],
    )
    _save(helper.make_model(graph, opset_imports=OPSET), repo / "auto_onnx/1/model.onnx")


def repository_of(model_repository: Path, where: Path, *models: str) -> Path:
    """A repository at ``where`` holding copies of ``models`` of ``model_repository``.

    A server on it starts only their instances: one on the whole e2e repository starts
    an instance process for each of its ~19 models, which takes many seconds.
    """
    for model in models:
        shutil.copytree(model_repository / model, where / model)
    return where


def instance_records(server: Server, model: str, version: int = 1) -> dict[str, dict]:
    """The instance records (name -> state, pid, heartbeat) of a model version in the
    server's Redis."""
    client = sync_client(server.redis_url)
    try:
        raw = client.hgetall(f"{server.key_prefix}{{{model}}}:instances:{version}")
    finally:
        client.close()
    return {k.decode(): json.loads(v) for k, v in raw.items()}


def grpc_health_status(grpc_url: str) -> str:
    """The ``grpc.health.v1.Health/Check`` answer of the server at ``grpc_url``
    (``host:port``) for the empty service name: ``"SERVING"``, ``"NOT_SERVING"``, ..."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(grpc_url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def load_module(relative_path: str, name: str) -> object:
    """A script of the repository that is not in a package (``examples/``,
    ``benchmarks/``), loaded as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def load_examples() -> object:
    """The example builders (``examples/build_models.py``) as a module."""
    return load_module("examples/build_models.py", "sluice_examples_build")


@dataclass
class Server:
    """A running ``sluice serve``."""

    process: subprocess.Popen[bytes]
    http_port: int
    key_prefix: str
    redis_url: str
    log_path: Path
    grpc_port: int = 0
    metrics_port: int = 0
    #: the key prefix was made up for this server: stop_server deletes its keys
    owns_prefix: bool = False

    @property
    def metrics_url(self) -> str:
        """``http://127.0.0.1:<metrics port>/metrics``."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"localhost:{self.http_port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def children_of(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def tree_cmdlines(pid: int) -> dict[int, str]:
    """The command line of ``pid`` and of every process below it (pid -> the arguments
    joined by spaces; "" for one that ended meanwhile)."""
    found, todo = [pid], [pid]
    while todo:
        kids = children_of(todo.pop())
        found += kids
        todo += kids
    lines = {}
    for one in found:
        try:
            lines[one] = Path(f"/proc/{one}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            lines[one] = ""
    return lines


def children_running(server: Server, module: str) -> list[int]:
    """Pids of the server's children running ``python -m <module>`` (``module`` is one
    argument of their command line); a child that exits while read is left out."""
    found = []
    for pid in children_of(server.process.pid):
        with contextlib.suppress(OSError):
            if module.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


def start_server(
    repo: Path | str,
    redis_url: str,
    log_path: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
    timeout_s: float = 90.0,
    metrics_port: int | None = None,
    key_prefix: str | None = None,
    new_session: bool = False,
    ports: tuple[int, int, int] | None = None,
    url_in_env: bool = False,
) -> Server:
    """Start ``sluice serve`` on free ports and wait (bounded) until it is ready.

    ``metrics_port`` None picks a free port for the metrics endpoint too; ``key_prefix``
    None gives the server a prefix of its own; ``new_session``: in a process group of its
    own (whose id is its pid), as a terminal starts it, so a test can Ctrl-C the group;
    ``ports``: (HTTP, gRPC, metrics) to listen on instead of free ones;
    ``url_in_env``: the Redis URL goes in ``SLUICE_REDIS__URL``, not on the command line.
    """
    port = free_port()
    grpc_port = free_port()
    while grpc_port == port:
        grpc_port = free_port()
    if ports is not None:
        port, grpc_port, metrics_port = ports
    if metrics_port is None:
        metrics_port = free_port()
        while metrics_port in (port, grpc_port):
            metrics_port = free_port()
    prefix = key_prefix or f"sluice-e2e-{uuid.uuid4().hex[:8]}:"
    full_env = dict(os.environ)
    full_env.update(env or {})
    if url_in_env:
        full_env["SLUICE_REDIS__URL"] = redis_url
    log = log_path.open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice.cli",
            "serve",
            "--model-repository",
            str(repo),
            "--http-port",
            str(port),
            "--http-address",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            "--grpc-address",
            "127.0.0.1",
            "--metrics-port",
            str(metrics_port),
            *([] if url_in_env else ["--redis-url", redis_url]),
            "--key-prefix",
            prefix,
            "--exit-timeout-secs",
            "10",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=full_env,
        cwd=ROOT,
        start_new_session=new_session,
    )
    server = Server(
        process, port, prefix, redis_url, log_path, grpc_port, metrics_port,
        owns_prefix=key_prefix is None,
    )  # fmt: skip
    if not wait_ready:
        return server
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sluice serve exited with {process.returncode}:\n{server.log()}")
        try:
            if requests.get(f"{server.base}/v2/health/ready", timeout=1).status_code == 200:
                return server
        except requests.RequestException:
            pass
        time.sleep(0.1)
    stop_server(server)
    raise RuntimeError(f"sluice serve not ready within {timeout_s}s:\n{server.log()}")


def start_gateway(
    redis_url: str, key_prefix: str, log_path: Path
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start one more ``sluice gateway`` against a deployment (not waited for).

    Returns:
        The process, its HTTP port and its gRPC port (both on 127.0.0.1).
    """
    port, grpc_port = free_port(), free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice.cli",
                "gateway",
                "--http-address",
                "127.0.0.1",
                "--http-port",
                str(port),
                "--grpc-address",
                "127.0.0.1",
                "--grpc-port",
                str(grpc_port),
                "--metrics-port",
                str(free_port()),
                "--redis-url",
                redis_url,
                "--key-prefix",
                key_prefix,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, port, grpc_port


def _poll(probe: Callable[[], bool], timeout_s: float) -> bool:
    """Call ``probe`` every 0.1 s until it answers True (errors count as False) or
    ``timeout_s`` passed; whether it did."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if probe():
                return True
        except Exception:
            pass
        time.sleep(0.1)
    return False


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the machine since boot (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def wait_machine_quiet(busy_below: float = 0.5, timeout_s: float = 30.0) -> bool:
    """Wait until the machine's CPUs were less than ``busy_below`` busy over half a
    second (a test that counts on a delay window just after a server started, while its
    instances still start their heartbeat processes); whether they were within
    ``timeout_s``. Returns at once where ``/proc/stat`` is absent."""
    if not os.path.exists("/proc/stat"):
        return True
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy0, total0 = _cpu_times()
        time.sleep(0.5)
        busy1, total1 = _cpu_times()
        if total1 > total0 and (busy1 - busy0) / (total1 - total0) < busy_below:
            return True
    return False


def wait_server_live(client: object, timeout_s: float = 30.0) -> None:
    """Poll ``client.is_server_live()`` (tritonclient) until true (a gateway that answers),
    for a deployment whose readiness may be false for other reasons (a model left
    UNAVAILABLE by an earlier test under strict readiness).

    Raises:
        AssertionError: not live within ``timeout_s``.
    """
    if not _poll(client.is_server_live, timeout_s):  # type: ignore[attr-defined]
        raise AssertionError(f"gateway not live within {timeout_s} s")


def wait_server_ready(client: object, timeout_s: float = 30.0) -> None:
    """Poll ``client.is_server_ready()`` (tritonclient) until true or ``timeout_s`` passed;
    errors while the gateway starts count as not ready."""
    _poll(client.is_server_ready, timeout_s)  # type: ignore[attr-defined]


def stop_server(server: Server, timeout_s: float = 30.0) -> int:
    """SIGINT (Ctrl-C) and wait; returns the exit code. A server whose key prefix was
    made up for it leaves no keys behind in Redis."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGINT)
        try:
            server.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(5)
    if server.owns_prefix:  # (a test of a Redis that never answered has nothing to delete)
        with contextlib.suppress(redis.exceptions.ConnectionError):
            delete_prefix(server.redis_url, server.key_prefix, timeout_s=2.0)
    return int(server.process.returncode)


def random_inputs(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic FP32 test data."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def build_batch_scale(repo: Path) -> None:
    """``batch_scale``: OUTPUT0 = 3 × INPUT0 [-1, 4], dynamic batching, two instances."""
    _save(_scale_model(3.0, ["b", 4]), repo / "batch_scale/1/model.onnx")
    (repo / "batch_scale/config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 16\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 20000 }\n"
        "instance_group [ { kind: KIND_CPU count: 2 } ]\n"
    )


SLOW_VARIANTS = {
    # name: (dynamic_batching body, instance count[, queue shards])
    "slow_queue": ("default_queue_policy { max_queue_size: 1 }", 1),
    "slow_queue_sharded": ("default_queue_policy { max_queue_size: 2 }", 1, 2),
    "slow_timeout": (
        "default_queue_policy { timeout_action: REJECT "
        "default_timeout_microseconds: 300000 allow_timeout_override: true }",
        1,
    ),
    "slow_delay": (
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 100000 }",
        1,
    ),
    "slow_pair": ("", 2),
    "slow_priority": ("priority_levels: 2 default_priority_level: 2", 1),  # max_batch_size 1
    "slow_priority_sharded": ("priority_levels: 2 default_priority_level: 2", 1, 3),
    "slow_pair_sharded": ("", 2, 3),
    "slow_batch4_sharded": ("", 1, 4),  # max_batch_size 4
}


def build_slow_variants(repo: Path) -> None:
    """Copies of the ``slow`` Python model with queue policies for the batching tests."""
    source = ROOT / "tests/assets/python_models/slow"
    for name, (batching, count, *shards) in SLOW_VARIANTS.items():
        (repo / name / "1").mkdir(parents=True)
        shutil.copy(source / "1/model.py", repo / name / "1/model.py")
        config = (source / "config.pbtxt").read_text()
        config = config.replace('name: "slow"', f'name: "{name}"')
        config = config.replace("count: 1", f"count: {count}")
        if name.startswith("slow_priority"):
            config = config.replace("max_batch_size: 8", "max_batch_size: 1")
        if name.startswith("slow_batch4"):
            config = config.replace("max_batch_size: 8", "max_batch_size: 4")
        config += f"dynamic_batching {{ {batching} }}\n"
        if shards:
            shard_count = f'{{ string_value: "{shards[0]}" }}'
            config += f'parameters {{ key: "queue_shards" value: {shard_count} }}\n'

        (repo / name / "config.pbtxt").write_text(config)


def read_http_responses(
    sock: socket.socket, count: int
) -> list[tuple[bytes, dict[str, str], bytes]]:
    """Read ``count`` Content-Length framed HTTP responses off ``sock``:
    (status line, lower-cased headers, body) each."""
    raw = b""
    responses: list[tuple[bytes, dict[str, str], bytes]] = []
    while len(responses) < count:
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(responses)} responses"
            raw += chunk
        head, raw = raw.split(b"\r\n\r\n", 1)
        status, *lines = head.split(b"\r\n")
        headers = {}
        for line in lines:
            key, value = line.decode().split(":", 1)
            headers[key.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        while len(raw) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed inside a body"
            raw += chunk
        responses.append((status, headers, raw[:length]))
        raw = raw[length:]
    return responses


def load_while(
    http_url: str,
    infer: Callable[[object, int], object],
    disturb: Callable[[], None],
    seconds: float,
    clients: int = 6,
) -> dict[int, object]:
    """``clients`` threads call ``infer(client, value)`` with distinct values (worker ×
    10000 + sequence) on tritonclient.http clients for ``seconds``; ``disturb()`` runs
    2 s in. Returns value -> answer (what ``infer`` returned, or the
    ``InferenceServerException``). Fails when a request is still open 90 s after the end.
    """
    from tritonclient.http import InferenceServerClient
    from tritonclient.utils import InferenceServerException

    results: dict[int, object] = {}
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client_loop(worker: int) -> None:
        client = InferenceServerClient(http_url, network_timeout=60)
        i = 0
        try:
            while time.monotonic() < stop_at:
                value = worker * 10000 + i
                try:
                    answer: object = infer(client, value)
                except InferenceServerException as exc:
                    answer = exc
                with lock:
                    results[value] = answer
                i += 1
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(w,)) for w in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    disturb()
    for thread in threads:
        thread.join(90)
    assert not any(t.is_alive() for t in threads), "a request hung"
    return results
