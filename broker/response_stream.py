"""The responses of one decoupled request as its gateway receives them.

A decoupled model (Triton ``model_transaction_policy { decoupled: true }``) answers a
request with zero or more responses and then a final flag. The instance pushes each onto
the gateway's reply list as it is produced (in order: one instance, one list); the
gateway's :class:`~sluice.broker.replies.ReplyRouter` hands them to the request's
:class:`ResponseStream`, which the front end iterates.

Flow control: the producer may run at most :data:`CREDIT_WINDOW` responses ahead of what
the client has taken. The stream tells it how far the client got by writing the count
to the request's credit key (``KeySchema.stream_credit``) every :data:`CREDIT_EVERY`
responses; a cancelled stream writes -1 there, which the model sees as
``request.is_cancelled()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import InferResponseMessage

__all__ = [
    "CANCELLED_CREDIT",
    "CREDIT_EVERY",
    "CREDIT_WINDOW",
    "ResponseStream",
    "instance_gone",
]

#: responses a producer may send beyond what the client has taken.
CREDIT_WINDOW = 64
#: the gateway writes the credit key after this many responses taken.
CREDIT_EVERY = 16
#: the credit key's value once the client cancelled.
CANCELLED_CREDIT = -1


class ResponseStream:
    """Async iterator over one decoupled request's responses (``InferResponseMessage``),
    ending after the final one.

    Args:
        request_id: the request's id.
        write_credit: called with the number of responses taken so far (or
            :data:`CANCELLED_CREDIT`); it writes the credit key (not awaited).

    Iteration raises ``SluiceError`` when the stream fails (deadline, the producing
    instance died, the gateway stops).
    """

    def __init__(self, request_id: str, write_credit: Callable[[int], None]) -> None:
        self.request_id = request_id
        self._queue: asyncio.Queue[InferResponseMessage | BaseException] = asyncio.Queue()
        self._write_credit = write_credit
        self._taken = 0
        self.done = False
        #: the instance producing the responses, once one has arrived
        self.instance = ""
        #: the model and version it runs (for the instance watch)
        self.model = ""
        self.version = 0
        self._on_close: list[Callable[[], None]] = []
        self._on_cancel: list[Callable[[], None]] = []

    def push(self, response: InferResponseMessage) -> None:
        """A response arrived (from the reply reader)."""
        if self.done:
            return
        if response.instance:
            self.instance = response.instance
        self._queue.put_nowait(response)
        if response.final or response.error is not None:
            self._close()

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error`` (raised by the next iteration step)."""
        if self.done:
            return
        self._queue.put_nowait(error)
        self._close()

    def cancel(self) -> None:
        """The client went away: tell the producer (its ``is_cancelled()`` turns true)
        and run the :meth:`on_cancel` callbacks (they take a queued request off)."""
        if not self.done:
            self._write_credit(CANCELLED_CREDIT)
            self._close()
            for callback in self._on_cancel:
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` if the client cancels the stream."""
        self._on_cancel.append(callback)

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the stream ends (final response, error or cancel)."""
        if self.done:
            callback()
        else:
            self._on_close.append(callback)

    def _close(self) -> None:
        self.done = True
        callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> InferResponseMessage:
        if self.done and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        self._taken += 1
        if not self.done and self._taken % CREDIT_EVERY == 0:
            self._write_credit(self._taken)
        return item


def instance_gone(model: str, instance: str) -> SluiceError:
    """The error of a stream whose producing instance (``<name>@<pid>``) died."""
    name = instance.rsplit("@", 1)[0]
    return SluiceError(
        ErrorCode.UNAVAILABLE,
        f"model '{model}': instance '{name}' exited while it was sending this request's responses",
        model=model,
    )
