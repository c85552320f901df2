"""Registering the servicer with ``grpc.aio``, with request parsing that does not raise.

The table is tritonclient's ``GRPCInferenceService`` (read from the shipped
``service_pb2`` descriptor, so every RPC of the service is registered and no
``.proto`` is copied). grpc.aio answers a request deserializer that raises with
UNKNOWN and logs a traceback; gRPC C++ (Triton) answers INTERNAL. Here a message
that does not parse becomes :class:`Unparsed`, which the guard
(:mod:`api.grpc.guard`) answers with INTERNAL naming the message type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

__all__ = ["SERVICE_NAME", "Unparsed", "add_servicer"]

SERVICE_NAME = "inference.GRPCInferenceService"


@dataclass(frozen=True, slots=True)
class Unparsed:
    """A request message whose bytes are not a valid protobuf of its type."""

    message: str


def _parser(message_class: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return Unparsed(f"failed to parse the {message_class.__name__} message: {exc}")

    return parse


def add_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    """Register every RPC of ``GRPCInferenceService`` on ``server`` with ``servicer``'s methods.

    Args:
        servicer: the (guarded) servicer; one attribute per RPC name.
        server: the ``grpc.aio`` server, not started yet.
    """
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        make = (
            grpc.stream_stream_rpc_method_handler
            if method.client_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=_parser(getattr(service_pb2, method.input_type.name)),
            response_serializer=getattr(service_pb2, method.output_type.name).SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    server.add_registered_method_handlers(service.full_name, handlers)
