"""Moving queued requests off streams a reload left behind.

A reload that changes a version's queue layout (``queue_shards``, or the priority
levels) names other streams: the requests still queued on the old ones would find no
instance reading them. Once the old instances are gone, each old stream's entries are
put on the new layout's streams of the same level (shards in turn), oldest first, and
the old stream is deleted. Requests an old instance had read and not answered are moved
too: that instance has stopped, so they run on the new ones (as a dead instance's
pending requests are claimed).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from sluice.broker.scheduling import StreamLayout

logger = logging.getLogger(__name__)

#: entries moved per round trip.
BATCH = 500


def move_left_behind(client: redis.Redis, old: StreamLayout, new: StreamLayout) -> int:
    """Move the entries of ``old``'s streams that ``new`` does not have onto ``new``'s
    streams, then delete the old streams; returns how many entries moved.

    A level that ``new`` lacks maps to ``new``'s default level (Triton: a priority
    outside the levels gets the default one).

    Raises:
        redis.exceptions.RedisError: Redis unreachable (what moved stays moved; the rest
            stays on the old stream).
    """
    kept = set(new.streams())
    moved = 0
    for level in old.levels():
        target_level = level if level in new.levels() else new.level_of(0)
        targets = [new.stream(target_level, shard) for shard in range(new.shards)]
        for shard in range(old.shards):
            source = old.stream(level, shard)
            if source not in kept:
                moved += _move(client, source, targets)
    if moved:
        logger.warning(
            "model '%s' version %d: moved %d queued requests onto its new queue layout",
            new.model,
            new.version,
            moved,
        )
    return moved


def _move(client: redis.Redis, source: str, targets: Sequence[str]) -> int:
    moved = 0
    while True:
        entries = client.xrange(source, count=BATCH)
        if not entries:
            break
        pipe = client.pipeline(transaction=False)
        for _, fields in entries:
            pipe.xadd(targets[moved % len(targets)], fields)
            moved += 1
        pipe.xdel(source, *[entry_id for entry_id, _ in entries])
        pipe.execute()
    client.delete(source)
    return moved
