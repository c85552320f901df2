"""The scaling curve: throughput and p99 against model instances and gateways on one Redis.

Usage::

    python benchmarks/bench_scaling.py [--sleep-ms 20] [--batch 1] [--seconds 8] \\
        [--instances 1 2 4 8 16] [--gateways 1 2 4] [--gateway-instances 8]

The model is a Python model that sleeps ``--sleep-ms`` per execution and uses no CPU
(a stand-in for a GPU whose execution time is fixed), ``max_batch_size`` ``--batch``.
The script starts its own ``redis-server`` on a loopback TCP port (as instances on
other hosts reach it), ``sluice serve --start-gateway=false --start-instances=false``,
one ``sluice gateway``, and then ``sluice worker`` processes: it adds instances to reach
each count of ``--instances`` (membership: a worker that joins takes work with no
coordinator) and measures each step; then it stops instances (SIGTERM) down to
``--gateway-instances`` and adds gateways to reach each count of ``--gateways``.

Each step (the median of ``--repeats`` windows) is a closed loop of
``--per-instance`` × instances keep-alive HTTP connections (spread over the gateways)
sending batch-1 binary requests for ``--seconds`` after ``--warmup`` s: requests/s,
p50, p99, the share of the ideal rate (instances × 1000 / sleep-ms × the batch the
connections can fill), the efficiency (rate / (instances × rate at 1 instance); the
marginal one per added instance too), Redis commands per request (``INFO commandstats``
deltas, with the four most called), Redis CPU per request (``INFO cpu`` user + sys
deltas), the gateways' and the instances' CPU per request (their process trees,
heartbeat processes included) and how busy Redis and the
machine were. The Redis figures are net of what Redis does unloaded (heartbeats,
blocked reads that time out, its own timers), measured for ``--idle`` s before each
step and subtracted at its rate. The load generator is asyncio over raw sockets, so it
costs little CPU beside the servers. From the busiest step it prints the sizing rule:
requests per second one Redis core carries at that cost, and how many instances of this
model that feeds. Nothing is asserted; every wait is bounded. Exit code 0, or 2 when a process
does not start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_anchors import proc_table

ROOT = Path(__file__).resolve().parent.parent
TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")
MODEL = "sleeper"

MODEL_PY = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.sleep_s = float(config["parameters"]["sleep_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        time.sleep(self.sleep_s)
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", data)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def write_model(repo: Path, sleep_ms: float, batch: int) -> None:
    """The sleeping model: ``IN`` FP32 [1] -> ``OUT`` (the same), ``sleep_ms`` per execution."""
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1/model.py").write_text(MODEL_PY)
    batching = "dynamic_batching { }\n" if batch > 1 else ""
    (repo / MODEL / "config.pbtxt").write_text(
        f'name: "{MODEL}"\nbackend: "python"\nmax_batch_size: {batch}\n'
        'input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        f"{batching}instance_group [ {{ kind: KIND_CPU, count: 1 }} ]\n"
        f'parameters {{ key: "sleep_ms" value: {{ string_value: "{sleep_ms}" }} }}\n'
    )


def request_bytes() -> bytes:
    """One HTTP infer request of the model: batch 1, binary tensor."""
    value = np.array([[1.5]], dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {"name": "IN", "shape": [1, 1], "datatype": "FP32",
                 "parameters": {"binary_data_size": value.nbytes}},
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()  # fmt: skip
    body = header + value.tobytes()
    return (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: bench\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@dataclass
class Window:
    """Requests answered in one measured window and their latencies (s)."""

    answered: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)


async def _connection(
    port: int, request: bytes, measure_from: float, stop_at: float, window: Window
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.monotonic() < stop_at:
            started = time.monotonic()
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await asyncio.wait_for(reader.readexactly(length), 60)
            done = time.monotonic()
            if started < measure_from or done > stop_at:
                continue
            if head.startswith(b"HTTP/1.1 200"):
                window.answered += 1
                window.latencies.append(done - started)
            else:
                window.errors += 1
    finally:
        writer.close()


def closed_loop(ports: list[int], connections: int, warmup_s: float, seconds: float) -> Window:
    """``connections`` keep-alive connections, spread over ``ports``, for ``warmup_s`` +
    ``seconds``; what was sent and answered inside the last ``seconds``."""
    request = request_bytes()
    window = Window()

    async def run() -> None:
        measure_from = time.monotonic() + warmup_s
        stop_at = measure_from + seconds
        await asyncio.gather(
            *(
                _connection(ports[i % len(ports)], request, measure_from, stop_at, window)
                for i in range(connections)
            )
        )

    asyncio.run(run())
    return window


class RedisCounters:
    """``INFO commandstats`` calls and ``INFO cpu`` seconds of one Redis, as deltas."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def read(self) -> tuple[dict[str, int], float]:
        stats = self._client.info("commandstats")
        calls = {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}
        cpu = self._client.info("cpu")
        return calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def tree_ticks(table: dict[int, tuple[str, int, int]], roots: list[int]) -> int:
    """utime + stime (clock ticks) of ``roots`` and all their descendants in ``table``
    (:func:`bench_anchors.proc_table`): an instance's heartbeat process counts as its."""
    members, grown = set(roots), True
    while grown:
        grown = False
        for pid, (_, parent, _) in table.items():
            if parent in members and pid not in members:
                members.add(pid)
                grown = True
    return sum(table[pid][2] for pid in members if pid in table)


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of the machine (``/proc/stat``)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


@dataclass
class Step:
    """One measured configuration."""

    instances: int
    gateways: int
    rate: float
    p50_ms: float
    p99_ms: float
    errors: int
    commands_per_request: float
    top_commands: str
    redis_cpu_us: float
    redis_busy: float
    machine_busy: float
    gateway_cpu_us: float
    instance_cpu_us: float


class Deployment:
    """Redis, the control plane, gateways and workers of one run (all killed at exit)."""

    def __init__(self, work: Path, repo: Path) -> None:
        self.work = work
        self.repo = repo
        self.prefix = f"bench-scaling-{uuid.uuid4().hex[:6]}:"
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self.gateway_ports: list[int] = []
        self.gateways: list[subprocess.Popen[bytes]] = []

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with (self.work / log).open("ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        self.processes.append(process)
        return process

    def start(self) -> None:
        """Redis and ``sluice serve`` without gateways or instances."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self._spawn(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.work)],
            "redis.log",
        )  # fmt: skip
        self.client = redis.Redis.from_url(self.url, socket_timeout=10)
        _until(lambda: self.client.ping(), 30, "redis-server answers")
        self._spawn(
            [sys.executable, "-m", "sluice.cli", "serve", "--model-repository", str(self.repo),
             "--start-gateway=false", "--start-instances=false", "--job-workers", "0",
             "--redis-url", self.url, "--key-prefix", self.prefix],
            "serve.log",
        )  # fmt: skip
        _until(
            lambda: self.client.hget(f"{self.prefix}server", "startup") == b"done",
            120, "sluice serve published the model",
        )  # fmt: skip

    def add_gateway(self) -> None:
        """One more ``sluice gateway`` on free ports; waits (bounded) until it answers."""
        http, grpc, metrics = _free_port(), _free_port(), _free_port()
        self._spawn(
            [sys.executable, "-m", "sluice.cli", "gateway", "--http-address", "127.0.0.1",
             "--http-port", str(http), "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc),
             "--metrics-port", str(metrics), "--redis-url", self.url,
             "--key-prefix", self.prefix],
            f"gateway{len(self.gateway_ports)}.log",
        )  # fmt: skip
        self.gateways.append(self.processes[-1])
        _until(lambda: _http_status(http, "/v2/health/live") == 200, 120, "a gateway answers")
        self.gateway_ports.append(http)

    def ready_instances(self) -> int:
        raw = self.client.hgetall(f"{self.prefix}{{{MODEL}}}:instances:1")
        return sum(json.loads(v).get("state") == "READY" for v in raw.values())

    def scale_instances(self, count: int) -> None:
        """Add (``sluice worker``) or stop (SIGTERM) workers until ``count`` are READY."""
        while len(self.workers) < count:
            name = f"w{len(self.workers)}"
            argv = [
                sys.executable, "-m", "sluice.cli", "worker", "--model", MODEL, "--version", "1",
                "--model-dir", str(self.repo / MODEL), "--instance", name,
                "--redis-url", self.url, "--key-prefix", self.prefix,
            ]  # fmt: skip
            self.workers.append(self._spawn(argv, f"{name}.log"))
        while len(self.workers) > count:
            worker = self.workers.pop()
            worker.terminate()
            worker.wait(60)
        _until(lambda: self.ready_instances() == count, 300, f"{count} instances READY")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        for process in reversed(self.processes):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def measure(deployment: Deployment, args: argparse.Namespace) -> Step:
    """One closed-loop window on the deployment as it is."""
    instances, ports = len(deployment.workers), deployment.gateway_ports
    counters = RedisCounters(deployment.client)
    # what Redis does with no load (heartbeats, blocked reads timing out, its own cron)
    idle_calls0, idle_cpu0 = counters.read()
    time.sleep(args.idle)
    idle_calls1, idle_cpu1 = counters.read()
    idle_s = args.idle
    calls0, cpu0 = counters.read()
    busy0, total0 = machine_busy()
    gateway_pids = [p.pid for p in deployment.gateways]
    worker_pids = [p.pid for p in deployment.workers]
    table0 = proc_table()
    started = time.monotonic()
    window = closed_loop(ports, args.per_instance * instances, args.warmup, args.seconds)
    elapsed = time.monotonic() - started
    calls1, cpu1 = counters.read()
    busy1, total1 = machine_busy()
    table1 = proc_table()
    gateway_ticks = tree_ticks(table1, gateway_pids) - tree_ticks(table0, gateway_pids)
    worker_ticks = tree_ticks(table1, worker_pids) - tree_ticks(table0, worker_pids)
    idle_rate = {
        name: (idle_calls1[name] - idle_calls0.get(name, 0)) / idle_s for name in idle_calls1
    }
    deltas = {
        name: calls1[name] - calls0.get(name, 0) - idle_rate.get(name, 0.0) * elapsed
        for name in calls1
    }
    deltas.pop("info", None)  # this script's own
    idle_cpu_s = (idle_cpu1 - idle_cpu0) / idle_s * elapsed
    sent = window.answered + window.errors
    # Redis counters cover the warm-up too: scale by the requests of the whole run
    whole = max(1, round(sent * elapsed / args.seconds))
    top = sorted(deltas.items(), key=lambda kv: -kv[1])[:4]
    latencies = np.array(window.latencies) * 1e3
    return Step(
        instances=instances,
        gateways=len(ports),
        rate=window.answered / args.seconds,
        p50_ms=float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
        p99_ms=float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
        errors=window.errors,
        commands_per_request=sum(deltas.values()) / whole,
        top_commands=" ".join(f"{k}:{v / whole:.2f}" for k, v in top),
        redis_cpu_us=(cpu1 - cpu0 - idle_cpu_s) / whole * 1e6,
        redis_busy=(cpu1 - cpu0) / elapsed,
        machine_busy=(busy1 - busy0) / max(1, total1 - total0),
        gateway_cpu_us=gateway_ticks * TICK_US / whole,
        instance_cpu_us=worker_ticks * TICK_US / whole,
    )


def measure_median(deployment: Deployment, args: argparse.Namespace) -> Step:
    """The window of median rate of ``--repeats`` windows (a machine shared with other
    work can stall one window; the median ignores it)."""
    steps = sorted((measure(deployment, args) for _ in range(args.repeats)), key=lambda s: s.rate)
    return steps[len(steps) // 2]


def report(steps: list[Step], args: argparse.Namespace) -> None:
    base = next((s.rate for s in steps if s.instances == 1 and s.gateways == 1), 0.0)
    ideal = 1000.0 / args.sleep_ms * args.batch_fill
    print(
        f"\nmodel: {args.sleep_ms} ms per execution, max_batch_size {args.batch}; "
        f"{args.per_instance} connections per instance; ideal per instance {ideal:.0f}/s\n"
    )
    print(
        "| instances | gateways | infer/s | p50 ms | p99 ms | of ideal | efficiency | marginal "
        "| Redis cmds/req | Redis CPU µs/req | Redis busy (all) "
        "| gateway CPU µs/req | instance CPU µs/req | machine busy | most called |"
    )
    print("| ---: " * 14 + "| --- |")
    previous: Step | None = None
    for step in steps:
        efficiency = step.rate / (step.instances * base) if base else float("nan")
        marginal = float("nan")
        if previous is not None and previous.gateways == step.gateways and base:
            added = step.instances - previous.instances
            if added > 0:
                marginal = (step.rate - previous.rate) / (added * base)
        print(
            f"| {step.instances} | {step.gateways} | {step.rate:.0f} | {step.p50_ms:.1f} "
            f"| {step.p99_ms:.1f} | {step.rate / (step.instances * ideal):.2f} "
            f"| {efficiency:.2f} | {marginal:.2f} "
            f"| {step.commands_per_request:.1f} | {step.redis_cpu_us:.0f} "
            f"| {step.redis_busy:.0%} | {step.gateway_cpu_us:.0f} | {step.instance_cpu_us:.0f} "
            f"| {step.machine_busy:.0%} | {step.top_commands} |"
        )
        if step.errors:
            print(f"  ({step.errors} errors in that window)")
        previous = step
    busiest = max(steps, key=lambda s: s.rate)
    if busiest.redis_cpu_us > 0:
        per_core = 1e6 / busiest.redis_cpu_us
        per_instance = busiest.rate / busiest.instances
        print(
            f"\nsizing (from the busiest step, {busiest.rate:.0f} infer/s): Redis spends "
            f"{busiest.redis_cpu_us:.0f} µs of CPU and {busiest.commands_per_request:.1f} "
            f"commands per request, so one Redis core carries about {per_core:.0f} "
            f"requests/s: about {per_core / per_instance:.0f} instances of this model "
            f"({per_instance:.0f}/s each)"
        )


def _free_port() -> int:
    from sluice.broker.redis_server import free_port

    return free_port()


def _http_status(port: int, path: str) -> int | None:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def _until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.exceptions.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout_s} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sleep-ms", type=float, default=20.0, help="execution time, ms")
    parser.add_argument("--batch", type=int, default=1, help="the model's max_batch_size")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured window, s")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured lead-in, s")
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument(
        "--idle", type=float, default=3.0, help="unloaded window before each step, s"
    )
    parser.add_argument("--gateways", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--gateway-instances", type=int, default=8)
    parser.add_argument(
        "--per-instance", type=int, default=2, help="connections per instance (closed loop)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="windows per step; the median one is reported"
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    args = parser.parse_args(argv)
    # each connection keeps one request queued while one runs: batches fill to at most
    # per-instance requests
    args.batch_fill = min(args.batch, args.per_instance)
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    repo = work / "models"
    write_model(repo, args.sleep_ms, args.batch)
    deployment = Deployment(work, repo)
    steps: list[Step] = []
    try:
        deployment.start()
        deployment.add_gateway()
        for count in sorted(set(args.instances)):
            deployment.scale_instances(count)
            steps.append(measure_median(deployment, args))
            print(f"measured {count} instance(s), 1 gateway: {steps[-1].rate:.0f}/s", flush=True)
        deployment.scale_instances(args.gateway_instances)
        for count in sorted(set(args.gateways)):
            while len(deployment.gateway_ports) < count:
                deployment.add_gateway()
            steps.append(measure_median(deployment, args))
            print(f"measured {count} gateway(s): {steps[-1].rate:.0f}/s", flush=True)
    except RuntimeError as exc:
        print(f"error: {exc} (logs in {work})", file=sys.stderr)
        deployment.stop()
        return 2
    finally:
        if steps:
            report(steps, args)
    deployment.stop()
    if args.keep:
        print(f"logs: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
