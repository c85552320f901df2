"""What the gateway does for a request, one handler per job, shared by HTTP and gRPC.

:class:`~sluice.api.dataplane.DataPlane` holds one of each for a gateway process; the
HTTP routes (:mod:`api.http.routes`, :mod:`api.http.infer`) and the gRPC servicer
(:mod:`api.grpc.servicer`) only convert their messages and call them.
"""

from __future__ import annotations

from sluice.api.handlers.health import Health
from sluice.api.handlers.metadata import Metadata
from sluice.api.handlers.queueing import RequestQueue
from sluice.api.handlers.repository import RepositoryControl
from sluice.api.handlers.shutdown import Shutdown
from sluice.api.handlers.statistics import Statistics
from sluice.api.handlers.submission import InferResult, Submission

__all__ = [
    "Health",
    "InferResult",
    "Metadata",
    "RepositoryControl",
    "RequestQueue",
    "Shutdown",
    "Statistics",
    "Submission",
]
