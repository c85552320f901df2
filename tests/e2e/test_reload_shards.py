"""A reload that changes a model's queue layout (``queue_shards``) loses no queued
request: what waits on the shards the new layout lacks is moved onto its streams once
the old instance has stopped (``broker.requeue``)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient
from e2e_support import ROOT, Server, start_server, stop_server

from sluice.broker.keys import KeySchema

pytestmark = pytest.mark.e2e

MODEL = "reshard"


def _config(shards: int) -> str:
    source = (ROOT / "tests/assets/python_models/slow/config.pbtxt").read_text()
    config = source.replace('name: "slow"', f'name: "{MODEL}"')
    config = config.replace("max_batch_size: 8", "max_batch_size: 4")
    return (
        config
        + "dynamic_batching { }\n"
        + f'parameters {{ key: "queue_shards" value: {{ string_value: "{shards}" }} }}\n'
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reshard-models")
    (out / MODEL / "1").mkdir(parents=True)
    shutil.copy(ROOT / "tests/assets/python_models/slow/1/model.py", out / MODEL / "1/model.py")
    (out / MODEL / "config.pbtxt").write_text(_config(4))
    return out


@pytest.fixture(scope="module")
def server(
    repo: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("reshard-logs") / "serve.log"
    srv = start_server(
        repo, redis_url, log, "--model-control-mode", "explicit", "--load-model", MODEL
    )
    yield srv
    assert stop_server(srv) == 0, srv.log()


@pytest.mark.parametrize("shards", [1, 3])
def test_requests_queued_on_shards_a_reload_drops_are_answered(
    server: Server, repo: Path, shards: int
) -> None:
    """40 requests of 200 ms batches (4 each) queue over the current shards; the model is
    reloaded with another shard count while most still wait: every request is answered
    with its own value, none waits for its timeout, and the old shard streams are gone."""
    keys = KeySchema(server.key_prefix)
    broker = redis.Redis.from_url(server.redis_url, socket_timeout=10)
    config = (repo / MODEL / "config.pbtxt").read_text()
    before = int(config.split('string_value: "')[1].split('"')[0])
    old_streams = [keys.queue(MODEL, 1, 0, k, before) for k in range(before)]
    results: dict[int, object] = {}

    def send(value: int) -> None:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=40)
        tensor = httpclient.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[float(value)]], np.float32))
        started = time.monotonic()
        try:
            out = client.infer(MODEL, [tensor], parameters={"sleep_ms": 200})
            results[value] = (float(out.as_numpy("OUT")[0][0]), time.monotonic() - started)
        except Exception as exc:
            results[value] = exc
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(v,)) for v in range(40)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while sum(int(broker.xlen(s)) for s in old_streams) < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sum(int(broker.xlen(s)) for s in old_streams) >= 20  # most are still queued
    (repo / MODEL / "config.pbtxt").write_text(_config(shards))
    control = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    control.load_model(MODEL)
    for thread in threads:
        thread.join(60)
    failures = {v: r for v, r in results.items() if isinstance(r, Exception)}
    assert not failures, list(failures.items())[:3]
    assert sorted(results) == list(range(40))
    assert all(r[0] == float(v) for v, r in results.items())  # type: ignore[index]
    assert max(r[1] for r in results.values()) < 20  # type: ignore[index]
    new_streams = {keys.queue(MODEL, 1, 0, k, shards) for k in range(shards)}
    assert not any(broker.exists(s) for s in old_streams if s not in new_streams)
    stats = control.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]
    assert stats["fail"]["count"] == 0
    control.close()
    broker.close()
