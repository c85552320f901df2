"""The messages that cross Redis: one inference request, one response.

Slotted dataclasses, treated as immutable once built but not declared frozen: a
frozen dataclass sets each field through ``object.__setattr__``, which makes building
one several times slower, and several are built per request in each process.
``broker.codec`` turns them into msgpack bytes and back.
Tensors stay in their wire layout (raw little-endian bytes; BYTES as 4-byte
length-prefixed elements) so no process re-encodes them on the way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ParameterValue = bool | int | float | str


@dataclass(slots=True)
class WireTensor:
    """One tensor in the wire layout.

    Attributes:
        name: tensor name as in the model config.
        datatype: protocol datatype (``FP32``, ``BYTES``, …).
        shape: full shape, batch dimension included when the model batches.
        data: row-major little-endian bytes; BYTES as 4-byte LE length + bytes per element.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for.

    Attributes:
        name: output name as in the model config.
        binary: HTTP only — return the data in the binary section (binary tensor extension).
        class_count: classification extension ``k`` (0 = plain tensor).
    """

    name: str
    binary: bool = False
    class_count: int = 0


@dataclass(slots=True)
class InferRequestMessage:
    """One inference request as queued on a model's stream.

    Attributes:
        request_id: Sluice's unique id of this request (routes the reply).
        client_id: the id the client gave (echoed back; may be empty).
        model: model name.
        version: the resolved model version (a concrete version number).
        inputs: input tensors in request order.
        outputs: names of requested outputs; empty = all outputs of the config.
        parameters: request parameters (sequence/priority/timeout and custom ones).
        reply_to: the Redis key the worker pushes the response to.
        deadline_ns: wall-clock deadline, ns since the epoch (``time.time_ns``).
        enqueued_ns: wall-clock time the gateway queued it, ns since the epoch.
        classification: output name -> ``k`` for outputs asked for as top-k class strings
            (Triton classification extension).
        load_id: the load of the version the gateway checked the request against
            (``VersionState.load_id``; empty: unknown). An instance of another load checks
            it again against its own config (``broker.request_checks``).
        trace: a traced request's trace context (``broker.tracing``: ``traceparent``,
            and ``url`` / ``resource`` in OpenTelemetry mode); empty, and not encoded,
            for a request that is not traced.
    """

    request_id: str
    client_id: str
    model: str
    version: int
    inputs: tuple[WireTensor, ...]
    outputs: tuple[str, ...]
    parameters: dict[str, ParameterValue]
    reply_to: str
    deadline_ns: int
    enqueued_ns: int
    classification: dict[str, int] = field(default_factory=dict)
    load_id: str = ""
    trace: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ErrorInfo:
    """An error that crossed a process boundary as data (code name + message)."""

    code: str
    message: str


@dataclass(slots=True)
class InferResponseMessage:
    """The answer to one request, pushed to the request's reply key.

    Attributes:
        request_id: Sluice's id of the request answered.
        model: model name.
        version: model version that ran it.
        outputs: output tensors (empty on error).
        error: set when the request failed; ``outputs`` is then empty.
        parameters: response parameters set by the model.
        timings: per-request durations in ns (queue, compute_input, compute_infer,
            compute_output) as measured by the worker; for a traced request, the
            instance's timestamps instead (``gpu_workers.tracing``: ``COMPUTE_START``,
            ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``, wall-clock
            ns since the epoch).
        load_id: the load of the model whose instance ran it (``VersionState.load_id``;
            "" when unknown): the response cache stores an answer only under the load
            that computed it.
        final: the request's last response (always for a non-decoupled model; a
            decoupled model's responses before its final one have it False).
        instance: ``<record name>@<pid>`` of the model instance that produced it
            (decoupled models: a gateway watches that process while the request
            streams; a restarted instance has the same name and another pid).
        empty: a decoupled model's final flag sent without a response (Triton
            ``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` alone): no message reaches the
            client unless it asked for ``triton_enable_empty_final_response``.
    """

    request_id: str
    model: str
    version: int
    outputs: tuple[WireTensor, ...] = ()
    error: ErrorInfo | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, int] = field(default_factory=dict)
    load_id: str = ""
    final: bool = True
    instance: str = ""
    empty: bool = False
