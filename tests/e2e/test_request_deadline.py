"""A request whose deadline (``--request-timeout-secs``) passes while it is queued is
answered at the deadline, taken off its queue at once, and never run."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import redis
import tritonclient.http as httpclient
from e2e_support import build_slow_variants, start_server, stop_server
from tritonclient.utils import InferenceServerException

from sluice.broker.keys import WORKER_GROUP, KeySchema


def _input(value: float) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    return [tensor]


def test_a_request_past_its_deadline_leaves_the_queue_and_never_runs(
    redis_url: str, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    build_slow_variants(repo)
    for folder in list(repo.iterdir()):
        if folder.name != "slow_pair":
            shutil.rmtree(folder)
    server = start_server(repo, redis_url, tmp_path / "serve.log", "--request-timeout-secs", "0.5")
    broker = redis.Redis.from_url(redis_url)
    stream = KeySchema(server.key_prefix).queue("slow_pair", 1)
    try:
        client = httpclient.InferenceServerClient(server.http_url, concurrency=4)
        before = client.get_inference_statistics("slow_pair")["model_stats"][0]
        # both instances busy for 1.5 s (each answer comes after its 0.5 s deadline)
        busy = [
            client.async_infer("slow_pair", _input(1.0), parameters={"sleep_ms": 1500})
            for _ in range(2)
        ]
        time.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as info:
            client.infer("slow_pair", _input(2.0))
        answered_s = time.monotonic() - started
        assert info.value.status() == "503" and "Request timeout expired" in info.value.message()
        assert 0.4 <= answered_s < 0.8
        # off the queue at once, not when an instance frees up (1.3 s from here)
        deadline = time.monotonic() + 0.3
        while broker.xlen(stream) - int(broker.xpending(stream, WORKER_GROUP)["pending"]) > 0:
            assert time.monotonic() < deadline, "still queued"
            time.sleep(0.01)
        for future in busy:
            with pytest.raises(InferenceServerException, match="Request timeout expired"):
                future.get_result(timeout=30)
        time.sleep(1.5)  # the instances finish the two they run; nothing is left to run
        assert broker.xlen(stream) == 0
        after = client.get_inference_statistics("slow_pair")["model_stats"][0]
        counts = {
            kind: after["inference_stats"][kind]["count"] - before["inference_stats"][kind]["count"]
            for kind in ("success", "fail")
        }
        # the two that ran finished after their deadline: failures too, as their clients
        # were told (executions of late answers are not counted)
        assert counts == {"success": 0, "fail": 3}
        client.close()
    finally:
        broker.close()
        stop_server(server)
