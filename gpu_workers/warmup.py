"""Model warmup: run the config's ``model_warmup`` samples before an instance is READY.

Triton semantics (model_config.proto ``ModelWarmup``; docs/user-guide/backends.md,
"Model warm-up"; core ``TritonModelInstance::GenerateWarmupData`` / ``WarmUp``):

* every sample runs ``max(count, 1)`` times; each run is one ``execute`` call
  holding ``batch_size`` requests of batch 1 (the sample's inputs duplicated),
  so a batching model sees a batch of ``batch_size``; a sample with
  ``batch_size`` 0 is skipped;
* each input has ``data_type``, ``dims`` (without the batch dimension) and one of
  ``zero_data``, ``random_data`` (BYTES falls back to zero data: empty strings)
  or ``input_data_file``, a file in ``<model_dir>/warmup/`` holding the raw
  row-major data (BYTES: 4-byte little-endian length + bytes per element); a
  file with more bytes than needed is read from its start;
* a sample that fails (bad data, an error response, an exception) fails the
  load, and the reason names the sample.

Random data is drawn with numpy (floats in [0, 1), integers in [0, 128), random
booleans) so it is always a valid value of its type.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from sluice.broker.datatypes import NUMPY_DTYPES, protocol_to_config
from sluice.gpu_workers.backends.base import Backend, InferError, InferRequest, InstanceContext

__all__ = ["WarmupError", "build_requests", "run_warmup"]

logger = logging.getLogger(__name__)

#: ``<model_dir>/warmup/`` holds the ``input_data_file`` files (Triton kWarmupDataFolder).
WARMUP_FOLDER = "warmup"

#: config ``TYPE_*`` name -> numpy dtype of every fixed-size type (broker.datatypes' table).
_NUMPY_TYPES: dict[str, Any] = {
    protocol_to_config(name): dtype for name, dtype in NUMPY_DTYPES.items() if name != "BYTES"
}


class WarmupError(RuntimeError):
    """A warmup sample failed; the message names the model and the sample."""


def _element_count(dims: Sequence[int]) -> int:
    count = 1
    for dim in dims:
        count *= dim
    return count


def _read_bytes_elements(raw: bytes, count: int, source: str) -> list[bytes]:
    """``count`` length-prefixed BYTES elements from the start of ``raw``.

    Raises:
        ValueError: ``raw`` holds fewer than ``count`` complete elements.
    """
    items: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + 4 > len(raw):
            raise ValueError(f"{source} holds {index} BYTES element(s), the sample needs {count}")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ValueError(f"{source}: BYTES element {index} is cut short")
        items.append(raw[offset : offset + length])
        offset += length
    return items


def _object_array(items: Sequence[bytes], dims: Sequence[int]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array.reshape(tuple(dims))


def sample_input(name: str, spec: Any, warmup_dir: Path, rng: np.random.Generator) -> np.ndarray:
    """One warmup input without the batch dimension (shape ``dims``).

    Args:
        name: the input's name (for messages).
        spec: a ``ModelWarmup.Input``.
        warmup_dir: ``<model_dir>/warmup``.
        rng: the random generator for ``random_data``.

    Raises:
        ValueError: variable dims, an unknown data type, no data source, or a
            missing/short ``input_data_file``; the message names the input.
    """
    type_name = DataType.Name(spec.data_type)
    dims = list(spec.dims)
    if any(d < 0 for d in dims):
        raise ValueError(f"input '{name}' has variable-size dims {dims}; warmup needs fixed dims")
    count = _element_count(dims)
    source = spec.WhichOneof("input_data_type")
    is_bytes = type_name == "TYPE_STRING"
    if not is_bytes and type_name not in _NUMPY_TYPES:
        raise ValueError(f"input '{name}' has data type {type_name}, which warmup cannot fill")
    if source is None:
        raise ValueError(f"input '{name}' sets none of zero_data, random_data, input_data_file")
    if source == "input_data_file":
        path = warmup_dir / spec.input_data_file
        if not path.is_file():
            raise ValueError(f"input '{name}': warmup data file '{path}' does not exist")
        raw = path.read_bytes()
        if is_bytes:
            return _object_array(_read_bytes_elements(raw, count, f"'{path}'"), dims)
        dtype = np.dtype(_NUMPY_TYPES[type_name]).newbyteorder("<")
        needed = count * dtype.itemsize
        if len(raw) < needed:
            raise ValueError(
                f"input '{name}': warmup setting expects {needed} bytes, but the data "
                f"provided from '{spec.input_data_file}' only has {len(raw)} bytes"
            )
        values = np.frombuffer(raw[:needed], dtype=dtype)
        return values.astype(dtype.newbyteorder("=")).reshape(dims)
    if is_bytes:  # zero_data, and random_data falls back to zeros for BYTES
        return _object_array([b""] * count, dims)
    dtype = np.dtype(_NUMPY_TYPES[type_name])
    if source == "zero_data" or not spec.random_data:
        return np.zeros(dims, dtype=dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, dims).astype(np.bool_)
    if dtype.kind == "f":
        return rng.random(dims).astype(dtype)
    return rng.integers(0, 128, dims).astype(dtype)


def build_requests(
    config: ModelConfig, sample: Any, model_dir: Path, rng: np.random.Generator
) -> list[InferRequest]:
    """The requests of one run of ``sample``: ``batch_size`` requests of batch 1.

    Args:
        config: the effective model config.
        sample: a ``ModelWarmup``.
        model_dir: the model's directory (``warmup/`` lives in it).
        rng: the random generator for ``random_data``.

    Returns:
        ``batch_size`` requests; inputs have shape ``[1] + dims`` when the model
        batches, ``dims`` otherwise. Empty when ``batch_size`` is 0.

    Raises:
        ValueError: an input cannot be built, or ``batch_size`` exceeds
            ``max_batch_size`` (a non-batching model takes batch_size 1 only).
    """
    batching = config.max_batch_size > 0
    limit = config.max_batch_size if batching else 1
    if sample.batch_size > limit:
        raise ValueError(
            f"batch_size {sample.batch_size} exceeds the model's "
            + (f"max_batch_size {limit}" if batching else "limit of 1 (max_batch_size 0)")
        )
    warmup_dir = model_dir / WARMUP_FOLDER
    inputs: dict[str, np.ndarray] = {}
    for name in sorted(sample.inputs):
        array = sample_input(name, sample.inputs[name], warmup_dir, rng)
        inputs[name] = array[np.newaxis, ...] if batching else array
    return [
        InferRequest(request_id=f"warmup-{sample.name}-{index}", client_id="", inputs=dict(inputs))
        for index in range(sample.batch_size)
    ]


def run_warmup(backend: Backend, ctx: InstanceContext, seed: int = 0) -> int:
    """Run every ``model_warmup`` sample of ``ctx.config`` through ``backend.execute``.

    Args:
        backend: the initialized instance.
        ctx: the instance's context (config and model directory).
        seed: seed of the ``random_data`` generator.

    Returns:
        How many ``execute`` calls ran.

    Raises:
        WarmupError: a sample could not be built, ``execute`` raised or
            answered a request with an error; the message names model and sample.
    """
    rng = np.random.default_rng(seed)
    calls = 0
    for sample in ctx.config.model_warmup:
        label = f"failed to run warmup sample '{sample.name}' of model '{ctx.model_name}'"
        if sample.batch_size == 0:
            logger.info(
                "model '%s': skipping warmup sample '%s' with batch_size 0",
                ctx.model_name,
                sample.name,
            )
            continue
        try:
            requests = build_requests(ctx.config, sample, ctx.model_dir, rng)
        except ValueError as exc:
            raise WarmupError(f"{label}: {exc}") from exc
        for _ in range(max(sample.count, 1)):
            try:
                results = backend.execute(requests)
            except Exception as exc:
                raise WarmupError(f"{label}: {type(exc).__name__}: {exc}") from exc
            calls += 1
            if not isinstance(results, list) or len(results) != len(requests):
                raise WarmupError(f"{label}: execute returned a malformed response list")
            for result in results:
                if isinstance(result, InferError):
                    raise WarmupError(f"{label}: {result.message}")
        logger.info(
            "model '%s' instance '%s': warmup sample '%s' ran %d time(s)",
            ctx.model_name,
            ctx.instance_name,
            sample.name,
            max(sample.count, 1),
        )
    return calls
