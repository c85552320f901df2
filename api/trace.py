"""The trace extension, which Sluice does not implement.

Triton's ``/v2/trace/setting`` (and per model ``/v2/models/{name}/trace/setting``) reads
and changes request tracing. Sluice answers both over HTTP and the gRPC
``TraceSetting`` call with :data:`TRACE_UNSUPPORTED` (UNSUPPORTED: HTTP 501, gRPC
UNIMPLEMENTED), not a bare "no such route" 404, and leaves ``trace`` out of the server
metadata's ``extensions`` (PROTOCOL.md 0: only advertise what is implemented).
"""

from __future__ import annotations

__all__ = ["TRACE_UNSUPPORTED"]

TRACE_UNSUPPORTED = "trace is not supported by this server"
