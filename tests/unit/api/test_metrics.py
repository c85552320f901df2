"""Metrics exposition, families, host gauges, dashboard history, flags: no Redis, no clock."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import pytest

from sluice.api.dashboard.history import DashboardHistory
from sluice.api.frontend_flags import (
    add_frontend_arguments,
    apply_frontend_arguments,
    forward_frontend_arguments,
)
from sluice.api.metrics.exposition import CONTENT_TYPE, Family, render
from sluice.api.metrics.families import model_families
from sluice.api.metrics.host import HostSampler
from sluice.api.metrics.snapshot import QueueFacts, VersionSample
from sluice.api.settings import GatewaySettings
from sluice.broker.logs import LogOptions
from sluice.broker.model_store import VersionState
from sluice.broker.states import ModelState
from sluice.broker.stats_store import VersionStats


def _sample(model: str = "m", state: str = "READY", **counters: int) -> VersionSample:
    return VersionSample(
        model,
        1,
        state,
        stats=VersionStats(dict(counters)),
        queue=QueueFacts(depth=3, pending=2, oldest_ms=9_000),
        live_instances=2,
    )


def test_render_keeps_tritons_names_and_integer_values() -> None:
    family = Family("nv_inference_count", "counter", "help")
    family.add({"version": "1", "model": 'a"b'}, 64.0)
    gauge = Family("nv_cpu_utilization", "gauge", "cpu", [({}, 0.25)])
    text = render([family, Family("empty", "gauge", "x"), gauge]).decode()
    assert text == (
        "# HELP nv_inference_count help\n# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="a\\"b",version="1"} 64\n'
        "# HELP nv_cpu_utilization cpu\n# TYPE nv_cpu_utilization gauge\n"
        "nv_cpu_utilization 0.25\n"
    )
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_model_families_from_counters() -> None:
    samples = [
        _sample(
            success_count=10,
            inference_count=64,
            execution_count=3,
            success_ns=12_345_678,
            **{"fail_reason:BACKEND": 2},
        ),
        _sample("gone", state="UNAVAILABLE"),
    ]
    families = {f.name: f for f in model_families(samples, now_ms=10_500)}
    labels = {"model": "m", "version": "1"}
    assert families["nv_inference_request_success"].samples == [(labels, 10)]
    assert families["nv_inference_count"].samples == [(labels, 64)]
    assert families["nv_inference_exec_count"].samples == [(labels, 3)]
    assert families["nv_inference_request_duration_us"].samples == [(labels, 12_345)]
    assert families["nv_inference_pending_request_count"].samples == [(labels, 5)]
    assert families["nv_inference_request_failure"].samples == [
        ({**labels, "reason": r}, 2 if r == "BACKEND" else 0)
        for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    ]
    assert families["sluice_queue_depth"].samples == [(labels, 3)]
    assert families["sluice_queue_pending"].samples == [(labels, 2)]
    assert families["sluice_queue_oldest_age_seconds"].samples == [(labels, 1.5)]
    assert families["sluice_instances_live"].samples == [(labels, 2)]
    no_latency = {f.name for f in model_families(samples, 0, counter_latencies=False)}
    assert not {n for n in no_latency if n.endswith("_duration_us")}


def test_host_sampler_reads_proc_and_has_no_gpu_without_nvml(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 250 kB\n")
    stat = tmp_path / "stat"
    stat.write_text("cpu 100 0 100 800 0 0 0 0 0 0\n")
    sampler = HostSampler(proc=tmp_path, gpu=False)
    sampler.refresh()
    stat.write_text("cpu 150 0 150 900 0 0 0 0 0 0\n")  # 100 busy of 200
    sampler.refresh()
    values = {f.name: f.samples[0][1] for f in sampler.families()}
    assert values == {
        "nv_cpu_utilization": 0.5,
        "nv_cpu_memory_total_bytes": 1_024_000,
        "nv_cpu_memory_used_bytes": 768_000,
    }
    assert not [f for f in sampler.families() if f.name.startswith("nv_gpu")]


def test_dashboard_history_rates() -> None:
    history = DashboardHistory(client=None, keys=None, interval_s=2.0)  # type: ignore[arg-type]
    history.record([_sample(inference_count=10, success_count=5, success_ns=0)], now_ms=0)
    history.record(
        [_sample(inference_count=30, success_count=15, success_ns=50_000_000)], now_ms=2_000
    )
    series = history.data(now_ms=2_000)["models"][0]["series"]
    assert [p["throughput"] for p in series] == [0.0, 10.0]
    assert [p["latency_ms"] for p in series] == [None, 5.0]
    assert series[-1]["queue_depth"] == 3
    history.record([], now_ms=4_000)  # unloaded: its history goes
    assert history.data(now_ms=4_000)["models"] == []


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_frontend_arguments(parser)
    return parser.parse_args(argv)


def test_metrics_and_log_flags() -> None:
    argv = [
        "--metrics-port",
        "18899",
        "--allow-gpu-metrics",
        "false",
        "--metrics-config",
        "counter_latencies=false",
        "--metrics-interval-ms",
        "500",
        "--log-format",
        "ISO8601",
        "--log-info",
        "false",
    ]
    args = _parse(argv)
    settings = apply_frontend_arguments(GatewaySettings(), args)
    assert (settings.metrics.port, settings.metrics.gpu, settings.metrics.interval_ms) == (
        18899,
        False,
        500,
    )
    assert settings.metrics.counter_latencies is False
    assert (settings.log_format, settings.log_info) == ("ISO8601", False)
    assert _parse(forward_frontend_arguments(args)) == args
    with pytest.raises(SystemExit):
        _parse(["--metrics-config", "bogus=1"])


def test_log_file_flag_is_checked_when_parsed(tmp_path, capsys) -> None:
    """A log file that cannot be opened is a flag error (one line, exit 2), not a
    traceback from the logging set-up."""
    good = tmp_path / "x.log"
    assert _parse(["--log-file", str(good)]).log_file == str(good)
    with pytest.raises(SystemExit):
        _parse(["--log-file", str(tmp_path / "missing" / "x.log")])
    assert "cannot append to" in capsys.readouterr().err


def test_log_options_round_trip_through_the_environment() -> None:
    options = LogOptions(verbose=1, info=False, format="ISO8601", file="/tmp/x.log")
    assert LogOptions.from_env(options.to_env()) == options
    assert LogOptions.from_env({}, verbose=2).verbose == 2
    assert not options.allows(logging.INFO)
    assert options.allows(logging.DEBUG) and options.allows(logging.WARNING)


def test_summary_flags_round_trip_and_bad_quantiles_are_refused(capsys) -> None:
    argv = [
        "--metrics-config",
        "summary_latencies=true",
        "--metrics-config",
        "summary_quantiles=0.5:0.05,0.99:0.001",
    ]
    args = _parse(argv)
    settings = apply_frontend_arguments(GatewaySettings(), args)
    assert settings.metrics.summary_latencies is True
    assert settings.metrics.summary_quantiles == "0.5:0.05,0.99:0.001"
    assert _parse(forward_frontend_arguments(args)) == args
    assert GatewaySettings().metrics.summary_latencies is False
    with pytest.raises(SystemExit):
        _parse(["--metrics-config", "summary_quantiles=0.5"])
    assert "summary_quantiles: '0.5' has no ':'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="quantile must be in"):
        GatewaySettings.model_validate({"metrics": {"summary_quantiles": "2:0.1"}})


def test_summary_families_have_counts_sums_and_window_quantiles() -> None:
    """``_count``/``_sum`` are the counters' totals; quantiles come from the window's
    histogram, NaN where the window holds no request (as Triton's prometheus-cpp)."""
    sample = dataclasses.replace(
        _sample(success_count=4, success_ns=10_000_000, queue_count=4, queue_ns=8_000),
        latencies={"request": {1000: 3, 4000: 1}, "queue": {}},
    )
    families = {
        f.name: f
        for f in model_families([sample], 0, summary_quantiles=((0.5, 0.05), (0.99, 0.001)))
    }
    labels = {"model": "m", "version": "1"}
    assert families["nv_inference_request_summary_us"].samples == [
        (labels, 4, "_count"),
        (labels, 10_000, "_sum"),
        ({**labels, "quantile": "0.5"}, 1000 + 3),  # the middle of the bin [1000, 1008)
        ({**labels, "quantile": "0.99"}, 4000 + 15),  # [4000, 4032)
    ]
    text = render([families["nv_inference_queue_summary_us"]]).decode()
    assert "# TYPE nv_inference_queue_summary_us summary\n" in text
    assert 'nv_inference_queue_summary_us_sum{model="m",version="1"} 8\n' in text
    assert 'nv_inference_queue_summary_us{model="m",version="1",quantile="0.5"} NaN\n' in text
    assert not any("summary" in name for name in (f.name for f in model_families([sample], 0)))


def test_load_duration_is_a_gauge_of_ready_versions_that_recorded_it() -> None:
    timed = dataclasses.replace(_sample("a"), load_s=1.611378)
    families = {f.name: f for f in model_families([timed, _sample("b")], 0)}
    family = families["nv_model_load_duration_secs"]
    assert (family.type, family.help) == ("gauge", "Model load time in seconds")
    assert family.samples == [({"model": "a", "version": "1"}, 1.611378)]


def test_version_state_keeps_the_load_duration() -> None:
    state = VersionState(ModelState.READY, load_s=2.5)
    assert VersionState.from_json(state.to_json()) == state
    assert VersionState.from_json('{"state": "READY", "reason": ""}').load_s is None
    assert "load_s" not in VersionState(ModelState.LOADING).to_json()
