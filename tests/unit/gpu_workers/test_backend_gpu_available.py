"""registry.gpu_available: whether each backend can serve KIND_GPU with this host's packages.

Asserts what the installed packages say, so it holds on CPU machines (CI) and GPU ones.
"""

from __future__ import annotations

import importlib.util

from sluice.gpu_workers.backends.registry import gpu_available


def test_onnxruntime_needs_the_cuda_execution_provider() -> None:
    import onnxruntime

    expected = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert gpu_available("onnxruntime") is expected


def test_pytorch_needs_a_cuda_build_with_a_device() -> None:
    if importlib.util.find_spec("torch") is None:
        assert gpu_available("pytorch") is False
        return
    import torch

    assert gpu_available("pytorch") is torch.cuda.is_available()


def test_tensorrt_needs_tensorrt_and_cuda() -> None:
    if importlib.util.find_spec("tensorrt") is None or importlib.util.find_spec("torch") is None:
        assert gpu_available("tensorrt") is False
        return
    import torch

    assert gpu_available("tensorrt") is torch.cuda.is_available()


def test_python_and_unknown_backends_leave_it_to_the_model() -> None:
    assert gpu_available("python") is True
    assert gpu_available("no_such_backend") is True
