"""OpenTelemetry glue shared by gateways and model instances: exporters, span contexts.

A traced request carries its trace context in the Redis request message
(``InferRequestMessage.trace``), a small string map that is empty, and not sent, for a
request that is not traced:

* ``traceparent``: the W3C trace context of the gateway's request span (the parent of
  the instance's spans), ``00-<trace id>-<span id>-<flags>``;
* ``url``: the OTLP/HTTP endpoint the gateway exports to (``--trace-config
  opentelemetry,url=...``); absent in ``triton`` mode, where the instance exports
  nothing and only returns its timestamps with the answer;
* ``resource``: the resource attributes the gateway was given, ``key=value`` pairs
  joined by ``,``;
* ``bsp``: the batch span processor's settings the gateway was given,
  ``<max queue size>,<schedule delay ms>,<max export batch size>`` (an empty part: the
  SDK's default); absent when none was given.

So an instance needs no trace flags of its own: it exports its spans to the collector
the request names, with one ``TracerProvider`` (a batch span processor and an OTLP/HTTP
exporter, as Triton's OpenTelemetry mode) per endpoint and resource.
Span model and settings: docs/user-guide/tracing.md.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the SDK is imported on first use: processes that never trace skip it
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "DEFAULT_OTLP_URL",
    "DEFAULT_SERVICE_NAME",
    "parent_context",
    "parse_resource",
    "record_span",
    "shutdown_tracers",
    "traceparent_of",
    "tracer_for",
]

#: Triton's default ``--trace-config opentelemetry,url``.
DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"
#: Triton's default ``service.name`` resource attribute.
DEFAULT_SERVICE_NAME = "triton-inference-server"

_lock = threading.Lock()
_providers: dict[tuple[str, str, str], TracerProvider] = {}


def parse_resource(text: str) -> dict[str, str]:
    """``key=value[,key=value...]`` as a dict (empty text: no attributes).

    Raises:
        ValueError: an item without ``=`` or with an empty key, naming it.
    """
    attributes: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected <key>=<value> as a resource attribute, got '{item}'")
        attributes[key.strip()] = value.strip()
    return attributes


def tracer_for(url: str, resource: str, role: str, bsp: str = "") -> trace.Tracer:
    """The tracer that exports to ``url`` (OTLP/HTTP, protobuf) with the resource
    attributes ``resource`` (``key=value,...``; ``service.name`` defaults to Triton's,
    ``OTEL_RESOURCE_ATTRIBUTES`` is merged in by the SDK). One provider per endpoint and
    resource in this process; ``role`` (``gateway`` or ``instance``) and the process id
    are resource attributes too. Spans leave in batches (``bsp``, see the module's
    docstring; else the SDK's ``OTEL_BSP_*`` variables: every 5000 ms by default) and at
    exit.

    Raises:
        ValueError: a malformed ``resource`` or ``bsp``.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    key = (url, resource, bsp)
    with _lock:
        provider = _providers.get(key)
        if provider is None:
            attributes: dict[str, Any] = {"service.name": DEFAULT_SERVICE_NAME}
            attributes.update(parse_resource(resource))
            attributes["sluice.role"] = role
            attributes["process.pid"] = os.getpid()
            provider = TracerProvider(resource=Resource.create(attributes))
            queue, delay, batch = (
                [int(part) if part else None for part in bsp.split(",")] if bsp else [None] * 3
            )
            provider.add_span_processor(
                BatchSpanProcessor(
                    OTLPSpanExporter(endpoint=url),
                    max_queue_size=queue,
                    schedule_delay_millis=delay,
                    max_export_batch_size=batch,
                )
            )
            if not _providers:
                atexit.register(shutdown_tracers)
            _providers[key] = provider
    return provider.get_tracer("sluice")


def shutdown_tracers() -> None:
    """Export what is still batched and stop every provider of this process (bounded by
    the SDK's export timeout, 10 s per provider by default)."""
    with _lock:
        providers = list(_providers.values())
        _providers.clear()
    for provider in providers:
        provider.shutdown()


def parent_context(traceparent: str) -> otel_context.Context | None:
    """The context of a W3C ``traceparent`` value; None when it is not a valid one."""
    if not traceparent:
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ctx = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    span_context = trace.get_current_span(ctx).get_span_context()
    return ctx if span_context.is_valid else None


def traceparent_of(span: trace.Span) -> str:
    """The W3C ``traceparent`` value naming ``span`` as the parent."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent", "")


def record_span(
    tracer: trace.Tracer,
    name: str,
    parent: otel_context.Context | None,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any] | None = None,
) -> trace.Span:
    """A finished span ``[start_ns, end_ns]`` (wall-clock ns since the epoch) under
    ``parent``; returns it (ended) so that children can name it."""
    span = tracer.start_span(name, context=parent, start_time=start_ns, attributes=attributes)
    span.end(end_time=max(start_ns, end_ns))
    return span
