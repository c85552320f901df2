"""Concatenate request inputs into one batch and split the outputs back.

Triton concatenates each input along dim 0 in the batch's request order and
splits every output back by each request's batch size ``b``. Arrays of dtype
``object`` (BYTES tensors) are handled like any other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate, pairwise

import numpy as np

from sluice.batching.errors import BatchingError

__all__ = ["concat_input", "concat_inputs", "split_outputs"]


def concat_inputs(per_request: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate each named input of a batch's requests along dim 0.

    Args:
        per_request: One mapping per request, in batch order, from input name to
            an array of shape ``[b_i, *dims]``; every request supplies the same
            names, and each name has the same dtype and trailing dims everywhere.

    Returns:
        Name → array of shape ``[sum(b_i), *dims]``. With a single request its own
        arrays are returned (no copy).

    Raises:
        BatchingError: For an empty batch, differing input names, a 0-d array,
            or dtypes / trailing dims that differ between requests (the message
            names the input).
    """
    if not per_request:
        raise BatchingError("cannot concatenate the inputs of an empty batch")
    first = per_request[0]
    if len(per_request) == 1:
        return dict(first)
    names = set(first)
    for index, inputs in enumerate(per_request[1:], start=1):
        if set(inputs) != names:
            raise BatchingError(
                f"request {index} of the batch supplies inputs {sorted(inputs)}, "
                f"expected {sorted(names)}"
            )
    return {name: concat_input(name, [inputs[name] for inputs in per_request]) for name in first}


def concat_input(name: str, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Concatenate one input's arrays (one per request, in batch order) along dim 0.

    Args:
        name: the input's name, for the error message.
        arrays: arrays of shape ``[b_i, *dims]``, one dtype and one ``dims``.

    Returns:
        An array of shape ``[sum(b_i), *dims]`` (a new one, also for a single array).

    Raises:
        BatchingError: For no arrays, a 0-d array, or dtypes / trailing dims that differ
            between requests (the message names the input).
    """
    if not arrays:
        raise BatchingError(f"input '{name}': cannot concatenate the inputs of an empty batch")
    head = arrays[0]
    dtype, trailing = head.dtype, head.shape[1:]
    for array in arrays:
        if array.ndim == 0:
            raise BatchingError(f"input '{name}' has no batch dimension")
        if array.dtype != dtype or array.shape[1:] != trailing:
            raise BatchingError(
                f"input '{name}': cannot batch {array.dtype}{list(array.shape)} "
                f"with {head.dtype}{list(head.shape)}"
            )
    return np.concatenate(arrays, axis=0)


def split_outputs(
    outputs: Mapping[str, np.ndarray], batch_sizes: Sequence[int]
) -> list[dict[str, np.ndarray]]:
    """Split each batched output back into per-request views along dim 0.

    Args:
        outputs: Name → array of shape ``[sum(batch_sizes), ...]``.
        batch_sizes: Each request's ``b`` in batch order (`Batch.batch_sizes`).

    Returns:
        One mapping per request (``len(batch_sizes)`` entries — "one response per
        request"), name → view of shape ``[b_i, ...]`` sharing memory with the
        batched output.

    Raises:
        BatchingError: When an output's first dimension is not ``sum(batch_sizes)``
            (the message names the output), or a batch size is negative.
    """
    if any(size < 0 for size in batch_sizes):
        raise BatchingError(f"batch sizes must be >= 0, got {list(batch_sizes)}")
    total = sum(batch_sizes)
    for name, array in outputs.items():
        rows = array.shape[0] if array.ndim else None
        if rows != total:
            raise BatchingError(
                f"output '{name}': first dimension is {rows}, expected {total} "
                f"(the sum of the batch's request batch sizes {list(batch_sizes)})"
            )
    bounds = list(accumulate(batch_sizes, initial=0))
    return [
        {name: array[start:stop] for name, array in outputs.items()}
        for start, stop in pairwise(bounds)
    ]
