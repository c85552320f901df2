"""Ensembles through the unmodified tritonclient, over HTTP and gRPC.

The repository holds the ensembles of ``tests/assets/ensemble_models`` and ``add_sub``
(ONNX) from the examples: steps on ONNX and Python models, FP32 and BYTES, two and
three steps, parallel branches, a nested ensemble, a failing step and a slow branch.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import ROOT, Server, load_examples, start_server, stop_server
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e

PROTOCOLS = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def ensemble_server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("ensemble-models")
    load_examples().build_add_sub(repo)  # type: ignore[attr-defined]
    for model in (ROOT / "tests/assets/ensemble_models").iterdir():
        shutil.copytree(model, repo / model.name)
    server = start_server(repo, redis_url, tmp_path_factory.mktemp("logs") / "serve.log")
    yield server
    assert stop_server(server) == 0, server.log()


@pytest.fixture(params=sorted(PROTOCOLS))
def client(request: pytest.FixtureRequest, ensemble_server: Server) -> Iterator[Any]:
    module = PROTOCOLS[request.param]
    url = ensemble_server.http_url if request.param == "http" else ensemble_server.grpc_url
    instance = module.InferenceServerClient(url)
    yield instance
    instance.close()


def _module(client: Any) -> ModuleType:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _inputs(client: Any, **arrays: np.ndarray) -> list[Any]:
    module = _module(client)
    tensors = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == object else "FP32"
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _outputs(client: Any, *names: str) -> list[Any]:
    return [_module(client).InferRequestedOutput(name) for name in names]


def _ab(rows: int = 2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rows)
    a = rng.standard_normal((rows, 16)).astype(np.float32)
    b = rng.standard_normal((rows, 16)).astype(np.float32)
    return a, b


def test_two_steps_exact(client: Any) -> None:
    a, b = _ab()
    result = client.infer("ens_two", _inputs(client, A=a, B=b))
    np.testing.assert_array_equal(result.as_numpy("SCALED"), (a + b) * 2)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)


def test_three_steps_with_parallel_branches_exact(client: Any) -> None:
    a, b = _ab(3)
    result = client.infer("ens_three", _inputs(client, A=a, B=b))
    np.testing.assert_array_equal(result.as_numpy("SCALED"), (a + b) * 2)
    np.testing.assert_array_equal(result.as_numpy("NEGATED"), -(a - b))


def test_nested_ensemble_exact(client: Any) -> None:
    a, b = _ab(1)
    result = client.infer("ens_nested", _inputs(client, A=a, B=b))
    np.testing.assert_array_equal(result.as_numpy("Z"), (a + b) * 2 + (a - b))


def test_only_requested_outputs_returned(client: Any) -> None:
    a, b = _ab(1)
    result = client.infer("ens_two", _inputs(client, A=a, B=b), outputs=_outputs(client, "DIFF"))
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    assert result.as_numpy("SCALED") is None


def test_subset_of_outputs_returned_promptly(client: Any) -> None:
    """The slow branch (3 s) does not run when only the fast output is asked for."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    started = time.monotonic()
    result = client.infer("ens_subset", _inputs(client, X=x), outputs=_outputs(client, "FAST"))
    elapsed = time.monotonic() - started
    np.testing.assert_array_equal(result.as_numpy("FAST"), x * 2)
    assert elapsed < 2.5, f"the answer waited for the slow branch ({elapsed:.2f} s)"


def test_failing_step_names_its_model_and_server_keeps_serving(client: Any) -> None:
    big = np.full((1, 16), 1e7, dtype=np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("ens_fail", _inputs(client, X=big))
    status = "400" if _module(client) is httpclient else "StatusCode.INVALID_ARGUMENT"
    assert info.value.status() == status
    assert info.value.message() == (
        "in ensemble 'ens_fail', step 1 (model 'pyneg'): value too large for pyneg"
    )
    x = np.ones((1, 16), dtype=np.float32)
    result = client.infer("ens_fail", _inputs(client, X=x))
    np.testing.assert_array_equal(result.as_numpy("Y"), -2 * x)


def test_bytes_through_an_ensemble(client: Any) -> None:
    text = np.array([[b"hello", b"", b"\xff\x00ab"]], dtype=object)
    result = client.infer("ens_bytes", _inputs(client, TEXT=text))
    assert result.as_numpy("OUT").tolist() == [[b"OLLEH", b"", b"BA\x00\xff"]]


def test_ensemble_metadata_config_and_readiness(client: Any) -> None:
    assert client.is_model_ready("ens_two")
    assert client.is_server_ready()
    if _module(client) is httpclient:
        metadata = client.get_model_metadata("ens_two")
        assert metadata["platform"] == "ensemble"
        assert [i["name"] for i in metadata["inputs"]] == ["A", "B"]
        config = client.get_model_config("ens_two")
        steps = config["ensemble_scheduling"]["step"]
        assert [s["model_name"] for s in steps] == ["add_sub", "pyscale"]
    else:
        assert client.get_model_metadata("ens_two").platform == "ensemble"


def test_statistics_count_the_ensemble_and_each_step(ensemble_server: Server) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)

    def counts(model: str) -> tuple[int, int]:
        stats = client.get_inference_statistics(model)["model_stats"][0]
        return stats["inference_stats"]["success"]["count"], stats["inference_count"]

    before = {m: counts(m) for m in ("ens_three", "add_sub", "pyscale", "pyneg")}
    a, b = _ab(2)
    for _ in range(3):
        client.infer("ens_three", _inputs(client, A=a, B=b))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        after = {m: counts(m) for m in before}
        if all(after[m][0] - before[m][0] == 3 for m in before):
            break
        time.sleep(0.1)
    for model in before:
        assert after[model][0] - before[model][0] == 3, model
        assert after[model][1] - before[model][1] == 6, model  # 3 requests of batch 2
    client.close()


def test_steps_batch_with_each_other(ensemble_server: Server) -> None:
    """Concurrent ensemble requests meet in the composing model's dynamic batcher."""
    client = httpclient.InferenceServerClient(ensemble_server.http_url, concurrency=16)
    a, b = _ab(1)
    before = client.get_inference_statistics("pyscale")["model_stats"][0]["execution_count"]
    pending = [client.async_infer("ens_two", _inputs(client, A=a, B=b)) for _ in range(16)]
    for request in pending:
        np.testing.assert_array_equal(request.get_result().as_numpy("SCALED"), (a + b) * 2)
    after = client.get_inference_statistics("pyscale")["model_stats"][0]["execution_count"]
    assert 0 < after - before < 16
    client.close()


def test_cancellation_reaches_the_steps(ensemble_server: Server) -> None:
    """A client that gives up before the slow step ends gets its deadline error at once."""
    client = grpcclient.InferenceServerClient(ensemble_server.grpc_url)
    x = np.ones((1, 16), dtype=np.float32)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.infer("ens_subset", _inputs(client, X=x), client_timeout=1.0)
    assert time.monotonic() - started < 2.5
    assert "Deadline" in str(info.value.status()) or "DEADLINE" in str(info.value.status())
    client.close()


def test_load_errors_name_step_and_tensor(tmp_path: Path, redis_url: str) -> None:
    """An ensemble whose step maps a tensor the model lacks fails to load; the server
    serves the rest (Triton: the ensemble is UNAVAILABLE with the reason)."""
    repo = tmp_path / "repo"
    for name in ("pyscale", "ens_fail", "pyneg"):
        shutil.copytree(ROOT / "tests/assets/ensemble_models" / name, repo / name)
    config = repo / "ens_fail" / "config.pbtxt"
    config.write_text(
        config.read_text().replace('key: "X" value: "doubled"', 'key: "Q" value: "doubled"')
    )
    server = start_server(repo, redis_url, tmp_path / "serve.log", "--exit-on-error", "false",
                          "--strict-readiness", "false")  # fmt: skip
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["ens_fail"]["state"] == "UNAVAILABLE"
        assert index["ens_fail"]["reason"] == (
            "in ensemble 'ens_fail', ensemble tensor 'doubled' is mapping to non-existing "
            "input 'Q' in model 'pyneg' (step 1 (model 'pyneg'))"
        )
        assert index["pyneg"]["state"] == "READY"
        client.close()
    finally:
        assert stop_server(server) == 0, server.log()


# -- BLS -------------------------------------------------------------------------------


def test_bls_sync_exact(client: Any) -> None:
    x = np.random.default_rng(7).standard_normal((2, 16)).astype(np.float32)
    result = client.infer("bls_sync", _inputs(client, X=x))
    np.testing.assert_array_equal(result.as_numpy("OUT"), x * 2 + x)


def test_bls_async_exact(client: Any) -> None:
    x = np.random.default_rng(8).standard_normal((1, 16)).astype(np.float32)
    result = client.infer("bls_async", _inputs(client, X=x))
    np.testing.assert_array_equal(result.as_numpy("SCALED"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("NEGATED"), -x)


def test_bls_calls_batch_in_the_callee(ensemble_server: Server) -> None:
    """Concurrent BLS calls (async_exec from a batch of requests) meet in the callee's
    dynamic batcher: the statistics show fewer executions than calls."""
    client = httpclient.InferenceServerClient(ensemble_server.http_url, concurrency=16)

    def pyscale() -> tuple[int, int]:
        stats = client.get_inference_statistics("pyscale")["model_stats"][0]
        return stats["execution_count"], stats["inference_stats"]["success"]["count"]

    before = pyscale()
    xs = [np.full((1, 16), i, np.float32) for i in range(16)]
    pending = [client.async_infer("bls_async", _inputs(client, X=x)) for x in xs]
    for x, request in zip(xs, pending, strict=True):
        np.testing.assert_array_equal(request.get_result().as_numpy("SCALED"), x * 2)
    deadline = time.monotonic() + 10
    while pyscale()[1] - before[1] < 16 and time.monotonic() < deadline:
        time.sleep(0.1)
    executions, successes = (a - b for a, b in zip(pyscale(), before, strict=True))
    assert successes == 16
    assert executions < 16  # batched executions
    client.close()


@pytest.mark.parametrize(
    ("target", "x", "timeout_us", "code", "message"),
    [
        ("nope", 1.0, 0, "404", "BLS: Request for unknown model: 'nope' is not found"),
        (
            "bls_errors",
            1.0,
            0,
            "400",
            "BLS: BLS request from model 'bls_errors' to itself is not allowed: its "
            "instances may all be waiting for this answer",
        ),
        ("pyneg", 1e7, 0, "400", "BLS: value too large for pyneg"),
        ("pysleep", 1.0, 300_000, "503", "BLS: Request timeout expired"),
    ],
)
def test_bls_errors(
    ensemble_server: Server, target: str, x: float, timeout_us: int, code: str, message: str
) -> None:
    client = httpclient.InferenceServerClient(ensemble_server.http_url)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            "bls_errors",
            _inputs(client, X=np.full((1, 16), x, np.float32)),
            parameters={"target": target, "timeout_us": timeout_us},
        )
    assert (info.value.status(), info.value.message()) == (code, message)
    assert time.monotonic() - started < 3.0  # no hang, not even for the slow model
    result = client.infer(
        "bls_errors",
        _inputs(client, X=np.ones((1, 16), np.float32)),
        parameters={"target": "pyneg"},
    )
    np.testing.assert_array_equal(result.as_numpy("OUT"), -np.ones((1, 16), np.float32))
    client.close()
