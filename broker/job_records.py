"""What Redis holds of an async job: its record (a hash) and a single job's request.

The record is written by the gateway that accepts the job and updated by the job
worker that runs it (``broker.job_store``); every field is text in the hash, times are
wall-clock ns since the epoch (0: not yet). A single job's request is msgpack, its
tensors raw bytes in the wire layout (``broker.messages.WireTensor``), like a queued
request (``broker.codec``). States and transitions: ``broker.states.JobState``; the
user's view: docs/user-guide/jobs.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum

import msgpack

from sluice.broker.messages import ParameterValue, RequestedOutput, WireTensor
from sluice.broker.states import JobState

__all__ = [
    "JobKind",
    "JobRecord",
    "JobRequest",
    "decode_job_request",
    "encode_job_request",
]

_REQUEST_LAYOUT = 1


class JobKind(StrEnum):
    """A single inference, or a bulk job over JSON lines (one request per line)."""

    SINGLE = "single"
    BULK = "bulk"


@dataclass(slots=True)
class JobRecord:
    """One job's record.

    Attributes:
        id: the job id (32 hex digits).
        kind: single or bulk.
        model: the model name.
        version: the version asked for; None: the model's version policy picks.
        state: the job's state.
        created_ns: when the gateway accepted it.
        started_ns: when a job worker first took it (0: not yet).
        finished_ns: when it reached a final state (0: not yet).
        deadline_ns: when it fails with "Request timeout expired" if not finished.
        ttl_s: how long the record and results stay once it finished, in s.
        model_version: the version that answered (single jobs; 0: none yet).
        error: why it failed (FAILURE; Triton's text, as the synchronous call gives it).
        code: the error's Triton code (``ErrorCode`` name), "" without one.
        total: the rows of a bulk job (0 until counted).
        source: a bulk job's rows: ``body`` (the key ``job_input``) or ``file:<path>``.
        priority: the priority level a bulk job's rows are queued at (0: the default).
        attempts: how many times a job worker started running it.
        retries: how many times it waited for an unavailable model.
    """

    id: str
    kind: JobKind
    model: str
    version: int | None
    state: JobState
    created_ns: int
    deadline_ns: int
    ttl_s: int
    started_ns: int = 0
    finished_ns: int = 0
    model_version: int = 0
    error: str = ""
    code: str = ""
    total: int = 0
    source: str = ""
    priority: int = 0
    attempts: int = 0
    retries: int = 0

    def to_fields(self) -> dict[str, str]:
        """The record as the hash's fields (every one, as text)."""
        out: dict[str, str] = {}
        for item in fields(self):
            if item.name == "id":
                continue
            value = getattr(self, item.name)
            out[item.name] = "" if value is None else str(value)
        return out

    @classmethod
    def from_fields(cls, job_id: str, raw: dict[bytes, bytes] | dict[str, str]) -> JobRecord:
        """The record of a hash read back (``HGETALL``); missing fields take defaults.

        Raises:
            ValueError: a hash that is not a job record (no kind, model or state).
        """
        text = {_text(k): _text(v) for k, v in raw.items()}
        try:
            version = text.get("version", "")
            return cls(
                id=job_id,
                kind=JobKind(text["kind"]),
                model=text["model"],
                version=int(version) if version else None,
                state=JobState(text["state"]),
                created_ns=int(text.get("created_ns") or 0),
                deadline_ns=int(text.get("deadline_ns") or 0),
                ttl_s=int(text.get("ttl_s") or 0),
                started_ns=int(text.get("started_ns") or 0),
                finished_ns=int(text.get("finished_ns") or 0),
                model_version=int(text.get("model_version") or 0),
                error=text.get("error", ""),
                code=text.get("code", ""),
                total=int(text.get("total") or 0),
                source=text.get("source", ""),
                priority=int(text.get("priority") or 0),
                attempts=int(text.get("attempts") or 0),
                retries=int(text.get("retries") or 0),
            )
        except KeyError as exc:
            raise ValueError(f"job {job_id}: record without '{exc.args[0]}'") from None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@dataclass(slots=True)
class JobRequest:
    """A single job's inference request, as the gateway parsed and checked it.

    Attributes:
        client_id: the request's ``id`` ("" when absent).
        inputs: the input tensors, wire layout.
        outputs: the outputs asked for (empty: every output), with their encoding.
        parameters: the request parameters (``priority``, ``timeout``, custom ones).
        binary_data_output: the request-level default encoding of outputs not listed
            (binary tensor data extension).
    """

    client_id: str
    inputs: tuple[WireTensor, ...]
    outputs: tuple[RequestedOutput, ...]
    parameters: dict[str, ParameterValue] = field(default_factory=dict)
    binary_data_output: bool = False


def encode_job_request(request: JobRequest) -> bytes:
    """msgpack bytes of ``request`` (tensor data as ``bin``)."""
    return msgpack.packb(
        [
            _REQUEST_LAYOUT,
            request.client_id,
            [[t.name, t.datatype, list(t.shape), t.data] for t in request.inputs],
            [[o.name, o.binary, o.class_count] for o in request.outputs],
            request.parameters,
            request.binary_data_output,
        ],
        use_bin_type=True,
    )


def decode_job_request(payload: bytes) -> JobRequest:
    """Inverse of :func:`encode_job_request`.

    Raises:
        ValueError: not a job request of a known layout.
    """
    try:
        layout, client_id, inputs, outputs, parameters, binary = msgpack.unpackb(
            payload, raw=False, use_list=False
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"undecodable job request: {exc}") from exc
    if layout != _REQUEST_LAYOUT:
        raise ValueError(f"job request layout {layout}, expected {_REQUEST_LAYOUT}")
    return JobRequest(
        client_id=client_id,
        inputs=tuple(WireTensor(n, d, tuple(s), b) for n, d, s, b in inputs),
        outputs=tuple(RequestedOutput(n, bool(b), int(k)) for n, b, k in outputs),
        parameters=dict(parameters),
        binary_data_output=bool(binary),
    )
