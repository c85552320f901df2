"""The gRPC front end: Triton's ``inference.GRPCInferenceService`` over ``grpc.aio``."""

from __future__ import annotations

__all__ = ["GrpcFrontEnd", "InferenceServicer", "build_servicer"]

from sluice.api.grpc.server import GrpcFrontEnd
from sluice.api.grpc.servicer import InferenceServicer, build_servicer
