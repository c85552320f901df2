"""Triton's classification extension: an output turned into its top-k ``"value:index[:label]"``.

Source: Triton ``src/classification.cc`` (docs/reference/http-protocol.md, "Classification
extension"). Values print the C++
``std::to_string`` way (integers as integers, floats with six decimals); the
index is the flat index inside one batch item; labels come from the output's
``label_filename`` (line ``index``) when the config names one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def read_labels(model_dir: Path, label_filename: str, model: str, output: str) -> list[str]:
    """Lines of ``model_dir / label_filename`` (empty list when no file is named).

    Raises:
        ValueError: the file cannot be read (the model fails to load, as in Triton),
            naming the model, the output and the file.
    """
    if not label_filename:
        return []
    path = model_dir / label_filename
    try:
        return path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(
            f"model '{model}', output '{output}': cannot read label_filename "
            f"'{label_filename}' ({path}): {reason}"
        ) from None


def _value_text(value: np.generic) -> str:
    if np.issubdtype(value.dtype, np.floating):
        return f"{float(value):.6f}"
    return str(int(value))


def classify(array: np.ndarray, k: int, batching: bool, labels: Sequence[str]) -> np.ndarray:
    """Top-``k`` class strings of ``array``.

    Args:
        array: the output, shape ``[b] + dims`` when ``batching`` else ``dims``; numeric,
            not 16-bit float, not BOOL.
        k: how many classes to keep per batch item (``min(k, n)`` are kept).
        batching: whether the first dimension is the batch.
        labels: label per flat index (may be shorter than the item or empty).

    Returns:
        An ``object`` array of ``bytes``, shape ``[b, min(k, n)]`` or ``[min(k, n)]``.
    """
    items = array.reshape(array.shape[0], -1) if batching else array.reshape(1, -1)
    n = items.shape[1]
    keep = min(k, n)
    out = np.empty((items.shape[0], keep), dtype=object)
    for row, item in enumerate(items):
        order = np.argsort(-item.astype(np.float64), kind="stable")[:keep]
        for col, index in enumerate(order):
            text = f"{_value_text(item[index])}:{int(index)}"
            if int(index) < len(labels):
                text += f":{labels[int(index)]}"
            out[row, col] = text.encode("utf-8")
    return out if batching else out.reshape(keep)
