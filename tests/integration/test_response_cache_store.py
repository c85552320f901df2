"""The gateway's response cache on a real Redis: what it stores and what it answers."""

from __future__ import annotations

import asyncio

from sluice.api.response_cache import ResponseCache
from sluice.broker.keys import KeySchema
from sluice.broker.messages import InferRequestMessage, InferResponseMessage, WireTensor
from sluice.broker.multiplex import MultiplexedConnection


def _request(request_id: str, load_id: str) -> InferRequestMessage:
    return InferRequestMessage(
        request_id=request_id, client_id="", model="m", version=1,
        inputs=(WireTensor("X", "FP32", (1,), b"\x00\x00\x80\x3f"),), outputs=(),
        parameters={}, reply_to="r", deadline_ns=0, enqueued_ns=0, load_id=load_id,
    )  # fmt: skip


async def _ask(cache: ResponseCache, request_id: str, load_id: str, answer_load: str):
    """One request through the cache; a miss is answered by an 'instance' of
    ``answer_load``. Returns (response, whether the model ran)."""
    ran = []

    def enqueue() -> asyncio.Future[InferResponseMessage]:
        ran.append(request_id)
        future = asyncio.get_running_loop().create_future()
        out = WireTensor("Y", "FP32", (1,), answer_load.encode().ljust(4)[:4])
        future.set_result(InferResponseMessage(request_id, "m", 1, (out,), load_id=answer_load))
        return future

    response = await cache.submit(_request(request_id, load_id), enqueue)
    await asyncio.sleep(0.05)  # the insert and counters run in the background
    return response, bool(ran)


async def test_an_answer_is_stored_only_under_the_load_that_computed_it(
    connection: MultiplexedConnection, key_prefix: str
) -> None:
    """During a reload an instance of the older load can still answer a request that the
    gateway keyed on the new load: that answer must not be stored for the new load."""
    cache = ResponseCache(connection, KeySchema(key_prefix), 1 << 20)
    response, ran = await _ask(cache, "1", load_id="new", answer_load="old")
    assert ran and response.outputs[0].data == b"old "  # answered, not stored
    response, ran = await _ask(cache, "2", load_id="new", answer_load="new")
    assert ran and response.outputs[0].data == b"new "  # the new load ran it: stored
    response, ran = await _ask(cache, "3", load_id="new", answer_load="other")
    assert not ran  # a hit
    assert response.request_id == "3" and response.outputs[0].data == b"new "
    response, ran = await _ask(cache, "4", load_id="newer", answer_load="newer")
    assert ran  # another load: its own key, the older answer is never served
