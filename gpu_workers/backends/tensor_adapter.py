"""Adapts a :class:`TensorBackend` (arrays in, arrays out) to the ``Backend`` protocol.

Applies the config's ``reshape`` on the way in and back to ``dims`` on the way
out (Triton model_config.proto: ``ModelTensorReshape`` — the wire and metadata
use ``dims``, the framework sees ``reshape.shape``), and turns a framework
exception into an INTERNAL error for the requests of that execution.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from sluice.batching import concat_input, split_outputs
from sluice.broker.datatypes import NUMPY_DTYPES, config_to_protocol
from sluice.gpu_workers.backends.base import (
    BackendInputError,
    InferError,
    InferRequest,
    InferResponse,
    InstanceContext,
    TensorBackend,
)

logger = logging.getLogger(__name__)


def _batched_shape(batch: int | None, shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(shape) if batch is None else (batch, *shape)


class TensorBackendAdapter:
    """Runs each request through a tensor framework (one execution per request for now).

    Args:
        framework: the framework session to drive.
    """

    def __init__(self, framework: TensorBackend) -> None:
        self._framework = framework
        self._ctx: InstanceContext | None = None
        self._input_reshape: dict[str, tuple[int, ...]] = {}
        self._output_dims: dict[str, tuple[tuple[int, ...], bool]] = {}
        self._output_dtypes: dict[str, np.dtype] = {}
        self._output_names: list[str] = []
        self._ragged: frozenset[str] = frozenset()

    def initialize(self, ctx: InstanceContext) -> None:
        """Load the model file of ``ctx`` into the framework."""
        self._ctx = ctx
        config = ctx.config
        for tensor in config.input:
            if tensor.HasField("reshape"):
                self._input_reshape[tensor.name] = tuple(tensor.reshape.shape)
        for tensor in config.output:
            self._output_names.append(tensor.name)
            self._output_dims[tensor.name] = (tuple(tensor.dims), tensor.HasField("reshape"))
            datatype = config_to_protocol(model_config_type_name(tensor.data_type))
            self._output_dtypes[tensor.name] = NUMPY_DTYPES[datatype]
        self._config_outputs = tuple(self._output_names)
        # implicit state outputs (sequence batching): produced on every run and always
        # returned, for the batcher to keep
        self._state_outputs: tuple[str, ...] = ()
        for state in config.sequence_batching.state:
            if state.output_name not in self._output_dims:
                self._output_names.append(state.output_name)
                self._output_dims[state.output_name] = (tuple(state.dims), False)
                datatype = config_to_protocol(model_config_type_name(state.data_type))
                self._output_dtypes[state.output_name] = NUMPY_DTYPES[datatype]
            self._state_outputs += (state.output_name,)
        self._ragged = frozenset(t.name for t in config.input if t.allow_ragged_batch)
        self._framework.load(ctx)

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | InferError]:
        """Run ``requests`` as one batch: concatenate along dim 0, run once, split back.

        Without a batch dimension (``max_batch_size`` 0) each request runs on its own.
        A framework exception fails every request of the execution with INTERNAL.
        """
        assert self._ctx is not None, "initialize() was not called"
        if self._ctx.config.max_batch_size <= 0 or len(requests) == 1:
            return [self._execute_many([request])[0] for request in requests]
        return self._execute_many(requests)

    def finalize(self) -> None:
        """Release the framework session."""
        self._framework.close()

    def _prepare(self, request: InferRequest, batching: bool) -> dict[str, np.ndarray]:
        feed: dict[str, np.ndarray] = {}
        for name, array in request.inputs.items():
            target = self._input_reshape.get(name)
            if target is not None:
                array = array.reshape(_batched_shape(array.shape[0] if batching else None, target))
            feed[name] = array
        return feed

    def _execute_many(self, requests: Sequence[InferRequest]) -> list[InferResponse | InferError]:
        assert self._ctx is not None
        batching = self._ctx.config.max_batch_size > 0
        sizes = [
            next(iter(r.inputs.values())).shape[0] if batching and r.inputs else 0 for r in requests
        ]
        try:
            if self._input_reshape:
                feeds = [self._prepare(r, batching) for r in requests]
            else:
                feeds = [r.inputs for r in requests]  # nothing to reshape: as they came
            if len(feeds) == 1:
                feed = dict(feeds[0])
            else:
                feed = {
                    name: np.concatenate([f[name].reshape(-1) for f in feeds])
                    if name in self._ragged
                    else concat_input(name, [f[name] for f in feeds])
                    for name in feeds[0]
                }
            produced = self._framework.run(feed, self._output_names)
            parts = [produced] if len(requests) == 1 else split_outputs(produced, sizes)
        except BackendInputError as exc:
            error = InferError("INVALID_ARG", f"model '{self._ctx.model_name}': {exc}")
            return [error] * len(requests)
        except Exception as exc:
            logger.exception(
                "model '%s' failed on %d request(s)", self._ctx.model_name, len(requests)
            )
            error = InferError("INTERNAL", f"model '{self._ctx.model_name}' failed: {exc}")
            return [error] * len(requests)
        responses: list[InferResponse | InferError] = []
        for request, part, size in zip(requests, parts, sizes, strict=True):
            wanted = request.requested_outputs or self._config_outputs
            if self._state_outputs:
                wanted = (*wanted, *(s for s in self._state_outputs if s not in wanted))
            outputs: dict[str, np.ndarray] = {}
            try:
                for name in wanted:
                    array = np.asarray(part[name])
                    dims, reshaped = self._output_dims[name]
                    if reshaped:
                        array = array.reshape(_batched_shape(size if batching else None, dims))
                    outputs[name] = self._cast(name, array)
            except Exception as exc:
                responses.append(
                    InferError("INTERNAL", f"model '{self._ctx.model_name}' output error: {exc}")
                )
                continue
            responses.append(InferResponse(outputs))
        return responses

    def _cast(self, name: str, array: np.ndarray) -> np.ndarray:
        dtype = self._output_dtypes[name]
        if dtype == np.dtype(object):
            if array.dtype != object or (array.size and isinstance(array.flat[0], str)):
                flat = [
                    v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.ravel()
                ]
                out = np.empty(len(flat), dtype=object)
                out[:] = flat
                return out.reshape(array.shape)
            return array
        return array if array.dtype == dtype else array.astype(dtype)


def model_config_type_name(data_type: int) -> str:
    """``DataType`` enum value -> its name (``TYPE_FP32``)."""
    from tritonclient.grpc.model_config_pb2 import DataType

    return DataType.Name(data_type)
