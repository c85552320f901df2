"""HTTP routes of Triton's shared-memory extensions: ``/v2/systemsharedmemory`` and
``/v2/cudasharedmemory`` (``[/region/{name}]/status``, ``/region/{name}/register``,
``[/region/{name}]/unregister``).

Bodies and texts: Triton ``src/http_server.cc`` (``HandleSystemSharedMemory``,
``HandleCudaSharedMemory``); the regions are :class:`api.shared_memory.SharedMemoryRegistry`'s.
Status answers a JSON array of regions; register and unregister answer 200 with an
empty body; unregister without a region name unregisters every region of the kind.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from sluice.api.http.json_tensors import NOT_STRING, NOT_UINT
from sluice.api.http.routes import dataplane, empty, json_response
from sluice.api.parameters import is_uint
from sluice.broker.errors import invalid_arg

__all__ = ["router"]

router = APIRouter()


async def _register_body(request: Request) -> dict[str, Any]:
    """The register request's JSON object.

    Raises:
        SluiceError: INVALID_ARG for a body that is not a JSON object.
    """
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(body, dict):
        raise invalid_arg("Shared memory register request must be a JSON object")
    return body


def _member(body: dict[str, Any], key: str, required: bool) -> Any:
    if key not in body:
        if required:
            raise invalid_arg(f"Shared memory register request has no '{key}' field")
        return 0
    value = body[key]
    if key == "key" and not isinstance(value, str):
        raise invalid_arg(
            f"Unable to parse '{key}' of the shared memory register request: {NOT_STRING}"
        )
    if key != "key" and not is_uint(value):
        raise invalid_arg(
            f"Unable to parse '{key}' of the shared memory register request: {NOT_UINT}"
        )
    return value


async def system_status(request: Request, name: str = "") -> Response:
    """Every registered system region, or the one named (404 when not registered)."""
    return json_response(dataplane(request).shared_memory.system_status(name))


async def system_register(request: Request, name: str) -> Response:
    """Register ``byte_size`` bytes at ``offset`` (default 0) of the object ``key``."""
    body = await _register_body(request)
    key = _member(body, "key", True)
    offset = _member(body, "offset", False)
    byte_size = _member(body, "byte_size", True)
    dataplane(request).shared_memory.register_system(name, key, offset, byte_size)
    return empty()


async def system_unregister(request: Request, name: str = "") -> Response:
    """Unregister one system region (a name not registered: nothing to do), or all."""
    dataplane(request).shared_memory.unregister_system(name)
    return empty()


async def cuda_status(request: Request, name: str = "") -> Response:
    """Every registered CUDA region, or the one named (404 when not registered)."""
    return json_response(dataplane(request).shared_memory.cuda_status(name))


def _raw_handle(body: dict[str, Any]) -> bytes:
    """The ``raw_handle: {"b64": ...}`` member, decoded.

    Raises:
        SluiceError: INVALID_ARG when it is missing, not an object with a string
            ``b64``, or not base64.
    """
    if "raw_handle" not in body:
        raise invalid_arg("Shared memory register request has no 'raw_handle' field")
    member = body["raw_handle"]
    encoded = member.get("b64") if isinstance(member, dict) else None
    if not isinstance(encoded, str):
        raise invalid_arg(
            f"Unable to parse 'b64' of the shared memory register request: {NOT_STRING}"
        )
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise invalid_arg(
            "'raw_handle' of the shared memory register request is not base64"
        ) from None


async def cuda_register(request: Request, name: str) -> Response:
    """Open the client's CUDA IPC handle (``raw_handle``, ``device_id``, ``byte_size``);
    without CUDA, 400 with Triton's no-GPU text whatever the body."""
    registry = dataplane(request).shared_memory
    registry.check_cuda(name)
    body = await _register_body(request)
    raw_handle = _raw_handle(body)
    byte_size = _member(body, "byte_size", True)
    device_id = _member(body, "device_id", True)
    registry.register_cuda(name, raw_handle, device_id, byte_size)
    return empty()


async def cuda_unregister(request: Request, name: str = "") -> Response:
    """Unregister one CUDA region (a name not registered: nothing to do), or all."""
    dataplane(request).shared_memory.unregister_cuda(name)
    return empty()


for _kind, _status, _register, _unregister in (
    ("systemsharedmemory", system_status, system_register, system_unregister),
    ("cudasharedmemory", cuda_status, cuda_register, cuda_unregister),
):
    for _prefix in (f"/v2/{_kind}", f"/v2/{_kind}/region/{{name}}"):
        router.add_api_route(f"{_prefix}/status", _status, methods=["GET"])
        router.add_api_route(f"{_prefix}/unregister", _unregister, methods=["POST"])
    router.add_api_route(f"/v2/{_kind}/region/{{name}}/register", _register, methods=["POST"])
