"""Train the ``textgen`` example model: a character n-gram model counted with numpy on
the prose of the Python documentation that ships with the interpreter.

Usage::

    .venv/bin/python examples/streaming/build_model.py [--out DIR] [--order N]

The training text is ``pydoc_data.topics`` from the standard library (the language
reference topics ``help()`` shows, about 270,000 characters once code samples and
grammar rules are left out), so nothing is downloaded, and the same Python version
gives the same model. The counts are written to ``DIR/textgen/1/textgen.npz`` (format:
``textgen_ngram.py``); ``DIR`` defaults to ``examples/streaming/model_repository``. For
another ``DIR`` the model's ``config.pbtxt``, ``model.py`` and ``textgen_ngram.py`` are
copied there too, so ``DIR`` is a complete model repository. Takes about a second.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "model_repository"
MODEL = "textgen"
#: the model's file, in its version directory
MODEL_FILE = "textgen.npz"
#: context length in characters: long enough for whole words, short enough not to copy
#: whole sentences of the training text
DEFAULT_ORDER = 7
#: the committed model files that a repository other than the default needs as well
SOURCES = ("config.pbtxt", "1/model.py", "1/textgen_ngram.py")


def load_ngram(repository: Path = DEFAULT_OUT) -> ModuleType:
    """``textgen_ngram.py`` of the model in ``repository`` (the module the server runs),
    imported by path."""
    path = repository / MODEL / "1" / "textgen_ngram.py"
    spec = importlib.util.spec_from_file_location("sluice_example_textgen_ngram", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def training_text() -> str:
    """The prose of ``pydoc_data.topics``, normalized (``textgen_ngram.normalize``): every
    paragraph that is not indented (code), a grammar rule (``::=``), an interactive
    session (``>>>``) or a heading underline, one paragraph after another."""
    import pydoc_data.topics

    ngram = load_ngram()
    underline = re.compile(r"\s*([*=~^+-])\1{3,}\s*")
    paragraphs = []
    for topic in sorted(pydoc_data.topics.topics):
        for paragraph in re.split(r"\n\s*\n", pydoc_data.topics.topics[topic]):
            lines = [
                line for line in paragraph.splitlines()
                if line.strip() and not underline.fullmatch(line)
            ]  # fmt: skip
            if not lines or lines[0].startswith(" ") or "::=" in paragraph or ">>>" in paragraph:
                continue
            paragraphs.append(ngram.normalize(" ".join(lines).replace("*", "")).strip())
    return " ".join(p for p in paragraphs if p)


def count_ngrams(text: str, order: int) -> dict[str, np.ndarray]:
    """The arrays of the model file (``textgen_ngram.py``) for ``text`` (printable ASCII).

    For each context length ``k``, every position ``i >= k`` of the text gives one
    (context code, next character) pair; ``np.unique`` over ``code * V + next`` counts
    them, sorted by context, which is the sparse table's row order.
    """
    vocab = sorted(set(text))
    size = len(vocab)
    if size > 96 or order > 8:
        raise ValueError("context codes need V <= 96 and order <= 8 to fit int64")
    lookup = np.zeros(128, dtype=np.int64)
    lookup[[ord(c) for c in vocab]] = np.arange(size)
    indices = lookup[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    arrays: dict[str, np.ndarray] = {
        "vocab": np.array(vocab),
        "order": np.array(order, dtype=np.int64),
        "unigram": np.bincount(indices, minlength=size).astype(np.int64),
    }
    for k in range(1, order + 1):
        codes = _shifted_codes(indices, k, size)
        pairs, counts = np.unique(codes * size + indices[k:], return_counts=True)
        contexts, starts = np.unique(pairs // size, return_index=True)
        arrays[f"contexts_{k}"] = contexts
        arrays[f"indptr_{k}"] = np.append(starts, len(pairs)).astype(np.int64)
        arrays[f"next_{k}"] = pairs % size
        arrays[f"counts_{k}"] = counts.astype(np.int64)
    return arrays


def _shifted_codes(indices: np.ndarray, k: int, size: int) -> np.ndarray:
    """int64 ``[len(indices) - k]``: the code of ``indices[i - k : i]`` for each ``i >= k``."""
    codes = np.zeros(len(indices) - k, dtype=np.int64)
    for j in range(k):  # oldest character first: the most significant digit
        codes = codes * size + indices[j : len(indices) - k + j]
    return codes


def build(out: Path = DEFAULT_OUT, order: int = DEFAULT_ORDER) -> Path:
    """Count the n-grams and write the model into the repository ``out``; the path of the
    model file. Copies the model's committed files there when ``out`` is not the default."""
    model_dir = out / MODEL
    if out.resolve() != DEFAULT_OUT.resolve():
        for name in SOURCES:
            (model_dir / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(DEFAULT_OUT / MODEL / name, model_dir / name)
    path = model_dir / "1" / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **count_ngrams(training_text(), order))
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"model repository (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--order", type=int, default=DEFAULT_ORDER,
        help=f"context length in characters, 1..8 (default {DEFAULT_ORDER})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not 1 <= args.order <= 8:
        parser.error("--order must be 1..8")
    started = time.perf_counter()
    path = build(args.out, args.order)
    seconds = time.perf_counter() - started
    ngram = load_ngram(args.out)
    model = ngram.CharNgram.load(path)
    with np.load(path) as data:
        contexts = sum(len(data[f"contexts_{k}"]) for k in range(1, args.order + 1))
    print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB): order {args.order}, "
        f"{len(model.vocab)} characters, {contexts} contexts, {seconds:.1f} s"
    )
    sample = "".join(model.generate("The ", 160, temperature=0.8, seed=2))
    print(f"sample (seed 2): The {sample}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
