"""Model warmup end to end, with the models in tests/assets/warmup_models.

Rules: docs/user-guide/backends.md (model warm-up).

``warmup_counter`` reports what it executed before the current call, so the
first client request proves that every warmup sample ran (zero data and file
data, batch_size requests per execute, count repetitions) before the model
became READY. ``broken_warmup``'s data file is too short: the model is
UNAVAILABLE with a reason naming the sample.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e_support import ROOT, Server, start_server, stop_server

pytestmark = pytest.mark.e2e

ASSETS = ROOT / "tests/assets/warmup_models"


def settled_index(server: Server, timeout_s: float = 90.0) -> dict[str, dict[str, str]]:
    """The repository index once every model is READY or UNAVAILABLE (bounded wait)."""
    client = httpclient.InferenceServerClient(server.http_url)
    deadline = time.monotonic() + timeout_s
    index: list[dict[str, str]] = []
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(f"sluice serve exited:\n{server.log()}")
            try:
                index = client.get_model_repository_index()
            except Exception:
                index = []
            if index and all(e.get("state") in ("READY", "UNAVAILABLE") for e in index):
                break
            time.sleep(0.2)
    finally:
        client.close()
    return {entry["name"]: entry for entry in index}


@pytest.fixture(scope="module")
def warmup_server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("warmup-models")
    for model in ("warmup_counter", "broken_warmup"):
        shutil.copytree(ASSETS / model, repo / model)
    server = start_server(
        repo,
        redis_url,
        tmp_path_factory.mktemp("logs") / "warmup.log",
        "--exit-on-error",
        "false",
        wait_ready=False,
    )
    yield server
    assert stop_server(server) == 0, server.log()


def _counter_input(value: int) -> list[httpclient.InferInput]:
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return [tensor]


def test_warmup_ran_before_ready_and_broken_warmup_is_unavailable(
    warmup_server: Server,
) -> None:
    index = settled_index(warmup_server)
    assert index["warmup_counter"]["state"] == "READY", warmup_server.log()
    broken = index["broken_warmup"]
    assert broken["state"] == "UNAVAILABLE"
    assert broken["reason"] == (
        "failed to run warmup sample 'short_file' of model 'broken_warmup': input 'IN': "
        "warmup setting expects 4 bytes, but the data provided from 'short.bin' only has "
        "2 bytes"
    )

    client = httpclient.InferenceServerClient(warmup_server.http_url)
    assert client.is_model_ready("warmup_counter")
    assert not client.is_model_ready("broken_warmup")
    first = client.infer("warmup_counter", _counter_input(100))
    # "zeros": batch_size 2, count 3 -> 3 calls of 2 requests; "from_file": 1 call, IN = 7.
    assert {
        name: first.as_numpy(name).tolist()
        for name in ("EXECUTIONS", "REQUESTS", "IN_SUM", "LARGEST_CALL")
    } == {
        "EXECUTIONS": [[4]],
        "REQUESTS": [[7]],
        "IN_SUM": [[7]],
        "LARGEST_CALL": [[2]],
    }
    second = client.infer("warmup_counter", _counter_input(1))
    assert second.as_numpy("EXECUTIONS").tolist() == [[5]]
    assert second.as_numpy("IN_SUM").tolist() == [[107]]
    client.close()
