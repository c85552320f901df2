"""Prometheus metrics and the statistics extension, driven with exact request counts."""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from metrics_support import Scrape, scrape
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

#: every metric we emit that Triton also has: name -> (type, label names)
#: (docs/reference/metrics.md).
TRITON_METRICS = {
    "nv_inference_request_success": ("counter", {"model", "version"}),
    "nv_inference_request_failure": ("counter", {"model", "version", "reason"}),
    "nv_inference_count": ("counter", {"model", "version"}),
    "nv_inference_exec_count": ("counter", {"model", "version"}),
    "nv_inference_pending_request_count": ("gauge", {"model", "version"}),
    "nv_inference_request_duration_us": ("counter", {"model", "version"}),
    "nv_inference_queue_duration_us": ("counter", {"model", "version"}),
    "nv_inference_compute_input_duration_us": ("counter", {"model", "version"}),
    "nv_inference_compute_infer_duration_us": ("counter", {"model", "version"}),
    "nv_inference_compute_output_duration_us": ("counter", {"model", "version"}),
    "nv_model_load_duration_secs": ("gauge", {"model", "version"}),
    "nv_cpu_utilization": ("gauge", set()),
    "nv_cpu_memory_total_bytes": ("gauge", set()),
    "nv_cpu_memory_used_bytes": ("gauge", set()),
}
#: GPU metrics: only where NVML finds a GPU (absent, not zero, elsewhere).
TRITON_GPU_METRICS = {
    "nv_gpu_utilization": ("gauge", {"gpu_uuid"}),
    "nv_gpu_memory_total_bytes": ("gauge", {"gpu_uuid"}),
    "nv_gpu_memory_used_bytes": ("gauge", {"gpu_uuid"}),
    "nv_gpu_power_usage": ("gauge", {"gpu_uuid"}),
    "nv_gpu_power_limit": ("gauge", {"gpu_uuid"}),
    "nv_energy_consumption": ("counter", {"gpu_uuid"}),
}
SLUICE_METRICS = {
    "sluice_queue_depth": ("gauge", {"model", "version"}),
    "sluice_queue_oldest_age_seconds": ("gauge", {"model", "version"}),
    "sluice_queue_pending": ("gauge", {"model", "version"}),
    "sluice_instances_live": ("gauge", {"model", "version"}),
}
#: async job metrics: present once the deployment has had a job (a bulk one for rows).
JOB_METRICS = {
    "sluice_jobs_submitted": ("counter", {"model", "kind"}),
    "sluice_jobs_succeeded": ("counter", {"model", "kind"}),
    "sluice_jobs_pending": ("gauge", {"model"}),
    "sluice_jobs_running": ("gauge", {"model"}),
    "sluice_job_rows": ("counter", {"model", "outcome"}),
    "sluice_job_rows_per_second": ("gauge", {"model"}),
}
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
)


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


def test_metric_names_types_and_labels_are_tritons(server) -> None:
    from jobs_support import JSONL, add_sub_row, jsonl, submit, wait_state

    wait_state(server.base, submit(server.base, "add_sub", jsonl([add_sub_row(1)]), headers=JSONL))
    metrics = scrape(server.metrics_url)
    expected = {**TRITON_METRICS, **SLUICE_METRICS, **JOB_METRICS}
    # failed and revoked jobs have series once there are some (other tests make them)
    for name in ("sluice_jobs_failed", "sluice_jobs_revoked"):
        if name in metrics.types:
            expected[name] = ("counter", {"model", "kind"})
    if _has_gpu():
        expected.update(TRITON_GPU_METRICS)
    assert set(metrics.types) == set(expected), metrics.text
    for name, (kind, labels) in expected.items():
        assert metrics.types[name] == kind, name
        sets = metrics.labelsets(name)
        assert sets, name
        assert all(set(s) == labels for s in sets), (name, sets)
    # Triton's names exactly: no _total / _created series from a client library.
    assert not [n for n, _ in metrics.values if n.endswith(("_total", "_created"))]
    # a series for every READY version, all four failure reasons, from load on
    for model in ("batch_scale", "raiser", "slow_pair"):
        assert metrics.model("nv_inference_pending_request_count", model) >= 0
        for reason in REASONS:
            assert metrics.model("nv_inference_request_failure", model, reason=reason) >= 0
    assert metrics.model("sluice_instances_live", "batch_scale") == 2
    # the load took a while (processes started, model loaded), not minutes
    assert 0.01 < metrics.model("nv_model_load_duration_secs", "batch_scale") < 120
    # versioned keeps versions 1 and 2 (version policy): version 3 has no series
    assert metrics.get("nv_inference_count", model="versioned", version="3") is None
    assert metrics.model("nv_inference_count", "versioned", "2") >= 0
    assert 0.0 <= (metrics.get("nv_cpu_utilization") or 0.0) <= 1.0
    assert metrics.get("nv_cpu_memory_total_bytes") >= metrics.get("nv_cpu_memory_used_bytes") > 0


def test_metrics_endpoint_answers_get_only(server) -> None:
    base = server.metrics_url
    assert requests.post(base, timeout=5).status_code == 405
    assert requests.get(base.replace("/metrics", "/other"), timeout=5).status_code == 404
    # the trailing slash is answered as Triton does: 200 at once, not a redirect
    slash = requests.get(base + "/", timeout=5, allow_redirects=False)
    assert slash.status_code == 200, slash.headers
    assert "nv_inference_count" in slash.text


def _counters(metrics: Scrape, model: str) -> dict[str, float]:
    values = {name: metrics.model(name, model) for name in COUNTERS}
    for reason in REASONS:
        values[reason] = metrics.model("nv_inference_request_failure", model, reason=reason)
    return values


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def _stats(server, model: str) -> tuple[dict, dict]:
    """The model's entry from HTTP and from gRPC (as JSON, int64 as strings)."""
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        h = http.get_inference_statistics(model)["model_stats"][0]
        g = grpc.get_inference_statistics(model, as_json=True)["model_stats"][0]
    finally:
        http.close()
        grpc.close()
    return h, g


def _flat(entry: dict) -> dict[str, int]:
    """Every numeric counter of a stats entry, keyed by path (gRPC JSON omits zeros)."""
    stats = entry.get("inference_stats", {})
    out = {
        "inference_count": int(entry.get("inference_count", 0)),
        "execution_count": int(entry.get("execution_count", 0)),
    }
    for name in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        out[f"{name}.count"] = int(stats.get(name, {}).get("count", 0))
        out[f"{name}.ns"] = int(stats.get(name, {}).get("ns", 0))
    for batch in entry.get("batch_stats", []):
        out[f"batch{int(batch['batch_size'])}"] = int(batch["compute_infer"].get("count", 0))
    return out


def _scale_request(client: httpclient.InferenceServerClient, size: int) -> None:
    tensor = httpclient.InferInput("INPUT0", [size, 4], "FP32")
    data = np.arange(4 * size, dtype=np.float32).reshape(size, 4)
    tensor.set_data_from_numpy(data)
    result = client.infer("batch_scale", [tensor])
    assert result.as_numpy("OUTPUT0").tolist() == (3 * data).tolist()


def _raiser(client: httpclient.InferenceServerClient, values: list[int]) -> None:
    tensor = httpclient.InferInput("X", [len(values), 1], "INT32")
    tensor.set_data_from_numpy(np.array(values, np.int32).reshape(-1, 1))
    client.infer("raiser", [tensor])


def _slow(client: httpclient.InferenceServerClient, model: str, sleep_ms: int) -> None:
    tensor = httpclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[1.0]], np.float32))
    client.infer(model, [tensor], parameters={"sleep_ms": sleep_ms})


def _wait_gauge(server, name: str, model: str, value: float, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scrape(server.metrics_url).model(name, model) == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} of {model} never reached {value}")


def test_exact_counters_on_metrics_and_statistics(server) -> None:
    models = ("batch_scale", "raiser", "slow_queue")
    before = scrape(server.metrics_url)
    counters_before = {m: _counters(before, m) for m in models}
    stats_before = {m: _stats(server, m) for m in models}
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)

    # batch_scale, two workers: six requests one after another (each its own execution;
    # the two instances take turns reading the stream).
    sizes = [1, 2, 3, 4, 1, 2]
    for size in sizes:
        _scale_request(client, size)
    # raiser: two requests the model fails (BACKEND), one of batch size 2 that succeeds.
    for values in ([-1], [-5]):
        with pytest.raises(InferenceServerException, match="negative input"):
            _raiser(client, values)
    _raiser(client, [1, 2])
    # slow_queue (max_queue_size 1): one executing, one queued, the third refused.
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(
            _slow, httpclient.InferenceServerClient(server.http_url), "slow_queue", 1500
        )
        _wait_gauge(server, "sluice_queue_pending", "slow_queue", 1)  # taken, executing
        second = pool.submit(
            _slow, httpclient.InferenceServerClient(server.http_url), "slow_queue", 0
        )
        _wait_gauge(server, "sluice_queue_depth", "slow_queue", 1)  # queued
        with pytest.raises(InferenceServerException, match="Exceeds maximum queue size"):
            _slow(client, "slow_queue", 0)
        first.result(30)
        second.result(30)
    client.close()

    after = scrape(server.metrics_url)
    got = {m: _delta(_counters(after, m), counters_before[m]) for m in models}
    zero = dict.fromkeys(REASONS, 0)
    assert got["batch_scale"] == {
        "nv_inference_request_success": 6,
        "nv_inference_count": sum(sizes),
        "nv_inference_exec_count": 6,
        **zero,
    }
    assert got["raiser"] == {  # as Triton's backends: an execution that failed whole
        "nv_inference_request_success": 1,  # is not an execution (no batch statistics)
        "nv_inference_count": 2,
        "nv_inference_exec_count": 1,
        **zero,
        "BACKEND": 2,
    }
    assert got["slow_queue"] == {
        "nv_inference_request_success": 2,
        "nv_inference_count": 2,
        "nv_inference_exec_count": 2,
        **zero,
        "REJECTED": 1,
    }
    # average batch size = inference count / execution count
    avg = got["batch_scale"]["nv_inference_count"] / got["batch_scale"]["nv_inference_exec_count"]
    assert avg == pytest.approx(13 / 6)

    for model in models:
        http_after, grpc_after = _stats(server, model)
        http_before, _ = stats_before[model]
        # both protocols answer the same numbers, parsed by tritonclient
        assert _flat(http_after) == _flat(grpc_after), model
        assert http_after["last_inference"] > 0 and int(grpc_after["last_inference"]) > 0
        d = {k: v - _flat(http_before).get(k, 0) for k, v in _flat(http_after).items()}
        m = got[model]
        assert d["success.count"] == m["nv_inference_request_success"]
        assert d["inference_count"] == m["nv_inference_count"]
        assert d["execution_count"] == m["nv_inference_exec_count"]
        assert d["fail.count"] == sum(m[r] for r in REASONS)
        if d["fail.count"]:  # a refusal lasts from its arrival to its answer (Triton)
            assert d["fail.ns"] > 0, model
        assert d["queue.count"] == d["compute_infer.count"] == d["success.count"]
        assert d["success.ns"] > 0 and d["compute_infer.ns"] > 0
        # the duration counters are the statistics' ns sums in µs
        for metric, key in (
            ("nv_inference_request_duration_us", "success.ns"),
            ("nv_inference_queue_duration_us", "queue.ns"),
            ("nv_inference_compute_input_duration_us", "compute_input.ns"),
            ("nv_inference_compute_infer_duration_us", "compute_infer.ns"),
            ("nv_inference_compute_output_duration_us", "compute_output.ns"),
        ):
            assert after.model(metric, model) == _flat(http_after)[key] // 1000, (model, metric)
        assert "0" in http_after["response_stats"] and "0" in grpc_after["response_stats"]
    http_after, _ = _stats(server, "batch_scale")
    http_before, _ = stats_before["batch_scale"]
    batches = {
        k: v - _flat(http_before).get(k, 0)
        for k, v in _flat(http_after).items()
        if k.startswith("batch")
    }
    assert {k: v for k, v in batches.items() if v} == {
        "batch1": 2,
        "batch2": 2,
        "batch3": 1,
        "batch4": 1,
    }
    avg_stats = (_flat(http_after)["inference_count"] - _flat(http_before)["inference_count"]) / (
        _flat(http_after)["execution_count"] - _flat(http_before)["execution_count"]
    )
    assert avg_stats == avg


def test_queue_depth_rises_under_a_burst_and_falls_to_zero(server) -> None:
    burst = 10
    done = threading.Event()
    seen: list[tuple[float, float, float, float]] = []

    def watch() -> None:
        while not done.is_set():
            m = scrape(server.metrics_url)
            seen.append(
                (
                    m.model("sluice_queue_depth", "slow"),
                    m.model("sluice_queue_pending", "slow"),
                    m.model("sluice_queue_oldest_age_seconds", "slow"),
                    m.model("nv_inference_pending_request_count", "slow"),
                )
            )
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(burst) as pool:
            clients = [
                httpclient.InferenceServerClient(server.http_url, network_timeout=60)
                for _ in range(burst)
            ]
            list(pool.map(lambda c: _slow(c, "slow", 250), clients))
            for c in clients:
                c.close()
    finally:
        done.set()
        watcher.join(10)
    peak = max(s[0] for s in seen)
    assert peak >= burst // 2, seen  # one instance takes one request at a time
    assert max(s[2] for s in seen) > 0.2  # the oldest queued request aged
    assert any(s[1] >= 1 for s in seen)  # one taken, unanswered
    assert all(s[3] == s[0] + s[1] for s in seen)  # Triton's gauge: queued + held
    final = scrape(server.metrics_url)
    assert final.model("sluice_queue_depth", "slow") == 0
    assert final.model("sluice_queue_pending", "slow") == 0
    assert final.model("sluice_queue_oldest_age_seconds", "slow") == 0
    assert final.model("nv_inference_pending_request_count", "slow") == 0


def test_summary_latencies_give_quantiles_of_the_last_minute(
    model_repository, redis_url, tmp_path
) -> None:
    """``--metrics-config summary_latencies=true``: Triton's five ``*_summary_us``
    summaries, with the configured quantiles; ``_count``/``_sum`` equal the counters, the
    quantiles split 30 fast requests from 10 that sleep 40 ms, and a model nobody called
    has NaN quantiles (an empty window)."""
    from e2e_support import repository_of, start_server, stop_server

    server = start_server(
        repository_of(model_repository, tmp_path / "repo", "slow", "batch_scale"),
        redis_url, tmp_path / "serve.log",
        "--metrics-config", "summary_latencies=true",
        "--metrics-config", "summary_quantiles=0.5:0.05,0.9:0.01",
    )  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
        for sleep_ms in [0] * 30 + [40] * 10:
            _slow(client, "slow", sleep_ms)
        client.close()
        deadline = time.monotonic() + 10
        while True:  # an instance sends its histogram within about a second
            metrics = scrape(server.metrics_url)
            if metrics.model("nv_inference_compute_infer_summary_us", "slow", quantile="0.9") > 0:
                break
            assert time.monotonic() < deadline, "no quantiles after 10 s"
            time.sleep(0.2)
        for kind in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
            name = f"nv_inference_{kind}_summary_us"
            assert metrics.model(f"{name}_count", "slow") == 40
            assert metrics.model(f"{name}_sum", "slow") == metrics.model(
                f"nv_inference_{kind}_duration_us", "slow"
            )
            quantiles = {s["quantile"] for s in metrics.labelsets(name) if s["model"] == "slow"}
            assert quantiles == {"0.5", "0.9"}
        infer = "nv_inference_compute_infer_summary_us"
        assert metrics.model(infer, "slow", quantile="0.5") < 20_000
        assert 40_000 <= metrics.model(infer, "slow", quantile="0.9") < 60_000
        request_p90 = metrics.model("nv_inference_request_summary_us", "slow", quantile="0.9")
        assert request_p90 >= 40_000
        assert math.isnan(metrics.model(infer, "batch_scale", quantile="0.5"))
    finally:
        stop_server(server)
