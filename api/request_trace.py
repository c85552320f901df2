"""Tracing of one gateway process: which requests are traced, their timestamps, and where
a finished trace goes.

A traced request collects Triton's timestamps (wall-clock ns since the epoch, as every
process of a deployment stamps alike): ``HTTP_RECV_START`` / ``GRPC_WAITREAD_START`` …
``REQUEST_START``, ``QUEUE_START`` (queued on the model's Redis stream), the instance's
``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``
(returned with its answer, ``gpu_workers.tracing``), ``REQUEST_END`` and the send
stamps. When it ends:

* ``triton`` mode: the trace joins Triton's JSON trace file (:class:`TraceFile`);
* ``opentelemetry`` mode: the gateway exports its spans: ``InferRequest`` (request
  received to response sent; the parent of the instance's spans, whose context the Redis
  message carries) with the children ``gateway_request`` (received to queued) and
  ``gateway_response`` (the instance's compute end to the response sent). The instance
  exports ``queue`` and ``compute`` (with ``compute_input``, ``compute_infer``,
  ``compute_output``) itself, so the children of ``InferRequest`` cover it end to end.

Span model and settings: docs/user-guide/tracing.md.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from sluice.api.models import ModelRegistry
from sluice.api.settings import TraceConfig
from sluice.api.trace_settings import TraceSettings
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import InferResponseMessage
from sluice.broker.tracing import parent_context, record_span, traceparent_of, tracer_for

__all__ = ["INSTANCE_STAMPS", "RequestTrace", "TraceFile", "Tracing", "header_traceparent"]

logger = logging.getLogger(__name__)

#: the timestamps an instance returns for a traced request, in order.
INSTANCE_STAMPS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def header_traceparent(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The W3C ``traceparent`` of an HTTP request's headers (ASGI's lower-case names), or
    of gRPC metadata (``(str, str)`` pairs); None when there is none."""
    for name, value in headers:
        if name in (b"traceparent", "traceparent"):
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


class TraceFile:
    """Triton's JSON trace file: an array of trace objects, written whole.

    With ``log_frequency`` N > 0, every N traces go to ``<path>.<k>`` (k = 0, 1, …);
    with 0, all of them go to ``<path>`` at exit (:meth:`close`), as Triton.

    Args:
        path: the trace file (``--trace-config triton,file=``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._pending: list[list[dict[str, Any]]] = []
        self._index = 0
        self._lock = threading.Lock()

    def add(self, entries: list[dict[str, Any]], log_frequency: int) -> None:
        """Add one trace's objects; writes ``<path>.<k>`` once ``log_frequency`` traces
        are pending (0: keep them for :meth:`close`)."""
        with self._lock:
            self._pending.append(entries)
            if log_frequency > 0 and len(self._pending) >= log_frequency:
                self._write(f"{self.path}.{self._index}")
                self._index += 1

    def close(self, log_frequency: int) -> None:
        """Write the traces still pending (to ``<path>`` when ``log_frequency`` is 0)."""
        with self._lock:
            if log_frequency == 0:
                self._write(self.path)
            elif self._pending:
                self._write(f"{self.path}.{self._index}")
                self._index += 1

    def _write(self, path: str) -> None:
        body = [entry for trace in self._pending for entry in trace]
        self._pending.clear()
        try:
            with open(path, "wb") as out:
                out.write(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        except OSError as exc:
            logger.error("cannot write the trace file '%s': %s", path, exc)


class Tracing:
    """The tracing of one gateway process (settings, sampling, export).

    Args:
        config: the start-up settings (``--trace-config``).
    """

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.settings = TraceSettings(config)
        self._ids = itertools.count(1)
        self.file: TraceFile | None = None
        #: what a traced request's message carries besides its traceparent
        self._carried: dict[str, str] = {}
        if config.mode == "triton" and config.file:
            self.file = TraceFile(config.file)
        elif config.mode == "opentelemetry":
            self._carried = {"url": config.url, "resource": ",".join(config.resource)}
            bsp = (
                config.bsp_max_queue_size,
                config.bsp_schedule_delay_ms,
                config.bsp_max_export_batch_size,
            )
            if any(value is not None for value in bsp):
                self._carried["bsp"] = ",".join("" if v is None else str(v) for v in bsp)
        if "TENSORS" in config.level:
            logger.warning("trace level TENSORS: Sluice's traces hold timestamps, not tensors")
        if config.mode == "triton" and not config.file and self.settings.active:
            logger.warning("tracing in triton mode without a trace file: traces are dropped")

    @property
    def active(self) -> bool:
        """Whether any request may be traced (a settings object's level is not ``OFF``)."""
        return self.settings.active

    def start(self, model: str, protocol: str, traceparent: str | None) -> RequestTrace | None:
        """The trace of a request to ``model`` that arrived now over ``protocol``
        (``HTTP`` or ``GRPC``), or None when it is not sampled
        (:meth:`TraceSettings.sample`; a client's ``traceparent`` forces it in
        OpenTelemetry mode)."""
        now = time.time_ns()
        otel = self.config.mode == "opentelemetry"
        parent = parent_context(traceparent or "") if otel else None
        if not self.settings.sample(model, parent is not None):
            return None
        return RequestTrace(self, next(self._ids), model, protocol, now, parent)

    def tracer(self) -> Any:
        """The gateway's OpenTelemetry tracer (OpenTelemetry mode)."""
        return tracer_for(
            self._carried["url"], self._carried["resource"], "gateway", self._carried.get("bsp", "")
        )

    def carried(self, traceparent: str) -> dict[str, str]:
        """The trace context a traced request's message carries (``broker.tracing``)."""
        return {"traceparent": traceparent, **self._carried} if traceparent else {}

    async def setting(
        self, registry: ModelRegistry, model: str | None, changes: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The trace extension's call: read (``changes`` None) or update the global or
        ``model``'s settings (:class:`TraceSettings`); returns the settings object.

        Raises:
            SluiceError: NOT_FOUND for a model the repository does not have; what
                :meth:`TraceSettings.update` raises.
        """
        if model:
            try:
                await registry.get(model)
            except SluiceError as exc:
                if exc.code is ErrorCode.NOT_FOUND:
                    raise SluiceError(
                        ErrorCode.NOT_FOUND, f"Request for unknown model : {model}", model=model
                    ) from None
                raise
        if changes is None:
            return self.settings.as_dict(model)
        return self.settings.update(changes, model)

    def close(self) -> None:
        """Write the trace file's pending traces (at the gateway's exit)."""
        if self.file is not None:
            self.file.close(self.settings.log_frequency)


class RequestTrace:
    """The trace of one request: its timestamps, and in OpenTelemetry mode its root span.

    Attributes:
        id: Triton's trace id (a counter of this gateway).
        model: the model asked for.
        version: the version that ran it (0 until queued).
        client_id: the client's request id.
    """

    __slots__ = ("_parent_span", "_tracing", "client_id", "id", "model", "stamps", "version")

    def __init__(
        self,
        tracing: Tracing,
        trace_id: int,
        model: str,
        protocol: str,
        start_ns: int,
        parent: Any,
    ) -> None:
        self._tracing = tracing
        self.id = trace_id
        self.model = model
        self.version = 0
        self.client_id = ""
        self.stamps: dict[str, int] = {
            ("HTTP_RECV_START" if protocol == "HTTP" else "GRPC_WAITREAD_START"): start_ns
        }
        self._parent_span: Any = None
        if tracing.config.mode == "opentelemetry":
            self._parent_span = tracing.tracer().start_span(
                "InferRequest", context=parent, start_time=start_ns
            )

    def stamp(self, name: str, ns: int | None = None) -> None:
        """Record timestamp ``name`` (now unless ``ns``)."""
        self.stamps[name] = time.time_ns() if ns is None else ns

    def queued(self, version: int, client_id: str, enqueued_ns: int) -> dict[str, str]:
        """The request is being queued at ``enqueued_ns``: returns the trace context its
        message carries (empty in triton mode: the instance only returns timestamps)."""
        self.version = version
        self.client_id = client_id
        self.stamps.setdefault("REQUEST_START", enqueued_ns)
        self.stamps["QUEUE_START"] = enqueued_ns
        if self._parent_span is None:
            return {"traceparent": "-"}  # any non-empty context: timestamps come back
        return self._tracing.carried(traceparent_of(self._parent_span))

    def answered(self, response: InferResponseMessage) -> None:
        """Take the instance's timestamps from its answer; stamp ``REQUEST_END``."""
        for name in INSTANCE_STAMPS:
            ns = response.timings.get(name)
            if isinstance(ns, int):
                self.stamps[name] = ns
        self.stamp("REQUEST_END")

    def finish(self, error: str | None = None) -> None:
        """The response was sent (or the request failed with ``error``): export."""
        stamps = self.stamps
        end = max(stamps.values())
        if self._parent_span is not None:
            self._export_spans(end, error)
        elif self._tracing.file is not None:
            entries = [
                {
                    "id": self.id,
                    "model_name": self.model,
                    "model_version": self.version,
                    "request_id": self.client_id,
                },
                {
                    "id": self.id,
                    "timestamps": [
                        {"name": name, "ns": ns}
                        for name, ns in sorted(stamps.items(), key=lambda item: item[1])
                    ],
                },
            ]
            self._tracing.file.add(entries, self._tracing.settings.log_frequency)

    def _export_spans(self, end: int, error: str | None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        span = self._parent_span
        stamps = self.stamps
        attributes = {
            "model_name": self.model,
            "model_version": self.version,
            "request_id": self.client_id,
        }
        span.set_attributes(attributes)
        for name, ns in sorted(stamps.items(), key=lambda item: item[1]):
            span.add_event(name.lower(), timestamp=ns)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        tracer = self._tracing.tracer()
        parent = trace.set_span_in_context(span)
        start = min(stamps.values())
        if "QUEUE_START" in stamps:
            record_span(tracer, "gateway_request", parent, start, stamps["QUEUE_START"], attributes)
        if "COMPUTE_END" in stamps:
            record_span(tracer, "gateway_response", parent, stamps["COMPUTE_END"], end, attributes)
        span.end(end_time=end)
