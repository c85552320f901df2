"""ReplyRouter against a real Redis: queued blocking pops, idle gaps, a killed connection."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis
import redis.asyncio

from sluice.broker.codec import encode_response
from sluice.broker.messages import InferResponseMessage
from sluice.broker.replies import _POP_BLOCK_S, _POPS_QUEUED, ReplyRouter


def _answer(request_id: str) -> bytes:
    return encode_response(InferResponseMessage(request_id, "m", 1, parameters={"n": request_id}))


def _deadline() -> int:
    return time.time_ns() + 30 * 10**9


@pytest.fixture
async def router(redis_url: str, key_prefix: str):
    r = ReplyRouter(redis_url, f"{key_prefix}reply:gw", client_name=f"{key_prefix}router")
    await r.start()
    yield r
    await r.stop()


@pytest.fixture
async def pusher(redis_url: str):
    client = redis.asyncio.Redis.from_url(redis_url, protocol=2)
    yield client
    await client.aclose()


async def test_answers_pushed_one_by_one_reach_their_own_requests(
    router: ReplyRouter, pusher: redis.asyncio.Redis
) -> None:
    """More answers than pops queued at once, each pushed alone (one pop per answer):
    the queue of pops is refilled and every request gets its own answer."""
    n = _POPS_QUEUED * 6
    futures = {f"r{i}": router.expect(f"r{i}", _deadline()) for i in range(n)}
    for request_id in futures:
        await pusher.rpush(router.reply_key, _answer(request_id))
    answers = await asyncio.wait_for(asyncio.gather(*futures.values()), 10)
    assert [a.request_id for a in answers] == list(futures)
    assert [a.parameters["n"] for a in answers] == list(futures)


async def test_an_answer_after_the_queued_pops_timed_out_arrives_at_once(
    router: ReplyRouter, pusher: redis.asyncio.Redis
) -> None:
    """Idle for longer than one pop waits: pops time out one after another and are
    queued again, so an answer pushed then is still taken within milliseconds."""
    await asyncio.sleep(_POP_BLOCK_S * 2.5)
    future = router.expect("late", _deadline())
    started = time.monotonic()
    await pusher.rpush(router.reply_key, _answer("late"))
    answer = await asyncio.wait_for(future, 5)
    assert answer.request_id == "late"
    assert time.monotonic() - started < 0.5


async def test_a_killed_connection_is_opened_again_and_answers_go_on(
    router: ReplyRouter, pusher: redis.asyncio.Redis, redis_url: str
) -> None:
    first = router.expect("before", _deadline())
    await pusher.rpush(router.reply_key, _answer("before"))
    assert (await asyncio.wait_for(first, 5)).request_id == "before"
    admin = redis.Redis.from_url(redis_url)
    try:
        name = f"{router.reply_key.split('reply:')[0]}router"
        ours = [c for c in admin.client_list() if c.get("name") == name]
        assert len(ours) == 1
        admin.client_kill_filter(_id=ours[0]["id"])
    finally:
        admin.close()
    second = router.expect("after", _deadline())
    await pusher.rpush(router.reply_key, _answer("after"))
    assert (await asyncio.wait_for(second, 5)).request_id == "after"
    assert await pusher.llen(router.reply_key) == 0


async def test_an_answer_nobody_waits_for_is_dropped(
    router: ReplyRouter, pusher: redis.asyncio.Redis
) -> None:
    waiting = router.expect("wanted", _deadline())
    await pusher.rpush(router.reply_key, _answer("stray"), _answer("wanted"))
    assert (await asyncio.wait_for(waiting, 5)).request_id == "wanted"
    await asyncio.sleep(0.05)
    assert await pusher.llen(router.reply_key) == 0
