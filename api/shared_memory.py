"""The shared-memory extension, answered as Triton with client shared memory off.

Sluice does not map client memory: no region is ever registered, so status answers
an empty list (HTTP) or map (gRPC), unregister succeeds with nothing to do, and
register is refused with :data:`SHM_DISABLED` (UNSUPPORTED: HTTP 501, gRPC
UNIMPLEMENTED). Recent Triton refuses client shared memory the same way unless
started with ``--allow-client-shm=true`` (PROTOCOL.md 1.10); the extension is not
listed in the server metadata's ``extensions``.
"""

from __future__ import annotations

__all__ = ["SHM_DISABLED"]

SHM_DISABLED = (
    "Client shared memory is disabled: this server does not implement the shared-memory extension"
)
