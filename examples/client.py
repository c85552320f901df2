"""Classify the held-out digits through a running Sluice server and compare with onnxruntime.

Usage::

    python examples/build_models.py          # once: writes the model.onnx files
    python examples/client.py [--url localhost:8000] [--model-repository DIR] [--batch-size 32]

The held-out images (the same split as ``build_models.py``) are sent to the
``digits`` model with ``tritonclient.http`` in batches (binary tensors, the
client's default); the same images are run through in-process onnxruntime on
``DIR/digits/1/model.onnx``. Both accuracies are printed, and the exit code is
1 when the predicted labels differ anywhere (2 when the server cannot be reached
or the model file is missing).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = "digits"


def _load_build_models() -> ModuleType:
    """Import ``build_models.py`` (next to this script) by path."""
    spec = importlib.util.spec_from_file_location(
        "sluice_examples_build_models", HERE / "build_models.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def infer_sluice(url: str, x: np.ndarray, batch_size: int, timeout_s: float = 30.0) -> np.ndarray:
    """Send ``x`` to the server's ``digits`` model in batches and return the int64 labels."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        url=url, connection_timeout=timeout_s, network_timeout=timeout_s
    )
    try:
        labels: list[np.ndarray] = []
        for start in range(0, len(x), batch_size):
            batch = np.ascontiguousarray(x[start : start + batch_size], dtype=np.float32)
            inp = httpclient.InferInput("input", list(batch.shape), "FP32")
            inp.set_data_from_numpy(batch)  # binary_data=True by default
            out = httpclient.InferRequestedOutput("label")  # binary_data=True by default
            result = client.infer(MODEL, inputs=[inp], outputs=[out])
            got = result.as_numpy("label")
            if got is None:
                raise RuntimeError("response has no 'label' output")
            got = np.asarray(got).reshape(-1)
            if got.shape[0] != batch.shape[0]:
                raise RuntimeError(
                    f"'label' has {got.shape[0]} values for a batch of {batch.shape[0]}"
                )
            labels.append(got.astype(np.int64, copy=False))
        return np.concatenate(labels)
    finally:
        client.close()


def infer_onnxruntime(model_path: Path, x: np.ndarray) -> np.ndarray:
    """Run ``x`` through the ONNX model in-process and return the int64 labels."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    (label,) = sess.run(["label"], {"input": np.ascontiguousarray(x, dtype=np.float32)})
    return np.asarray(label).reshape(-1).astype(np.int64, copy=False)


def _accuracy_line(name: str, pred: np.ndarray, y: np.ndarray) -> str:
    """Format ``name accuracy: 0.9733 (438/450)``."""
    correct = int((pred == y).sum())
    return f"{name} accuracy: {correct / len(y):.4f} ({correct}/{len(y)})"


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(
        description="Digits accuracy through Sluice vs in-process onnxruntime."
    )
    parser.add_argument(
        "--url", default="localhost:8000", help="server HTTP host:port (default localhost:8000)"
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=HERE / "model_repository",
        help="model repository holding digits/1/model.onnx (default: examples/model_repository)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="images per request (default 32)"
    )
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error("--batch-size must be >= 1")

    x, y = _load_build_models().digits_test_split()
    model_path = args.model_repository / MODEL / "1" / "model.onnx"
    if not model_path.is_file():
        print(
            f"error: {model_path} not found; run `python examples/build_models.py` first",
            file=sys.stderr,
        )
        return 2

    ort_pred = infer_onnxruntime(model_path, x)
    try:
        sluice_pred = infer_sluice(args.url, x, args.batch_size)
    except (ConnectionError, OSError) as exc:
        print(f"onnxruntime in-process {_accuracy_line('', ort_pred, y).strip()}")
        print(f"error: cannot reach the server at {args.url}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        print(f"onnxruntime in-process {_accuracy_line('', ort_pred, y).strip()}")
        print(
            f"error: inference on {args.url} failed: {type(exc).__name__}: {exc}", file=sys.stderr
        )
        return 2

    print(_accuracy_line("sluice", sluice_pred, y))
    print(_accuracy_line("onnxruntime in-process", ort_pred, y))
    diff = np.flatnonzero(sluice_pred != ort_pred)
    if diff.size == 0:
        print("match: exact")
        return 0
    shown = ", ".join(f"#{i}: sluice {sluice_pred[i]} vs ort {ort_pred[i]}" for i in diff[:10])
    print(f"match: MISMATCH in {diff.size}/{len(y)} labels ({shown})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
