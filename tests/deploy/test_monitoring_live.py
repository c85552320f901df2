"""The compose stack's monitoring profile run for real: Debian's ``prometheus`` binary with
the project's own ``compose/prometheus/prometheus.yml`` scraping the two gateways of a
deployment laid out as the compose stack runs it (``sluice serve`` publishing add_sub
with no gateway and no instance, two ``sluice gateway`` replicas, a ``sluice worker``),
queried through Prometheus's HTTP API: the queue-depth gauge counts the requests sent
before any instance runs, then the success counter counts them once one does.

The compose file finds the gateway replicas through Docker's DNS (``dns_sd_configs`` on
the ``gateway`` service name); here the same scrape job gets the two gateways' metrics
addresses as static targets instead, every other setting (job name, metrics path,
scrape interval) as committed. Skipped where no ``prometheus`` binary is installed
(``apt-get install prometheus``; ``.ci/run`` installs it as root). Grafana has no Debian
package: its dashboard stays checked by configuration (tests/unit/test_monitoring_config.py),
and this test checks that every metric name the dashboard queries has a series here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import yaml
from e2e_support import ROOT, Server, load_examples, load_module, start_server, stop_server

from sluice.broker.redis_server import free_port

pytestmark = pytest.mark.e2e

PROMETHEUS = shutil.which("prometheus")
CONFIG = ROOT / "compose/prometheus/prometheus.yml"
#: add_sub inferences sent through each gateway
PER_GATEWAY = 3
#: the bound on every wait below, in seconds
DEADLINE_S = 30.0


def render_config(metrics_addresses: list[str], out: Path) -> Path:
    """Write the committed Prometheus config to ``out`` with its one scrape job's DNS
    discovery of the ``gateway`` service replaced by static ``host:port`` targets.

    Raises:
        AssertionError: the committed file no longer has one job discovering ``gateway``.
    """
    config = yaml.safe_load(CONFIG.read_text())
    (job,) = config["scrape_configs"]
    (discovery,) = job.pop("dns_sd_configs")
    assert discovery["names"] == ["gateway"], discovery
    job["static_configs"] = [{"targets": metrics_addresses}]
    out.write_text(yaml.safe_dump(config))
    return out


def query(base: str, promql: str) -> list[dict]:
    """The instant vector ``promql`` evaluates to (``/api/v1/query``): a list of
    ``{"metric": labels, "value": [time, "text"]}``."""
    response = requests.get(f"{base}/api/v1/query", params={"query": promql}, timeout=10)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "success", body
    assert body["data"]["resultType"] == "vector", body
    return body["data"]["result"]


def values_by_instance(result: list[dict]) -> dict[str, float]:
    """``instance`` label (the scraped ``host:port``) -> sample value."""
    return {s["metric"]["instance"]: float(s["value"][1]) for s in result}


def wait_for(base: str, promql: str, expected: dict[str, float]) -> dict[str, float]:
    """Poll ``promql`` until its values by instance equal ``expected`` (new scrapes come
    every scrape interval) or :data:`DEADLINE_S` passed; the last values seen."""
    deadline = time.monotonic() + DEADLINE_S
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        seen = values_by_instance(query(base, promql))
        if seen == expected:
            break
        time.sleep(0.5)
    return seen


def _wait_http(url: str, what: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}:\n{log.read_text()}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} not ready within {DEADLINE_S} s:\n{log.read_text()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def _start_gateway(
    redis_url: str, key_prefix: str, log: Path
) -> tuple[subprocess.Popen[bytes], int, int]:
    """A ``sluice gateway`` (the compose ``gateway`` service) on free loopback ports:
    (process, HTTP port, metrics port)."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [
                sys.executable, "-m", "sluice.cli", "gateway",
                "--http-address", "127.0.0.1", "--http-port", str(http_port),
                "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
                "--metrics-port", str(metrics_port),
                "--redis-url", redis_url, "--key-prefix", key_prefix,
            ],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    _wait_http(f"http://127.0.0.1:{http_port}/v2/health/live", "gateway", gateway, log)
    return gateway, http_port, metrics_port


@dataclass
class Deployment:
    """The compose stack's processes without Docker: ``sluice serve`` publishing add_sub
    (no gateway, no instance), two ``sluice gateway`` replicas, and the command that
    starts an add_sub instance (``sluice worker``)."""

    server: Server
    http_ports: list[int]
    metrics_ports: list[int]
    worker_command: list[str]
    env: dict[str, str]


@pytest.fixture
def deployment(redis_url: str, tmp_path: Path) -> Iterator[Deployment]:
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary (Debian: apt-get install prometheus)")
    repo = tmp_path / "models"
    load_examples().build_add_sub(repo)  # type: ignore[attr-defined]
    server = start_server(
        repo, redis_url, tmp_path / "serve.log", "--start-gateway=false",
        "--start-instances=false", "--job-workers", "0", wait_ready=False,
    )  # fmt: skip
    gateways: list[tuple[subprocess.Popen[bytes], int, int]] = []
    try:
        for i in range(2):
            gateways.append(_start_gateway(redis_url, server.key_prefix, tmp_path / f"gw{i}.log"))
        yield Deployment(
            server,
            [g[1] for g in gateways],
            [g[2] for g in gateways],
            [sys.executable, "-m", "sluice.cli", "worker", "--model", "add_sub",
             "--version", "1", "--model-dir", str(repo / "add_sub")],
            {**os.environ, "SLUICE_REDIS__URL": redis_url,
             "SLUICE_REDIS__KEY_PREFIX": server.key_prefix},
        )  # fmt: skip
    finally:
        for gateway, _, _ in gateways:
            _stop(gateway)
        assert stop_server(server) == 0, server.log()


@pytest.fixture
def prometheus(deployment: Deployment, tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """Debian's Prometheus on the rendered config: (its base URL, the scraped targets)."""
    targets = [f"127.0.0.1:{port}" for port in deployment.metrics_ports]
    config = render_config(targets, tmp_path / "prometheus.yml")
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(PROMETHEUS), f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/-/ready", "prometheus", process, log)
        yield base, targets
    finally:
        _stop(process)


def _infer(client: httpclient.InferenceServerClient, a: np.ndarray, b: np.ndarray) -> None:
    inputs = [httpclient.InferInput(n, list(a.shape), "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_prometheus_scrapes_both_gateways_with_the_dashboards_metrics(
    deployment: Deployment, prometheus: tuple[str, list[str]], tmp_path: Path
) -> None:
    base, targets = prometheus
    rng = np.random.default_rng(39)
    pairs = rng.standard_normal((2 * PER_GATEWAY, 2, 1, 16), dtype=np.float32)
    ports = [port for port in deployment.http_ports for _ in range(PER_GATEWAY)]

    def send(i: int) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports[i]}", network_timeout=60)
        try:
            _infer(client, pairs[i][0], pairs[i][1])
        finally:
            client.close()

    both = dict.fromkeys(targets, 1.0)
    assert wait_for(base, 'up{job="sluice"}', both) == both
    depth = 'sluice_queue_depth{model="add_sub",version="1"}'
    worker: subprocess.Popen[bytes] | None = None
    with ThreadPoolExecutor(len(ports)) as pool:
        sent = [pool.submit(send, i) for i in range(len(ports))]
        try:
            # no instance yet: every request waits in the model's queue, and every
            # gateway reports the whole queue
            queued = dict.fromkeys(targets, float(len(ports)))
            assert wait_for(base, depth, queued) == queued
            with (tmp_path / "worker.log").open("wb") as log:
                worker = subprocess.Popen(
                    deployment.worker_command, env=deployment.env,
                    stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                )  # fmt: skip
            for future in sent:
                future.result(timeout=DEADLINE_S)
        finally:
            if worker is None:  # let the waiting requests end
                worker = subprocess.Popen(deployment.worker_command, env=deployment.env)
    try:
        # each gateway reports the deployment's totals, so both targets show every request
        total = dict.fromkeys(targets, float(len(ports)))
        success = 'nv_inference_request_success{model="add_sub",version="1"}'
        assert wait_for(base, success, total) == total
        empty = dict.fromkeys(targets, 0.0)
        assert wait_for(base, depth, empty) == empty
        live = 'sluice_instances_live{model="add_sub",version="1"}'
        assert wait_for(base, live, both) == both
        # the failure panel's series: the four reasons on every gateway, none counted
        failures = query(base, 'nv_inference_request_failure{model="add_sub"}')
        reasons = {(s["metric"]["instance"], s["metric"]["reason"]) for s in failures}
        assert reasons == {
            (t, r) for t in targets for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
        }
        assert {float(s["value"][1]) for s in failures} == {0.0}

        checks = load_module("tests/unit/test_monitoring_config.py", "monitoring_config")
        names = set().union(*(checks.queried_metric_names(q) for q in checks.dashboard_queries()))  # type: ignore[attr-defined]
        assert "sluice_queue_depth" in names and "nv_inference_request_success" in names
        missing = sorted(n for n in names if not query(base, f'{n}{{job="sluice"}}'))
        assert missing == [], f"dashboard metrics with no series in Prometheus: {missing}"
    finally:
        _stop(worker)
