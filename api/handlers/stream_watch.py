"""Watching the instances that send decoupled requests' responses.

A decoupled request's responses come from one model instance, possibly for a long
time. If that instance dies (SIGKILL, OOM) nothing more will come: instead of letting
the client wait for its deadline, the gateway checks the instance records of the
streams it relays every :data:`WATCH_INTERVAL_S` and fails a stream whose instance is
gone (its record STOPPED, UNAVAILABLE, missing, another process's, or without a
heartbeat for ``LIVE_HEARTBEAT_NS``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import redis.asyncio
import redis.exceptions

from sluice.broker.keys import KeySchema
from sluice.broker.model_store import LIVE_HEARTBEAT_NS
from sluice.broker.response_stream import ResponseStream, instance_gone
from sluice.broker.states import InstanceState

__all__ = ["WATCH_INTERVAL_S", "InstanceWatch"]

logger = logging.getLogger(__name__)

#: seconds between two looks at the instances of the streams being relayed.
WATCH_INTERVAL_S = 0.25


class InstanceWatch:
    """Fails the response streams whose producing instance died.

    Args:
        client: the gateway's Redis client.
        keys: the deployment's key schema.
    """

    def __init__(self, client: redis.asyncio.Redis, keys: KeySchema) -> None:
        self._redis = client
        self._keys = keys
        self._streams: set[ResponseStream] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, stream: ResponseStream) -> None:
        """Watch ``stream`` until it ends (the task runs while any stream is watched)."""
        self._streams.add(stream)
        stream.on_close(lambda: self._streams.discard(stream))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="sluice-stream-watch")

    async def _watch(self) -> None:
        while self._streams:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                await self.check()
            except (redis.exceptions.RedisError, OSError) as exc:
                logger.debug("stream watch: %s", exc)

    async def check(self) -> int:
        """Look at the instances once; returns how many streams were failed."""
        by_version: dict[tuple[str, int], set[str]] = {}
        for stream in self._streams:
            if stream.instance and not stream.done:
                by_version.setdefault((stream.model, stream.version), set()).add(stream.instance)
        gone: set[tuple[str, int, str]] = set()
        now_ns = time.time_ns()
        for (model, version), producers in by_version.items():
            ordered = sorted(producers)
            names = [producer.rsplit("@", 1)[0] for producer in ordered]
            rows = await self._redis.hmget(self._keys.instances(model, version), names)
            for producer, raw in zip(ordered, rows, strict=True):
                if not _alive(raw, producer, now_ns):
                    gone.add((model, version, producer))
        failed = 0
        for stream in list(self._streams):
            if (stream.model, stream.version, stream.instance) in gone:
                stream.fail(instance_gone(stream.model, stream.instance))
                failed += 1
        return failed


def _alive(raw: bytes | None, producer: str, now_ns: int) -> bool:
    """Whether the instance record ``raw`` is still the live process ``producer``
    (``<name>@<pid>``): a restarted instance keeps its name, not its pid."""
    if raw is None:
        return False
    try:
        info = json.loads(raw)
    except ValueError:
        return False
    if info.get("state") in (InstanceState.STOPPED, InstanceState.UNAVAILABLE):
        return False
    _, _, pid = producer.rpartition("@")
    if pid and str(info.get("pid", pid)) != pid:
        return False
    beat = int(info.get("heartbeat_ns", 0) or 0)
    return not beat or now_ns - beat <= LIVE_HEARTBEAT_NS
