"""Inference endpoint with the binary tensor data extension (PROTOCOL.md 1.7, 2, 3)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response

from api.http.body import compress, decompress, negotiate_encoding, read_body
from api.http.infer_codec import encode_infer_response, parse_infer_request
from api.http.responses import dataplane
from broker.errors import invalid_arg

router = APIRouter(tags=["inference"])

_HEADER_LENGTH = "inference-header-content-length"


async def _infer(request: Request, model_name: str, version: int | None) -> Response:
    dp = dataplane(request)
    await dp.registry.resolve(model_name, version)  # unknown model: 404 before the body
    limit = dp.settings.http.max_body_bytes
    body = decompress(
        await read_body(request, limit), request.headers.get("content-encoding"), limit
    )
    raw_length = request.headers.get(_HEADER_LENGTH)
    header_length: int | None = None
    if raw_length is not None:
        try:
            header_length = int(raw_length)
        except ValueError:
            raise invalid_arg(
                f"inference header size should be in range (0, {len(body)}), got: {raw_length}"
            ) from None
    parsed = parse_infer_request(body, header_length, model=model_name)
    result = await dp.infer(
        model_name, version, parsed.client_id, parsed.inputs, parsed.outputs, parsed.parameters
    )
    content, headers = encode_infer_response(
        model=model_name,
        version=str(result.version),
        client_id=result.client_id,
        outputs=result.outputs,
        requested=parsed.outputs,
        binary_data_output=parsed.binary_data_output,
        parameters=result.parameters,
    )
    encoding = negotiate_encoding(request.headers.get("accept-encoding"))
    if encoding is not None:
        content = compress(content, encoding)
        headers["Content-Encoding"] = encoding
    return Response(content, headers=headers)


@router.post("/v2/models/{model_name}/infer")
async def infer(request: Request, model_name: str) -> Response:
    """Run the model's newest READY version."""
    return await _infer(request, model_name, None)


@router.post("/v2/models/{model_name}/versions/{model_version:int}/infer")
async def infer_version(request: Request, model_name: str, model_version: int) -> Response:
    """Run one version of the model."""
    return await _infer(request, model_name, model_version)
