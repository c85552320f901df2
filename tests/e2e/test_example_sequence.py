"""The stateful example (``examples/sequence``): ``build_model.py`` trains a GRU with torch
and writes ``gru_stream`` (one ONNX step, the hidden state as implicit state); a real
``sluice serve`` serves it; ``client.py`` streams interleaved sequences over one gRPC
stream, and every answer must equal the model run in-process step by step."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from e2e_support import ROOT, Server, load_module, start_server, stop_server

from sluice.broker.redis_server import delete_prefix

EXAMPLE = ROOT / "examples" / "sequence"
TOLERANCE = 1e-5
#: optimizer steps of the test's model: fewer than the example's default (time), enough
#: for predictions clearly better than repeating the last observation.
ITERATIONS = 150


@pytest.fixture(scope="module")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model repository with ``gru_stream``, built by the example's own script."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: examples/sequence/build_model.py trains with it")
    out = tmp_path_factory.mktemp("sequence-example")
    build = subprocess.run(
        [sys.executable, str(EXAMPLE / "build_model.py"), "--out", str(out),
         "--iterations", str(ITERATIONS)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    return out


@pytest.fixture(scope="module")
def example_server(example_repository: Path, redis_url: str) -> Iterator[Server]:
    """``sluice serve`` on the example repository, under a key prefix of its own."""
    prefix = f"sluice-e2e-seq-example-{uuid.uuid4().hex[:8]}:"
    log = example_repository.parent / "sequence-example-serve.log"
    server = start_server(example_repository, redis_url, log, key_prefix=prefix)
    try:
        yield server
    finally:
        stop_server(server)
        delete_prefix(redis_url, prefix, timeout_s=5.0)


@pytest.fixture(scope="module")
def client() -> object:
    """``examples/sequence/client.py`` as a module."""
    return load_module("examples/sequence/client.py", "sluice_example_sequence_client")


@pytest.mark.parametrize("pipelined", [False, True], ids=["round-by-round", "pipelined"])
def test_streamed_steps_equal_the_model_run_in_process(
    example_server: Server, example_repository: Path, client: object, pipelined: bool
) -> None:
    """Ten sequences of 21 to 24 steps interleaved on one gRPC stream (each round's steps
    in a shuffled order; or every step sent at once): every answer equals onnxruntime
    in-process within 1e-5, steps of several sequences ran as one batch, and the
    predictions beat repeating the last observation."""
    model_path = example_repository / "gru_stream" / "1" / "model.onnx"
    first_id = 5000 if pipelined else 4000
    result = client.compare(  # type: ignore[attr-defined]
        example_server.grpc_url, model_path, sequences=10, steps=24, first_id=first_id,
        pipelined=pipelined,
    )  # fmt: skip
    assert result.ids == list(range(first_id, first_id + 10))
    assert [len(s) for s in result.served] == [24 - i % 4 for i in range(10)]
    for served, local in zip(result.served, result.local, strict=True):
        assert not np.isnan(served).any()
        np.testing.assert_allclose(served, local, rtol=0, atol=TOLERANCE)
    assert result.max_diff() <= TOLERANCE
    # the sequences are different series, so a mixed-up state would show as a mismatch
    assert len({round(float(s[-1]), 4) for s in result.served}) == 10
    assert result.executions is not None and result.executions < result.steps
    series = client.load_series()  # type: ignore[attr-defined]
    rmse = client.pooled_rmse  # type: ignore[attr-defined]
    model_error = rmse(result.served, result.target, series.WARMUP_STEPS)
    naive_error = rmse(result.observed, result.target, series.WARMUP_STEPS)
    assert model_error < 0.6 * naive_error


def test_client_command_line_reports_a_match(
    example_server: Server, example_repository: Path
) -> None:
    """``client.py`` as a user runs it: exit code 0 and an OK result line; a sequence id
    range of its own."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLE / "client.py"), "--url", example_server.grpc_url,
         "--model-repository", str(example_repository), "--sequences", "8", "--steps", "16",
         "--first-id", "6000"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "result: OK: max |Sluice - in-process| over 116 steps" in run.stdout


def test_client_refuses_more_round_by_round_sequences_than_the_model_keeps_live(
    example_server: Server, example_repository: Path, client: object
) -> None:
    """Round by round, a 17th sequence would wait for one of the 16 candidates to end
    while the client waits for its answer: the client refuses before sending anything."""
    model_path = example_repository / "gru_stream" / "1" / "model.onnx"
    with pytest.raises(client.StreamError, match=r"holds 16 .* Use --pipelined"):  # type: ignore[attr-defined]
        client.compare(example_server.grpc_url, model_path, sequences=17, steps=4)  # type: ignore[attr-defined]


def test_report_flags_a_difference(client: object) -> None:
    """The client's verdict turns to MISMATCH (False) when one answer is off by more than
    the tolerance."""
    zeros = [np.zeros(12, dtype=np.float32) for _ in range(2)]
    result = client.Comparison(  # type: ignore[attr-defined]
        ids=[1, 2], observed=zeros, target=zeros,
        served=[z.copy() for z in zeros], local=[z.copy() for z in zeros],
    )  # fmt: skip
    assert client.report(result, "test", TOLERANCE) is True  # type: ignore[attr-defined]
    result.served[1][5] = 2e-5
    assert client.report(result, "test", TOLERANCE) is False  # type: ignore[attr-defined]


def test_build_script_without_torch_says_so() -> None:
    """Where torch cannot be imported, build_model.py names it and exits with 2."""
    code = (
        "import sys, runpy; sys.modules['torch'] = None; sys.argv = ['build_model.py', "
        f"'--out', '/nonexistent']; runpy.run_path({str(EXAMPLE / 'build_model.py')!r}, "
        "run_name='__main__')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "trains its model with torch, which cannot be imported" in run.stderr
