"""Checks every request against its model's config before it runs.

One rule set for HTTP and gRPC, in Triton's order and with Triton's texts
(docs/reference/model-configuration.md, "Checks before a request is queued";
docs/reference/errors.md; Triton ``src/infer_request.cc``): requested outputs, input
names and count, batch size, datatype, shape, byte size. The gateway checks each request
before it queues it (against its view of the model); an instance checks again a request
the gateway checked against another load of the model than the instance's own (during a
reload, while a gateway's cached view is older or newer than the instance: Triton
switches a model's config at once, so each request runs under the config it was checked
against).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from sluice.broker.datatypes import (
    ELEMENT_SIZES,
    config_to_protocol,
    deserialize_bytes,
    element_count,
)
from sluice.broker.errors import SluiceError, invalid_arg
from sluice.broker.messages import RequestedOutput, WireTensor

__all__ = [
    "ModelRules",
    "RequestRules",
    "TensorSpec",
    "negative_shape",
    "tensor_spec",
    "validate_request",
]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One config input or output, in protocol terms.

    Attributes:
        name: tensor name.
        datatype: protocol datatype (``FP32``, ``BYTES``, …).
        dims: config ``dims`` (batch dimension excluded; -1 = any size).
        optional: Triton ``ModelInput.optional``.
        is_shape_tensor: Triton ``is_shape_tensor``.
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    is_shape_tensor: bool = False


def tensor_spec(tensor: Any) -> TensorSpec:
    """The :class:`TensorSpec` of a config ``ModelInput`` / ``ModelOutput``."""
    return TensorSpec(
        name=tensor.name,
        datatype=config_to_protocol(DataType.Name(tensor.data_type)),
        dims=tuple(int(d) for d in tensor.dims),
        optional=bool(getattr(tensor, "optional", False)),
        is_shape_tensor=bool(tensor.is_shape_tensor),
    )


class ModelRules(Protocol):
    """What the checks read of a model (the gateway's ``ModelView`` has it too)."""

    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> dict[str, TensorSpec]: ...
    @property
    def outputs(self) -> dict[str, TensorSpec]: ...
    @property
    def max_batch_size(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RequestRules:
    """A model config's inputs, outputs and ``max_batch_size``, for :func:`validate_request`.

    Attributes:
        name: model name.
        inputs: input name -> spec.
        outputs: output name -> spec.
        max_batch_size: Triton model_config.proto ``max_batch_size`` (0: no batch dim).
    """

    name: str
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    max_batch_size: int

    @classmethod
    def from_config(cls, config: ModelConfig) -> RequestRules:
        """The rules of an effective (completed) model config."""
        return cls(
            name=config.name,
            inputs={t.name: tensor_spec(t) for t in config.input},
            outputs={t.name: tensor_spec(t) for t in config.output},
            max_batch_size=int(config.max_batch_size),
        )


#: Triton classification extension: only numeric, non-16-bit outputs can be classified.
_UNCLASSIFIABLE = frozenset({"BOOL", "BYTES", "FP16", "BF16"})


def _names_text(names: Iterable[str]) -> str:
    """Tensor names as Triton lists them: ``['A','B']``."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _dims_text(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def negative_shape(name: str, model: str) -> SluiceError:
    """INVALID_ARG for an input shape with a negative (or non-integer) dimension; the same
    text for a JSON ``shape`` that does not parse and a gRPC ``shape`` below zero."""
    return invalid_arg(
        f"Unable to parse 'shape' for input '{name}' of model '{model}': "
        "expected an array of non-negative integers",
        model=model,
        tensor=name,
    )


def _shape_matches(shape: Sequence[int], dims: Sequence[int]) -> bool:
    return len(shape) == len(dims) and all(
        d == -1 or d == s for s, d in zip(shape, dims, strict=True)
    )


def validate_request(
    view: ModelRules, inputs: Sequence[WireTensor], outputs: Sequence[RequestedOutput]
) -> int:
    """Check a request against ``view``'s config; return its batch size (0 when not batching).

    Args:
        view: the model's config (the gateway's ``ModelView``, or :class:`RequestRules`).
        inputs: the request's tensors, data in wire layout.
        outputs: the outputs the client asked for (may be empty).

    Returns:
        The batch size ``b`` (first dim shared by every input) for a batching model, else 0.

    Raises:
        SluiceError: INVALID_ARG naming the model, tensor and rule that failed.
    """
    model = view.name
    for requested in outputs:
        spec = view.outputs.get(requested.name)
        if spec is not None and requested.class_count > 0 and spec.datatype in _UNCLASSIFIABLE:
            raise invalid_arg(
                f"class result not available for output '{requested.name}' of model '{model}' "
                f"due to unsupported type '{spec.datatype}'",
                model=model,
                tensor=requested.name,
            )
        if requested.name not in view.outputs:
            raise invalid_arg(
                f"unexpected inference output '{requested.name}' for model '{model}'",
                model=model,
                tensor=requested.name,
            )
    for tensor in inputs:
        if tensor.name not in view.inputs:
            raise invalid_arg(
                f"unexpected inference input '{tensor.name}' for model '{model}'",
                model=model,
                tensor=tensor.name,
            )
        if any(dim < 0 for dim in tensor.shape):
            raise negative_shape(tensor.name, model)
    required = sum(1 for spec in view.inputs.values() if not spec.optional)
    given = {t.name for t in inputs}
    missing = [s.name for s in view.inputs.values() if not s.optional and s.name not in given]
    if missing:
        total = len(view.inputs)
        if total == required:
            expected = f"expected {required} inputs but got {len(inputs)} inputs"
        else:
            expected = (
                f"expected number of inputs between {required} and {total} "
                f"but got {len(inputs)} inputs"
            )
        raise invalid_arg(
            # Triton core InferenceRequest::ValidateRequestInputs, word for word
            f"{expected} for model '{model}'. Got input(s) {_names_text(t.name for t in inputs)}, "
            f"but missing required input(s) {_names_text(missing)}. Please provide all "
            "required input(s).",
            model=model,
            tensor=missing[0],
        )
    batch = _batch_size(view, inputs)
    for tensor in inputs:
        _check_tensor(view, view.inputs[tensor.name], tensor, batch)
    return batch


def _batch_size(view: ModelRules, inputs: Sequence[WireTensor]) -> int:
    if view.max_batch_size <= 0:
        return 0
    model = view.name
    batch: int | None = None
    for tensor in inputs:
        if view.inputs[tensor.name].is_shape_tensor:
            continue
        if not tensor.shape:
            raise invalid_arg(
                f"input '{tensor.name}' for model '{model}' has no batch dimension: "
                f"model batches (max_batch_size {view.max_batch_size}) so the shape must be "
                f"[batch-size] + {_dims_text(view.inputs[tensor.name].dims)}",
                model=model,
                tensor=tensor.name,
            )
        if batch is None:
            batch = tensor.shape[0]
        elif tensor.shape[0] != batch:
            raise invalid_arg(
                f"input '{tensor.name}' batch size does not match other inputs for '{model}': "
                f"{tensor.shape[0]} vs {batch}",
                model=model,
                tensor=tensor.name,
            )
    if batch is not None and batch < 1:
        # Triton core InferenceRequest::Normalize: a batching model's request holds at
        # least one sample
        raise invalid_arg(f"inference request batch-size must be >= 1 for '{model}'", model=model)
    batch = batch or 0
    if batch > view.max_batch_size:
        raise invalid_arg(
            # Triton core InferenceRequest::Normalize's text, word for word
            f"inference request batch-size must be <= {view.max_batch_size} for '{model}'",
            model=model,
        )
    return batch


def _check_tensor(view: ModelRules, spec: TensorSpec, tensor: WireTensor, batch: int) -> None:
    model = view.name
    if tensor.datatype != spec.datatype:
        raise invalid_arg(
            f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
            f"'{model}' expects '{spec.datatype}'",
            model=model,
            tensor=tensor.name,
        )
    batching = view.max_batch_size > 0 and not spec.is_shape_tensor
    item_shape = tensor.shape[1:] if batching else tensor.shape
    if not _shape_matches(item_shape, spec.dims):
        expected = [-1, *spec.dims] if batching else list(spec.dims)
        raise invalid_arg(
            f"unexpected shape for input '{tensor.name}' for model '{model}'. Expected "
            f"{_dims_text(expected)}, got {_dims_text(tensor.shape)}",
            model=model,
            tensor=tensor.name,
        )
    count = element_count(tensor.shape)
    if spec.datatype == "BYTES":
        try:
            elements = len(deserialize_bytes(tensor.data))
        except ValueError as exc:
            raise invalid_arg(
                f"input '{tensor.name}' for model '{model}': {exc}", model=model, tensor=tensor.name
            ) from None
        # Triton core InferenceRequest::ValidateBytesInputs' texts (L0_input_validation)
        if elements < count:
            raise invalid_arg(
                f"expected {count} string elements for inference input '{tensor.name}' for "
                f"model '{model}', got {elements}",
                model=model,
                tensor=tensor.name,
            )
        if elements > count:
            raise invalid_arg(
                f"unexpected number of string elements {count + 1} for inference input "
                f"'{tensor.name}' for model '{model}', expecting {count}",
                model=model,
                tensor=tensor.name,
            )
        return
    expected_bytes = count * ELEMENT_SIZES[spec.datatype]
    if len(tensor.data) != expected_bytes:
        raise invalid_arg(
            f"input byte size mismatch for input '{tensor.name}' for model '{model}'. "
            f"Expected {expected_bytes}, got {len(tensor.data)}",
            model=model,
            tensor=tensor.name,
        )
