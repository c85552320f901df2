"""ONNX Runtime backend (Triton ``platform: onnxruntime_onnx``, ``backend: onnxruntime``).

``onnxruntime`` is imported only when a model of this backend loads. The CUDA
execution provider is used for ``KIND_GPU`` instances (``onnxruntime-gpu``;
without it a GPU instance fails to load), the CPU provider otherwise; the
config's accelerators, thread counts and execution mode are mapped by
:mod:`gpu_workers.backends.ort_options` (Triton onnxruntime_backend README).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from sluice.gpu_workers.backends.base import BackendInputError, InstanceContext
from sluice.gpu_workers.backends.ort_options import apply_settings, session_settings
from sluice.gpu_workers.backends.tensor_adapter import TensorBackendAdapter
from sluice.gpu_workers.thread_priority import set_idle, started_threads
from sluice.repository.autocomplete import (
    ORT_TYPE_TO_CONFIG,
    TensorSignature,
    autocomplete_from_signature,
)

logger = logging.getLogger(__name__)


def _model_path(path: Path) -> Path:
    """A ``model.onnx`` directory holds the graph as ``model.onnx`` inside it (Triton 5.2)."""
    return path / "model.onnx" if path.is_dir() else path


def _signature(args: Sequence[Any]) -> list[TensorSignature]:
    out = []
    for arg in args:
        dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
        out.append(TensorSignature(arg.name, ORT_TYPE_TO_CONFIG[arg.type], dims))
    return out


def _as_ort_strings(name: str, array: np.ndarray) -> np.ndarray:
    """ONNX string tensors hold text: BYTES elements are decoded as UTF-8.

    Raises:
        ValueError: an element is not valid UTF-8 (ONNX Runtime cannot hold it).
    """
    out = np.empty(array.shape, dtype=object)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        try:
            flat_out[i] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        except UnicodeDecodeError:
            raise BackendInputError(
                f"input '{name}' element {i} is not valid UTF-8; ONNX string tensors hold text"
            ) from None
    return out


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _check_tensors(ctx: InstanceContext, kind: str, configured: Any, graph: Sequence[Any]) -> None:
    model = ctx.model_name
    by_name = {arg.name: arg for arg in graph}
    batching = ctx.config.max_batch_size > 0
    for tensor in configured:
        arg = by_name.get(tensor.name)
        if arg is None:
            raise ValueError(
                f"unable to load model '{model}': configuration expects {kind} "
                f"'{tensor.name}' but the ONNX model has no such {kind} "
                f"(model {kind}s: {', '.join(sorted(by_name)) or 'none'})"
            )
        expected = DataType.Name(tensor.data_type)
        actual = ORT_TYPE_TO_CONFIG.get(arg.type)
        if actual != expected:
            raise ValueError(
                f"unable to load model '{model}': unexpected datatype {expected} for {kind} "
                f"'{tensor.name}', the ONNX model has {actual or arg.type}"
            )
        if actual == "TYPE_BF16":
            raise ValueError(
                f"unable to load model '{model}': {kind} '{tensor.name}' is TYPE_BF16, which "
                "the onnxruntime backend of Sluice cannot exchange with numpy yet"
            )
        dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
        if batching:
            dims = [-1, *dims]
        model_dims = [d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or [])]
        if batching and model_dims and model_dims[0] != -1:
            # Triton backend common CompareDimsSupported: a batching model's tensors need a
            # variable first dimension (else every batch but the graph's own size fails)
            raise ValueError(
                f"model '{model}', tensor '{tensor.name}': for the model to support batching "
                "the shape should have at least 1 dimension and the first dimension must be "
                f"-1; but shape expected by the model is {_dims_text(model_dims)}"
            )
        compatible = len(dims) == len(model_dims) and all(
            m == -1 or c == -1 or m == c for c, m in zip(dims, model_dims, strict=True)
        )
        if not compatible:
            raise ValueError(
                f"unable to load model '{model}': {kind} '{tensor.name}' has shape "
                f"{_dims_text(model_dims)} in the ONNX model but the configuration specifies "
                f"{_dims_text(dims)} (batch dimension included when max_batch_size > 0)"
            )


def check_model_io(ctx: InstanceContext, session: Any) -> None:
    """Refuse a config that disagrees with the graph (Triton onnxruntime backend ValidateInputs).

    Raises:
        ValueError: the config lists more or fewer inputs than the graph has (initializers
            aside), a configured input/output is missing from the graph, or its datatype
            or shape (batch dimension included) differs, or ``max_batch_size`` > 0 and the
            graph fixes its first dimension, naming the model and tensor.
    """
    graph_inputs = session.get_inputs()
    seq = ctx.config.sequence_batching
    fed = {c.name for c in seq.control_input} | {s.input_name for s in seq.state}
    configured = len({t.name for t in ctx.config.input} | fed)
    if configured != len(graph_inputs):
        # Triton onnxruntime_backend ValidateInputs: every graph input must be configured
        raise ValueError(
            f"unable to load model '{ctx.model_name}', configuration expects "
            f"{configured} inputs, model provides {len(graph_inputs)}"
        )
    _check_tensors(ctx, "input", ctx.config.input, graph_inputs)
    _check_tensors(ctx, "output", ctx.config.output, session.get_outputs())


class OnnxRuntimeSession:
    """One ``onnxruntime.InferenceSession`` (a :class:`TensorBackend`)."""

    def __init__(self) -> None:
        self._session: Any = None

    def load(self, ctx: InstanceContext) -> None:
        import onnxruntime as ort

        settings = session_settings(
            ctx.config, ctx.kind, ctx.device_id, ort.get_available_providers()
        )
        options = ort.SessionOptions()
        apply_settings(settings, options, ort)
        self._session, helpers = started_threads(
            lambda: ort.InferenceSession(
                str(_model_path(ctx.model_file)),
                sess_options=options,
                providers=settings.providers,
            )
        )
        if settings.helper_priority == "idle":
            set_idle(helpers, f"model '{ctx.model_name}' instance '{ctx.instance_name}'")
        check_model_io(ctx, self._session)
        logger.info(
            "model '%s' instance '%s' loaded with %s",
            ctx.model_name,
            ctx.instance_name,
            self._session.get_providers(),
        )

    def run(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        feed = {
            name: _as_ort_strings(name, a) if a.dtype == object else a for name, a in inputs.items()
        }
        results = self._session.run(list(outputs), feed)
        return dict(zip(outputs, results, strict=True))

    def close(self) -> None:
        self._session = None


class OnnxRuntimeBackend(TensorBackendAdapter):
    """The ``onnxruntime`` backend: :class:`OnnxRuntimeSession` behind the tensor adapter."""

    def __init__(self) -> None:
        super().__init__(OnnxRuntimeSession())

    @staticmethod
    def gpu_available() -> bool:
        """Whether the installed onnxruntime offers the CUDA execution provider
        (``onnxruntime-gpu``); False when onnxruntime is not installed."""
        try:
            import onnxruntime as ort
        except ImportError:
            return False
        return "CUDAExecutionProvider" in ort.get_available_providers()

    @staticmethod
    def auto_complete(config: ModelConfig, version_dir: Path) -> None:
        """Fill inputs/outputs/max_batch_size from the ONNX graph (Triton onnxruntime_backend).

        Raises:
            repository.ConfigError: the graph cannot batch but ``max_batch_size`` > 0.
        """
        if len(config.input) and len(config.output):
            return
        import onnxruntime as ort

        path = _model_path(version_dir / (config.default_model_filename or "model.onnx"))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        autocomplete_from_signature(
            config, _signature(session.get_inputs()), _signature(session.get_outputs())
        )
