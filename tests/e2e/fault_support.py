"""The fault suite: a steady load over HTTP, gRPC, a gRPC stream and async jobs, a fault
injected into one deployment, and per request what became of it.

Every request carries a unique id and a unique value ``v`` sent to the ``ledger`` model,
which answers ``2 v`` and appends ``v`` to a file per process each time it runs it. Per
fault the suite counts requests

* **accepted**: sent on a connection the server took (a refused connection is not),
* **ok**: answered with the request's own id and ``2 v``,
* **errors**, by status: ``deadline`` for 503 / UNAVAILABLE ``Request timeout expired``
  (no answer came within the request's deadline), else the HTTP status, the gRPC code,
  ``stream error`` for an error answer on the stream (which carries no code), ``conn``
  for a connection closed without an answer, job ``FAILURE``,
* **lost**: accepted and not answered within the server's request deadline plus a margin
  (the client gave up waiting; a job not final by the end),
* **twice**: a second answer for one id on the stream, or an answer carrying another
  request's id or value,

plus ``ran_twice`` (the model ran a value more than once, from its files) and the time to
recover: from the fault until the last request that failed or waited over a second ended.

Each deployment gets its own ``redis-server`` on a free port, so faults that stop,
freeze, fill or empty Redis touch nothing else. ``benchmarks/faults.py`` prints the table;
``test_faults.py`` asserts on each row.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis
import requests
from e2e_support import (
    Server,
    children_running,
    free_port,
    instance_records,
    start_server,
    stop_server,
)

from sluice.broker.redis_server import redis_answers

LEDGER_MODEL = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sleep_ms = max(float(json.loads(r.parameters()).get("sleep_ms", 0)) for r in requests)
        time.sleep(sleep_ms / 1000.0)
        responses = []
        with open(os.path.join(os.environ["LEDGER_DIR"], f"{os.getpid()}.log"), "a") as log:
            for request in requests:
                data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                log.write(" ".join(str(int(v)) for v in data.ravel()) + "\\n")
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", data * 2)]))
        return responses
"""

#: seconds a request may wait in the server (``--request-timeout-secs`` of the suite)
REQUEST_TIMEOUT_S = 8.0
#: a client gives up (and counts the request lost) this long after sending it
CLIENT_TIMEOUT_S = REQUEST_TIMEOUT_S + 7.0
#: the model's run time per batch (ms): a steady, moderate load
SLEEP_MS = 20
#: a request slower than this counts as disturbed for the recovery time (s)
SLOW_S = 1.0


class PrivateRedis:
    """A redis-server on a fixed port that a test may stop, freeze, fill and restart."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = tempfile.mkdtemp(prefix="sluice-disrupt-")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (loading the dump a ``SHUTDOWN SAVE`` left in its folder) and wait
        (10 s at most) until it answers."""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not redis_answers(self.url, 0.2):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGKILL it (thawed first), losing what it held."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=10)


@contextlib.contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    """A started :class:`PrivateRedis`, stopped and its folder removed afterwards."""
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.workdir, ignore_errors=True)


def ledger_repo(where: Path, instances: int = 2) -> Path:
    """A repository at ``where/repo`` holding ``ledger`` (IN, OUT FP32 [1], batching up
    to 8, ``instances`` CPU instances); its runs go to ``where/ledger`` (``LEDGER_DIR``)."""
    repo = where / "repo"
    (repo / "ledger/1").mkdir(parents=True)
    (repo / "ledger/1/model.py").write_text(LEDGER_MODEL)
    (repo / "ledger/config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        f"instance_group [ {{ kind: KIND_CPU, count: {instances} }} ]\n"
        "dynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    )
    (where / "ledger").mkdir(exist_ok=True)
    return repo


def executions(where: Path) -> Counter[int]:
    """How many times the ``ledger`` model of :func:`ledger_repo` ran each value."""
    counts: Counter[int] = Counter()
    for log in (where / "ledger").glob("*.log"):
        for line in log.read_text().split():
            counts[int(line)] += 1
    return counts


@dataclass
class Outcome:
    """What became of one request: ``status`` is ``ok``, ``wrong`` (another request's
    answer), ``lost``, ``refused`` (never accepted) or an error status."""

    kind: str
    sent: float
    ended: float
    status: str
    answers: int = 1
    #: the error's text (non-ok outcomes)
    detail: str = ""


@dataclass
class FaultRow:
    """One fault's counts (see the module's docstring)."""

    fault: str
    accepted: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    lost: int = 0
    twice: int = 0
    ran_twice: int = 0
    recovery_s: float = 0.0
    #: every kind of client was answered ok (3 in a row) after the fault
    recovered: bool = False
    #: processes of the deployment that died and were restarted (its log's lines)
    restarts: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    #: status -> the text of one error answer of that status
    samples: dict[str, str] = field(default_factory=dict)

    def cells(self) -> list[str]:
        errors = ", ".join(f"{s} ×{n}" for s, n in sorted(self.errors.items())) or "0"
        return [self.fault, str(self.accepted), str(self.ok), errors, str(self.lost),
                str(self.twice), str(self.ran_twice), f"{self.recovery_s:.1f}"]  # fmt: skip


HEADER = ["fault", "accepted", "answered ok", "answered with an error", "lost",
          "answered twice", "ran twice", "recovery (s)"]  # fmt: skip


def table(rows: list[FaultRow]) -> str:
    """The rows as a Markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows]
    return "\n".join(lines)


def _status_of(exc: BaseException) -> str:
    """A short status of a failed call: HTTP status, gRPC code, ``conn``, ``lost``,
    ``refused``."""
    from tritonclient.utils import InferenceServerException

    text = str(exc).lower()
    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        if "failed to connect to all addresses" in text:  # grpcio found no server
            return "refused"
        if "stream is no longer in valid state" in text:  # not sent: the stream never opened
            return "refused"
        if "request timeout expired" in text:  # 503 / UNAVAILABLE, no answer came in time
            return "deadline"
        if status.endswith("DEADLINE_EXCEEDED") and "deadline exceeded" in text:
            return "lost"  # the client's own deadline: the server never answered
        if status:
            return status.removeprefix("StatusCode.")
        # a stream's error answer carries a message and no code
        return "stream INTERNAL" if text.startswith("internal error") else "stream error"
    if isinstance(exc, ConnectionRefusedError):
        return "refused"
    if (
        isinstance(exc, TimeoutError)
        or "timed out" in text
        or "timeout" in type(exc).__name__.lower()
    ):
        return "lost"
    return "conn"


def _detail(exc: BaseException) -> str:
    """The start of an error's text, for :attr:`FaultRow.samples`."""
    return f"{type(exc).__name__}: {exc}"[:200]


class Load:
    """Client threads sending ``ledger`` requests until :meth:`stop`; every call bounded
    by :data:`CLIENT_TIMEOUT_S`."""

    def __init__(
        self, server: Server, http: int = 2, grpc: int = 2, stream: int = 1, jobs: int = 0
    ) -> None:
        self.server = server
        self.outcomes: dict[str, Outcome] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        kinds = ["http"] * http + ["grpc"] * grpc + ["stream"] * stream + ["job"] * jobs
        run = {"http": self._http, "grpc": self._grpc, "stream": self._stream, "job": self._job}
        self._threads = [
            threading.Thread(target=run[kind], args=(worker,), name=f"{kind}-{worker}", daemon=True)
            for worker, kind in enumerate(kinds, start=1)
        ]
        self._serial = 0

    def _next(self, worker: int) -> tuple[str, int]:
        with self._lock:
            self._serial += 1
            value = worker * 100_000 + self._serial
        return f"r{value}", value

    def _record(self, key: str, outcome: Outcome) -> None:
        with self._lock:
            seen = self.outcomes.get(key)
            if seen is not None:  # a second answer for one id
                seen.answers += 1
                return
            self.outcomes[key] = outcome

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = CLIENT_TIMEOUT_S + 15) -> None:
        """Stop sending and wait for the threads; fails if one is still stuck."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        assert not stuck, f"load threads still waiting: {stuck}"

    def healthy_since(self, since: float) -> bool:
        """Whether each kind of client's last three requests were sent after ``since``
        and answered ok."""
        with self._lock:
            outcomes = list(self.outcomes.values())
        for kind in {o.kind for o in outcomes}:
            mine = sorted((o for o in outcomes if o.kind == kind), key=lambda o: o.sent)[-3:]
            if len(mine) < 3 or any(o.sent < since or o.status != "ok" for o in mine):
                return False
        return True

    def _pause_after(self, status: str) -> None:
        if status != "ok":  # a refused or failed call is not repeated in a tight loop
            time.sleep(0.05)

    def _check(self, key: str, value: int, got_id: str, out: float) -> str:
        return "ok" if got_id == key and out == 2.0 * value else "wrong"

    def _http(self, worker: int) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(
            self.server.http_url, network_timeout=CLIENT_TIMEOUT_S, connection_timeout=5
        )
        try:
            while not self._stop.is_set():
                key, value = self._next(worker)
                tensor = httpclient.InferInput("IN", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[value]], np.float32))
                sent, detail = time.monotonic(), ""
                try:
                    result = client.infer(
                        "ledger", [tensor], request_id=key, parameters={"sleep_ms": SLEEP_MS}
                    )
                    response = result.get_response()
                    out = float(result.as_numpy("OUT")[0][0])
                    status = self._check(key, value, response.get("id", ""), out)
                except Exception as exc:  # every failure is counted by its status
                    status, detail = _status_of(exc), _detail(exc)
                    if status in ("conn", "lost"):  # start again on a new connection
                        client.close()
                        client = httpclient.InferenceServerClient(
                            self.server.http_url, network_timeout=CLIENT_TIMEOUT_S,
                            connection_timeout=5,
                        )  # fmt: skip
                self._record(key, Outcome("http", sent, time.monotonic(), status, detail=detail))
                self._pause_after(status)
        finally:
            client.close()

    def _grpc(self, worker: int) -> None:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        try:
            while not self._stop.is_set():
                key, value = self._next(worker)
                tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[value]], np.float32))
                sent, detail = time.monotonic(), ""
                try:
                    result = client.infer(
                        "ledger", [tensor], request_id=key, parameters={"sleep_ms": SLEEP_MS},
                        client_timeout=CLIENT_TIMEOUT_S,
                    )  # fmt: skip
                    out = float(result.as_numpy("OUT")[0][0])
                    status = self._check(key, value, result.get_response().id, out)
                except Exception as exc:
                    status, detail = _status_of(exc), _detail(exc)
                self._record(key, Outcome("grpc", sent, time.monotonic(), status, detail=detail))
                self._pause_after(status)
        finally:
            client.close()

    def _stream(self, worker: int) -> None:
        """One request at a time on a ``ModelStreamInfer`` stream, opened again when it
        breaks; every answer is recorded, so a second answer for an id is seen."""
        import tritonclient.grpc as grpcclient

        expected: dict[str, int] = {}

        def callback_into(answers: queue.Queue[tuple[str, str, str]]) -> Callable[..., None]:
            """The callback of one stream: its answers go to its own queue, so what a
            stream stopped after an error still delivers reaches no later request."""

            def callback(result: object, error: object) -> None:
                if error is not None:
                    answers.put(("", _status_of(error), _detail(error)))  # type: ignore[arg-type]
                    return
                response = result.get_response()  # type: ignore[attr-defined]
                out = float(result.as_numpy("OUT")[0][0])  # type: ignore[attr-defined]
                key = response.id
                status = self._check(key, expected.get(key, -1), key, out)
                if key in self.outcomes:  # late or second answer
                    self._record(key, Outcome("stream", 0.0, time.monotonic(), status))
                answers.put((key, status, ""))

            return callback

        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        streaming = False
        try:
            while not self._stop.is_set():
                if not streaming:
                    answers: queue.Queue[tuple[str, str, str]] = queue.Queue()
                    client.start_stream(callback=callback_into(answers), stream_timeout=None)
                    streaming = True
                key, value = self._next(worker)
                expected[key] = value
                tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[value]], np.float32))
                sent, detail = time.monotonic(), ""
                try:
                    client.async_stream_infer(
                        "ledger", [tensor], request_id=key, parameters={"sleep_ms": SLEEP_MS}
                    )
                    got, status, detail = answers.get(timeout=CLIENT_TIMEOUT_S)
                    while got not in (key, ""):  # a late answer of an earlier request
                        got, status, detail = answers.get(timeout=CLIENT_TIMEOUT_S)
                except queue.Empty:
                    status = "lost"
                except Exception as exc:
                    status, detail = _status_of(exc), _detail(exc)
                if status != "ok":
                    client.stop_stream(cancel_requests=True)
                    streaming = False
                self._record(key, Outcome("stream", sent, time.monotonic(), status, detail=detail))
                self._pause_after(status)
        finally:
            with contextlib.suppress(Exception):
                client.stop_stream(cancel_requests=True)
            client.close()

    def _job(self, worker: int) -> None:
        """Single async jobs, up to 4 open at a time, each polled until final; a job
        still open when the load stops is polled up to :data:`CLIENT_TIMEOUT_S` more."""
        base = self.server.base
        open_jobs: dict[str, tuple[str, int, float]] = {}
        session = requests.Session()
        stop_polling_at = float("inf")
        while open_jobs or not self._stop.is_set():
            if self._stop.is_set() and stop_polling_at == float("inf"):
                stop_polling_at = time.monotonic() + CLIENT_TIMEOUT_S * 2
            while len(open_jobs) < 4 and not self._stop.is_set():
                key, value = self._next(worker)
                body = {
                    "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "FP32",
                                "data": [value]}],
                    "parameters": {"sleep_ms": SLEEP_MS},
                }  # fmt: skip
                sent = time.monotonic()
                try:
                    reply = session.post(f"{base}/v2/models/ledger/jobs", json=body, timeout=10)
                except requests.RequestException as exc:
                    status = "refused" if "refused" in str(exc).lower() else "conn"
                    self._record(key, Outcome("job", sent, time.monotonic(), status))
                    time.sleep(0.05)
                    continue
                if reply.status_code != 202:
                    self._record(
                        key, Outcome("job", sent, time.monotonic(), str(reply.status_code))
                    )
                    time.sleep(0.05)
                    continue
                open_jobs[reply.json()["id"]] = (key, value, sent)
            for job_id, (key, value, sent) in list(open_jobs.items()):
                try:
                    job = session.get(f"{base}/v2/jobs/{job_id}", timeout=10).json()
                except (requests.RequestException, ValueError):
                    continue
                if job.get("state") in ("SUCCESS", "FAILURE", "REVOKED"):
                    status = job["state"]
                    if status == "SUCCESS":
                        out = job["outputs"][0]["data"][0]
                        status = "ok" if out == 2.0 * value else "wrong"
                    self._record(key, Outcome("job", sent, time.monotonic(), status))
                    del open_jobs[job_id]
            if time.monotonic() > stop_polling_at:
                for key, _, sent in open_jobs.values():
                    self._record(key, Outcome("job", sent, time.monotonic(), "lost"))
                break
            time.sleep(0.05)
        session.close()


def summarize(name: str, load: Load, fault_at: float, where: Path) -> FaultRow:
    """The row of a fault injected at ``fault_at`` (monotonic s) from the load's outcomes
    and the model's runs."""
    row = FaultRow(name)
    disturbed_until = fault_at
    for outcome in load.outcomes.values():
        if outcome.status == "refused":
            row.errors["refused (not accepted)"] += 1
        else:
            row.accepted += 1
            row.by_kind[outcome.kind] += 1
        if outcome.status == "ok":
            row.ok += 1
        elif outcome.status == "lost":
            row.lost += 1
        elif outcome.status == "wrong":
            row.twice += 1
        elif outcome.status != "refused":
            row.errors[outcome.status] += 1
            row.samples.setdefault(outcome.status, f"{outcome.kind}: {outcome.detail}")
        if outcome.answers > 1:
            row.twice += 1
        if outcome.status != "ok" or outcome.ended - outcome.sent > SLOW_S:
            disturbed_until = max(disturbed_until, outcome.ended)
    row.recovery_s = disturbed_until - fault_at
    row.ran_twice = sum(1 for n in executions(where).values() if n > 1)
    return row


def child_pid(server: Server, module: str) -> int:
    """The pid of one of the server's children running ``python -m <module>``."""
    found = children_running(server, module)
    if found:
        return found[0]
    raise AssertionError(f"no {module} process:\n{server.log()[-3000:]}")


@dataclass
class Deployment:
    """``sluice serve`` (two gateways on one port pair, ``ledger`` with two instances, a
    job worker) on a private Redis; :attr:`where` holds its files."""

    redis: PrivateRedis
    server: Server
    where: Path

    def restart_server(self) -> None:
        """Start ``sluice serve`` again on the same ports, Redis and key prefix."""
        old = self.server
        self.server = start_server(
            self.where / "repo", self.redis.url, self.where / "serve-2.log",
            *SERVE_FLAGS, env=serve_env(self.where), key_prefix=old.key_prefix,
            ports=(old.http_port, old.grpc_port, old.metrics_port),
        )  # fmt: skip
        self.server.owns_prefix = True


#: a job worker's settings under which a killed worker's jobs come back within seconds
FAST_JOB_RECOVERY = {
    "SLUICE_JOB_WORKER__VISIBILITY_TIMEOUT_S": "4",
    "SLUICE_JOB_WORKER__LEASE_S": "2",
    "SLUICE_JOB_WORKER__RETRY_BACKOFF_MAX_S": "2",
}
SERVE_FLAGS = ("--gateway-processes", "2", "--request-timeout-secs", str(REQUEST_TIMEOUT_S))


def serve_env(where: Path) -> dict[str, str]:
    """The server's environment: the ledger folder, a job worker that gets a killed
    worker's jobs back within seconds."""
    return {
        "LEDGER_DIR": str(where / "ledger"),
        **FAST_JOB_RECOVERY,
    }


@contextlib.contextmanager
def deployment(where: Path) -> Iterator[Deployment]:
    """A :class:`Deployment` in ``where``, stopped (its keys deleted) afterwards."""
    with private_redis() as broker:
        repo = ledger_repo(where)
        server = start_server(
            repo, broker.url, where / "serve.log", *SERVE_FLAGS, env=serve_env(where)
        )
        deployed = Deployment(broker, server, where)
        deadline = time.monotonic() + 30  # both gateways listen, so clients spread over both
        while server.log().count("Started GRPCInferenceService") < 2:
            assert time.monotonic() < deadline, server.log()[-3000:]
            time.sleep(0.1)
        try:
            yield deployed
        finally:
            with contextlib.suppress(Exception):
                stop_server(deployed.server)


def _kill_instance(d: Deployment) -> None:
    records = instance_records(d.server, "ledger")
    pid = next(r["pid"] for r in records.values() if r.get("state") == "READY")
    os.kill(int(pid), signal.SIGKILL)


def _connections(pid: int, ports: set[int]) -> int:
    """Established TCP connections process ``pid`` holds on one of its local ``ports``
    (``/proc/<pid>/fd`` socket inodes matched against ``/proc/net/tcp{,6}``)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    count = 0
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table_path).read_text().splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and local_port in ports and fields[9] in inodes:
                    count += 1
    return count


def _kill_gateway(d: Deployment) -> None:
    """SIGKILL the gateway holding the most client connections."""
    ports = {d.server.http_port, d.server.grpc_port}
    busiest = max(
        children_running(d.server, "sluice.api.gateway"), key=lambda pid: _connections(pid, ports)
    )
    assert _connections(busiest, ports) > 0, "no client connection on a gateway"
    os.kill(busiest, signal.SIGKILL)


def _kill_job_worker(d: Deployment) -> None:
    os.kill(child_pid(d.server, "sluice.job_workers.main"), signal.SIGKILL)


def _restart_redis_keeping_data(d: Deployment) -> None:
    with contextlib.suppress(redis.exceptions.ConnectionError):
        d.redis.client().shutdown(save=True)
    assert d.redis.process is not None
    d.redis.process.wait(10)
    time.sleep(1.0)
    d.redis.start()  # loads the dump it saved


def _restart_redis_empty(d: Deployment) -> None:
    d.redis.stop()
    time.sleep(1.0)
    d.redis.start()


def _fill_redis(d: Deployment) -> None:
    """Redis filled to ``maxmemory`` (``noeviction``): 4 MB of filler, then the limit set
    just below what it holds, so every command that needs memory fails with OOM; held
    3 s, then the filler deleted and the limit lifted."""
    client = d.redis.client()
    filler = f"{d.server.key_prefix}faults:filler"
    try:
        client.config_set("maxmemory-policy", "noeviction")
        for _ in range(64):
            client.rpush(filler, b"x" * 65536)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used - 1024 * 1024))
        with contextlib.suppress(redis.exceptions.ResponseError):
            client.set(f"{d.server.key_prefix}faults:probe", b"x")
            raise AssertionError("Redis still takes writes")
        time.sleep(3.0)
    finally:
        client.delete(filler)
        client.config_set("maxmemory", "0")
        client.close()


def _freeze_redis(d: Deployment) -> None:
    assert d.redis.process is not None
    os.kill(d.redis.process.pid, signal.SIGSTOP)
    time.sleep(5.0)
    os.kill(d.redis.process.pid, signal.SIGCONT)


def _kill_supervisor(d: Deployment) -> None:
    """SIGKILL ``sluice serve`` (its children die with it), then start it again on the
    same ports and prefix (it waits for the old lease to lapse)."""
    d.server.process.kill()
    d.server.process.wait(10)
    d.restart_server()


#: fault name -> (what it does, job load alongside)
FAULTS: dict[str, tuple[Callable[[Deployment], None], bool]] = {
    "SIGKILL an instance": (_kill_instance, False),
    "SIGKILL a gateway (of two on one port)": (_kill_gateway, False),
    "SIGKILL the job worker": (_kill_job_worker, True),
    "Redis restarted with its data": (_restart_redis_keeping_data, False),
    "Redis restarted empty": (_restart_redis_empty, False),
    "Redis full (maxmemory, noeviction) for 3 s": (_fill_redis, False),
    "Redis frozen (SIGSTOP) for 5 s": (_freeze_redis, False),
    "SIGKILL the supervisor, started again": (_kill_supervisor, False),
}


def run_fault(
    name: str, where: Path, warm_s: float = 1.5, settle_timeout_s: float = 60.0
) -> FaultRow:
    """One fault on a fresh deployment under load: ``warm_s`` of load, the fault, then
    load until every kind answers ok again (``settle_timeout_s`` at most) and 1 s more."""
    inject, jobs = FAULTS[name]
    where.mkdir(parents=True, exist_ok=True)
    with deployment(where) as d:
        load = Load(d.server, jobs=1 if jobs else 0)
        load.start()
        try:
            time.sleep(warm_s)
            fault_at = time.monotonic()
            inject(d)
            injected = time.monotonic()
            deadline = injected + settle_timeout_s
            while not load.healthy_since(injected) and time.monotonic() < deadline:
                time.sleep(0.2)
            recovered = load.healthy_since(injected)
            time.sleep(1.0)
        finally:
            load.stop()
    row = summarize(name, load, fault_at, where)
    row.recovered = recovered
    row.restarts = sum(
        log.read_text(errors="replace").count("exited with code") for log in where.glob("*.log")
    )
    return row
