"""Backend name -> implementation, imported on first use (uvicorn's import-string pattern).

The gateway never imports this module's targets, so it starts without
onnxruntime, torch or tensorrt installed.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Any

from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.errors import ErrorCode, SluiceError

#: Triton ``backend`` name -> "module:attribute" of a class implementing ``Backend``.
BACKENDS: dict[str, str] = {
    "onnxruntime": "sluice.gpu_workers.backends.onnxruntime:OnnxRuntimeBackend",
    "python": "sluice.gpu_workers.backends.python.backend:PythonBackend",
    "pytorch": "sluice.gpu_workers.backends.torch:TorchBackend",
    "tensorrt": "sluice.gpu_workers.backends.tensorrt:TensorRTBackend",
}


def import_from_string(target: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute.

    Raises:
        ImportError: the module or attribute does not exist.
    """
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise ImportError(f"module '{module_name}' has no attribute '{attribute}'") from exc


def backend_class(backend: str, model: str) -> Any:
    """The class serving Triton backend ``backend``.

    Raises:
        SluiceError: UNSUPPORTED when Sluice has no such backend or it is not installed here.
    """
    target = BACKENDS.get(backend)
    if target is None:
        raise SluiceError(
            ErrorCode.UNSUPPORTED,
            f"model '{model}': backend '{backend}' is not supported by Sluice "
            f"(supported: {', '.join(sorted(BACKENDS))})",
            model=model,
        )
    try:
        return import_from_string(target)
    except ImportError as exc:
        raise SluiceError(
            ErrorCode.UNSUPPORTED,
            f"model '{model}': backend '{backend}' is not installed here ({exc})",
            model=model,
        ) from exc


def auto_complete(config: ModelConfig, version_dir: Path) -> None:
    """Auto-complete hook for ``repository.load_model_config``: asks the model's backend.

    Backends without an ``auto_complete`` static method leave the config as it is.
    """
    cls = backend_class(config.backend, config.name)
    hook = getattr(cls, "auto_complete", None)
    if hook is not None:
        hook(config, version_dir)


@functools.cache
def gpu_available(backend: str) -> bool:
    """Whether a ``KIND_GPU`` instance of ``backend`` can run with this host's packages.

    Asks the backend class's optional ``gpu_available`` static method (onnxruntime: the
    CUDA execution provider is offered; pytorch: ``torch.cuda.is_available()``; tensorrt:
    tensorrt and CUDA present); a backend without one (python: the model decides what its
    device id means) and an unknown backend count as able. Imports the framework, so call
    it only on a host where NVML found GPUs. Cached per backend for the process.
    """
    target = BACKENDS.get(backend)
    if target is None:
        return True
    try:
        hook = getattr(import_from_string(target), "gpu_available", None)
    except ImportError:
        return True  # the load itself reports the missing backend
    return True if hook is None else bool(hook())
