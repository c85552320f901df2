"""The compose stack, built and run for real: compose/docker-compose.yml on a local base
image, driven with tritonclient through its published ports.

Builds the images (layers cached between runs), starts the stack, waits for readiness,
runs examples/client.py against it (exact match with in-process ONNX Runtime), runs an
async job on the job worker service and polls it to SUCCESS (Flower, started with the
flower profile, lists its task), scales
the digits instances 1 -> 3, SIGKILLs one instance container and scales back to 1 under
a bounded load that must lose no request, then takes the stack down and finds no
container, network or volume of it left. Skipped where Docker cannot run.

Run it alone: ``.venv/bin/python -m pytest -m docker``.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import requests
from docker_support import (
    COMPOSE_DIR,
    ROOT,
    DockerUnavailable,
    bridge_works,
    compose_command,
    docker_engine,
    make_base_image,
    project_leftovers,
)

from sluice.broker.redis_server import free_port

pytestmark = pytest.mark.docker

#: longest wait for the stack to be ready after `up`, in s
READY_S = 240.0
#: longest wait for the instances to reach a count after scaling, in s
SCALE_S = 120.0
#: longest wait for an async job to finish, and for the jobs service to be healthy, in s
JOB_S = 90.0
#: images per request of the load
BATCH = 4


@dataclass
class Stack:
    """A running compose project."""

    compose: list[str]
    env: dict[str, str]
    project: str
    http_port: int
    metrics_port: int
    down: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
        """Run the compose tool on the stack; fails the test with its output on an error."""
        result = subprocess.run(
            [*self.compose, *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=COMPOSE_DIR,
            timeout=timeout_s,
            check=False,
        )
        assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result

    def logs(self) -> str:
        """The last lines of every service's log."""
        result = subprocess.run(
            [*self.compose, "logs", "--no-color", "--tail", "40"],
            capture_output=True, text=True, env=self.env, cwd=COMPOSE_DIR, check=False,
        )  # fmt: skip
        return result.stdout + result.stderr

    def containers(self, service: str) -> list[str]:
        """Ids of the service's running containers."""
        return self.run("ps", "-q", service).stdout.split()

    def live_instances(self, model: str) -> int:
        """``sluice_instances_live`` of the model, read through the published metrics port."""
        text = requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        line = rf'^sluice_instances_live{{model="{model}",version="1"}} (\d+)'
        found = re.search(line, text, re.M)
        return int(found.group(1)) if found else 0

    def wait_instances(self, model: str, count: int) -> None:
        """Wait until exactly ``count`` instances of the model are live."""
        deadline = time.monotonic() + SCALE_S
        seen = -1
        while time.monotonic() < deadline:
            try:
                seen = self.live_instances(model)
            except requests.RequestException:
                seen = -1
            if seen == count:
                return
            time.sleep(0.5)
        raise AssertionError(f"{model}: {seen} live instances, not {count}\n{self.logs()}")


def _model_repository(where: Path) -> Path:
    """The example models, readable by the image's non-root user."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import build_models
    finally:
        sys.path.pop(0)
    repo = where / "models"
    build_models.build_digits(repo)
    build_models.build_add_sub(repo)
    for path in [repo, *repo.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return repo


def _environment(project: str, base: str, repo: Path, bridge: bool) -> dict[str, str]:
    ports = {
        name: str(free_port()) for name in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "FLOWER_PORT")
    }
    env = {
        **os.environ,
        **ports,
        "COMPOSE_PROJECT_NAME": project,
        "BASE_IMAGE": base,
        "MODEL_REPOSITORY": str(repo),
        "SLUICE_ADMIN_KEY": secrets.token_hex(16),  # the restricted APIs' secret
    }
    if not bridge:  # every service on 127.0.0.1, on free ports of its own
        redis_port = str(free_port())
        env |= {
            "REDIS_BIND": "127.0.0.1",
            "REDIS_PORT": redis_port,
            "SLUICE_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "GATEWAY_ADDRESS": "127.0.0.1",
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_HTTP_PORT": str(free_port()),
            "GATEWAY_GRPC_PORT": str(free_port()),
            "GATEWAY_METRICS_PORT": str(free_port()),
            "PROXY_ADDRESS": "127.0.0.1",
            "PROXY_HTTP_PORT": ports["HTTP_PORT"],
            "PROXY_GRPC_PORT": ports["GRPC_PORT"],
            "PROXY_METRICS_PORT": ports["METRICS_PORT"],
            "FLOWER_ADDRESS": "127.0.0.1",
            "FLOWER_INTERNAL_PORT": ports["FLOWER_PORT"],
            "DNS_SERVER": "127.0.0.1:53",
        }
    return env


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack, built and up; taken down at the end whatever happened."""
    where = tmp_path_factory.mktemp("compose")
    try:
        with docker_engine(where / "dockerd.log"):
            compose = compose_command()
            started = time.monotonic()
            base = make_base_image()
            timings = {"base image": time.monotonic() - started}
            bridge = bridge_works()
            files = ["-f", "docker-compose.yml"]
            if not bridge:
                files += ["-f", str(Path(__file__).parent / "host-network.yml")]
            files += ["--profile", "flower"]  # built and started with the rest
            project = f"sluicetest{uuid.uuid4().hex[:8]}"
            env = _environment(project, base, _model_repository(where), bridge)
            stack = Stack(
                [*compose, *files], env, project, int(env["HTTP_PORT"]),
                int(env["METRICS_PORT"]), timings=timings,
            )  # fmt: skip
            try:
                started = time.monotonic()
                stack.run("build")
                timings["build"] = time.monotonic() - started
                started = time.monotonic()
                stack.run("up", "-d")
                _wait_ready(stack)
                timings["up until ready"] = time.monotonic() - started
                yield stack
            finally:
                if not stack.down:
                    subprocess.run(
                        [*stack.compose, "down", "-v", "--remove-orphans", "--timeout", "20"],
                        capture_output=True, env=env, cwd=COMPOSE_DIR, check=False,
                    )  # fmt: skip
                print("compose stack timings (s):", {k: round(v, 1) for k, v in timings.items()})
    except DockerUnavailable as exc:
        pytest.skip(f"Docker cannot run here: {exc}")


def _wait_ready(stack: Stack) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{stack.http_port}/v2/health/ready"
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise AssertionError(f"the stack was not ready within {READY_S:.0f} s\n{stack.logs()}")


def test_client_matches_in_process_onnxruntime(stack: Stack) -> None:
    result = subprocess.run(
        [sys.executable, "examples/client.py", "--url", f"127.0.0.1:{stack.http_port}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "match: exact" in result.stdout, result.stdout


def test_an_async_job_runs_on_the_jobs_service(stack: Stack) -> None:
    """A single job submitted through the published port runs on the ``jobs`` service (the
    ``sluice`` service starts no job worker) and is polled to SUCCESS with add_sub's
    outputs; the service's own health check (a Celery ping) says healthy, and Flower
    lists the job's task."""
    base = f"http://127.0.0.1:{stack.http_port}"
    a = [float(i) for i in range(16)]
    b = [0.5] * 16
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": a},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": b},
        ]
    }
    submitted = requests.post(f"{base}/v2/models/add_sub/jobs", json=body, timeout=10)
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert submitted.headers["location"] == f"/v2/jobs/{job['id']}"
    deadline = time.monotonic() + JOB_S
    while job["state"] not in ("SUCCESS", "FAILURE", "REVOKED"):
        assert time.monotonic() < deadline, f"job still {job['state']}\n{stack.logs()}"
        time.sleep(0.5)
        job = requests.get(f"{base}/v2/jobs/{job['id']}", timeout=10).json()
    assert job["state"] == "SUCCESS", job
    outputs = {o["name"]: o for o in job["outputs"]}
    assert outputs["OUTPUT0"]["data"] == [x + y for x, y in zip(a, b, strict=True)]
    assert outputs["OUTPUT1"]["data"] == [x - y for x, y in zip(a, b, strict=True)]
    (worker,) = stack.containers("jobs")
    while (health := _health(worker)) != "healthy":
        assert time.monotonic() < deadline, f"jobs service {health}\n{stack.logs()}"
        time.sleep(1)
    _flower_shows(stack, job["id"])


def _flower_shows(stack: Stack, job_id: str) -> None:
    """Flower (profile flower) turns healthy and lists the job's Celery task (the job id
    is the task id) as SUCCESS, run by a worker of the jobs service."""
    flower = f"http://127.0.0.1:{stack.env['FLOWER_PORT']}"
    query = (
        "draw=1&start=0&length=50&search%5Bvalue%5D=&order%5B0%5D%5Bcolumn%5D=0"
        "&order%5B0%5D%5Bdir%5D=asc&columns%5B0%5D%5Bdata%5D=name"
    )
    deadline = time.monotonic() + JOB_S
    tasks: dict[str, dict] = {}
    while tasks.get(job_id, {}).get("state") != "SUCCESS":
        assert time.monotonic() < deadline, f"Flower shows {tasks}\n{stack.logs()}"
        time.sleep(1)
        try:
            if requests.get(f"{flower}/healthcheck", timeout=5).text != "OK":
                continue
            rows = requests.get(f"{flower}/tasks/datatable?{query}", timeout=5).json()["data"]
        except (requests.RequestException, ValueError):
            continue
        tasks = {row["uuid"]: row for row in rows}
    assert tasks[job_id]["name"] == "sluice.jobs.run"
    assert tasks[job_id]["worker"].startswith("jobs-"), tasks[job_id]


def _health(container: str) -> str:
    result = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Health.Status}}", container],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return result.stdout.strip()


class Load:
    """Bounded load on the digits model through the published HTTP port: ``clients``
    threads, each one request of :data:`BATCH` images at a time with a pause between,
    every answer checked against in-process ONNX Runtime."""

    def __init__(self, http_port: int, images: np.ndarray, labels: np.ndarray) -> None:
        self.url = f"127.0.0.1:{http_port}"
        self.images, self.labels = images, labels
        self.sent = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(3)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        assert not any(t.is_alive() for t in self._threads), "a request hung"

    def _loop(self, worker: int) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, network_timeout=120)
        i = worker
        try:
            while not self._stop.is_set():
                rows = [(i * BATCH + k) % len(self.images) for k in range(BATCH)]
                tensor = httpclient.InferInput("input", [BATCH, 64], "FP32")
                tensor.set_data_from_numpy(self.images[rows])
                try:
                    answer = client.infer("digits", [tensor]).as_numpy("label").reshape(-1)
                    problem = None if np.array_equal(answer, self.labels[rows]) else "wrong"
                except Exception as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    self.sent += 1
                    if problem:
                        self.failures.append(f"request {i}: {problem}")
                i += 3
                time.sleep(0.02)
        finally:
            client.close()


def test_scaling_and_a_killed_instance_lose_no_request(stack: Stack) -> None:
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import build_models
    finally:
        sys.path.pop(0)
    _, images, _, _ = build_models._digits_split()
    images = images.astype(np.float32)
    model = Path(stack.env["MODEL_REPOSITORY"]) / "digits/1/model.onnx"
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    labels = session.run(["label"], {"input": images})[0].reshape(-1)

    stack.wait_instances("digits", 1)
    started = time.monotonic()
    with Load(stack.http_port, images, labels) as load:
        time.sleep(2)
        stack.run("up", "-d", "--no-recreate", "--scale", "digits=3", "digits")
        stack.wait_instances("digits", 3)
        time.sleep(3)
        victim = stack.containers("digits")[-1]
        subprocess.run(["docker", "kill", "--signal", "KILL", victim], check=True,
                       capture_output=True)  # fmt: skip
        time.sleep(10)  # its heartbeat goes stale (5 s), its peers claim what it held
        stack.run("up", "-d", "--no-recreate", "--scale", "digits=1", "digits")
        stack.wait_instances("digits", 1)
        time.sleep(2)
    stack.timings["scale and kill under load"] = time.monotonic() - started
    assert load.sent > 100, f"only {load.sent} requests sent"
    assert not load.failures, f"{len(load.failures)} of {load.sent} lost: {load.failures[:5]}"


def test_down_leaves_nothing(stack: Stack) -> None:
    started = time.monotonic()
    stack.run("down", "-v", "--remove-orphans", "--timeout", "20")
    stack.down = True
    stack.timings["down"] = time.monotonic() - started
    left = project_leftovers(stack.project)
    assert left == {"containers": [], "networks": [], "volumes": []}, left
