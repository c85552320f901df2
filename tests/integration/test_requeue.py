"""broker.requeue on a real Redis: entries on streams a new layout lacks move onto its
streams of the same level (or the default level), oldest first, shards in turn."""

from __future__ import annotations

import redis

from sluice.broker.keys import KeySchema
from sluice.broker.requeue import move_left_behind
from sluice.broker.scheduling import StreamLayout, stream_layout
from sluice.repository import parse_config_text

BASE = (
    'name: "m" backend: "python" max_batch_size: 4 '
    'input { name: "X" data_type: TYPE_FP32 dims: [1] } '
    'output { name: "Y" data_type: TYPE_FP32 dims: [1] } '
)


def _layout(keys: KeySchema, batching: str, shards: int) -> StreamLayout:
    count = f'parameters {{ key: "queue_shards" value: {{ string_value: "{shards}" }} }}'
    text = f"{BASE}dynamic_batching {{ {batching} }} {count}"
    return stream_layout(keys, "m", 1, parse_config_text(text))


def test_shards_and_levels_left_behind_move_to_the_new_layout(
    redis_url: str, key_prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = KeySchema(key_prefix)
    old = _layout(keys, "priority_levels: 2 default_priority_level: 2", 3)
    new = _layout(keys, "", 2)
    for level in (1, 2):
        for shard in range(3):
            for n in range(2):
                client.xadd(old.stream(level, shard), {"m": f"{level}-{shard}-{n}"})
    moved = move_left_behind(client, old, new)
    assert moved == 12
    assert not any(client.exists(s) for s in old.streams())
    got = [fields[b"m"].decode() for stream in new.streams() for _, fields in client.xrange(stream)]
    assert sorted(got) == sorted(
        f"{lv}-{s}-{n}" for lv in (1, 2) for s in range(3) for n in range(2)
    )
    assert [client.xlen(s) for s in new.streams()] == [6, 6]
    client.delete(*new.streams())
    client.close()


def test_a_layout_that_keeps_every_stream_moves_nothing(redis_url: str, key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = KeySchema(key_prefix)
    old = _layout(keys, "", 1)
    client.xadd(old.stream(0), {"m": "kept"})
    assert move_left_behind(client, old, _layout(keys, "", 1)) == 0
    assert client.xlen(old.stream(0)) == 1
    client.delete(old.stream(0))
    client.close()
