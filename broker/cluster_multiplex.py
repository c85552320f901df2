"""The gateway's multiplexed Redis connection, for a Redis Cluster.

One :class:`~sluice.broker.multiplex.MultiplexedConnection` per primary; each command
goes to the primary of its key's hash slot (``broker.cluster.SlotMap``), so the commands
of one event-loop iteration still share one write per node. Redirections are followed
here, without a round trip through the caller:

* ``MOVED``: the slot is recorded at its new node, the whole map is read again in the
  background, and the command is sent to the new node (it did not run).
* ``ASK`` (a slot being migrated, this key already moved): ``ASKING`` and the command
  are sent together to the importing node.
* ``TRYAGAIN`` / ``CLUSTERDOWN`` (a migration in progress, a failover not finished): sent
  again after :data:`RETRY_PAUSE_S`.
* A node that cannot be reached (a failed primary before its replica is promoted): the
  map is read again and the command sent again after :data:`RETRY_PAUSE_S`; only a
  command that was never written is sent again. One that was written before its
  connection was lost fails as on a single Redis (it may have run).

Every command is answered or failed within ``timeout_s`` of being queued, plus one
reply wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

import redis.exceptions

from sluice.broker.cluster import (
    MAP_TIMEOUT_S,
    Address,
    SlotMap,
    command_key,
    is_cluster,
    parse_cluster_url,
    redirection,
)
from sluice.broker.multiplex import MAY_HAVE_RUN, MultiplexedConnection
from sluice.broker.scripts import Script

logger = logging.getLogger(__name__)

#: pause before a command answered ``TRYAGAIN``/``CLUSTERDOWN`` or whose node could not
#: be reached is sent again, in s.
RETRY_PAUSE_S = 0.05
#: most redirections one command follows.
MAX_REDIRECTS = 16

_NOT_SENT = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


class ClusterMultiplexedConnection:
    """The interface of :class:`MultiplexedConnection` over every primary of a cluster.

    Args:
        url: a ``redis+cluster://`` URL (``broker.cluster.parse_cluster_url``).
        timeout_s: longest wait for a reply, in s; also how long a command is retried
            while its slot has no reachable primary.

    Raises:
        ValueError: a malformed cluster URL.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self._cluster = parse_cluster_url(url)
        self._map = SlotMap(self._cluster.seeds)
        self._timeout_s = timeout_s
        self._nodes: dict[Address, MultiplexedConnection] = {}
        self._scripts: list[Script] = []
        self._refreshing: asyncio.Task[None] | None = None
        self._started = False

    async def start(self) -> None:
        """Read the slot map (a failure is retried by the first command's redirection)."""
        self._started = True
        try:
            await self._map.refresh_async(self._cluster, MAP_TIMEOUT_S)
        except redis.exceptions.ConnectionError as exc:
            logger.warning("Redis Cluster slot map not read yet: %s", exc)

    async def stop(self) -> None:
        """Stop every node's connection (what waits fails with ``ConnectionError``)."""
        self._started = False
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refreshing
            self._refreshing = None
        nodes, self._nodes = self._nodes, {}
        for node in nodes.values():
            await node.stop()

    def call(self, *args: object) -> asyncio.Future[Any]:
        """Queue one command on its slot's primary; as ``MultiplexedConnection.call``."""
        return self._call(args, command_key(args))

    async def run_all(self, commands: Sequence[Sequence[object]]) -> list[Any]:
        """Queue every command and await their replies, in order.

        Raises:
            redis.exceptions.RedisError: the first failure.
        """
        return list(await asyncio.gather(*(self.call(*command) for command in commands)))

    def keep_loaded(self, *scripts: Script) -> None:
        """Have every primary know ``scripts`` (``MultiplexedConnection.keep_loaded``)."""
        self._scripts.extend(scripts)
        for node in self._nodes.values():
            node.keep_loaded(*scripts)

    async def script(self, script: Script, keys: list[str], args: list[object]) -> Any:
        """Run ``script`` on its first key's primary, loading it there on ``NOSCRIPT``.

        Raises:
            redis.exceptions.RedisError: as :meth:`call`.
        """
        command = script.command(keys, args)
        try:
            return await self._call(command, keys[0])
        except redis.exceptions.NoScriptError:
            await self._call(("SCRIPT", "LOAD", script.body), keys[0])
            return await self._call(command, keys[0])

    # -- routing ----------------------------------------------------------------------------

    def _call(self, args: Sequence[object], route: object | None) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        outer: asyncio.Future[Any] = loop.create_future()
        if not self._started:
            outer.set_exception(redis.exceptions.ConnectionError("connection not started"))
            return outer
        deadline = time.monotonic() + self._timeout_s
        self._send(args, route, outer, 0, deadline, None)
        return outer

    def _node(self, address: Address) -> MultiplexedConnection:
        node = self._nodes.get(address)
        if node is None:
            node = MultiplexedConnection(self._cluster.node_url(address), self._timeout_s)
            node.open()
            if self._scripts:
                node.keep_loaded(*self._scripts)
            self._nodes[address] = node
        return node

    def _send(
        self,
        args: Sequence[object],
        route: object | None,
        outer: asyncio.Future[Any],
        tries: int,
        deadline: float,
        ask: Address | None,
    ) -> None:
        if outer.done() or not self._started:
            if not outer.done():
                outer.set_exception(redis.exceptions.ConnectionError("connection closed"))
            return
        if ask is not None:
            node = self._node(ask)
            asking = node.call("ASKING")  # the very next command on that connection
            asking.add_done_callback(_retrieve)
        else:
            address = self._map.node_for(route) if route is not None else None
            node = self._node(address or self._map.any_node())
        inner = node.call(*args)
        inner.add_done_callback(
            functools.partial(self._answered, args, route, outer, tries, deadline)
        )

    def _answered(
        self,
        args: Sequence[object],
        route: object | None,
        outer: asyncio.Future[Any],
        tries: int,
        deadline: float,
        inner: asyncio.Future[Any],
    ) -> None:
        if outer.done():
            return
        if inner.cancelled():
            outer.cancel()
            return
        exc = inner.exception()
        if exc is None:
            outer.set_result(inner.result())
            return
        in_time = tries < MAX_REDIRECTS and time.monotonic() < deadline
        moved = redirection(exc)
        if moved is not None and in_time:
            if moved.kind == "MOVED" and moved.address is not None:
                self._map.move(moved.slot, moved.address)
                self._refresh_soon()
                self._send(args, route, outer, tries + 1, deadline, None)
            elif moved.kind == "ASK":
                self._send(args, route, outer, tries + 1, deadline, moved.address)
            else:
                self._later(args, route, outer, tries + 1, deadline)
            return
        if isinstance(exc, _NOT_SENT):
            self._refresh_soon()  # a primary lost: its replica may serve the slot now
            if MAY_HAVE_RUN not in str(exc) and time.monotonic() < deadline:
                self._later(args, route, outer, tries, deadline)
                return
        outer.set_exception(exc)

    def _later(
        self,
        args: Sequence[object],
        route: object | None,
        outer: asyncio.Future[Any],
        tries: int,
        deadline: float,
    ) -> None:
        asyncio.get_running_loop().call_later(
            RETRY_PAUSE_S, self._send, args, route, outer, tries, deadline, None
        )

    def _refresh_soon(self) -> None:
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh(), name="sluice-slot-map")

    async def _refresh(self) -> None:
        try:
            await self._map.refresh_async(self._cluster, MAP_TIMEOUT_S)
        except redis.exceptions.ConnectionError as exc:
            logger.warning("Redis Cluster slot map not refreshed: %s", exc)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def connect_multiplexed(
    url: str, timeout_s: float
) -> MultiplexedConnection | ClusterMultiplexedConnection:
    """The gateway's multiplexed connection for ``url``: one connection for a Redis, one
    per primary for a ``redis+cluster://`` URL."""
    if is_cluster(url):
        return ClusterMultiplexedConnection(url, timeout_s)
    return MultiplexedConnection(url, timeout_s)
