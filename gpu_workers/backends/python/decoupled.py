"""Decoupled Python models: the response sender and the pump that carries its responses.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers each request
through ``request.get_response_sender()``: ``send(response, flags)`` any number of times,
from ``execute`` or from a thread after it returned, ending with
``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` (python_backend README, "Decoupled mode").
Each response is encoded at once; a request's first response is pushed onto its reply
list by the sending thread (the time to first response is what streaming clients
watch), the others are handed to the instance's :class:`ResponsePump`, a thread that
pushes them in order, several per round trip.

Flow control and cancellation (:mod:`sluice.broker.response_stream`): ``send`` waits
while the request has :data:`CREDIT_WINDOW` responses more than its gateway has passed
to the client (the gateway writes that count to the request's credit key); a credit of
-1 means the client cancelled: ``is_cancelled()`` turns true and later responses are
dropped. A request past its deadline drops its responses too (its client was told
"Request timeout expired").
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

import redis
import redis.exceptions

from sluice.broker.codec import encode_response
from sluice.broker.keys import KeySchema
from sluice.broker.response_stream import CANCELLED_CREDIT, CREDIT_WINDOW
from sluice.gpu_workers.answers import Answers
from sluice.gpu_workers.backends.base import InferError, InferResponse
from sluice.gpu_workers.backends.python.pb_utils.errors import TritonModelException
from sluice.gpu_workers.backends.python.pb_utils.inference import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
)

__all__ = ["ResponsePump", "ResponseSender"]

logger = logging.getLogger(__name__)

#: most responses pushed in one round trip.
_BATCH = 256
#: how often the credit keys of requests waiting for credit are read, in s.
_CREDIT_POLL_S = 0.002
#: how often the credit keys of every open request are read (cancellation), in s.
_CANCEL_POLL_S = 0.05


class ResponseSender:
    """python_backend's ``InferenceResponseSender`` for one request.

    Args:
        pump: the instance's pump.
        request_id: Sluice's id of the request.
        reply_to: the reply list of the request's gateway.
        deadline_ns: the request's wall-clock deadline (ns since the epoch; 0: none).
        convert: turns a ``pb_utils.InferenceResponse`` into an encodable answer.
    """

    def __init__(
        self,
        pump: ResponsePump,
        request_id: str,
        reply_to: str,
        deadline_ns: int,
        convert: Any,
    ) -> None:
        self._pump = pump
        self.request_id = request_id
        self.reply_to = reply_to
        self.deadline_ns = deadline_ns
        self._convert = convert
        self.sent = 0
        self.closed = False
        self._cancelled = False
        self._lock = threading.Lock()

    def send(self, response: Any = None, flags: int = 0) -> None:
        """Send ``response`` (None: none) with ``flags``
        (``TRITONSERVER_RESPONSE_COMPLETE_FINAL`` ends the request).

        Raises:
            TritonModelException: the final flag was sent already, or neither a
                response nor the final flag was given.
        """
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self._lock:
            if self.closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            if response is None and not final:
                raise TritonModelException("Response must be set or the final flag must be set")
            self.closed = final
        if self.is_cancelled() or 0 < self.deadline_ns <= time.time_ns():
            if final:
                self._pump.forget(self.request_id)
            return
        self._pump.wait_for_credit(self, self.sent)
        if self.is_cancelled():  # while it waited for credit
            if final:
                self._pump.forget(self.request_id)
            return
        answer = self._convert(self.request_id, response, final)
        first = self.sent == 0
        self.sent += 1
        if first:  # at once: the pump thread may wait for a GIL switch interval
            self._pump.write_now(self, encode_response(answer), final)
        else:
            self._pump.push(self, encode_response(answer), final)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (it closed its stream); once true,
        true for good."""
        if not self._cancelled:
            self._cancelled = self._pump.cancelled(self.request_id)
        return self._cancelled


class ResponsePump:
    """Pushes one instance's decoupled responses to Redis from a thread of its own.

    Args:
        client: a Redis client of its own (thread-safe connection pool).
        keys: the deployment's key schema.
        answers: builds the response messages (outputs in the config's datatypes).
        instance: the instance's record name, stamped on each response.
    """

    def __init__(
        self, client: redis.Redis, keys: KeySchema, answers: Answers, instance: str
    ) -> None:
        self._redis = client
        self._keys = keys
        self.answers = answers
        self.instance = instance
        self._queue: queue.Queue[tuple[str, bytes, str, bool] | None] = queue.Queue()
        self._open: dict[str, ResponseSender] = {}
        self._credit: dict[str, int] = {}
        self._lock = threading.Lock()
        self._credit_changed = threading.Condition(self._lock)
        self._next_poll = 0.0
        self._thread = threading.Thread(target=self._run, name="sluice-responses", daemon=True)
        self._thread.start()

    def sender(
        self, request_id: str, reply_to: str, deadline_ns: int, convert: Any
    ) -> ResponseSender:
        """A new request's sender."""
        sender = ResponseSender(self, request_id, reply_to, deadline_ns, convert)
        with self._lock:
            self._open[request_id] = sender
            self._credit[request_id] = 0
        return sender

    def cancelled(self, request_id: str) -> bool:
        with self._lock:
            return self._credit.get(request_id, 0) == CANCELLED_CREDIT

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._open.pop(request_id, None)
            self._credit.pop(request_id, None)

    def wait_for_credit(self, sender: ResponseSender, sent: int) -> None:
        """Block while ``sent`` is :data:`CREDIT_WINDOW` past what the client has taken
        (until the deadline, or a cancellation)."""
        with self._lock:
            while True:
                credit = self._credit.get(sender.request_id, 0)
                if credit == CANCELLED_CREDIT or sent - credit < CREDIT_WINDOW:
                    return
                if 0 < sender.deadline_ns <= time.time_ns():
                    return
                self._credit_changed.wait(_CREDIT_POLL_S * 5)

    def push(self, sender: ResponseSender, payload: bytes, final: bool) -> None:
        """Queue a response for the pump thread."""
        self._queue.put((sender.reply_to, payload, sender.request_id, final))

    def write_now(self, sender: ResponseSender, payload: bytes, final: bool) -> None:
        """Send a request's first response from the calling thread (no later response of
        it can be queued before it)."""
        try:
            self._write([(sender.reply_to, payload, sender.request_id, final)])
        except redis.exceptions.RedisError as exc:
            logger.warning("decoupled responses: Redis: %s", exc)

    def stop(self) -> None:
        """Send what is queued, then end the thread (bounded by 5 s)."""
        self._queue.put(None)
        self._thread.join(5)

    # -- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=_CREDIT_POLL_S)
            except queue.Empty:
                item = ()  # type: ignore[assignment]
            batch = [] if not item else [item]
            while len(batch) < _BATCH:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    item = None
                    break
                batch.append(more)
            try:
                self._write(batch)  # type: ignore[arg-type]
                self._poll_credit()
            except redis.exceptions.RedisError as exc:
                logger.warning("decoupled responses: Redis: %s", exc)
                time.sleep(0.05)
            if item is None:
                return

    def _write(self, batch: list[tuple[str, bytes, str, bool]]) -> None:
        if not batch:
            return
        with self._redis.pipeline(transaction=False) as pipe:
            for reply_to, payload, _, _ in batch:
                pipe.rpush(reply_to, payload)
            pipe.execute()
        for _, _, request_id, final in batch:
            if final:
                self.forget(request_id)

    def _poll_credit(self) -> None:
        """Read the credit keys: of the requests waiting for credit at once, of every
        open one every :data:`_CANCEL_POLL_S` (so that ``is_cancelled()`` turns true)."""
        now = time.monotonic()
        with self._lock:
            ids = [
                rid
                for rid, sender in self._open.items()
                if now >= self._next_poll or sender.sent - self._credit.get(rid, 0) >= CREDIT_WINDOW
            ]
        if not ids:
            return
        if now >= self._next_poll:
            self._next_poll = now + _CANCEL_POLL_S
        values = self._redis.mget([self._keys.stream_credit(rid) for rid in ids])
        with self._lock:
            for rid, value in zip(ids, values, strict=True):
                if value is not None and rid in self._credit:
                    self._credit[rid] = int(value)
            self._credit_changed.notify_all()


def make_converter(pump: ResponsePump, convert_response: Any) -> Any:
    """``(request_id, pb_response or None, final) -> InferResponseMessage`` for senders:
    ``convert_response(pb_response) -> InferResponse | InferError``."""

    def convert(request_id: str, response: Any, final: bool) -> Any:
        if response is None:
            message = pump.answers.final_flag(request_id)
        else:
            result: InferResponse | InferError = convert_response(response)
            message = pump.answers.response(request_id, result, {}, {})
        message.final = final
        message.instance = f"{pump.instance}@{os.getpid()}"
        return message

    return convert
