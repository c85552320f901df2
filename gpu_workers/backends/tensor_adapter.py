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

from broker.datatypes import NUMPY_DTYPES, config_to_protocol
from gpu_workers.backends.base import (
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
        self._framework.load(ctx)

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | InferError]:
        """Run every request; a framework exception fails that request with INTERNAL."""
        return [self._execute_one(request) for request in requests]

    def finalize(self) -> None:
        """Release the framework session."""
        self._framework.close()

    def _execute_one(self, request: InferRequest) -> InferResponse | InferError:
        assert self._ctx is not None, "initialize() was not called"
        batching = self._ctx.config.max_batch_size > 0
        batch = None
        feed: dict[str, np.ndarray] = {}
        for name, array in request.inputs.items():
            if batching:
                batch = array.shape[0]
            target = self._input_reshape.get(name)
            feed[name] = (
                array
                if target is None
                else array.reshape(_batched_shape(array.shape[0] if batching else None, target))
            )
        try:
            produced = self._framework.run(feed, self._output_names)
        except Exception as exc:
            logger.exception(
                "model '%s' failed on request %s", self._ctx.model_name, request.request_id
            )
            return InferError("INTERNAL", f"model '{self._ctx.model_name}' failed: {exc}")
        wanted = request.requested_outputs or tuple(self._output_names)
        outputs: dict[str, np.ndarray] = {}
        for name in wanted:
            array = np.asarray(produced[name])
            dims, reshaped = self._output_dims[name]
            if reshaped:
                array = array.reshape(_batched_shape(batch, dims))
            outputs[name] = self._cast(name, array)
        return InferResponse(outputs)

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
