"""The instance's part of a traced request (docs/user-guide/tracing.md).

A request whose message carries a trace context (``InferRequestMessage.trace``,
``broker.tracing``) gets the batch's timestamps back with its answer
(``InferResponseMessage.timings``: ``COMPUTE_START``, ``COMPUTE_INPUT_END``,
``COMPUTE_OUTPUT_START``, ``COMPUTE_END``, wall-clock ns since the epoch), which the
gateway writes into Triton's trace file. In OpenTelemetry mode (the context names an
OTLP endpoint) the instance also exports its own spans, children of the gateway's
``InferRequest`` span:

* ``queue``: from the gateway queueing the request on the model's Redis stream to the
  start of the batch that ran it (time in Redis and in the dynamic batcher);
* ``compute``: the batch's execution, with ``compute_input`` (inputs gathered and
  concatenated), ``compute_infer`` (the backend) and ``compute_output`` (outputs split
  and encoded) as its children.

Requests that are not traced cost one check of an empty dict each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from sluice.broker.messages import InferResponseMessage
from sluice.broker.tracing import parent_context, record_span, tracer_for
from sluice.gpu_workers.batch_assembly import Held

__all__ = ["record_traced"]

logger = logging.getLogger(__name__)


def record_traced(
    held: Sequence[Held],
    answers: Sequence[InferResponseMessage | None],
    stamps: tuple[int, int, int, int],
    instance: str,
) -> None:
    """Stamp the answers of the traced requests of one batch and export their spans.

    Args:
        held: the batch's requests.
        answers: their answers, in the same order (None: the model answered itself).
        stamps: the batch's compute start, input end, output start and end (ns).
        instance: this instance's name, an attribute of its spans.
    """
    start, input_end, output_start, end = stamps
    for item, answer in zip(held, answers, strict=True):
        message = item.delivery.message
        context = message.trace
        if not context:
            continue
        if answer is not None:
            answer.timings = {
                "COMPUTE_START": start,
                "COMPUTE_INPUT_END": input_end,
                "COMPUTE_OUTPUT_START": output_start,
                "COMPUTE_END": end,
            }
        url = context.get("url")
        if not url:
            continue
        from opentelemetry import trace  # imported once a request is traced

        try:
            tracer = tracer_for(
                url, context.get("resource", ""), "instance", context.get("bsp", "")
            )
        except ValueError as exc:
            logger.warning("request %s: trace context refused: %s", message.request_id, exc)
            continue
        parent = parent_context(context.get("traceparent", ""))
        attributes = {
            "model_name": message.model,
            "model_version": message.version,
            "request_id": message.client_id,
            "sluice.instance": instance,
            "sluice.pid": os.getpid(),
            "sluice.batch_size": len(held),
        }
        record_span(tracer, "queue", parent, message.enqueued_ns, start, attributes)
        compute = record_span(tracer, "compute", parent, start, end, attributes)
        inner = trace.set_span_in_context(compute)
        record_span(tracer, "compute_input", inner, start, input_end, attributes)
        record_span(tracer, "compute_infer", inner, input_end, output_start, attributes)
        record_span(tracer, "compute_output", inner, output_start, end, attributes)
