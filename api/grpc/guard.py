"""The one translation point of the gRPC front end: access control and errors.

Every servicer method is wrapped once, when the servicer is built
(:func:`guard_servicer`), not by a decorator per method (one place to read, none to
forget):

* a call to a restricted API group without the right metadata is refused with
  PERMISSION_DENIED before the method runs (:mod:`api.access`);
* a request message that did not parse (:class:`api.grpc.registration.Unparsed`)
  is answered INTERNAL, as gRPC C++ answers it;
* any other error -> the status code and details of :func:`api.errors.client_error`
  (``SluiceError``: its code's gRPC status, Triton ``grpc_utils.cc`` ``CodeToStatus``;
  Redis unreachable: UNAVAILABLE; anything else: INTERNAL, logged with its traceback).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import grpc

from sluice.api.access import AccessPolicy
from sluice.api.errors import client_error
from sluice.api.grpc.registration import Unparsed
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.outage import OutageLog

__all__ = ["RPC_GROUPS", "guard_servicer", "metadata_dict", "translate"]

logger = logging.getLogger(__name__)
#: one line per Redis outage, not one per failed request
REDIS_OUTAGE = OutageLog(logger, "gRPC requests")

#: RPC name -> Triton API group (server ``src/grpc/grpc_server.cc`` registrations).
RPC_GROUPS: dict[str, str] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


def translate(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status code and details for an exception raised by a handler
    (:func:`client_error`)."""
    error = client_error(exc, REDIS_OUTAGE, "a gRPC handler")
    return error.grpc_status, error.message


def metadata_dict(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's metadata as ``{lower-case key: value}`` (last value wins)."""
    found: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            found[key.lower()] = value
    return found


def _refusal(policy: AccessPolicy, group: str, context: grpc.aio.ServicerContext) -> str | None:
    if not policy:
        return None
    header = policy.missing_header(group, metadata_dict(context))
    if header is None:
        return None
    return f"This protocol is restricted, expecting header '{header}'"


def _guard_unary(
    method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    group: str,
    policy: AccessPolicy,
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    @functools.wraps(method)
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        refusal = _refusal(policy, group, context)
        if refusal is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        if isinstance(request, Unparsed):
            await context.abort(grpc.StatusCode.INTERNAL, request.message)
        try:
            return await method(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            code, details = translate(exc)
        # grpc keeps the AbortError on the call's state, and its traceback (this frame,
        # the context, the state) is a reference cycle that only the garbage collector
        # frees. Raised inside the except block it would also chain the handled error,
        # whose traceback holds the handler's frames and decoded tensors; and this frame
        # still holds the request. So it is raised here, after dropping the request: a
        # refused large request leaves nothing large in the cycle
        # (tests/e2e/test_grpc_infer.py, test_refused_large_requests_leave_no_memory_behind)
        del request
        await context.abort(code, details)

    return guarded


def _guard_stream(
    method: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]],
    group: str,
    policy: AccessPolicy,
) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
    @functools.wraps(method)
    async def guarded(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        refusal = _refusal(policy, group, context)
        if refusal is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        try:
            async for item in method(_parsed(requests), context):
                yield item
            return
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            code, details = translate(exc)
        del requests  # as in _guard_unary: nothing large in the aborting frame
        await context.abort(code, details)

    return guarded


async def _parsed(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The stream's requests; one that did not parse ends the stream with INTERNAL."""
    async for request in requests:
        if isinstance(request, Unparsed):
            raise SluiceError(ErrorCode.INTERNAL, request.message)
        yield request


def guard_servicer(servicer: Any, policy: AccessPolicy, groups: Mapping[str, str]) -> Any:
    """Wrap every RPC method of ``servicer`` in place (access check + error translation).

    Args:
        servicer: a ``GRPCInferenceServiceServicer`` instance.
        policy: the restricted groups (metadata keys already prefixed).
        groups: RPC name -> API group.

    Returns:
        The same servicer, its RPC methods replaced by instance attributes.
    """
    for name, group in groups.items():
        method = getattr(servicer, name)
        if inspect.isasyncgenfunction(method):
            setattr(servicer, name, _guard_stream(method, group, policy))
        else:
            setattr(servicer, name, _guard_unary(method, group, policy))
    return servicer
