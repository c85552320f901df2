"""TensorRT backend (Triton ``platform: tensorrt_plan``, ``backend: tensorrt``, ``model.plan``).

``tensorrt`` is imported when a model of this backend loads; without it, or
without a CUDA device, the instance fails to load with the reason
``TensorRT is not available on this machine: ...`` and the model is
UNAVAILABLE with it (Triton tensorrt_backend needs a GPU too).

When available (TensorRT >= 10 name-based I/O API):

* the plan file is ``cc_model_filenames["<major>.<minor>"]`` for the device's
  compute capability when the config has that key, else
  ``default_model_filename`` (model_config.proto ``cc_model_filenames``);
* the engine is deserialized once per instance, inputs and outputs are bound by
  name (``set_tensor_address``), each input's shape is set per execution with
  ``set_input_shape`` after a check against the engine's optimization profile
  0 (dynamic shapes within the profile; a shape outside it is INVALID_ARG);
* each instance has its own CUDA stream (``torch.cuda.Stream``, which also
  allocates the device buffers); instances are ``KIND_GPU`` only.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.gpu_workers.backends.base import BackendInputError, InstanceContext
from sluice.gpu_workers.backends.tensor_adapter import TensorBackendAdapter

__all__ = ["TensorRTBackend", "TensorRTEngine", "check_profile", "plan_file"]

logger = logging.getLogger(__name__)

#: TensorRT ``DataType`` name -> torch dtype attribute name.
_TORCH_DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "UINT8": "uint8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
}


def unavailable(reason: str) -> RuntimeError:
    """The load error of a machine that cannot run TensorRT engines."""
    return RuntimeError(f"TensorRT is not available on this machine: {reason}")


def plan_file(config: ModelConfig, version_dir: Path, capability: tuple[int, int]) -> Path:
    """The plan for a device of compute ``capability`` (``cc_model_filenames`` first).

    Args:
        config: the model config.
        version_dir: the version directory.
        capability: ``(major, minor)`` of the device.
    """
    key = f"{capability[0]}.{capability[1]}"
    name = config.cc_model_filenames.get(key) or config.default_model_filename or "model.plan"
    return version_dir / name


def check_profile(
    name: str,
    shape: Sequence[int],
    profile: tuple[Sequence[int], Sequence[int], Sequence[int]],
) -> None:
    """Refuse an input shape outside the optimization profile's ``[min, max]`` per dimension.

    Args:
        name: the input's name (for the message).
        shape: the shape of this execution, batch dimension included.
        profile: ``(min, opt, max)`` from ``engine.get_tensor_profile_shape``.

    Raises:
        BackendInputError: the rank differs or a dimension is outside the profile.
    """
    low, _, high = (list(p) for p in profile)
    if len(shape) != len(low):
        raise BackendInputError(
            f"input '{name}' has rank {len(shape)} but the engine expects rank {len(low)}"
        )
    for axis, (dim, lo, hi) in enumerate(zip(shape, low, high, strict=True)):
        if not lo <= dim <= hi:
            raise BackendInputError(
                f"input '{name}' dimension {axis} is {dim}, outside the engine's optimization "
                f"profile [{lo}, {hi}] (shape {list(shape)}, min {low}, max {high})"
            )


class TensorRTEngine:
    """One deserialized engine, its execution context and CUDA stream (a TensorBackend)."""

    def __init__(self) -> None:
        self._trt: Any = None
        self._torch: Any = None
        self._engine: Any = None
        self._context: Any = None
        self._stream: Any = None
        self._device: Any = None
        self._inputs: set[str] = set()
        self._outputs: list[str] = []
        self._dynamic: set[str] = set()

    def load(self, ctx: InstanceContext) -> None:
        """Deserialize the plan of ``ctx`` on ``cuda:<device_id>``.

        Raises:
            RuntimeError: TensorRT or CUDA is missing ("TensorRT is not available on
                this machine: ..."), the instance is not KIND_GPU, the plan does not
                deserialize, or the config names a tensor the engine lacks.
        """
        try:
            import tensorrt as trt
        except ImportError as exc:
            raise unavailable(
                f"{exc} (model '{ctx.model_name}' needs the tensorrt package and a CUDA GPU)"
            ) from exc
        try:
            import torch
        except ImportError as exc:
            reason = f"Sluice's tensorrt backend drives CUDA through torch ({exc})"
            raise unavailable(reason) from exc
        if not torch.cuda.is_available():
            raise unavailable(f"torch {torch.__version__} sees no CUDA device")
        if ctx.kind != "GPU":
            raise RuntimeError(
                f"model '{ctx.model_name}': the tensorrt backend runs KIND_GPU instances only; "
                f"instance '{ctx.instance_name}' is KIND_{ctx.kind}"
            )
        self._trt, self._torch = trt, torch
        self._device = torch.device(f"cuda:{ctx.device_id}")
        path = plan_file(
            ctx.config, ctx.version_dir, torch.cuda.get_device_capability(ctx.device_id)
        )
        if not path.is_file():
            raise FileNotFoundError(f"model '{ctx.model_name}': plan file '{path}' does not exist")
        with torch.cuda.device(self._device):
            runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            engine = runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is None:
                raise RuntimeError(
                    f"model '{ctx.model_name}': unable to deserialize TensorRT plan '{path}' "
                    "(built for another TensorRT version or GPU?)"
                )
            self._engine = engine
            self._context = engine.create_execution_context()
            self._stream = torch.cuda.Stream(device=self._device)
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = {n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT}
        self._outputs = [n for n in names if n not in self._inputs]
        outputs = set(self._outputs)
        for kind, configured, present in (
            ("input", ctx.config.input, self._inputs),
            ("output", ctx.config.output, outputs),
        ):
            for tensor in configured:
                if tensor.name not in present:
                    raise RuntimeError(
                        f"unable to load model '{ctx.model_name}': configuration expects {kind} "
                        f"'{tensor.name}' but the engine has no such {kind} "
                        f"(engine {kind}s: {', '.join(sorted(present)) or 'none'})"
                    )
        self._dynamic = {n for n in self._inputs if -1 in tuple(engine.get_tensor_shape(n))}
        logger.info(
            "model '%s' instance '%s': TensorRT engine %s on %s",
            ctx.model_name,
            ctx.instance_name,
            path.name,
            self._device,
        )

    def _torch_dtype(self, name: str) -> Any:
        dtype_name = self._engine.get_tensor_dtype(name).name
        attribute = _TORCH_DTYPES.get(dtype_name)
        if attribute is None:
            raise RuntimeError(f"tensor '{name}' has TensorRT type {dtype_name}, not supported")
        return getattr(self._torch, attribute)

    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Copy inputs to the device, execute on the instance's stream, copy outputs back.

        Raises:
            BackendInputError: an input shape outside the profile, or an input missing.
        """
        torch, engine, context = self._torch, self._engine, self._context
        missing = sorted(self._inputs - set(inputs))
        if missing:
            raise BackendInputError(f"input '{missing[0]}' is required by the TensorRT engine")
        keep: list[Any] = []
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            for name, array in inputs.items():
                if name in self._dynamic:
                    check_profile(name, array.shape, engine.get_tensor_profile_shape(name, 0))
                    context.set_input_shape(name, tuple(array.shape))
                elif tuple(array.shape) != tuple(engine.get_tensor_shape(name)):
                    raise BackendInputError(
                        f"input '{name}' has shape {list(array.shape)} but the engine's is "
                        f"{list(engine.get_tensor_shape(name))}"
                    )
                with warnings.catch_warnings():  # read-only wire buffers; copied just below
                    warnings.simplefilter("ignore", UserWarning)
                    host = torch.from_numpy(np.ascontiguousarray(array))
                device = host.to(self._device, dtype=self._torch_dtype(name), non_blocking=False)
                keep.append(device)
                context.set_tensor_address(name, device.data_ptr())
            produced: dict[str, Any] = {}
            for name in self._outputs:  # every engine output needs an address
                shape = tuple(context.get_tensor_shape(name))
                buffer = torch.empty(shape, dtype=self._torch_dtype(name), device=self._device)
                produced[name] = buffer
                context.set_tensor_address(name, buffer.data_ptr())
            if not context.execute_async_v3(self._stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed")
            self._stream.synchronize()
        return {name: produced[name].cpu().numpy() for name in outputs}

    def close(self) -> None:
        """Release the context, engine and stream."""
        self._context = None
        self._engine = None
        self._stream = None


class TensorRTBackend(TensorBackendAdapter):
    """The ``tensorrt`` backend: :class:`TensorRTEngine` behind the tensor adapter."""

    def __init__(self) -> None:
        super().__init__(TensorRTEngine())

    @staticmethod
    def gpu_available() -> bool:
        """Whether the tensorrt package imports and torch (which drives CUDA here) sees a
        CUDA device."""
        try:
            import tensorrt  # noqa: F401
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())
