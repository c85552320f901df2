"""A deployment on separate hosts (:mod:`hosts_support`) and the load that drives it.

The model, ``hostecho``, sleeps :data:`SLEEP_MS` per batch and answers ``OUT = 2 × IN``
and ``WHO``, the instance that ran it, so every answer shows whose request it answers
and where it ran. :class:`Load` drives gateways with ``tritonclient.http`` clients and
records every request's outcome; the checks read answers and statistics.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis
import requests
from hosts_support import Host, HostNetwork

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


def until(check: object, timeout_s: float, what: str, every_s: float = 0.05) -> float:
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
