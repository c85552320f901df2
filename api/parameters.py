"""Request and response rules shared by the HTTP and gRPC front ends (each written once).

Triton's reserved request parameters (docs/reference/http-protocol.md, Request parameters;
server ``http_server.cc``
``SetTritonParameterFromJsonParameter`` / ``grpc/infer_handler.cc``
``SetInferenceRequestMetadata``):

| key | accepted value |
| --- | --- |
| ``sequence_id`` | unsigned integer or string (gRPC ``int64_param`` >= 0 / ``string_param``) |
| ``sequence_start`` / ``sequence_end`` | boolean |
| ``priority`` | unsigned integer (gRPC ``int64_param`` >= 0 or ``uint64_param``) |
| ``timeout`` | unsigned integer, microseconds (gRPC ``int64_param`` only) |
| ``binary_data_output`` | boolean (HTTP's default output encoding; ignored over gRPC) |
| ``triton_*`` | rejected, except the keys a transport allows |
| anything else | custom: string, integer, boolean or number (no ``uint64_param``) |

Each transport turns its wire values into Python values first (JSON as parsed;
gRPC ``InferParameter`` oneofs, ``uint64_param`` wrapped in :class:`UInt64`), then
calls :func:`check_request_parameters`, so both answer with the same texts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.broker.datatypes import ELEMENT_SIZES
from sluice.broker.errors import SluiceError, invalid_arg
from sluice.broker.messages import ParameterValue, RequestedOutput, WireTensor

__all__ = [
    "UInt64",
    "check_datatype",
    "check_request_parameters",
    "duplicate_tensor",
    "extra_input_data",
    "is_uint",
    "select_outputs",
    "value_type_name",
]

#: Triton's reserved prefix for request parameter keys.
RESERVED_PREFIX = "triton_"


class UInt64(int):
    """A gRPC ``uint64_param`` value: an int that remembers it came unsigned.

    Only ``priority`` accepts it; custom parameters, ``sequence_id``
    and ``timeout`` refuse it, as Triton does.
    """

    __slots__ = ()


def is_uint(value: object) -> bool:
    """Whether ``value`` is a non-negative integer (not a bool)."""
    return type(value) in (int, UInt64) and value >= 0  # type: ignore[operator]


def value_type_name(value: object) -> str:
    """The JSON-style name of a value's type, for error texts ("negative integer", …)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, UInt64):
        return "uint64"
    if isinstance(value, int):
        return "negative integer" if value < 0 else "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def bad_parameter(key: str, expected: str, value: object, model: str) -> SluiceError:
    """INVALID_ARG for a reserved parameter of the wrong type."""
    return invalid_arg(
        f"invalid value for parameter '{key}' in request for model '{model}': expected "
        f"{expected}, got {value_type_name(value)}",
        model=model,
    )


def _expect_bool(value: object, key: str, model: str) -> bool:
    if not isinstance(value, bool):
        raise bad_parameter(key, "a boolean", value, model)
    return value


def check_request_parameters(
    items: Iterable[tuple[str, object]],
    model: str,
    *,
    allowed_reserved: frozenset[str] = frozenset(),
) -> tuple[dict[str, ParameterValue], bool]:
    """Check request parameters against Triton's rules; split off ``binary_data_output``.

    Args:
        items: ``(key, value)`` pairs with Python values (gRPC ``uint64_param`` as
            :class:`UInt64`).
        model: model name, for error messages.
        allowed_reserved: ``triton_``-prefixed keys this transport accepts (booleans,
            dropped from the result: they steer the front end, not the model).

    Returns:
        ``(parameters, binary_data_output)``: what travels with the request to the
        model, and the HTTP default output encoding (False when absent).

    Raises:
        SluiceError: INVALID_ARG naming the key, the model and the rule that failed.
    """
    parameters: dict[str, ParameterValue] = {}
    binary_data_output = False
    for key, value in items:
        if key.startswith(RESERVED_PREFIX):
            if key in allowed_reserved:
                _expect_bool(value, key, model)
                continue
            raise invalid_arg(
                f"invalid parameter '{key}' for model '{model}': parameter keys starting "
                "with 'triton_' are reserved for Triton usage and should not be specified",
                model=model,
            )
        if key == "binary_data_output":
            binary_data_output = _expect_bool(value, key, model)
            continue
        if key in ("sequence_start", "sequence_end"):
            _expect_bool(value, key, model)
        elif key == "priority":
            if not is_uint(value):
                raise bad_parameter(key, "an unsigned integer", value, model)
            value = int(value)  # type: ignore[call-overload]
        elif key == "timeout":
            if not is_uint(value) or isinstance(value, UInt64):
                raise bad_parameter(key, "an unsigned integer", value, model)
        elif key == "sequence_id":
            if not (isinstance(value, str) or (is_uint(value) and not isinstance(value, UInt64))):
                raise bad_parameter(key, "an unsigned integer or a string", value, model)
        elif isinstance(value, UInt64) or not isinstance(value, str | int | float):
            raise bad_parameter(key, "a string, integer, boolean or number", value, model)
        parameters[key] = value  # type: ignore[assignment]
    return parameters, binary_data_output


# ------------------------------------------------------------------ tensor-level rules


def check_datatype(datatype: str, name: str, model: str) -> None:
    """INVALID_ARG unless ``datatype`` is a protocol datatype (``BOOL``, ``INT8`` ...
    ``BYTES``)."""
    if datatype not in ELEMENT_SIZES:
        raise invalid_arg(
            f"invalid datatype '{datatype}' for input '{name}' of model '{model}'",
            model=model,
            tensor=name,
        )


def duplicate_tensor(kind: str, name: str, model: str) -> SluiceError:
    """INVALID_ARG for an input/output named twice (Triton: ``'X' already exists``)."""
    return invalid_arg(f"{kind} '{name}' already exists in request", model=model, tensor=name)


def extra_input_data(model: str) -> SluiceError:
    """INVALID_ARG for tensor data left over after every input took its share."""
    return invalid_arg(f"unexpected additional input data for model '{model}'", model=model)


def select_outputs(
    outputs: Sequence[WireTensor], requested: Sequence[RequestedOutput]
) -> list[tuple[WireTensor, RequestedOutput | None]]:
    """Which outputs a response carries: each output to send, paired with its request
    (None when the client listed none).

    KServe v2: with no ``outputs`` in the request every output is returned, in the order
    the model produced them; otherwise the requested ones, in request order. A requested
    output the model did not produce is left out, not an error: Triton's front ends
    write the outputs a response holds (a Python model may answer without some), and
    tritonclient's ``as_numpy`` then gives None for it.
    """
    if not requested:
        return [(tensor, None) for tensor in outputs]
    by_name = {tensor.name: tensor for tensor in outputs}
    return [(by_name[w.name], w) for w in requested if w.name in by_name]
