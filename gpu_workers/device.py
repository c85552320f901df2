"""GPU discovery through NVML (pynvml), imported lazily; empty on machines without GPUs."""

from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)


@functools.cache
def gpu_ids() -> tuple[int, ...]:
    """Ordinals of the CUDA devices NVML sees; ``()`` without a GPU or without pynvml."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return ()
    try:
        return tuple(range(pynvml.nvmlDeviceGetCount()))
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            logger.debug("nvmlShutdown failed", exc_info=True)
