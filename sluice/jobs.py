"""A small client of Sluice's async job API: submit, wait with a progress bar, fetch.

Standard library and numpy only (no tritonclient needed)::

    import numpy as np
    from sluice.jobs import JobClient

    jobs = JobClient("localhost:8000")
    job = jobs.submit("add_sub", {"INPUT0": a, "INPUT1": b})  # a, b: float32 [1, 16]
    jobs.wait(job)  # a progress line on standard error
    outputs = jobs.result(job)  # {"OUTPUT0": array, "OUTPUT1": array}

    bulk = jobs.submit_bulk("add_sub", rows)  # rows: dicts with a "custom_id" each
    jobs.wait(bulk)
    for line in jobs.output(bulk): ...

Endpoints and formats: docs/user-guide/jobs.md and docs/reference/http-protocol.md (Async
jobs). :meth:`JobClient.wait` rides out a gateway that restarts or is briefly
unreachable: it polls again until the job is final or its own timeout passes.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

__all__ = [
    "FINAL_STATES",
    "JobClient",
    "JobError",
    "decode_outputs",
    "encode_request",
    "progress_text",
]

#: how often :meth:`JobClient.wait` writes a progress line to a stream that is not a
#: terminal (and at each change of state), in s.
_LOG_EVERY_S = 5.0

#: the states a job ends in.
FINAL_STATES = frozenset({"SUCCESS", "FAILURE", "REVOKED"})

_DATATYPES = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}
_DTYPES = {name: dtype for dtype, name in _DATATYPES.items()}


class JobError(Exception):
    """A refused call (the server's status and ``error`` text), or a job that did not
    succeed (its state and error)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"[{status}] {message}")
        self.status = status
        self.message = message


def _datatype(array: np.ndarray) -> str:
    if array.dtype.kind in "OSU":
        return "BYTES"
    try:
        return _DATATYPES[array.dtype]
    except KeyError:
        raise ValueError(f"no KServe v2 datatype for numpy dtype {array.dtype}") from None


def _raw(array: np.ndarray, datatype: str) -> bytes:
    """A tensor's bytes in the binary tensor data extension's layout (little-endian;
    BYTES: a 4-byte little-endian length before each element)."""
    if datatype != "BYTES":
        return np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
    parts = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += [len(data).to_bytes(4, "little"), data]
    return b"".join(parts)


def encode_request(
    inputs: Mapping[str, np.ndarray],
    outputs: Iterable[str] | None = None,
    *,
    binary: bool = True,
    parameters: Mapping[str, Any] | None = None,
    request_id: str = "",
) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 inference request body and its headers: inputs as binary tensor data
    (``binary``) or JSON, the outputs asked for (None: every one) in binary or JSON."""
    header: dict[str, Any] = {"inputs": []}
    if request_id:
        header["id"] = request_id
    params = dict(parameters or {})
    if binary and outputs is None:
        params["binary_data_output"] = True
    if params:
        header["parameters"] = params
    chunks = []
    for name, array in inputs.items():
        array = np.asarray(array)
        datatype = _datatype(array)
        entry: dict[str, Any] = {"name": name, "shape": list(array.shape), "datatype": datatype}
        if binary:
            data = _raw(array, datatype)
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            values = array.reshape(-1)
            entry["data"] = [v.decode() if isinstance(v, bytes) else v for v in values.tolist()]
        header["inputs"].append(entry)
    if outputs is not None:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in outputs]
    text = json.dumps(header).encode()
    if not chunks:
        return text, {"Content-Type": "application/json"}
    headers = {"Inference-Header-Content-Length": str(len(text))}
    return text + b"".join(chunks), {**headers, "Content-Type": "application/octet-stream"}


def decode_outputs(
    body: bytes, header_length: int | None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON part of an answer and its outputs as arrays (binary or JSON data)."""
    length = len(body) if header_length is None else header_length
    document = json.loads(body[:length])
    offset = length
    arrays: dict[str, np.ndarray] = {}
    for output in document.get("outputs", []):
        shape, datatype = output["shape"], output["datatype"]
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            values = output["data"]
            dtype = object if datatype == "BYTES" else _DTYPES[datatype]
            arrays[output["name"]] = np.array(values, dtype=dtype).reshape(shape)
            continue
        raw = body[offset : offset + size]
        offset += size
        if datatype == "BYTES":
            items, at = [], 0
            while at < len(raw):
                n = int.from_bytes(raw[at : at + 4], "little")
                items.append(raw[at + 4 : at + 4 + n])
                at += 4 + n
            arrays[output["name"]] = np.array(items, dtype=object).reshape(shape)
        else:
            dtype = _DTYPES[datatype].newbyteorder("<")
            arrays[output["name"]] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return document, arrays


def progress_text(job: Mapping[str, Any], elapsed_s: float, width: int = 30) -> str:
    """One progress line of a job: its state and, for a bulk job, a bar with the rows
    done, the rows failed and the rows per second since the wait began."""
    state = job.get("state", "?")
    counts = job.get("request_counts")
    if not counts:
        return f"job {job.get('id', '?')} {state} ({elapsed_s:.1f} s)"
    total = max(1, int(counts.get("total") or 0))
    done = int(counts.get("completed", 0)) + int(counts.get("failed", 0))
    filled = min(width, width * done // total)
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {100 * done // total:3d}% "
        f"{done}/{counts.get('total', 0)} rows, {counts.get('failed', 0)} failed, "
        f"{rate:,.0f} rows/s, {state}"
    )


class JobClient:
    """Talks to one Sluice gateway's job API over HTTP.

    Args:
        url: ``host:port`` (or ``http://host:port``) of the gateway's HTTP front end.
        timeout_s: longest wait for one HTTP call, in s.
    """

    def __init__(self, url: str = "localhost:8000", timeout_s: float = 30.0) -> None:
        self.base = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
        self.timeout_s = timeout_s

    def _call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[bytes, Mapping[str, str]]:
        request = urllib.request.Request(
            self.base + path, data=body, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return reply.read(), reply.headers
        except urllib.error.HTTPError as exc:
            text = exc.read()
            try:
                message = json.loads(text)["error"]
            except (ValueError, KeyError, TypeError):
                message = text.decode(errors="replace")
            raise JobError(exc.code, message) from None

    def _json(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        return json.loads(self._call(method, path, body, headers)[0])

    @staticmethod
    def _jobs_path(model: str, version: int | None, ttl_s: int | None) -> str:
        path = f"/v2/models/{urllib.parse.quote(model, safe='')}"
        if version is not None:
            path += f"/versions/{version}"
        path += "/jobs"
        return path + (f"?ttl_secs={ttl_s}" if ttl_s is not None else "")

    def submit(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        outputs: Iterable[str] | None = None,
        version: int | None = None,
        binary: bool = True,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
        ttl_s: int | None = None,
    ) -> str:
        """Submit a single job; returns its id.

        Raises:
            JobError: the request was refused (the synchronous call's status and text).
        """
        body, headers = encode_request(
            inputs, outputs, binary=binary, parameters=parameters, request_id=request_id
        )
        return self._json("POST", self._jobs_path(model, version, ttl_s), body, headers)["id"]

    def submit_bulk(
        self,
        model: str,
        rows: Iterable[Mapping[str, Any]] | str | Path,
        *,
        version: int | None = None,
        ttl_s: int | None = None,
    ) -> str:
        """Submit a bulk job of ``rows`` (KServe v2 JSON requests with a ``custom_id``
        each, or the path of a JSON-lines file of them); returns its id."""
        if isinstance(rows, str | Path):
            body = Path(rows).read_bytes()
        else:
            body = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
        headers = {"Content-Type": "application/jsonl"}
        return self._json("POST", self._jobs_path(model, version, ttl_s), body, headers)["id"]

    def submit_bulk_file(
        self, model: str, input_file: str, *, version: int | None = None, ttl_s: int | None = None
    ) -> str:
        """Submit a bulk job whose rows are a file of the model repository (a path
        relative to it); returns its id."""
        body = json.dumps({"input_file": input_file}).encode()
        headers = {"Content-Type": "application/json"}
        return self._json("POST", self._jobs_path(model, version, ttl_s), body, headers)["id"]

    def get(self, job_id: str) -> dict[str, Any]:
        """The job (state, times, counts; a single job's outputs as JSON members)."""
        body, headers = self._call("GET", f"/v2/jobs/{job_id}")
        length = headers.get("Inference-Header-Content-Length")
        return decode_outputs(body, int(length) if length else None)[0]

    def wait(
        self,
        job_id: str,
        *,
        progress: bool | TextIO = True,
        poll_s: float = 0.5,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Poll until the job is final; returns it. ``progress``: a line on standard
        error (or this stream), redrawn in place on a terminal, else written at each
        change of state and every 5 s. Connection errors (a
        gateway restarting) and 5xx answers are waited out.

        Raises:
            TimeoutError: ``timeout_s`` passed first.
            JobError: the job is unknown or expired (404).
        """
        stream = sys.stderr if progress is True else (progress or None)
        tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        started = time.monotonic()
        last_state, printed_at = "", 0.0
        while True:
            try:
                job = self.get(job_id)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                job = None  # the gateway restarts, or is out of reach for a moment
            except JobError as exc:
                if exc.status < 500:
                    raise
                job = None  # the gateway cannot reach Redis for a moment
            if job is not None and stream is not None:
                now = time.monotonic()
                line = progress_text(job, now - started)
                if tty:
                    stream.write("\r" + line)
                elif job["state"] != last_state or now - printed_at >= _LOG_EVERY_S:
                    stream.write(line + "\n")  # a log, not a terminal: a line now and then
                    printed_at = now
                stream.flush()
                last_state = job["state"]
            if job is not None and job["state"] in FINAL_STATES:
                if tty and stream is not None:
                    stream.write("\n")
                return job
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise TimeoutError(f"job {job_id} not finished within {timeout_s} s")
            time.sleep(poll_s)

    def result(self, job_id: str) -> dict[str, np.ndarray]:
        """A finished single job's outputs.

        Raises:
            JobError: the job failed (its status and error), was revoked, is not done, or
                is a bulk job (its answers are :meth:`output` lines).
        """
        body, headers = self._call("GET", f"/v2/jobs/{job_id}")
        length = headers.get("Inference-Header-Content-Length")
        job, arrays = decode_outputs(body, int(length) if length else None)
        if job.get("kind") == "bulk":
            raise JobError(409, f"job {job_id} is a bulk job: read its output() lines")
        if job["state"] != "SUCCESS":
            raise JobError(int(job.get("status", 409)), job.get("error") or f"job {job['state']}")
        return arrays

    def _lines(self, job_id: str, which: str) -> Iterator[dict[str, Any]]:
        body, _ = self._call("GET", f"/v2/jobs/{job_id}/{which}")
        for line in body.splitlines():
            if line.strip():
                yield json.loads(line)

    def output(self, job_id: str) -> Iterator[dict[str, Any]]:
        """A bulk job's output lines (``custom_id``, ``response``), in line order."""
        return self._lines(job_id, "output")

    def errors(self, job_id: str) -> Iterator[dict[str, Any]]:
        """A bulk job's error lines (``custom_id``, ``line``, ``status``, ``error``)."""
        return self._lines(job_id, "errors")

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job that has not finished; returns it as it is now."""
        return self._json("DELETE", f"/v2/jobs/{job_id}")

    def list(
        self, model: str | None = None, state: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The newest jobs, of ``model`` and in ``state`` when given."""
        query = {
            "limit": str(limit),
            **({"model": model} if model else {}),
            **({"state": state} if state else {}),
        }
        return self._json("GET", "/v2/jobs?" + urllib.parse.urlencode(query))["jobs"]
