"""Sluice's ``triton_python_backend_utils``: the API a Triton Python-backend ``model.py`` imports.

User code does ``import triton_python_backend_utils as pb_utils`` exactly as it
does under Triton. The names, signatures and behaviours follow Triton's
python_backend (``src/resources/triton_python_backend_utils.py`` for the helpers
and :class:`ModelConfig`, ``src/pb_stub.cc`` bindings and the python_backend
README for ``Tensor``, ``InferenceRequest``, ``InferenceResponse``,
``TritonError`` and ``Logger``). The worker-side adapter is
``gpu_workers.backends.python``.

This module imports only the standard library and numpy, because it is what
user model code imports.

BF16 tensors behave as Triton's: ``as_numpy`` raises (numpy has no bfloat16), and
``to_dlpack`` / ``from_dlpack`` exchange them with torch (imported only then).

Left out for now: decoupled models (``get_response_sender`` raises), GPU
tensors (every tensor is a CPU numpy array), request
cancellation (``is_cancelled`` is always False) and the metrics API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "LogLevel",
    "Logger",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]

# tritonserver.h TRITONSERVER_RequestFlag / TRITONSERVER_ResponseCompleteFlag /
# TRITONSERVER_RequestReleaseFlag.
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

#: model_config.proto ``DataType`` name -> numpy type (python_backend utils).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# tritonserver.h TRITONSERVER_DataType values, as ``Tensor.triton_dtype()`` returns them.
_TRITON_TO_NUMPY: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
_BYTES_TYPE = 13
#: TRITONSERVER_TYPE_BF16; such data is held as an ``ml_dtypes.bfloat16`` array (the
#: worker's wire type) or as its raw 16-bit patterns.
_BF16_TYPE = 14
_BF16_AS_NUMPY = (
    "Tensor dtype is BF16 and cannot be converted to numpy. Use to_dlpack() and "
    "from_dlpack() instead."
)
_NUMPY_TO_TRITON: dict[np.dtype, int] = {
    np.dtype(t): code for code, t in _TRITON_TO_NUMPY.items() if code != _BYTES_TYPE
}


def triton_to_numpy_type(data_type: int | str) -> Any:
    """TRITONSERVER_DataType value (or config name such as ``"TYPE_FP32"``) -> numpy type.

    python_backend utils ``triton_to_numpy_type``; returns None for unknown types.
    """
    if isinstance(data_type, str):
        return TRITON_STRING_TO_NUMPY.get(data_type)
    return _TRITON_TO_NUMPY.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or type -> TRITONSERVER_DataType value (python_backend utils).

    ``object``, ``bytes_`` and ``str_`` map to BYTES (13); unknown types to None.
    """
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OSU":
        return _BYTES_TYPE
    if dtype.name == "bfloat16":  # ml_dtypes' type (what tritonclient uses for BF16)
        return _BF16_TYPE
    return _NUMPY_TO_TRITON.get(dtype.newbyteorder("=") if dtype.byteorder != "|" else dtype)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32`` (python_backend utils; KeyError when unknown)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """BYTES array -> 4-byte little-endian length + bytes per element, C order.

    python_backend utils ``serialize_byte_tensor``; None for an empty or
    non-bytes array. ``str`` elements are UTF-8 encoded.
    """
    if input_tensor.size == 0 or input_tensor.dtype.kind not in "OS":
        return None
    parts: list[bytes] = []
    for item in input_tensor.ravel(order="C"):
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Inverse of :func:`serialize_byte_tensor`: a 1-D ``object`` array of ``bytes``."""
    items: list[bytes] = []
    offset = 0
    while offset < len(encoded_tensor):
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


class TritonModelException(Exception):
    """Exception a model raises (or Triton raises into it) for a failed operation.

    python_backend ``TritonModelException``; ``message()`` returns the text.
    """

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self._msg = msg

    def message(self) -> str:
        """The exception message."""
        return self._msg


class TritonError:
    """An error carried by an :class:`InferenceResponse` (fails only that request).

    python_backend ``TritonError(message, code=TritonError.INTERNAL)``; the
    codes are tritonserver.h ``TRITONSERVER_Error_Code`` values.
    """

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    #: code value -> Triton error code name.
    CODE_NAMES: dict[int, str] = {  # noqa: RUF012 - read-only lookup table
        0: "UNKNOWN",
        1: "INTERNAL",
        2: "NOT_FOUND",
        3: "INVALID_ARG",
        4: "UNAVAILABLE",
        5: "UNSUPPORTED",
        6: "ALREADY_EXISTS",
        7: "CANCELLED",
    }

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = message
        self._code = int(code)

    def message(self) -> str:
        """The error message."""
        return self._message

    def code(self) -> int:
        """The error code (one of the class attributes)."""
        return self._code

    def code_name(self) -> str:
        """The code's name, e.g. ``"INVALID_ARG"`` (Sluice addition)."""
        return self.CODE_NAMES.get(self._code, "UNKNOWN")

    def __str__(self) -> str:
        return self._message

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self.code_name()})"


def _torch(name: str) -> Any:
    """torch, imported for a BF16 DLPack exchange.

    Raises:
        TritonModelException: torch is not installed in the worker's environment.
    """
    try:
        import torch
    except ImportError as exc:
        raise TritonModelException(
            f"Tensor '{name}': BF16 tensors are exchanged through DLPack with torch, which "
            "is not installed"
        ) from exc
    return torch


def _bf16_view(bits: np.ndarray) -> np.ndarray:
    """16-bit patterns as an ``ml_dtypes.bfloat16`` array when ml_dtypes is there (the
    worker's wire type), else as they are."""
    try:
        from ml_dtypes import bfloat16
    except ImportError:
        return bits
    return bits.view(bfloat16)


class _DLPackCapsule:
    """Wraps a raw DLPack capsule so ``np.from_dlpack`` can consume it (CPU only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU, device 0


class Tensor:
    """A named tensor (python_backend ``pb_utils.Tensor``); always a CPU numpy array.

    Args:
        name: Tensor name.
        numpy_array: The data. BYTES tensors hold ``object`` arrays of ``bytes``
            (``bytes_``/``str_`` arrays are accepted and converted on output).

    Raises:
        TritonModelException: the array's dtype has no Triton datatype.
    """

    def __init__(self, name: str, numpy_array: Any) -> None:
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        dtype = numpy_to_triton_type(array.dtype)
        if dtype is None:
            raise TritonModelException(
                f"Tensor '{name}': numpy dtype '{array.dtype}' is not supported by the "
                "Python backend; use np.object_ for BYTES"
            )
        self._name = name
        self._array = array
        self._triton_dtype = dtype

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The data as a numpy array (no copy).

        Raises:
            TritonModelException: a BF16 tensor (python_backend: numpy has no bfloat16;
                use :meth:`to_dlpack`).
        """
        if self._triton_dtype == _BF16_TYPE:
            raise TritonModelException(_BF16_AS_NUMPY)
        return self._array

    def _data(self) -> np.ndarray:
        """The data whatever its type (the worker's view; BF16 included)."""
        return self._array

    def shape(self) -> list[int]:
        """The tensor's shape."""
        return [int(d) for d in self._array.shape]

    def triton_dtype(self) -> int:
        """The TRITONSERVER_DataType value (e.g. 11 for FP32, 13 for BYTES)."""
        return self._triton_dtype

    def is_cpu(self) -> bool:
        """Always True: Sluice hands Python models CPU tensors."""
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the data (numpy ``__dlpack__``; not for BYTES).

        Raises:
            TritonModelException: a BYTES tensor (DLPack has no string type).
        """
        if self._triton_dtype == _BYTES_TYPE:
            raise TritonModelException(
                f"Tensor '{self._name}': BYTES tensors cannot be converted to DLPack"
            )
        if self._triton_dtype == _BF16_TYPE:
            torch = _torch(self._name)
            bits = np.ascontiguousarray(self._array).view(np.int16)
            return torch.utils.dlpack.to_dlpack(torch.from_numpy(bits).view(torch.bfloat16))
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor from a DLPack capsule or any object with ``__dlpack__`` (CPU only).

        Raises:
            TritonModelException: the data is not on the CPU or cannot be read.
        """
        source = dlpack if hasattr(dlpack, "__dlpack__") else _DLPackCapsule(dlpack)
        try:
            array = np.from_dlpack(source)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            if "dtype" in str(exc).lower():  # numpy has no bfloat16: torch reads it
                return Tensor._from_bf16_dlpack(name, dlpack)
            raise TritonModelException(
                f"Tensor '{name}': cannot read DLPack data ({exc}); "
                "Sluice supports CPU tensors only"
            ) from exc
        return Tensor(name, array)

    @staticmethod
    def _from_bf16_dlpack(name: str, dlpack: Any) -> Tensor:
        """A BF16 tensor from DLPack data numpy cannot read (read through torch, copied).

        Raises:
            TritonModelException: torch is missing, or the data is not BF16 on the CPU.
        """
        torch = _torch(name)
        try:
            data = torch.utils.dlpack.from_dlpack(dlpack)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise TritonModelException(f"Tensor '{name}': cannot read DLPack data ({exc})") from exc
        if data.dtype != torch.bfloat16 or data.device.type != "cpu":
            raise TritonModelException(
                f"Tensor '{name}': DLPack data of dtype {data.dtype} on {data.device} that "
                "numpy cannot read; Sluice supports CPU tensors only"
            )
        bits = data.contiguous().view(torch.int16).numpy().copy()
        tensor = Tensor(name, bits)
        tensor._array = _bf16_view(bits)
        tensor._triton_dtype = _BF16_TYPE
        return tensor

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, shape={self.shape()}, dtype={self._array.dtype})"


#: BLS hook installed by the Sluice worker: runs one request on another model.
#: ``None`` when BLS is not available in this process.
_bls_executor: Callable[[InferenceRequest], InferenceResponse] | None = None


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
        """Always False: Sluice does not propagate cancellation to Python models yet."""
        return False

    def get_response_sender(self) -> Any:
        """Decoupled response sender (not available).

        Raises:
            TritonModelException: always; decoupled models are not supported yet.
        """
        raise TritonModelException("decoupled models are not supported yet by Sluice")

    def exec(self, decoupled: bool = False) -> InferenceResponse:
        """Run this request on ``model_name`` (BLS) and return its response.

        Like Triton, a failure of the target model is returned as a response
        whose ``has_error()`` is True.

        Raises:
            TritonModelException: BLS is not available here, or ``decoupled`` was asked.
        """
        if decoupled:
            raise TritonModelException("decoupled BLS requests are not supported yet by Sluice")
        executor = _bls_executor
        if executor is None:
            raise TritonModelException(
                "BLS is not available: this process has no inference executor"
            )
        try:
            return executor(self)
        except TritonModelException:
            raise
        except Exception as exc:
            return InferenceResponse(error=TritonError(str(exc), TritonError.INTERNAL))

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse:
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


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The config dict's ``input`` entry named ``name``, or None (python_backend utils)."""
    for properties in model_config.get("input", []):
        if properties["name"] == name:
            return properties
    return None


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The config dict's ``output`` entry named ``name``, or None (python_backend utils)."""
    for properties in model_config.get("output", []):
        if properties["name"] == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether ``model_transaction_policy.decoupled`` is set (python_backend utils)."""
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


class LogLevel:
    """python_backend ``pb_utils.LogLevel`` values for :meth:`Logger.log`."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_model_logger = logging.getLogger("triton_python_backend_utils")


class Logger:
    """python_backend ``pb_utils.Logger``: messages go to the ``logging`` module.

    Used as ``pb_utils.Logger.log_info("...")`` (static methods), also through
    an instance.
    """

    _LEVELS: dict[int, int] = {  # noqa: RUF012 - read-only lookup table
        LogLevel.INFO: logging.INFO,
        LogLevel.WARNING: logging.WARNING,
        LogLevel.ERROR: logging.ERROR,
        LogLevel.VERBOSE: logging.DEBUG,
    }

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:
        """Log ``message`` at a :class:`LogLevel`."""
        _model_logger.log(Logger._LEVELS.get(level, logging.INFO), "%s", message)

    @staticmethod
    def log_info(message: str) -> None:
        """Log at INFO."""
        _model_logger.info("%s", message)

    @staticmethod
    def log_warn(message: str) -> None:
        """Log at WARNING."""
        _model_logger.warning("%s", message)

    @staticmethod
    def log_error(message: str) -> None:
        """Log at ERROR."""
        _model_logger.error("%s", message)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Log at DEBUG (Triton's verbose level)."""
        _model_logger.debug("%s", message)


class ModelConfig:
    """The config handed to ``auto_complete_config`` (python_backend ``pb_utils.ModelConfig``).

    Wraps the config's JSON dict (PROTOCOL.md 1.6 shape). Only
    ``max_batch_size``, inputs, outputs, the dynamic-batching scheduler and
    the transaction policy can be changed, with Triton's checks.

    Args:
        model_config: The config as a JSON string or an already decoded dict.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        self._model_config: dict[str, Any] = (
            json.loads(model_config) if isinstance(model_config, str) else model_config
        )
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)
        self._model_config.setdefault("name", "")

    def _name(self) -> str:
        return str(self._model_config["name"])

    def as_dict(self) -> dict[str, Any]:
        """The config dict (read it; change it through the setters)."""
        return self._model_config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``.

        Raises:
            ValueError: the config already specifies a larger non-zero value.
        """
        current = int(self._model_config["max_batch_size"])
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in "
                f"auto-complete-config function for model '{self._name()}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        """Use the dynamic batcher unless another scheduler is set (no-op if already set).

        Raises:
            ValueError: ``sequence_batching`` or ``ensemble_scheduling`` is set.
        """
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name()}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def _check_tensor(self, kind: str, tensor: Mapping[str, Any], valid: Sequence[str]) -> None:
        name = tensor.get("name", "")
        for key in tensor:
            if key not in valid:
                allowed = ", ".join(f"'{v}'" for v in valid)
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than {allowed}."
                )
        if "name" not in tensor:
            raise ValueError(
                f"{kind} in auto-complete-config function for model '{self._name()}' "
                "is missing 'name' property."
            )
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} '{name}' in auto-complete-config function for model "
                    f"'{self._name()}' is missing '{key}' property."
                )

    def _add_tensor(self, kind: str, tensor: Mapping[str, Any], valid: Sequence[str]) -> None:
        self._check_tensor(kind, tensor, valid)
        name = tensor["name"]
        for current in self._model_config[kind]:
            if current.get("name") != name:
                continue
            current_type = current.get("data_type", "TYPE_INVALID")
            if current_type != "TYPE_INVALID" and current_type != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype "
                    f"{current_type} for {kind} '{name}', model provides {tensor['data_type']}"
                )
            current_dims = [int(d) for d in current.get("dims", [])]
            if current_dims and current_dims != [int(d) for d in tensor["dims"]]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects dims "
                    f"{list(tensor['dims'])} but the model configuration specifies dims "
                    f"{current_dims}"
                )
            if (
                "optional" in tensor
                and "optional" in current
                and bool(current["optional"]) != bool(tensor["optional"])
            ):
                raise ValueError(
                    f"model '{self._name()}', tensor '{name}': the model expects optional "
                    f"{tensor['optional']} but the model configuration specifies optional "
                    f"{current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = list(tensor["dims"])
            if "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(dict(tensor))

    def add_input(self, input: Mapping[str, Any]) -> None:
        """Add an input ``{name, data_type, dims, optional?}`` (merged if present).

        Raises:
            ValueError: an unknown or missing property, or an input of that name
                with a different data_type, dims or optional.
        """
        self._add_tensor("input", input, ("name", "data_type", "dims", "optional"))

    def add_output(self, output: Mapping[str, Any]) -> None:
        """Add an output ``{name, data_type, dims}`` (merged if present).

        Raises:
            ValueError: an unknown or missing property, or an output of that
                name with a different data_type or dims.
        """
        self._add_tensor("output", output, ("name", "data_type", "dims"))

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        """Set ``model_transaction_policy`` (only ``decoupled``).

        Raises:
            ValueError: a property other than ``decoupled``, or ``decoupled``
                already set to a different value.
        """
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name()}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = bool(transaction_policy_dict["decoupled"])
            if "decoupled" in policy and bool(policy["decoupled"]) != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name()}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
