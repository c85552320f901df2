"""compose/'s Grafana dashboard and Prometheus configuration: the dashboard queries only
metric names Sluice exports (the names in ``api/metrics/``), and every file the
monitoring profile mounts agrees with the compose file."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
DASHBOARD = COMPOSE / "grafana/dashboards/sluice.json"
#: a metric name Sluice exports: Triton's ``nv_`` families and its own ``sluice_`` gauges
EXPORTED_NAME = re.compile(r"^(?:nv|sluice)_[a-z0-9_]+$")


def exported_metric_names() -> set[str]:
    """Every metric family name written as a string in the metrics package, with the
    ``_count`` and ``_sum`` series of its summaries."""
    names: set[str] = set()
    for path in (ROOT / "api/metrics").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and EXPORTED_NAME.match(value):
                names.add(value)
    names |= {f"{n}_{s}" for n in names if n.endswith("_summary_us") for s in ("count", "sum")}
    return names


def queried_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression (or Grafana ``label_values`` query) reads: every
    name before a label selector, the first argument of ``label_values``, and every
    ``nv_`` or ``sluice_`` name."""
    names = set(re.findall(r"\b([a-zA-Z_:][\w:]*)\s*\{", expr))
    names |= set(re.findall(r"label_values\(\s*([a-zA-Z_:][\w:]*)", expr))
    names |= set(re.findall(r"\b(?:nv|sluice)_\w+", expr))
    return names


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def test_the_exported_names_are_found() -> None:
    names = exported_metric_names()
    assert {"nv_inference_request_success", "sluice_queue_depth", "sluice_instances_live"} <= names
    assert "nv_inference_request_summary_us_count" in names


@pytest.mark.parametrize("expr", dashboard_queries())
def test_the_dashboard_queries_only_exported_metrics(expr: str) -> None:
    queried = queried_metric_names(expr)
    assert queried, f"no metric found in {expr!r}"
    assert queried <= exported_metric_names(), sorted(queried - exported_metric_names())


def test_a_name_sluice_does_not_export_is_caught() -> None:
    queried = queried_metric_names('rate(nv_inference_requests_total{model="m"}[1m])')
    assert queried - exported_metric_names() == {"nv_inference_requests_total"}


def test_the_dashboard_shows_the_queue_depth_gauges() -> None:
    queried = set().union(*(queried_metric_names(q) for q in dashboard_queries()))
    assert {"sluice_queue_depth", "sluice_queue_pending", "sluice_instances_live"} <= queried


def test_the_monitoring_files_agree_with_the_compose_file() -> None:
    compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    services = compose["services"]
    prometheus = yaml.safe_load((COMPOSE / "prometheus/prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    (discovery,) = job["dns_sd_configs"]
    assert discovery["names"] == ["gateway"] and "gateway" in services
    assert str(discovery["port"]) in " ".join(services["gateway"]["command"]).replace(
        "${GATEWAY_METRICS_PORT:-8002}", "8002"
    )
    mounts = {m.split(":")[1]: m.split(":")[0] for m in services["grafana"]["volumes"]}
    provisioning = COMPOSE / mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards/sluice.yml").read_text())["providers"]
    assert mounts[provider["options"]["path"]] == "./grafana/dashboards"
    assert (COMPOSE / "grafana/dashboards/sluice.json").exists()
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        assert panel["datasource"]["uid"] == source["uid"]
