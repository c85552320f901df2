"""Fill missing inputs, outputs and batching from a model's own signature.

The rules are the ONNX Runtime backend's auto-complete (docs/reference/model-configuration.md,
auto-complete; onnxruntime_backend ``AutoCompleteConfig``). The backend reads the model file
and hands us plain `TensorSignature` values, so this module needs no onnx.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInput, ModelOutput

from sluice.repository.errors import ConfigError

__all__ = [
    "ONNX_TO_CONFIG",
    "ORT_TYPE_TO_CONFIG",
    "TensorSignature",
    "autocomplete_from_signature",
]

logger = logging.getLogger(__name__)

# ONNX TensorProto.DataType (elem_type) -> Triton model_config.proto DataType name.
ONNX_TO_CONFIG: dict[int, str] = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}

# onnxruntime ``NodeArg.type`` strings -> Triton model_config.proto DataType name.
ORT_TYPE_TO_CONFIG: dict[str, str] = {
    "tensor(float)": "TYPE_FP32",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(int8)": "TYPE_INT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(string)": "TYPE_STRING",
    "tensor(bool)": "TYPE_BOOL",
    "tensor(float16)": "TYPE_FP16",
    "tensor(double)": "TYPE_FP64",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(bfloat16)": "TYPE_BF16",
}


@dataclass(frozen=True, slots=True)
class TensorSignature:
    """One graph input or output as the model file declares it.

    Attributes:
        name: Tensor name.
        data_type: Config data type name, e.g. ``"TYPE_FP32"``.
        dims: Full model shape including any batch dim; -1 for dynamic or
            symbolic dims.
    """

    name: str
    data_type: str
    dims: tuple[int, ...]


def _supports_batching(signatures: Sequence[TensorSignature]) -> bool:
    """onnxruntime_backend: every tensor has rank >= 1 and a dynamic first dim."""
    return all(len(sig.dims) >= 1 and sig.dims[0] == -1 for sig in signatures)


def _fill(
    target: ModelInput | ModelOutput, sig: TensorSignature, *, batching: bool, model: str, kind: str
) -> None:
    """Set name, data_type, dims (and reshape for scalars) on a ModelInput/ModelOutput."""
    try:
        data_type = DataType.Value(sig.data_type)
    except ValueError as exc:
        raise ConfigError(
            f"autofill failed for model '{model}': {kind} '{sig.name}' has unsupported "
            f"data type '{sig.data_type}'",
            model=model,
            field=kind,
        ) from exc
    dims = list(sig.dims[1:] if batching else sig.dims)
    target.name = sig.name
    target.data_type = data_type
    if dims:
        target.dims.extend(dims)
        return
    # Triton model_config.proto: dims must be non-empty; a per-item scalar is
    # dims [1] with an empty reshape, and reshape is only valid when batching.
    target.dims.append(1)
    if batching:
        target.reshape.SetInParent()


def autocomplete_from_signature(
    config: ModelConfig,
    inputs: Sequence[TensorSignature],
    outputs: Sequence[TensorSignature],
    *,
    default_max_batch_size: int = 4,
) -> None:
    """Complete a config from the model's signature, in place.

    ONNX Runtime backend auto-complete (docs/reference/model-configuration.md): nothing is done
    when the config lists both inputs and outputs. Batching is possible iff
    every input and output has rank >= 1 and a dynamic first dim; then a zero
    ``max_batch_size`` becomes ``default_max_batch_size`` (the backend's
    ``default-max-batch-size``), and ``dynamic_batching {}`` is added when
    ``max_batch_size > 1`` and the config has no dynamic or sequence batching.
    Missing input/output lists are generated without the batch dim.

    Args:
        config: The model config; changed in place.
        inputs: The model's graph inputs.
        outputs: The model's graph outputs.
        default_max_batch_size: Used when batching is possible and the config
            says 0.

    Raises:
        ConfigError: Batching is impossible but ``max_batch_size`` is non-zero,
            or a tensor has an unknown data type.
    """
    if config.input and config.output:
        return
    model = config.name
    if _supports_batching([*inputs, *outputs]):
        if config.max_batch_size == 0 and default_max_batch_size > 0:
            logger.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported "
                "but no max_batch_size is specified in model configuration",
                default_max_batch_size,
                model,
            )
            config.max_batch_size = default_max_batch_size
        if (
            config.max_batch_size > 1
            and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")
        ):
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ConfigError(
            f"autofill failed for model '{model}': model does not support batching while "
            "non-zero max_batch_size is specified",
            model=model,
            field="max_batch_size",
        )
    batching = config.max_batch_size > 0
    # the sequence batcher feeds control and state inputs and takes state outputs itself
    seq = config.sequence_batching
    fed = {c.name for c in seq.control_input} | {s.input_name for s in seq.state}
    taken = {s.output_name for s in seq.state}
    inputs = [sig for sig in inputs if sig.name not in fed]
    outputs = [sig for sig in outputs if sig.name not in taken]
    if not config.input:
        for sig in inputs:
            _fill(config.input.add(), sig, batching=batching, model=model, kind="input")
    if not config.output:
        for sig in outputs:
            _fill(config.output.add(), sig, batching=batching, model=model, kind="output")
