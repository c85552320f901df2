"""The standard gRPC health service (``grpc.health.v1.Health``) on the inference port.

Triton serves ``grpc.health.v1.Health/Check`` beside ``GRPCInferenceService`` and
answers SERVING iff the server is ready (docs/reference/grpc-protocol.md; Kubernetes gRPC
probes and ``grpc_health_probe`` call it). The messages and the service stub are the
``grpcio-health-checking`` package's; readiness is the gateway's own
(:meth:`api.handlers.health.Health.server_ready`, the answer of ``GET /v2/health/ready``),
whatever service name the request carries, as Triton does. ``Watch`` is not offered
(UNIMPLEMENTED, the stub's default).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.api.dataplane import DataPlane

__all__ = ["ReadinessHealthServicer", "add_health_servicer"]


class ReadinessHealthServicer(health_pb2_grpc.HealthServicer):
    """``Check`` answers SERVING when the server is ready, NOT_SERVING otherwise.

    Args:
        dataplane: the gateway's DataPlane (its readiness check waits at most its probe
            deadline on Redis).
    """

    def __init__(self, dataplane: DataPlane) -> None:
        self._dp = dataplane

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        """SERVING iff ``GET /v2/health/ready`` would answer 200 (Triton: server ready)."""
        ready = await self._dp.health.server_ready()
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


def add_health_servicer(dataplane: DataPlane, server: grpc.aio.Server) -> None:
    """Register ``grpc.health.v1.Health`` on ``server`` (not started yet)."""
    health_pb2_grpc.add_HealthServicer_to_server(ReadinessHealthServicer(dataplane), server)
