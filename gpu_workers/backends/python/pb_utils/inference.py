"""Requests and responses of python_backend's API (``pb_utils.InferenceRequest``,
``pb_utils.InferenceResponse``; python_backend ``src/infer_request.cc``,
``src/infer_response.cc``, the ``src/pb_stub.cc`` bindings and the README), with the
module functions that look a tensor up by name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.gpu_workers.backends.python.pb_utils import bls
from sluice.gpu_workers.backends.python.pb_utils.errors import TritonError, TritonModelException
from sluice.gpu_workers.backends.python.pb_utils.tensor import Tensor

# tritonserver.h TRITONSERVER_RequestFlag / TRITONSERVER_ResponseCompleteFlag /
# TRITONSERVER_RequestReleaseFlag.
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class InferenceRequest:
    """A request: one the model receives in ``execute``, or a BLS request it builds.

    python_backend ``pb_utils.InferenceRequest``. Model code builds BLS requests
    with ``InferenceRequest(model_name=..., inputs=[...],
    requested_output_names=[...])`` and runs them with :meth:`exec`.

    Args:
        model_name: Target model (BLS).
        inputs: Input tensors.
        requested_output_names: Outputs to return.
        model_version: Target version, -1 = as the version policy decides.
        flags: ``TRITONSERVER_REQUEST_FLAG_SEQUENCE_*`` bits.
        request_id: The client's request id.
        correlation_id: Sequence id (0 = none); int or str.
        timeout: Queue timeout in microseconds (0 = none).
        parameters: Custom parameters, a dict or a JSON object string.
        preferred_memory: Accepted and ignored (GPU placement).
        trace: Accepted and ignored.
    """

    def __init__(
        self,
        model_name: str = "",
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str] = (),
        model_version: int = -1,
        flags: int = 0,
        request_id: str = "",
        correlation_id: int | str = 0,
        timeout: int = 0,
        parameters: Mapping[str, Any] | str | None = None,
        preferred_memory: Any = None,
        trace: Any = None,
    ) -> None:
        del preferred_memory, trace
        self._model_name = model_name
        self._inputs = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._timeout = int(timeout)
        if parameters is None:
            parameters = {}
        self._parameters = (
            parameters if isinstance(parameters, str) else json.dumps(dict(parameters))
        )
        #: a decoupled model's response sender for this request (set by the backend)
        self._response_sender: Any = None

    def inputs(self) -> list[Tensor]:
        """The input tensors (only those the client sent)."""
        return self._inputs

    def get_input_tensor_by_name(self, name: str) -> Tensor | None:
        """The input named ``name`` or None (same as the module function)."""
        return get_input_tensor_by_name(self, name)

    def requested_output_names(self) -> list[str]:
        """Outputs to produce (every configured output when the client named none)."""
        return self._requested_output_names

    def request_id(self) -> str:
        """The client's request id ("" when none)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (0 when the request is not in a sequence)."""
        return self._correlation_id

    def flags(self) -> int:
        """``TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`` / ``_END`` bits."""
        return self._flags

    def parameters(self) -> str:
        """The request's custom parameters as a JSON object string."""
        return self._parameters

    def timeout(self) -> int:
        """The request's timeout in microseconds (0 = none)."""
        return self._timeout

    def model_name(self) -> str:
        """The target model of a BLS request."""
        return self._model_name

    def model_version(self) -> int:
        """The target version of a BLS request (-1 = policy's choice)."""
        return self._model_version

    def is_cancelled(self) -> bool:
        """Whether the client cancelled this request (a decoupled model's request whose
        gRPC stream was closed or cancelled); always False for other models."""
        sender = self._response_sender
        return bool(sender is not None and sender.is_cancelled())

    def get_response_sender(self) -> Any:
        """The response sender of a request to a decoupled model
        (``send(response=None, flags=0)``, ``is_cancelled()``).

        Raises:
            TritonModelException: the model is not decoupled.
        """
        if self._response_sender is None:
            raise TritonModelException(
                "the response sender is available to decoupled models only "
                "(model_transaction_policy { decoupled: true })"
            )
        return self._response_sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on ``model_name`` (BLS) and return its response; with
        ``decoupled``, an iterator over its responses (a decoupled model's; the last one
        has the final flag and may be empty).

        Like Triton, a failure of the target model is returned as a response
        whose ``has_error()`` is True.

        Raises:
            TritonModelException: BLS is not available here.
        """
        executor = bls.executor
        if executor is None:
            raise TritonModelException(
                "BLS is not available: this process has no inference executor"
            )
        try:
            return executor(self, decoupled) if decoupled else executor(self)
        except TritonModelException:
            raise
        except Exception as exc:
            failed = InferenceResponse(error=TritonError(str(exc), TritonError.INTERNAL))
            return iter([failed]) if decoupled else failed

    async def async_exec(self, decoupled: bool = False) -> Any:
        """:meth:`exec` in a worker thread, for ``async def execute`` models."""
        return await asyncio.to_thread(self.exec, decoupled)

    def __repr__(self) -> str:
        names = [t.name() for t in self._inputs]
        return f"InferenceRequest(request_id={self._request_id!r}, inputs={names})"


class InferenceResponse:
    """A model's answer to one request (python_backend ``pb_utils.InferenceResponse``).

    Args:
        output_tensors: The output tensors.
        error: When set, the request fails with this error.
        parameters: Response parameters, a dict or a JSON object string.

    Raises:
        TritonModelException: ``output_tensors`` is not a list.
    """

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:
            output_tensors = []
        if not isinstance(output_tensors, list | tuple):
            raise TritonModelException('"output_tensors" must be a list.')
        self._output_tensors = list(output_tensors)
        self._error = error
        if parameters is None:
            parameters = {}
        self._parameters = (
            parameters if isinstance(parameters, str) else json.dumps(dict(parameters))
        )

    def output_tensors(self) -> list[Tensor]:
        """The output tensors."""
        return self._output_tensors

    def has_error(self) -> bool:
        """Whether the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The error, or None."""
        return self._error

    def parameters(self) -> str:
        """Response parameters as a JSON object string."""
        return self._parameters


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input tensor named ``name``, or None (python_backend utils)."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output tensor named ``name``, or None (python_backend utils)."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None
