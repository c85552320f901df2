"""broker.redis_server.delete_prefix against a real Redis: a throwaway prefix goes, nothing else."""

from __future__ import annotations

import pytest
import redis

from sluice.broker.redis_server import delete_prefix


def test_deletes_only_the_prefix(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    other = key_prefix.rstrip(":") + "-other:"
    try:
        for index in range(2500):  # more than one DEL batch
            client.set(f"{key_prefix}k{index}", b"x")
        client.xadd(f"{key_prefix}{{m}}:q:1", {"p": b"1"})
        client.set(f"{other}keep", b"y")
        assert delete_prefix(redis_url, key_prefix) == 2501
        assert list(client.scan_iter(match=f"{key_prefix}*")) == []
        assert client.get(f"{other}keep") == b"y"
        assert delete_prefix(redis_url, key_prefix) == 0
    finally:
        client.delete(f"{other}keep")
        client.close()


def test_an_empty_prefix_is_refused(redis_url: str) -> None:
    with pytest.raises(ValueError, match="non-empty prefix"):
        delete_prefix(redis_url, "")
