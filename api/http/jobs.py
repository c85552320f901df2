"""HTTP routes of async jobs: submit, look up, cancel, list, download.

``POST /v2/models/{m}[/versions/{v}]/jobs`` takes the body of an infer request (JSON or
binary tensor data, compressed or not) for a single job, a JSON-lines body
(``Content-Type: application/jsonl``) or ``{"input_file": ...}`` for a bulk job, and
answers 202 with the job and ``Location: /v2/jobs/{id}``. The checks are the
synchronous infer's, with its statuses and texts (:func:`api.http.infer.parse_body`,
:meth:`api.handlers.submission.Submission.check`). Endpoints and bodies:
docs/reference/http-protocol.md (Async jobs).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sluice.api.errors import http_status
from sluice.api.handlers.jobs import Jobs, JobView
from sluice.api.http.body import compress, decompress, negotiate_encoding
from sluice.api.http.infer import parse_body
from sluice.api.http.infer_response import encode_infer_response
from sluice.api.http.routes import dataplane, json_response
from sluice.api.shm_tensors import refuse_shared_memory
from sluice.broker.errors import invalid_arg, too_large
from sluice.broker.job_records import JobKind, JobRequest
from sluice.broker.states import JobState

__all__ = ["JSONL_TYPES", "bulk_input_file", "job_fields", "router"]

router = APIRouter()

#: content types of a bulk job's JSON-lines body.
JSONL_TYPES = frozenset(
    {
        "application/jsonl",
        "application/x-jsonl",
        "application/jsonlines",
        "application/x-jsonlines",
        "application/x-ndjson",
        "application/json-lines",
    }
)
#: a JSON body this small is looked at for ``input_file`` (a bulk job from a file).
_FILE_REQUEST_BYTES = 4096


def _jobs(request: Request) -> Jobs:
    return dataplane(request).jobs


def _seconds(ns: int) -> float | None:
    return round(ns / 1e9, 3) if ns else None


def job_fields(view: JobView) -> dict[str, Any]:
    """The JSON members of a job, without a single job's outputs (docs/reference/
    http-protocol.md, Async jobs): ``id``, ``kind``, ``state``, ``model_name``,
    ``model_version``, the times in Unix seconds (``created_at``, ``started_at``,
    ``finished_at``, ``expires_at``; null when not yet), ``error`` and ``status`` once
    FAILURE, and a bulk job's ``request_counts``, ``output_url`` and ``errors_url``."""
    record = view.record
    version = record.model_version or record.version
    body: dict[str, Any] = {
        "id": record.id,
        "kind": record.kind.value,
        "state": record.state.value,
        "model_name": record.model,
        "model_version": "" if version is None else str(version),
        "created_at": _seconds(record.created_ns),
        "started_at": _seconds(record.started_ns),
        "finished_at": _seconds(record.finished_ns),
        "expires_at": _seconds(
            (record.finished_ns or record.deadline_ns) + record.ttl_s * 1_000_000_000
        ),
    }
    if record.state is JobState.FAILURE:
        body["error"] = record.error
        body["status"] = http_status(record.code or "INTERNAL")
    if record.kind is JobKind.BULK:
        body["request_counts"] = {
            "total": record.total,
            "completed": view.completed,
            "failed": view.failed,
        }
        body["output_url"] = f"/v2/jobs/{record.id}/output"
        body["errors_url"] = f"/v2/jobs/{record.id}/errors"
    return body


async def _read_limited(request: Request, limit: int) -> bytes:
    """The request body, refused past ``limit`` bytes as the infer endpoint refuses it.

    Raises:
        SluiceError: TOO_LARGE (HTTP 413) past the limit.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(None, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _ttl(request: Request) -> int | None:
    raw = request.query_params.get("ttl_secs")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise invalid_arg(f"'ttl_secs' must be a whole number of seconds, got '{raw}'") from None


def bulk_input_file(body: bytes, content_type: str) -> str | None:
    """The ``input_file`` of a small JSON body that names one (and no ``inputs``)."""
    if len(body) > _FILE_REQUEST_BYTES or content_type not in ("", "application/json"):
        return None
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(document, dict) and "input_file" in document and "inputs" not in document:
        value = document["input_file"]
        if not isinstance(value, str):
            raise invalid_arg("'input_file' of a bulk job must be a string")
        return value
    return None


async def _submit(request: Request, model: str, version: int | None) -> Response:
    jobs = _jobs(request)
    ttl_s = jobs.ttl(_ttl(request))
    view = await jobs.resolve(model, version)  # an unknown model: 404 before the body
    limit = dataplane(request).settings.http.max_body_bytes
    raw = await _read_limited(request, limit)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    headers = dict(request.scope["headers"])
    if content_type in JSONL_TYPES:
        # a gzip or deflate body is undone as for infer (within the same size limit)
        body = decompress(raw, request.headers.get("content-encoding"), limit)
        record = await jobs.submit_bulk(view, version, body, ttl_s)
    elif b"inference-header-content-length" not in headers and (
        input_file := bulk_input_file(raw, content_type)
    ):
        record = await jobs.submit_bulk_file(view, version, input_file, ttl_s)
    else:
        parsed, _ = parse_body(limit, view, headers, raw)
        refuse_shared_memory(parsed.shm, view.name, "an async job")
        job_request = JobRequest(
            client_id=parsed.client_id,
            inputs=parsed.inputs,
            outputs=parsed.outputs,
            parameters=parsed.parameters,
            binary_data_output=parsed.binary_data_output,
        )
        record = await jobs.submit_single(view, version, job_request, ttl_s)
    response = json_response(job_fields(JobView(record)), 202)
    response.headers["Location"] = f"/v2/jobs/{record.id}"
    return response


@router.post("/v2/models/{model_name}/jobs")
async def submit_job(request: Request, model_name: str) -> Response:
    """Accept a single or bulk job for the model's default version."""
    return await _submit(request, model_name, None)


@router.post("/v2/models/{model_name}/versions/{model_version:int}/jobs")
async def submit_version_job(request: Request, model_name: str, model_version: int) -> Response:
    """Accept a single or bulk job for one version."""
    return await _submit(request, model_name, model_version)


@router.get("/v2/jobs")
async def list_jobs(request: Request) -> Response:
    """The newest jobs: ``?model=``, ``?state=`` and ``?limit=`` (default 100) filter."""
    raw_limit = request.query_params.get("limit", "100")
    try:
        limit = int(raw_limit)
    except ValueError:
        raise invalid_arg(f"'limit' must be a whole number, got '{raw_limit}'") from None
    views = await _jobs(request).recent(
        request.query_params.get("model"), request.query_params.get("state"), limit
    )
    return json_response({"jobs": [job_fields(v) for v in views]})


def _job_response(request: Request, view: JobView) -> Response:
    """A job's body; a single job's outputs once SUCCESS, encoded as its request asked
    (JSON, or binary tensor data with ``Inference-Header-Content-Length``)."""
    fields = job_fields(view)
    if view.response is None or view.request is None:
        return json_response(fields)
    response, job_request = view.response, view.request
    fields.pop("model_name")
    fields.pop("model_version")
    if job_request.client_id:
        fields["request_id"] = job_request.client_id
    content, headers = encode_infer_response(
        model=view.record.model,
        version=str(response.version),
        client_id="",
        outputs=response.outputs,
        requested=job_request.outputs,
        binary_data_output=job_request.binary_data_output,
        parameters=dict(response.parameters),
        extra=fields,
    )
    chosen = negotiate_encoding(request.headers.get("accept-encoding"))
    if chosen is not None:
        content = compress(content, chosen)
        headers["Content-Encoding"] = chosen
    return Response(content, headers=headers)


@router.get("/v2/jobs/{job_id}")
async def get_job(request: Request, job_id: str) -> Response:
    """The job: state, times, and a single job's outputs or a bulk job's row counts."""
    return _job_response(request, await _jobs(request).view(job_id))


@router.delete("/v2/jobs/{job_id}")
async def cancel_job(request: Request, job_id: str) -> Response:
    """Cancel a job that has not finished (REVOKED); answers the job as it is now."""
    return _job_response(request, await _jobs(request).cancel(job_id))


async def _rows(request: Request, job_id: str, errors: bool) -> Response:
    chunks = await _jobs(request).rows(job_id, errors)
    return StreamingResponse(chunks, media_type="application/jsonl")


@router.get("/v2/jobs/{job_id}/output")
async def job_output(request: Request, job_id: str) -> Response:
    """A bulk job's answered rows, one JSON line each, in the order of its lines."""
    return await _rows(request, job_id, errors=False)


@router.get("/v2/jobs/{job_id}/errors")
async def job_errors(request: Request, job_id: str) -> Response:
    """A bulk job's failed rows, one JSON line each, in the order of its lines."""
    return await _rows(request, job_id, errors=True)
