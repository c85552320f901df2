"""The compose stack's monitoring profile run for real: Debian's ``prometheus`` binary with
the project's own ``compose/prometheus/prometheus.yml`` scraping two real gateways of a
``sluice serve`` deployment, queried through Prometheus's HTTP API.

The compose file finds the gateway replicas through Docker's DNS (``dns_sd_configs`` on
the ``gateway`` service name); here the same scrape job gets the two gateways' metrics
addresses as static targets instead, every other setting (job name, metrics path,
scrape interval) as committed. Skipped where no ``prometheus`` binary is installed
(``apt-get install prometheus``; ``.ci/run`` installs it as root). Grafana has no Debian
package: its dashboard stays checked by configuration (tests/unit/test_monitoring_config.py),
and this test checks that every metric name the dashboard queries has a series here.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
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


@pytest.fixture
def deployment(redis_url: str, tmp_path: Path) -> Iterator[tuple[Server, int, int]]:
    """``sluice serve`` on add_sub plus a second ``sluice gateway`` on the same key prefix:
    (server, second gateway's HTTP port, second gateway's metrics port)."""
    if PROMETHEUS is None:
        pytest.skip("no prometheus binary (Debian: apt-get install prometheus)")
    repo = tmp_path / "models"
    load_examples().build_add_sub(repo)  # type: ignore[attr-defined]
    server = start_server(repo, redis_url, tmp_path / "serve.log")
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        gateway = subprocess.Popen(
            [
                sys.executable, "-m", "sluice.cli", "gateway",
                "--http-address", "127.0.0.1", "--http-port", str(http_port),
                "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
                "--metrics-port", str(metrics_port),
                "--redis-url", redis_url, "--key-prefix", server.key_prefix,
            ],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
    try:
        _wait_http(f"http://127.0.0.1:{http_port}/v2/health/ready", "gateway", gateway, log)
        yield server, http_port, metrics_port
    finally:
        _stop(gateway)
        assert stop_server(server) == 0, server.log()


@pytest.fixture
def prometheus(
    deployment: tuple[Server, int, int], tmp_path: Path
) -> Iterator[tuple[str, list[str]]]:
    """Debian's Prometheus on the rendered config: (its base URL, the scraped targets)."""
    server, _, second_metrics = deployment
    targets = [f"127.0.0.1:{server.metrics_port}", f"127.0.0.1:{second_metrics}"]
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
    deployment: tuple[Server, int, int], prometheus: tuple[str, list[str]]
) -> None:
    server, second_http, _ = deployment
    base, targets = prometheus
    rng = np.random.default_rng(39)
    for port in (server.http_port, second_http):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=30)
        try:
            for _ in range(PER_GATEWAY):
                a, b = rng.standard_normal((2, 1, 16), dtype=np.float32)
                _infer(client, a, b)
        finally:
            client.close()
    both = dict.fromkeys(targets, 1.0)
    assert wait_for(base, 'up{job="sluice"}', both) == both
    # each gateway reports the deployment's totals, so both targets show every request
    total = dict.fromkeys(targets, float(2 * PER_GATEWAY))
    success = 'nv_inference_request_success{model="add_sub",version="1"}'
    assert wait_for(base, success, total) == total
    # the dashboard's queue-depth panel: max over gateways; nothing waits once answered
    (depth,) = query(base, 'max by (model, version) (sluice_queue_depth{model="add_sub"})')
    assert float(depth["value"][1]) == 0.0
    (live,) = query(base, 'max by (model, version) (sluice_instances_live{model="add_sub"})')
    assert float(live["value"][1]) == 1.0  # instance_group count: 1
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
