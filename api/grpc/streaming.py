"""``ModelStreamInfer``: the bidirectional inference stream.

Requests of one stream run concurrently. A non-decoupled model's request gets exactly
one response, written in the order the requests arrived; a decoupled model's request
gets its responses as they are produced, each carrying ``triton_final_response`` (true
on the last), and a final flag sent alone by the model reaches the client only as an
empty response when the request asked for ``triton_enable_empty_final_response``
(Triton ``grpc/stream_infer_handler.cc``, docs/reference/grpc-protocol.md). Errors are
in-band (``error_message``) and the stream stays open. Closing the stream cancels what
is in flight: queued requests are taken off their queues and decoupled models see
``is_cancelled()``.

Steps of one sequence (the same model and ``sequence_id``) reach the sequence batcher in
the order they arrived on the stream, as Triton's stream handler enqueues them: a step is
queued only after the one before it was, whatever each waited for on its way (a model
view read from Redis, say).

At most :data:`STREAM_WINDOW` requests of a stream are in flight and as many responses
wait for the client: a client that reads slowly slows its producers down instead of
making the gateway hold its responses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import service_pb2

from sluice.api.grpc.codec import encode_infer_response, parse_infer_request, parse_version
from sluice.api.grpc.guard import translate
from sluice.api.handlers.submission import Submission
from sluice.api.models import ModelView
from sluice.api.shm_tensors import refuse_shared_memory

__all__ = ["STREAM_WINDOW", "stream_infer"]

#: most requests of one stream in flight, and most responses waiting for the client.
STREAM_WINDOW = 1024

_DONE: Any = object()
_EXITING: Any = object()

Answer = service_pb2.ModelStreamInferResponse
Unary = Callable[
    [service_pb2.ModelInferRequest, Callable[[], None]], Awaitable[service_pb2.ModelInferResponse]
]


def _sequence_of(request: service_pb2.ModelInferRequest) -> tuple[str, object] | None:
    """The model and correlation id of a sequence step; None for other requests."""
    if "sequence_id" not in request.parameters:
        return None
    parameter = request.parameters["sequence_id"]
    kind = parameter.WhichOneof("parameter_choice")
    if kind is None:
        return None
    return request.model_name, getattr(parameter, kind)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _error(request: service_pb2.ModelInferRequest, exc: BaseException) -> Answer:
    _, details = translate(exc)
    answer = Answer(error_message=details)
    answer.infer_response.id = request.id
    answer.infer_response.parameters["triton_final_response"].bool_param = True
    return answer


async def _decoupled(
    submission: Submission,
    request: service_pb2.ModelInferRequest,
    view: ModelView,
    resolved: int,
    waited_ns: int,
    put: Callable[[Answer], Awaitable[None]],
    on_queued: Callable[[], None],
) -> None:
    """Relay the responses of one request to a decoupled model as they arrive.

    Raises:
        SluiceError: the request is refused, or the model answered an error (the
            caller sends it in-band, as the request's final response).
    """
    model = request.model_name
    parsed = parse_infer_request(request)
    refuse_shared_memory(parsed.shm, model, "a decoupled model's responses")
    empty_final = False
    if "triton_enable_empty_final_response" in request.parameters:
        empty_final = request.parameters["triton_enable_empty_final_response"].bool_param
    responses = submission.submit_stream(
        submission.next_request_id(), view, resolved, parsed.client_id, parsed.inputs,
        parsed.outputs, parsed.parameters, waited_ns,
    )  # fmt: skip
    on_queued()
    try:
        async for message in responses:
            if message.error is not None:
                submission.result(model, parsed.client_id, message)  # raises its error
            if message.empty and not empty_final:
                continue
            if message.empty:
                response = service_pb2.ModelInferResponse(
                    model_name=model, model_version=str(message.version), id=parsed.client_id
                )
            else:
                response = encode_infer_response(
                    model=model, version=str(message.version), client_id=parsed.client_id,
                    outputs=message.outputs, requested=parsed.outputs,
                    parameters=dict(message.parameters),
                )  # fmt: skip
            response.parameters["triton_final_response"].bool_param = message.final
            await put(Answer(infer_response=response))
    except asyncio.CancelledError:
        responses.cancel()
        raise


def _follow(mine: asyncio.Future[None], before: asyncio.Future[None] | None) -> None:
    """Resolve ``mine`` when ``before`` is (at once without one)."""
    if before is None or before.done():
        _settle(mine)
        return
    before.add_done_callback(lambda _: _settle(mine))


async def stream_infer(
    submission: Submission,
    unary: Unary,
    request_iterator: AsyncIterator[service_pb2.ModelInferRequest],
    context: grpc.aio.ServicerContext,
    on_shutdown: Callable[[Callable[[], None]], Callable[[], None]],
) -> AsyncIterator[Answer]:
    """The responses of one ``ModelStreamInfer`` call.

    Args:
        submission: the gateway's submission handler.
        unary: runs one request to a non-decoupled model (the ``ModelInfer`` path); its
            second argument is called once the request is queued.
        request_iterator: the client's requests.
        context: the call's context (its status is set when the server exits).
        on_shutdown: registers a callback for the gateway's exit; returns its withdrawal.

    Once the gateway begins to exit the stream ends with UNAVAILABLE as soon as every
    request it sent is answered.
    """
    out: asyncio.Queue[Any] = asyncio.Queue(maxsize=STREAM_WINDOW)
    slots = asyncio.Semaphore(STREAM_WINDOW)
    tasks: set[asyncio.Task[None]] = set()
    exiting: list[bool] = []
    # the previous non-decoupled request's turn to write: their answers keep request order
    turn: list[asyncio.Future[None]] = []
    # each live sequence's last step: resolved once it is queued (or failed before)
    steps: dict[tuple[str, object], asyncio.Future[None]] = {}

    async def run(request: service_pb2.ModelInferRequest, mine: asyncio.Future[None],
                  before: asyncio.Future[None] | None, queued: asyncio.Future[None],
                  step_before: asyncio.Future[None] | None) -> None:  # fmt: skip
        try:
            decoupled = False
            try:
                if step_before is not None and not step_before.done():
                    await step_before
                model = request.model_name
                started_ns = time.monotonic_ns()
                view, resolved = await submission.resolve_for_infer(
                    model, parse_version(request.model_version, model)
                )
                decoupled = view.decoupled
                if decoupled:
                    # no order with the others: the next ordered request waits only for
                    # the ordered ones before this one
                    _follow(mine, before)
                    waited_ns = time.monotonic_ns() - started_ns
                    await _decoupled(
                        submission, request, view, resolved, waited_ns, out.put,
                        lambda: _settle(queued),
                    )  # fmt: skip
                    return
                response = await unary(request, lambda: _settle(queued))
                response.parameters["triton_final_response"].bool_param = True
                answer = Answer(infer_response=response)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                answer = _error(request, exc)
            if before is not None and not decoupled:
                await before
            await out.put(answer)
        finally:
            _settle(queued)
            if not decoupled:
                _follow(mine, None)
            slots.release()

    async def read() -> None:
        try:
            async for request in request_iterator:
                await slots.acquire()
                loop = asyncio.get_running_loop()
                mine, queued = loop.create_future(), loop.create_future()
                sequence = _sequence_of(request)
                step_before = None
                if sequence is not None:
                    step_before = steps.get(sequence)
                    steps[sequence] = queued
                    queued.add_done_callback(
                        lambda done, key=sequence: (
                            steps.pop(key, None) if steps.get(key) is done else None
                        )
                    )
                task = asyncio.create_task(
                    run(request, mine, turn[-1] if turn else None, queued, step_before)
                )
                turn[:] = [mine]
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.wait(set(tasks))
        finally:
            await out.put(_DONE)

    def begin_exit() -> None:
        exiting.append(True)
        with contextlib.suppress(asyncio.QueueFull):
            out.put_nowait(_EXITING)

    reader = asyncio.create_task(read())
    withdraw = on_shutdown(begin_exit)
    try:
        while True:
            item = await out.get()
            if item is _DONE:
                break
            if item is not _EXITING:
                yield item
            if exiting and not tasks and out.empty():
                context.set_code(grpc.StatusCode.UNAVAILABLE)
                context.set_details("Server exiting: every request of this stream was answered")
                return
        await reader  # re-raise a read failure (client went away)
    finally:
        withdraw()
        reader.cancel()
        for task in list(tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
