"""Response cache keys, flag values and the LRU insert/lookup scripts on a real Redis."""

from __future__ import annotations

import pytest
import redis

from sluice.broker.keys import KeySchema
from sluice.broker.messages import WireTensor
from sluice.broker.response_cache import (
    CACHE_INSERT,
    CACHE_LOOKUP,
    parse_cache_config,
    request_digest,
)

X = WireTensor("X", "FP32", (1, 2), b"\x00\x00\x80\x3f\x00\x00\x00\x40")
Y = WireTensor("Y", "INT32", (1,), b"\x07\x00\x00\x00")


def _digest(**change: object) -> str:
    args: dict[str, object] = {
        "model": "m", "version": 1, "load_id": "a1", "inputs": [X, Y],
        "outputs": ["OUT"], "classification": {},
    }  # fmt: skip
    args.update(change)
    return request_digest(**args)  # type: ignore[arg-type]


def test_the_key_changes_with_everything_that_changes_the_answer() -> None:
    base = _digest()
    assert _digest() == base
    assert _digest(inputs=[Y, X]) == base  # input order does not matter
    different = [
        _digest(model="n"),
        _digest(version=2),
        _digest(load_id="b2"),  # a reload or restart: older answers are never served
        _digest(inputs=[WireTensor("X", "FP32", (1, 2), b"\x00" * 8), Y]),  # bytes
        _digest(inputs=[WireTensor("X", "FP32", (2, 1), X.data), Y]),  # shape
        _digest(inputs=[WireTensor("X", "INT32", (1, 2), X.data), Y]),  # datatype
        _digest(inputs=[WireTensor("Z", "FP32", (1, 2), X.data), Y]),  # name
        _digest(inputs=[X]),
        _digest(outputs=[]),
        _digest(classification={"OUT": 3}),
    ]
    assert base not in different
    assert len(set(different)) == len(different)
    assert len(base) == 32


def test_cache_config_takes_tritons_local_size() -> None:
    assert parse_cache_config(["local,size=1048576"]) == 1048576
    assert parse_cache_config([]) == 0
    assert parse_cache_config(["local,size=10", "local,size=0"]) == 0
    for bad, words in (
        ("redis,host=localhost", "only the 'local' cache"),
        ("local", "expected local,size=<bytes>"),
        ("local,bytes=3", "expected local,size=<bytes>"),
        ("local,size=1k", "whole number of bytes"),
        ("local,size=-1", ">= 0"),
        ("local,size= 100", "whole number of bytes"),
        ("local,size=1_000", "whole number of bytes"),
        ("local,size=100,bogus=1", "size is the only setting"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_cache_config([bad])


def test_inserts_evict_the_least_recently_used_within_the_size(
    redis_url: str, key_prefix: str
) -> None:
    keys = KeySchema(key_prefix)
    lru, held = keys.cache_lru(), keys.cache_bytes()
    client = redis.Redis.from_url(redis_url)

    def insert(name: str, payload: bytes, now: int, limit: int = 250) -> int:
        entry = keys.cache_entry(name)
        return client.eval(CACHE_INSERT.body, 3, entry, lru, held, payload, limit, now)

    def lookup(name: str, now: int) -> bytes | None:
        return client.eval(CACHE_LOOKUP.body, 2, keys.cache_entry(name), lru, now)

    try:
        assert insert("a", b"A" * 100, 1) == 0
        assert insert("b", b"B" * 100, 2) == 0
        assert lookup("a", 3) == b"A" * 100  # a is now used more recently than b
        assert insert("c", b"C" * 100, 4) == 1  # 300 > 250: the least recent (b) goes
        assert lookup("b", 5) is None
        assert lookup("a", 6) == b"A" * 100 and lookup("c", 7) == b"C" * 100
        assert int(client.get(held)) == 200 and client.zcard(lru) == 2
        assert insert("c", b"c" * 50, 8) == 0  # replaced: counted once, at its new size
        assert int(client.get(held)) == 150 and lookup("c", 9) == b"c" * 50
        assert insert("huge", b"H" * 251, 10) == -1  # larger than the cache: not stored
        assert lookup("huge", 11) is None and int(client.get(held)) == 150
        assert insert("d", b"D" * 240, 12) == 2  # room for it alone
        assert client.zrange(lru, 0, -1) == [keys.cache_entry("d").encode()]
        assert int(client.get(held)) == 240
        assert client.exists(keys.cache_entry("a"), keys.cache_entry("c")) == 0
    finally:
        client.close()
