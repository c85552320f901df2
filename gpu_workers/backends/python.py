"""Triton's Python backend (``backend: "python"``): runs a ``model.py`` unchanged.

The model file defines ``TritonPythonModel`` written against
``triton_python_backend_utils`` (PROTOCOL.md 8; Triton python_backend README).
Sluice imports it in the worker process itself (Triton uses a stub process;
there is no ``EXECUTION_ENV_PATH`` support yet), hands ``execute`` the whole
list of requests of one call as Triton does, and converts the answers to
:class:`InferResponse` / :class:`InferError`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import json
import logging
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from sluice.broker.datatypes import NUMPY_DTYPES, numpy_to_protocol
from sluice.gpu_workers.backends import pb_utils
from sluice.gpu_workers.backends.base import (
    InferError,
    InferRequest,
    InferResponse,
    InstanceContext,
    ModelCodeError,
)
from sluice.repository.render import config_to_json

__all__ = ["PythonBackend", "from_pb_response", "to_pb_request"]

logger = logging.getLogger(__name__)

# A Triton model.py does ``import triton_python_backend_utils as pb_utils``; Triton's stub
# process injects that module, Sluice provides it from inside its own package.
sys.modules.setdefault("triton_python_backend_utils", pb_utils)

#: Request parameters with a meaning for Triton itself (PROTOCOL.md 2.3); the
#: model's ``parameters()`` holds only the other (custom) ones.
RESERVED_PARAMETERS = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "binary_data_output",
        "headers",
    }
)

_DEFAULT_FILE = "model.py"
_module_counter = itertools.count()
_sys_path_lock = threading.Lock()


def _import_model_file(path: Path, tag: str) -> ModuleType:
    """Import ``path`` as a fresh module; its directory goes on ``sys.path`` for siblings.

    Raises:
        FileNotFoundError: the file does not exist.
        ImportError: the file cannot be imported.
    """
    if not path.is_file():
        raise FileNotFoundError(f"Python model file '{path}' does not exist")
    directory = str(path.parent)
    with _sys_path_lock:
        if directory not in sys.path:
            sys.path.insert(0, directory)
    safe = re.sub(r"\W", "_", tag)
    module_name = f"_sluice_python_model_{safe}_{next(_module_counter)}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import Python model file '{path}'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _model_class(module: ModuleType, path: Path) -> type:
    cls = getattr(module, "TritonPythonModel", None)
    if not isinstance(cls, type):
        raise ImportError(f"Python model file '{path}' does not define class TritonPythonModel")
    return cls


def _model_file(config: ModelConfig, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or _DEFAULT_FILE)


def _check_supported(config: ModelConfig) -> None:
    """Refuse what Sluice cannot run yet, with a clear load error.

    Raises:
        RuntimeError: ``EXECUTION_ENV_PATH`` or a decoupled transaction policy.
    """
    if "EXECUTION_ENV_PATH" in config.parameters:
        raise RuntimeError(
            f"model '{config.name}': parameter EXECUTION_ENV_PATH is not supported by Sluice "
            "yet; install the model's dependencies into the worker's environment instead"
        )
    if config.model_transaction_policy.decoupled:
        raise RuntimeError(
            f"model '{config.name}': decoupled models are not supported by Sluice yet"
        )


def _int_or_str(value: Any) -> int | str:
    """``sequence_id`` is an unsigned integer or a string (PROTOCOL.md 2.3)."""
    if isinstance(value, int):
        return int(value)
    return str(value)


def _writable(array: np.ndarray) -> np.ndarray:
    """Python-backend inputs are writable under Triton; wire buffers here are not."""
    return array if array.flags.writeable else array.copy()


def to_pb_request(
    request: InferRequest,
    *,
    output_names: Sequence[str] = (),
    input_reshape: dict[str, tuple[int, ...]] | None = None,
    batching: bool = False,
) -> pb_utils.InferenceRequest:
    """Our request -> ``pb_utils.InferenceRequest`` as Triton builds it.

    ``correlation_id`` comes from ``sequence_id`` (0 when absent), ``flags``
    from ``sequence_start``/``sequence_end``, ``parameters()`` holds the
    custom parameters only, and ``requested_output_names()`` lists every
    configured output when the client named none (Triton core
    ``InferenceRequest::Normalize``). Config ``reshape`` is applied to inputs.

    Args:
        request: The request.
        output_names: The config's output names.
        input_reshape: Input name -> ``reshape.shape`` for inputs with a reshape.
        batching: Whether the model batches (first dim is the batch).
    """
    params = request.parameters
    flags = 0
    if params.get("sequence_start"):
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
    if params.get("sequence_end"):
        flags |= pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
    custom = {
        k: v
        for k, v in params.items()
        if k not in RESERVED_PARAMETERS and not k.startswith("triton_")
    }
    reshape = input_reshape or {}
    tensors = []
    for name, array in request.inputs.items():
        target = reshape.get(name)
        if target is not None:
            array = array.reshape((array.shape[0], *target) if batching else target)
        tensors.append(pb_utils.Tensor(name, _writable(array)))
    return pb_utils.InferenceRequest(
        inputs=tensors,
        requested_output_names=list(request.requested_outputs or output_names),
        flags=flags,
        request_id=request.client_id,
        correlation_id=_int_or_str(params.get("sequence_id", 0)),
        timeout=int(params.get("timeout", 0) or 0),
        parameters=custom,
    )


def _to_config_dtype(array: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """``array`` as the config's ``dtype``, or None when that would change its values.

    A float array converts to a float type as numpy converts it (FP64 to FP32 or FP16:
    rounding to the narrower float is what the config's type means), unless a finite
    value would overflow to inf (``70000`` as FP16, ``1e300`` as FP32); BOOL converts to
    anything. Any other conversion (integer to float, float to integer or BOOL, integer to a
    narrower or unsigned integer) is made only when every value is equal after it:
    ``-1`` or ``300`` as UINT8, ``2.7`` as INT32, ``2`` as BOOL or ``2**40 + 1`` as FP32
    would be silently different numbers. Triton's python_backend sends the model's own
    datatype instead of the config's (python_backend ``InferResponse::Send``); Sluice
    answers with the type the model metadata declares.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        converted = array.astype(dtype)
        if array.dtype.kind == "b":
            return converted
        if array.dtype.kind == "f" and dtype.kind == "f":
            overflowed = np.isinf(converted) & np.isfinite(array)
            return None if overflowed.any() else converted
        return converted if np.array_equal(converted, array) else None


def _as_bytes_array(array: np.ndarray) -> np.ndarray:
    """Any BYTES-like array -> ``object`` array of ``bytes`` (``str`` encoded as UTF-8)."""
    if array.dtype == object and all(isinstance(v, bytes) for v in array.flat):
        return array
    flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.ravel()]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


class _OutputSpec:
    """What the config says about one output."""

    __slots__ = ("bytes", "dims", "dtype", "name", "reshaped")

    def __init__(self, name: str, data_type: int, dims: tuple[int, ...], reshaped: bool) -> None:
        self.name = name
        type_name = DataType.Name(data_type)
        self.bytes = type_name == "TYPE_STRING"
        numpy_type = None if self.bytes else pb_utils.triton_to_numpy_type(type_name)
        if type_name == "TYPE_BF16":  # ml_dtypes' bfloat16, the wire type (None without it)
            numpy_type = NUMPY_DTYPES.get("BF16")
        self.dtype: np.dtype | None = None if numpy_type is None else np.dtype(numpy_type)
        self.dims = dims
        self.reshaped = reshaped


def from_pb_response(
    response: Any,
    request: pb_utils.InferenceRequest,
    outputs: dict[str, _OutputSpec],
    *,
    model: str,
    batching: bool,
) -> InferResponse | InferError:
    """``pb_utils.InferenceResponse`` -> our answer for one request.

    An attached ``TritonError`` becomes :class:`InferError` with its code name.
    Outputs the request did not ask for (every configured output when it named none)
    are dropped before anything else, an output the config does not declare
    included, and a response may carry no output at all: python_backend prunes a
    response to the requested outputs (``InferResponse::PruneOutputTensors``) before
    Triton core sees it. BYTES outputs become ``object`` arrays
    of ``bytes``; a numeric output of another dtype than the config's is cast
    to the config's dtype (the wire format follows the config).
    """
    if not isinstance(response, pb_utils.InferenceResponse):
        return InferError(
            "INTERNAL",
            f"model '{model}': execute() must return pb_utils.InferenceResponse objects, "
            f"got {type(response).__name__}",
        )
    if response.has_error():
        error = response.error()
        if isinstance(error, pb_utils.TritonError):
            return InferError(error.code_name(), error.message())
        return InferError("INTERNAL", str(error))
    wanted = set(request.requested_output_names())
    result: dict[str, np.ndarray] = {}
    for tensor in response.output_tensors():
        name = tensor.name()
        if wanted and name not in wanted:
            continue
        spec = outputs.get(name)
        if spec is None:  # asked for but not configured: the gateway refuses such requests
            return InferError(
                "INTERNAL", f"unexpected inference output '{name}' for model '{model}'"
            )
        array = np.asarray(tensor._data())  # as_numpy() refuses BF16, as Triton's
        if spec.reshaped:
            array = array.reshape((array.shape[0], *spec.dims) if batching else spec.dims)
        if spec.bytes:
            if array.dtype.kind not in "OSU":
                return InferError(
                    "INTERNAL",
                    f"model '{model}': output '{name}' is BYTES in the model configuration "
                    f"but the model returned dtype {array.dtype}",
                )
            array = _as_bytes_array(array)
        elif spec.dtype is not None and array.dtype != spec.dtype:
            if array.dtype.kind in "OSU":
                return InferError(
                    "INTERNAL",
                    f"model '{model}': output '{name}' is "
                    f"{numpy_to_protocol(spec.dtype)} in the model configuration but the "
                    "model returned BYTES",
                )
            converted = _to_config_dtype(array, spec.dtype)
            if converted is None:
                return InferError(
                    "INTERNAL",
                    f"model '{model}': output '{name}' is "
                    f"{numpy_to_protocol(spec.dtype)} in the model "
                    f"configuration but the model returned {array.dtype} values that "
                    "change when converted to it",
                )
            array = converted
        result[name] = array
    params = response.parameters()
    parameters = json.loads(params) if params else {}
    return InferResponse(result, parameters if isinstance(parameters, dict) else {})


class PythonBackend:
    """Runs a Triton ``model.py`` in-process (Triton python_backend lifecycle)."""

    def __init__(self) -> None:
        self._ctx: InstanceContext | None = None
        self._model: Any = None
        self._outputs: dict[str, _OutputSpec] = {}
        self._output_names: list[str] = []
        self._input_reshape: dict[str, tuple[int, ...]] = {}
        self._batching = False

    @staticmethod
    def initialize_args(ctx: InstanceContext) -> dict[str, str]:
        """Triton's ``args`` dict for ``TritonPythonModel.initialize`` (PROTOCOL.md 8)."""
        return {
            "model_config": json.dumps(config_to_json(ctx.config)),
            "model_instance_kind": ctx.kind,
            "model_instance_name": ctx.instance_name,
            "model_instance_device_id": str(ctx.device_id),
            "model_repository": str(ctx.model_dir),
            "model_version": str(ctx.model_version),
            "model_name": ctx.model_name,
        }

    def initialize(self, ctx: InstanceContext) -> None:
        """Import the model file, instantiate ``TritonPythonModel``, call its ``initialize``.

        Raises:
            RuntimeError: unsupported config (EXECUTION_ENV_PATH, decoupled), or the
                model's ``initialize`` raised (fails the load; the message names the
                exception's type, as python_backend's load error does, ``KeyError:
                'weights'``, and the original is chained).
            FileNotFoundError, ImportError: the model file is missing or broken.
        """
        config = ctx.config
        _check_supported(config)
        path = _model_file(config, ctx.version_dir)
        module = _import_model_file(
            path, f"{ctx.model_name}_{ctx.model_version}_{ctx.instance_name}"
        )
        model = _model_class(module, path)()
        self._ctx = ctx
        self._batching = config.max_batch_size > 0
        self._input_reshape = {
            t.name: tuple(t.reshape.shape) for t in config.input if t.HasField("reshape")
        }
        self._outputs = {
            t.name: _OutputSpec(t.name, t.data_type, tuple(t.dims), t.HasField("reshape"))
            for t in config.output
        }
        self._output_names = [t.name for t in config.output]
        init = getattr(model, "initialize", None)
        if init is not None:
            try:
                init(self.initialize_args(ctx))
            except Exception as exc:
                raise ModelCodeError(f"{type(exc).__name__}: {exc}") from exc
        self._model = model
        logger.info(
            "Python model '%s' instance '%s' loaded from %s",
            ctx.model_name,
            ctx.instance_name,
            path,
        )

    def execute(self, requests: Sequence[InferRequest]) -> list[InferResponse | InferError]:
        """Call the model's ``execute`` once with every request; one answer per request.

        A raised exception, a non-list result or a list of the wrong length
        fails every request with INTERNAL (Triton python_backend).
        """
        assert self._ctx is not None and self._model is not None, "initialize() was not called"
        name = self._ctx.model_name
        instance = self._ctx.instance_name
        pb_requests = [
            to_pb_request(
                r,
                output_names=self._output_names,
                input_reshape=self._input_reshape,
                batching=self._batching,
            )
            for r in requests
        ]
        try:
            responses = self._model.execute(pb_requests)
            if inspect.iscoroutine(responses):  # python_backend allows ``async def execute``
                responses = asyncio.run(responses)
        except pb_utils.TritonModelException as exc:
            logger.exception("Python model '%s' execute raised", name)
            return self._fail_all(
                len(requests),
                f"Failed to process the request(s) for model "
                f"instance '{instance}', message: {exc.message()}",
            )
        except Exception as exc:
            logger.exception("Python model '%s' execute raised", name)
            return self._fail_all(
                len(requests),
                f"Failed to process the request(s) for model "
                f"instance '{instance}', message: {type(exc).__name__}: {exc}",
            )
        if not isinstance(responses, list | tuple):
            return self._fail_all(
                len(requests),
                f"model '{name}': execute() must return a list of InferenceResponse objects, "
                f"got {type(responses).__name__} (decoupled models are not supported yet)",
            )
        if len(responses) != len(requests):
            return self._fail_all(
                len(requests),
                f"model '{name}': number of InferenceResponse objects ({len(responses)}) does "
                f"not match the number of InferenceRequest objects ({len(requests)})",
            )
        return [
            from_pb_response(resp, req, self._outputs, model=name, batching=self._batching)
            for resp, req in zip(responses, pb_requests, strict=True)
        ]

    @staticmethod
    def _fail_all(count: int, message: str) -> list[InferResponse | InferError]:
        return [InferError("INTERNAL", message) for _ in range(count)]

    def finalize(self) -> None:
        """Call the model's ``finalize`` if it has one."""
        model, self._model = self._model, None
        fin = getattr(model, "finalize", None)
        if fin is not None:
            fin()

    @staticmethod
    def auto_complete(config: ModelConfig, version_dir: Path) -> None:
        """Run the model's ``auto_complete_config`` on ``config``, in place.

        Triton python_backend: the static ``auto_complete_config`` receives a
        ``pb_utils.ModelConfig`` over the config's JSON and returns it; the
        result replaces the config. Nothing else is added for Python models.

        Raises:
            RuntimeError: EXECUTION_ENV_PATH in the config.
            Exception: the model file fails to import or ``auto_complete_config`` raises.
        """
        if "EXECUTION_ENV_PATH" in config.parameters:
            _check_supported(config)
        path = _model_file(config, version_dir)
        module = _import_model_file(path, f"{config.name}_autocomplete")
        try:
            hook = getattr(_model_class(module, path), "auto_complete_config", None)
            if hook is None:
                return
            wrapper = pb_utils.ModelConfig(config_to_json(config))
            result = hook(wrapper)
            if result is None:
                result = wrapper
            data = result.as_dict() if isinstance(result, pb_utils.ModelConfig) else result
            completed = ModelConfig()
            json_format.ParseDict(data, completed, ignore_unknown_fields=False)
            config.CopyFrom(completed)
        finally:
            sys.modules.pop(module.__name__, None)
