"""A bulk job's rows: its JSON lines in, output and error JSON lines out. Pure functions.

Each line that holds more than white space is one row: a KServe v2 inference request
(JSON, as the body of ``POST .../infer``) with a ``custom_id`` string, unique in the
job. Rows are numbered by their line (1 = the first line). Formats:
docs/user-guide/jobs.md (Bulk jobs).

Output line: ``{"custom_id": ..., "response": <the synchronous infer's JSON answer>}``;
error line: ``{"custom_id": ... | null, "line": n, "status": <HTTP status>, "error":
<the synchronous call's text>}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from sluice.api.errors import http_status
from sluice.api.http.infer_request import HttpInferRequest, parse_infer_request
from sluice.api.http.infer_response import encode_infer_response
from sluice.api.models import ModelView
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg
from sluice.broker.messages import RequestedOutput, WireTensor

__all__ = ["Row", "error_line", "output_line", "parse_request", "retryable", "split_rows"]


@dataclass(slots=True)
class Row:
    """One line of a bulk job.

    Attributes:
        line: its line number, from 1.
        text: the line's bytes.
        custom_id: its ``custom_id``; None when the line has none (it fails).
        problem: why the row fails before it runs (bad JSON, no or a duplicate
            ``custom_id``); None: it runs.
        attempts: how many times it was sent.
    """

    line: int
    text: bytes
    custom_id: str | None
    problem: SluiceError | None = None
    attempts: int = 0


def split_rows(body: bytes, model: str) -> list[Row]:
    """The rows of a JSON-lines body, with their ``custom_id``; a row without a non-empty
    string ``custom_id`` or whose ``custom_id`` an earlier line has gets its ``problem``. A line
    that is not JSON is left to :func:`parse_request` (which words the error as the
    synchronous endpoint does)."""
    rows: list[Row] = []
    first_line: dict[str, int] = {}
    for index, text in enumerate(body.split(b"\n"), start=1):
        if not text.strip():
            continue
        row = Row(index, text, None)
        rows.append(row)
        try:
            document = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(document, dict):
            continue
        custom_id = document.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            what = (
                "has no 'custom_id'"
                if custom_id is None
                else "has an empty 'custom_id'"
                if custom_id == ""
                else "has a 'custom_id' that is not a string"
            )
            row.problem = invalid_arg(f"line {index} of the bulk job of model '{model}' {what}")
            continue
        row.custom_id = custom_id
        if custom_id in first_line:
            row.problem = invalid_arg(
                f"line {index} of the bulk job of model '{model}': 'custom_id' '{custom_id}' "
                f"is also on line {first_line[custom_id]}"
            )
            continue
        first_line[custom_id] = index
    return rows


def parse_request(row: Row, view: ModelView) -> HttpInferRequest:
    """The row's inference request, parsed as the synchronous HTTP endpoint parses a
    JSON body (``custom_id`` is a member the parser skips).

    Raises:
        SluiceError: the row's ``problem``, or the synchronous endpoint's refusal.
    """
    if row.problem is not None:
        raise row.problem
    return parse_infer_request(
        row.text,
        None,
        model=view.name,
        config_inputs=view.inputs.values(),
        max_batch_size=view.max_batch_size,
    )


def output_line(
    custom_id: str | None,
    model: str,
    version: int,
    request: HttpInferRequest,
    outputs: Sequence[WireTensor],
    parameters: dict[str, object],
) -> bytes:
    """A row's output line: the synchronous answer's JSON under ``response`` (every
    output as JSON data: a JSON line carries no binary tensor data).

    Raises:
        SluiceError: INVALID_ARG for an output JSON cannot carry (FP16, BF16, non-UTF-8
            BYTES), as the synchronous endpoint words it.
    """
    requested = [RequestedOutput(o.name, False, o.class_count) for o in request.outputs]
    body, _ = encode_infer_response(
        model=model,
        version=str(version),
        client_id=request.client_id,
        outputs=outputs,
        requested=requested,
        binary_data_output=False,
        parameters=parameters,
    )
    return b'{"custom_id":' + orjson.dumps(custom_id) + b',"response":' + body + b"}"


def error_line(row: Row, error: SluiceError) -> bytes:
    """A row's error line: its ``custom_id``, line, HTTP status and the error text."""
    return orjson.dumps(
        {
            "custom_id": row.custom_id,
            "line": row.line,
            "status": http_status(error.code),
            "error": error.message,
        }
    )


def retryable(error: SluiceError) -> bool:
    """Whether a row (or a single job) that failed with ``error`` is tried again: the
    model was unavailable (not ready, its queue full, Redis unreachable), but not a
    deadline that passed."""
    return error.code is ErrorCode.UNAVAILABLE and not error.message.startswith(
        "Request timeout expired"
    )
