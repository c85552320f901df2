"""msgpack codec for ``broker.messages``: header fields plus raw tensor bytes.

Tensor bytes are msgpack ``bin`` values (no base64, no JSON). The layout is a
positional array so decoding allocates no field-name strings; ``_VERSION``
guards against a mixed deployment reading a layout it does not know.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

from sluice.broker.messages import (
    ErrorInfo,
    InferRequestMessage,
    InferResponseMessage,
    WireTensor,
)

_VERSION = 1
#: the trace context of every decoded request that is not traced: one shared empty dict
#: (never changed in place), not one new dict per request
_UNTRACED: dict[str, str] = {}


class CodecError(ValueError):
    """A message that is not a Sluice message of a known layout version."""


_local = threading.local()


def _pack(fields: list[Any]) -> bytes:
    """msgpack bytes of ``fields`` (``bin`` for bytes) with this thread's packer: a
    ``Packer`` is not safe to share between threads, and ``msgpack.packb`` builds a new
    one per call."""
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(fields)


def _pack_tensors(tensors: tuple[WireTensor, ...]) -> list[list[Any]]:
    return [[t.name, t.datatype, list(t.shape), t.data] for t in tensors]


def _unpack_tensors(raw: Any) -> tuple[WireTensor, ...]:
    """Tensors of a message unpacked with ``use_list=False`` (shapes are tuples)."""
    return tuple([WireTensor(n, d, s, b) for n, d, s, b in raw])


def encode_request(message: InferRequestMessage) -> bytes:
    """Serialize a request for ``XADD``; tensors travel as msgpack ``bin``. A traced
    request's trace context is a last field; an untraced request has none."""
    fields = [
        _VERSION,
        message.request_id,
        message.client_id,
        message.model,
        message.version,
        _pack_tensors(message.inputs),
        list(message.outputs),
        message.parameters,
        message.reply_to,
        message.deadline_ns,
        message.enqueued_ns,
        message.classification,
        message.load_id,
    ]
    if message.trace:
        fields.append(message.trace)
    return _pack(fields)


def decode_request(payload: bytes) -> InferRequestMessage:
    """Inverse of :func:`encode_request`.

    Raises:
        CodecError: not a request of layout version ``_VERSION``.
    """
    try:
        fields = msgpack.unpackb(payload, raw=False, use_list=False)
        (
            version,
            request_id,
            client_id,
            model,
            model_version,
            inputs,
            outputs,
            parameters,
            reply_to,
            deadline_ns,
            enqueued_ns,
            classification,
        ) = fields[:12]
        load_id = fields[12] if len(fields) > 12 else ""  # a gateway without it: ""
        trace = fields[13] if len(fields) > 13 else _UNTRACED  # not traced: no field
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CodecError(f"undecodable request message: {exc}") from exc
    if version != _VERSION:
        raise CodecError(f"request message layout {version}, expected {_VERSION}")
    return InferRequestMessage(
        request_id=request_id,
        client_id=client_id,
        model=model,
        version=model_version,
        inputs=_unpack_tensors(inputs),
        outputs=outputs,
        parameters=parameters,
        reply_to=reply_to,
        deadline_ns=deadline_ns,
        enqueued_ns=enqueued_ns,
        classification=classification,
        load_id=load_id if isinstance(load_id, str) else "",
        trace=trace if isinstance(trace, dict) else _UNTRACED,
    )


def encode_response(message: InferResponseMessage) -> bytes:
    """Serialize a response for the reply key."""
    error = None if message.error is None else [message.error.code, message.error.message]
    return _pack(
        [
            _VERSION,
            message.request_id,
            message.model,
            message.version,
            _pack_tensors(message.outputs),
            error,
            message.parameters,
            message.timings,
            message.load_id,
            message.final,
            message.instance,
            message.empty,
        ]
    )


def decode_response(payload: bytes) -> InferResponseMessage:
    """Inverse of :func:`encode_response`.

    Raises:
        CodecError: not a response of layout version ``_VERSION``.
    """
    try:
        fields = msgpack.unpackb(payload, raw=False, use_list=False)
        version, request_id, model, model_version, outputs, error, parameters, timings = fields[:8]
        load_id = fields[8] if len(fields) > 8 else ""  # a worker without it: ""
        final, instance, empty = fields[9:12] if len(fields) > 11 else (True, "", False)
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
        raise CodecError(f"undecodable response message: {exc}") from exc
    if version != _VERSION:
        raise CodecError(f"response message layout {version}, expected {_VERSION}")
    return InferResponseMessage(
        request_id=request_id,
        model=model,
        version=model_version,
        outputs=_unpack_tensors(outputs),
        error=None if error is None else ErrorInfo(error[0], error[1]),
        parameters=parameters,
        timings=timings,
        load_id=load_id if isinstance(load_id, str) else "",
        final=bool(final),
        instance=instance if isinstance(instance, str) else "",
        empty=bool(empty),
    )
