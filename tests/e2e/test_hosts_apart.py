"""Gateways and instances on separate hosts (network namespaces), under load.

Redis and the ``sluice serve`` control plane (``--start-gateway=false
--start-instances=false``) run on one host, a ``sluice gateway`` on each of two more, and
a ``sluice worker`` on each of two (three) more, every host with its own address on one
switch (:mod:`hosts_support`). ``tritonclient.http`` clients drive both gateways from
the test's own namespace while hosts are cut off and restored, or killed. The model
sleeps a fixed time per batch and answers ``OUT = 2 × IN`` and ``WHO``, the instance
that ran it, so every answer shows whose request it answers and where it ran.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis
import requests
from hosts_support import Host, HostNetwork, namespaces_unavailable

_UNAVAILABLE = namespaces_unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or "")

MODEL = "hostecho"
PREFIX = "sluice-hosts:"
#: the model's fixed time per batch, in ms
SLEEP_MS = 20
#: an instance whose heartbeat is older is taken for dead (``sluice worker`` default), in s
STALE_S = 5.0

MODEL_PY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.who = args["model_instance_name"].encode()
        config = json.loads(args["model_config"])
        self.sleep_s = float(config["parameters"]["sleep_ms"]["string_value"]) / 1000.0

    def execute(self, requests):
        time.sleep(self.sleep_s)
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            who = np.full((data.shape[0], 1), self.who, dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", data * 2), pb_utils.Tensor("WHO", who)]
            ))
        return responses
"""

CONFIG = f"""name: "{MODEL}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [
  {{ name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] }},
  {{ name: "WHO", data_type: TYPE_STRING, dims: [ 1 ] }}
]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
parameters {{ key: "sleep_ms" value: {{ string_value: "{SLEEP_MS}" }} }}
"""


def _until(check: object, timeout_s: float, what: str, every_s: float = 0.05) -> float:
    """Poll ``check()`` until true; the monotonic time it was. Errors count as false.

    Raises:
        AssertionError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return time.monotonic()
        except Exception:
            pass
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s} s")


def ready_status(host: Host) -> int | None:
    """The gateway's ``/v2/health/ready`` status code, None when it cannot be reached."""
    try:
        return requests.get(f"http://{host.address}:8000/v2/health/ready", timeout=3).status_code
    except requests.RequestException:
        return None


@dataclass
class Deployment:
    """The hosts of one test and what runs on them."""

    net: HostNetwork
    repo: Path
    logs: Path
    redis_url: str

    def host(self, name: str) -> Host:
        return self.net.hosts[name]

    def start_worker(self, name: str) -> None:
        """A ``sluice worker`` of the model on host ``name``, named after the host."""
        self.net.run(
            self.host(name),
            [sys.executable, "-m", "sluice.cli", "worker", "--model", MODEL, "--version", "1",
             "--model-dir", str(self.repo / MODEL), "--instance", name,
             "--redis-url", self.redis_url, "--key-prefix", PREFIX,
             "--stale-instance-secs", str(STALE_S)],
            self.logs / f"{name}.log",
        )  # fmt: skip

    def start_gateway(self, name: str) -> None:
        """A ``sluice gateway`` on host ``name``, on ports 8000-8002 of its address."""
        self.net.run(
            self.host(name),
            [sys.executable, "-m", "sluice.cli", "gateway", "--http-address", "0.0.0.0",
             "--http-port", "8000", "--grpc-port", "8001", "--metrics-port", "8002",
             "--redis-url", self.redis_url, "--key-prefix", PREFIX],
            self.logs / f"{name}.log",
        )  # fmt: skip

    def instance_record(self, name: str) -> dict | None:
        """The instance record of instance ``name`` (state, pid, heartbeat) in Redis."""
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        try:
            raw = client.hget(f"{PREFIX}{{{MODEL}}}:instances:1", name)
        finally:
            client.close()
        return None if raw is None else json.loads(raw)

    def logs_text(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.logs.iterdir()))  # fmt: skip


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Redis + control plane on host ``redis``, gateways on ``gw1`` and ``gw2``,
    instances on ``in1`` and ``in2``, an empty host ``in3``; all ready. Every process
    and namespace is removed afterwards, also when the test failed."""
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        pytest.skip("redis-server is not installed")
    repo = tmp_path / "models"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1/model.py").write_text(MODEL_PY)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    logs = tmp_path / "logs"
    logs.mkdir()
    net = HostNetwork()
    try:
        for name in ("redis", "gw1", "gw2", "in1", "in2", "in3"):
            net.add_host(name)
        redis_host = net.hosts["redis"]
        url = f"redis://{redis_host.address}:6379/0"
        deployment = Deployment(net, repo, logs, url)
        net.run(
            redis_host,
            [redis_server, "--bind", "0.0.0.0", "--port", "6379", "--protected-mode", "no",
             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
            logs / "redis.log",
        )  # fmt: skip
        _until(lambda: redis.Redis.from_url(url, socket_timeout=1).ping(), 30, "Redis answers")
        net.run(
            redis_host,
            [sys.executable, "-m", "sluice.cli", "serve", "--model-repository", str(repo),
             "--start-gateway=false", "--start-instances=false", "--job-workers", "0",
             "--redis-url", url, "--key-prefix", PREFIX, "--exit-timeout-secs", "10"],
            logs / "serve.log",
        )  # fmt: skip
        for name in ("in1", "in2"):
            deployment.start_worker(name)
        for name in ("gw1", "gw2"):
            deployment.start_gateway(name)
        for name in ("gw1", "gw2"):
            host = net.hosts[name]
            try:
                _until(lambda h=host: ready_status(h) == 200, 120, f"{name} ready", 0.2)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{deployment.logs_text()}") from None
        yield deployment
    finally:
        for host in net.hosts.values():
            net.stop(host, timeout_s=10)
        net.close()


@dataclass
class Outcome:
    """One request of the load: its value, gateway, times (monotonic s) and answer."""

    value: int
    gateway: str
    sent: float
    done: float
    out: float | None = None
    who: str | None = None
    error: str | None = None


class Load:
    """``threads_per_gateway`` tritonclient.http clients per gateway, each sending one
    request after the other (distinct values) until :meth:`stop`; a failed request is
    followed by a 0.2 s pause."""

    def __init__(self, gateways: list[Host], threads_per_gateway: int = 3) -> None:
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(g, i * 1_000_000 + n * 100_000), daemon=True)
            for i, g in enumerate(gateways)
            for n in range(threads_per_gateway)
        ]
        for n, thread in enumerate(self._threads):
            thread.name = f"load-{n}"

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self, gateway: Host, base: int) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(
            f"{gateway.address}:8000", network_timeout=60, connection_timeout=5
        )
        i = 0
        try:
            while not self._stop.is_set():
                value = base + i
                i += 1
                tensor = httpclient.InferInput("IN", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
                sent = time.monotonic()
                outcome = Outcome(value, gateway.name, sent, sent)
                try:
                    result = client.infer(MODEL, [tensor])
                    outcome.out = float(result.as_numpy("OUT")[0, 0])
                    outcome.who = result.as_numpy("WHO")[0, 0].decode()
                except Exception as exc:
                    outcome.error = f"{type(exc).__name__}: {exc}"
                outcome.done = time.monotonic()
                with self._lock:
                    self.outcomes.append(outcome)
                if outcome.error is not None:
                    time.sleep(0.2)
                    client.close()
                    client = httpclient.InferenceServerClient(
                        f"{gateway.address}:8000", network_timeout=60, connection_timeout=5
                    )
        finally:
            client.close()

    def stop(self) -> None:
        """Stop sending and wait (bounded) for every request in flight."""
        self._stop.set()
        for thread in self._threads:
            thread.join(90)
        assert not any(t.is_alive() for t in self._threads), "a request got no answer in 90 s"

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def answered_by(self, who: str, after: float) -> bool:
        """Whether a request sent after ``after`` was answered by instance ``who``."""
        return any(o.who == who and o.sent > after for o in self.snapshot())


def model_stats(gateway: Host) -> dict:
    """The model's statistics as one gateway reports them (``/v2/models/m/stats``)."""
    reply = requests.get(f"http://{gateway.address}:8000/v2/models/{MODEL}/stats", timeout=10)
    reply.raise_for_status()
    return reply.json()["model_stats"][0]


def metric_value(gateway: Host, name: str) -> float:
    """The sum of one metric's series on a gateway's Prometheus endpoint."""
    text = requests.get(f"http://{gateway.address}:8002/metrics", timeout=10).text
    pattern = re.compile(rf"^{name}\{{[^}}]*model=\"{MODEL}\"[^}}]*\}} (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def check_answers(outcomes: list[Outcome]) -> list[Outcome]:
    """The answered outcomes, after checking each answers its own request (2 × IN)."""
    answered = [o for o in outcomes if o.error is None]
    wrong = [o for o in answered if o.out != 2.0 * o.value]
    assert not wrong, f"answers to other requests: {wrong[:5]}"
    return answered


def check_statistics_add_up(deployment: Deployment, answered: int, reruns: int) -> None:
    """Every gateway reports the same totals, counting each answered request once, plus
    at most ``reruns`` requests run again after their instance was taken for dead."""
    gateways = [deployment.host("gw1"), deployment.host("gw2")]
    gateways = [g for g in gateways if ready_status(g) is not None]
    seen = [model_stats(g)["inference_stats"]["success"]["count"] for g in gateways]
    assert len(set(seen)) == 1, f"gateways disagree on the success count: {seen}"
    assert answered <= seen[0] <= answered + reruns, (seen[0], answered, reruns)
    metrics = [metric_value(g, "nv_inference_request_success") for g in gateways]
    assert metrics == [float(seen[0])] * len(gateways), (metrics, seen)
    print(f"statistics: {seen[0]} successes counted, {answered} requests answered")


def test_host_cut_and_killed_under_load(deployment: Deployment) -> None:
    """Cut an instance host and a gateway host off and back, then kill an instance host
    and a gateway host, all under load: every request answered once and correctly (but
    those the killed gateway held), readiness true on every reachable gateway, and the
    work moves to the instance host that remains."""
    net = deployment.net
    gw1, gw2 = deployment.host("gw1"), deployment.host("gw2")
    in1, in2 = deployment.host("in1"), deployment.host("in2")
    with Load([gw1, gw2]) as load:
        start = time.monotonic()
        _until(lambda: load.answered_by("in1", start) and load.answered_by("in2", start),
               20, "both instance hosts used")  # fmt: skip

        # an instance host cut off for longer than the heartbeat bound, then back
        net.cut(in1)
        cut_at = time.monotonic()
        while time.monotonic() < cut_at + STALE_S + 2.0:
            assert ready_status(gw1) == 200 and ready_status(gw2) == 200
            time.sleep(0.5)
        # what was sent during the cut and answered before the restore, in2 ran
        recent = [o for o in load.snapshot() if o.sent > cut_at and o.who]
        assert recent and {o.who for o in recent} == {"in2"}, recent[-5:]
        net.restore(in1)
        restored_at = time.monotonic()
        _until(lambda: load.answered_by("in1", restored_at), 20, "in1 used again after restore")

        # a gateway host cut off and back: its clients wait, the other gateway serves
        net.cut(gw1)
        gw_cut_at = time.monotonic()
        assert ready_status(gw1) is None
        assert ready_status(gw2) == 200
        time.sleep(2.0)
        net.restore(gw1)
        _until(lambda: ready_status(gw1) == 200, 20, "gw1 ready after restore")
        _until(lambda: any(o.gateway == "gw1" and o.sent > gw_cut_at + 3 and o.who
                           for o in load.snapshot()), 20, "gw1 serves again")  # fmt: skip

        # an instance host killed: the work moves to in1
        net.kill(in2)
        killed_at = time.monotonic()
        time.sleep(STALE_S + 2.0)
        assert ready_status(gw1) == 200 and ready_status(gw2) == 200
        after_kill = [o for o in load.snapshot() if o.sent > killed_at and o.who]
        assert after_kill and {o.who for o in after_kill} == {"in1"}

        # a gateway host killed: its clients fail, the other gateway goes on
        gw2_killed_from = time.monotonic()
        net.kill(gw2)
        assert ready_status(gw2) is None and ready_status(gw1) == 200
        time.sleep(2.0)
    outcomes = load.snapshot()
    answered = check_answers(outcomes)
    failed = [o for o in outcomes if o.error is not None]
    # the only failures: requests the killed gateway held or that reached it after
    assert all(o.gateway == "gw2" and o.done >= gw2_killed_from for o in failed), failed[:5]
    assert not [o for o in outcomes if o.gateway == "gw1" and o.error], "gw1 failed requests"
    assert len(answered) > 100, len(answered)
    late = [o for o in answered if o.done - o.sent > 2.0]
    longest = max(o.done - o.sent for o in answered)
    assert longest < 30.0
    print(
        f"{len(answered)} answered, {len(failed)} failed at the killed gateway, "
        f"{len(late)} held > 2 s across a cut or kill, longest {longest:.1f} s"
    )
    # requests held across a cut or a kill waited, and were answered once, correctly
    assert late, "no request was held across the cuts"
    check_statistics_add_up(deployment, len(answered), reruns=len(late) + 8 * len(failed))

    # no instance left: the gateway says not ready, then a joining host brings it back
    net.kill(in1)
    # (Triton answers "not ready" with 400)
    _until(lambda: ready_status(gw1) == 400, STALE_S + 5, "gw1 not ready without instances")
    deployment.start_worker("in3")
    _until(lambda: ready_status(gw1) == 200, 120, "gw1 ready once in3 joined", 0.2)


def test_membership_join_and_leave(deployment: Deployment) -> None:
    """A host that joins is used within a second of its instance reporting READY; one
    that leaves (SIGTERM) or dies (SIGKILL) gets no more work; the statistics every
    gateway reports add up to the requests answered."""
    net = deployment.net
    gw1, gw2 = deployment.host("gw1"), deployment.host("gw2")
    with Load([gw1, gw2], threads_per_gateway=4) as load:
        start = time.monotonic()
        _until(lambda: load.answered_by("in1", start) and load.answered_by("in2", start),
               20, "both instance hosts used")  # fmt: skip
        deployment.start_worker("in3")
        ready_at = _until(
            lambda: (deployment.instance_record("in3") or {}).get("state") == "READY",
            120, "in3 READY", 0.02,
        )  # fmt: skip
        used_at = _until(lambda: load.answered_by("in3", ready_at - 1.0), 5, "in3 used")
        assert used_at - ready_at < 1.0, f"in3 first used {used_at - ready_at:.2f} s after READY"
        print(f"in3 first used {used_at - ready_at:.3f} s after its READY record was seen")

        # a clean leave: SIGTERM, it drains and exits; nothing sent after goes to it
        net.stop(deployment.host("in3"))
        left_at = time.monotonic()
        assert deployment.instance_record("in3")["state"] == "STOPPED"
        # a death: SIGKILL; nothing sent after goes to it
        net.kill(deployment.host("in2"))
        killed_at = time.monotonic()
        _until(lambda: load.answered_by("in1", killed_at + STALE_S), STALE_S + 10, "in1 serves")
        time.sleep(1.0)
    outcomes = load.snapshot()
    answered = check_answers(outcomes)
    assert len(answered) == len(outcomes), [o for o in outcomes if o.error][:5]
    assert not [o for o in answered if o.who == "in3" and o.sent > left_at]
    assert not [o for o in answered if o.who == "in2" and o.sent > killed_at]
    assert {o.who for o in answered} == {"in1", "in2", "in3"}
    claimed = [o for o in answered if o.done - o.sent > 2.0]
    check_statistics_add_up(deployment, len(answered), reruns=len(claimed))


def test_redis_host_cut_under_load(deployment: Deployment) -> None:
    """The Redis host cut off for a few seconds and back, under load: both gateways
    answer not ready (400) within the health deadline while they cannot reach it and
    ready again after; every request, those sent during the cut included, is answered
    once and correctly (the packets wait; no connection is refused or reset)."""
    net = deployment.net
    gw1, gw2 = deployment.host("gw1"), deployment.host("gw2")
    with Load([gw1, gw2]) as load:
        start = time.monotonic()
        _until(lambda: load.answered_by("in1", start) and load.answered_by("in2", start),
               20, "both instance hosts used")  # fmt: skip
        net.cut(deployment.host("redis"))
        cut_at = time.monotonic()
        for gateway in (gw1, gw2):
            _until(lambda g=gateway: ready_status(g) == 400, 5, f"{gateway.name} not ready")
        time.sleep(max(0.0, cut_at + 4.0 - time.monotonic()))
        net.restore(deployment.host("redis"))
        restored_at = time.monotonic()
        for gateway in (gw1, gw2):
            _until(lambda g=gateway: ready_status(g) == 200, 20, f"{gateway.name} ready again")
        back_at = time.monotonic()
        _until(lambda: load.answered_by("in1", back_at) and load.answered_by("in2", back_at),
               20, "both instance hosts used again")  # fmt: skip
        time.sleep(1.0)
    outcomes = load.snapshot()
    answered = check_answers(outcomes)
    assert len(answered) == len(outcomes), [o for o in outcomes if o.error][:5]
    held = [o for o in answered if o.sent < restored_at < o.done]
    assert held, "no request waited across the cut"
    print(
        f"{len(answered)} answered, {len(held)} across the Redis cut; ready again "
        f"{back_at - restored_at:.1f} s after the restore"
    )
    check_statistics_add_up(deployment, len(answered), reruns=0)
