"""The response cache (``--cache-config local,size=N`` + ``response_cache { enable: true }``)
driven with tritonclient over HTTP and gRPC."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import ROOT, start_server, stop_server
from metrics_support import scrape

pytestmark = pytest.mark.e2e

SLEEP_MS = 400


@pytest.fixture(scope="module")
def cached_server(redis_url, tmp_path_factory):
    """A server with a 1 MiB cache on two copies of the ``slow`` model (it sleeps the
    request parameter ``sleep_ms`` and echoes the request id): ``slow_cached`` with
    ``response_cache { enable: true }``, ``slow_plain`` without."""
    repo = tmp_path_factory.mktemp("cache-models")
    source = ROOT / "tests/assets/python_models/slow"
    for name, extra in (("slow_cached", "response_cache { enable: true }\n"), ("slow_plain", "")):
        shutil.copytree(source, repo / name)
        config = (source / "config.pbtxt").read_text().replace('"slow"', f'"{name}"')
        (repo / name / "config.pbtxt").write_text(config + extra)
    log = tmp_path_factory.mktemp("cache-logs") / "serve.log"
    server = start_server(
        repo, redis_url, log,
        "--cache-config", "local,size=1048576", "--metrics-config", "summary_latencies=true",
    )  # fmt: skip
    yield server
    assert stop_server(server) == 0, server.log()


def _infer(client, module, model: str, value: float, request_id: str) -> tuple[float, dict]:
    tensor = module.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    started = time.perf_counter()
    result = client.infer(model, [tensor], request_id=request_id, parameters={"sleep_ms": SLEEP_MS})
    elapsed = time.perf_counter() - started
    return elapsed, {
        "id": result.get_response()["id"] if module is httpclient else result.get_response().id,
        "OUT": result.as_numpy("OUT").tolist(),
        "REQUEST_ID": result.as_numpy("REQUEST_ID").tolist(),
    }


def _stats(server, model: str) -> dict:
    body = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()
    entry = body["model_stats"][0]
    flat = {k: v["count"] for k, v in entry["inference_stats"].items()}
    flat.update(inference_count=entry["inference_count"], execution_count=entry["execution_count"])
    responses = entry["response_stats"].get("0", {})
    flat["model_responses"] = responses.get("success", {}).get("count", 0)
    return flat


def test_a_repeated_request_is_answered_from_the_cache(cached_server) -> None:
    """The first request runs (≥ 400 ms); the same inputs again, over HTTP or gRPC, are
    answered at once with the stored outputs under the new request's id; other inputs
    run; a model without ``response_cache`` always runs; the statistics and metrics
    count hits and misses as Triton does."""
    http = httpclient.InferenceServerClient(cached_server.http_url, network_timeout=30)
    grpc = grpcclient.InferenceServerClient(cached_server.grpc_url)
    try:
        first_s, first = _infer(http, httpclient, "slow_cached", 1.0, "first")
        assert first_s >= SLEEP_MS / 1000
        assert first["OUT"] == [[1.0]]
        hit_s, hit = _infer(http, httpclient, "slow_cached", 1.0, "second")
        assert hit_s < SLEEP_MS / 2000, hit_s
        assert hit["id"] == "second"  # the response carries the asking request's id
        assert hit["OUT"] == first["OUT"] and hit["REQUEST_ID"] == first["REQUEST_ID"]
        grpc_s, over_grpc = _infer(grpc, grpcclient, "slow_cached", 1.0, "third")
        assert grpc_s < SLEEP_MS / 2000, grpc_s
        assert over_grpc["id"] == "third" and over_grpc["OUT"] == first["OUT"]
        other_s, other = _infer(http, httpclient, "slow_cached", 2.0, "fourth")
        assert other_s >= SLEEP_MS / 1000 and other["OUT"] == [[2.0]]
        for request_id in ("p1", "p2"):
            plain_s, _ = _infer(http, httpclient, "slow_plain", 1.0, request_id)
            assert plain_s >= SLEEP_MS / 1000
    finally:
        http.close()
        grpc.close()
    deadline = time.monotonic() + 10
    while _stats(cached_server, "slow_cached")["cache_miss"] < 2:  # counted after the insert
        assert time.monotonic() < deadline
        time.sleep(0.1)
    stats = _stats(cached_server, "slow_cached")
    assert stats["success"] == 4 and stats["queue"] == 4
    assert (stats["cache_hit"], stats["cache_miss"]) == (2, 2)
    assert (stats["inference_count"], stats["execution_count"], stats["compute_infer"]) == (2, 2, 2)
    assert stats["model_responses"] == 2  # response statistics: what the model produced
    plain = _stats(cached_server, "slow_plain")
    assert (plain["cache_hit"], plain["cache_miss"], plain["execution_count"]) == (0, 0, 2)
    metrics = scrape(cached_server.metrics_url)
    assert metrics.model("nv_cache_num_hits_per_model", "slow_cached") == 2
    assert metrics.model("nv_cache_num_misses_per_model", "slow_cached") == 2
    # per-model cache counters only for models that enable the cache (Triton)
    assert metrics.get("nv_cache_num_hits_per_model", model="slow_plain", version="1") is None
    assert metrics.types["nv_cache_miss_duration_per_model"] == "counter"
    assert metrics.get("nv_cache_num_entries") == 2
    assert 0 < metrics.get("nv_cache_util") < 0.01
    assert (metrics.get("nv_cache_num_hits"), metrics.get("nv_cache_num_misses")) == (2, 2)
    assert (metrics.get("nv_cache_num_lookups"), metrics.get("nv_cache_num_evictions")) == (4, 0)
    assert metrics.get("nv_cache_lookup_duration") > 0
    assert metrics.get("nv_cache_insertion_duration") > 0
    # the latency summaries hold the hits too (Triton: "includes cached requests"): of
    # 4 requests, the 2 fast hits are the lower half, the 2 that ran the upper
    summary = "nv_inference_request_summary_us"

    def p90() -> float:  # NaN (no request in the window yet) compares False
        return scrape(cached_server.metrics_url).model(summary, "slow_cached", quantile="0.9")

    while not p90() >= SLEEP_MS * 1000:
        assert time.monotonic() < deadline + 10, "the instances' histograms did not arrive"
        time.sleep(0.2)
    metrics = scrape(cached_server.metrics_url)
    assert metrics.model(f"{summary}_count", "slow_cached") == 4
    assert metrics.model(summary, "slow_cached", quantile="0.5") < SLEEP_MS * 1000 / 4
