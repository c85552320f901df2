"""The instance loop's direct Redis connection, for a Redis Cluster.

One :class:`~sluice.broker.direct.DirectConnection` per primary. A pipeline's commands
are grouped by the primary of their key's hash slot (``broker.cluster.SlotMap``; a
model's stream, statistics and sequences share one slot, each gateway's reply list has
its own), written to every node first, then read node by node, the node of a blocking
read last: one round trip, as on a single Redis.

Redirections are followed here: ``MOVED`` (the slot moved: recorded, the map read again,
the command sent to its new node), ``ASK`` (a key of a slot being migrated: ``ASKING``
and the command sent to the importing node), ``TRYAGAIN`` / ``CLUSTERDOWN`` (sent again
after :data:`RETRY_PAUSE_S`), each within the connection's socket timeout. A redirected
command did not run, so sending it again is safe. A lost connection closes every node's
connection and raises, as ``DirectConnection`` does (the caller keeps the commands that
may have run and sends them again); the next pipeline reads the map first, so a primary
replaced by its replica is found.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.exceptions

from sluice.broker.cluster import (
    MAP_TIMEOUT_S,
    Address,
    SlotMap,
    cluster_url_of,
    command_key,
    parse_cluster_url,
    redirection,
)
from sluice.broker.direct import Command, DirectConnection

#: pause before a command answered ``TRYAGAIN``/``CLUSTERDOWN`` is sent again, in s.
RETRY_PAUSE_S = 0.05
#: most rounds of redirections one pipeline follows.
MAX_ROUNDS = 16


class ClusterDirectConnection:
    """The interface of :class:`DirectConnection` over every primary of a cluster.

    Args:
        client: the process's synchronous cluster client, made by
            ``broker.cluster.sync_client`` (its URL and socket timeout are used).
    """

    def __init__(self, client: redis.Redis) -> None:
        self._cluster = parse_cluster_url(cluster_url_of(client))
        kwargs = client.nodes_manager.connection_kwargs  # type: ignore[attr-defined]
        self._timeout_s = float(kwargs.get("socket_timeout") or 30.0)
        self._map = SlotMap(self._cluster.seeds)
        self._nodes: dict[Address, DirectConnection] = {}
        #: commands written by :meth:`send` whose replies were not read yet, in order
        self._owed: list[tuple[Address, Command]] = []
        self._stale = True

    def send(self, commands: Sequence[Command]) -> None:
        """Write ``commands`` to their nodes without waiting for the replies (the next
        :meth:`pipeline` reads them first; as ``DirectConnection.send``).

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: a node was
                lost (every connection is closed; the commands may have run).
        """
        routed = [(self._route(command), command) for command in commands]
        try:
            for address, group in _grouped(routed).items():
                self._node(address).send(group)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self.close()
            raise
        self._owed.extend(routed)

    def pipeline(
        self, commands: Sequence[Command], last_blocks: bool = False, keep_owed: bool = False
    ) -> list[Any]:
        """Run ``commands`` on their nodes and return their replies in order (as
        ``DirectConnection.pipeline``); redirections are followed.

        Raises:
            redis.exceptions.ConnectionError, redis.exceptions.TimeoutError: a node was
                lost or did not answer (every connection is closed).
            redis.exceptions.ResponseError: an error reply of a command sent by
                :meth:`send` (unless ``keep_owed``).
        """
        owed, self._owed = self._owed, []
        routed = [(self._route(command), command) for command in commands]
        try:
            replies = self._run(owed, routed, last_blocks)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self.close()
            raise
        if keep_owed:
            return replies
        for reply in replies[: len(owed)]:
            if isinstance(reply, redis.exceptions.ResponseError):
                raise reply
        return replies[len(owed) :]

    def close(self) -> None:
        """Close every node's connection (idempotent); the next pipeline reads the slot
        map again."""
        for node in self._nodes.values():
            node.close()
        self._owed = []
        self._stale = True

    # -- internals --------------------------------------------------------------------------

    def _node(self, address: Address) -> DirectConnection:
        node = self._nodes.get(address)
        if node is None:
            client = redis.Redis.from_url(
                self._cluster.node_url(address),
                protocol=2,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
            )
            node = self._nodes[address] = DirectConnection(client)
        return node

    def _route(self, command: Command) -> Address:
        if self._stale:
            self._map.refresh(self._cluster, MAP_TIMEOUT_S)
            self._stale = False
        key = command_key(command)
        return (self._map.node_for(key) if key is not None else None) or self._map.any_node()

    def _run(
        self,
        owed: list[tuple[Address, Command]],
        routed: list[tuple[Address, Command]],
        last_blocks: bool,
    ) -> list[Any]:
        """Replies of ``owed`` (already written) then ``routed``, redirections followed."""
        items = [*owed, *routed]
        replies: list[Any] = [None] * len(items)
        # (index, address, command, asking) still to be answered; owed ones are written
        todo = [(i, a, c, False) for i, (a, c) in enumerate(items)]
        written = len(owed)
        deadline = time.monotonic() + self._timeout_s
        last_index = len(items) - 1 if last_blocks and routed else -1
        blocking = routed[-1][0] if last_index >= 0 else None
        for _ in range(MAX_ROUNDS):
            by_node: dict[Address, list[int]] = {}
            outgoing: dict[Address, list[Command]] = {}
            for n, (i, address, command, asking) in enumerate(todo):
                by_node.setdefault(address, []).append(i)
                if n >= written:
                    if asking:
                        outgoing.setdefault(address, []).append(("ASKING",))
                    outgoing.setdefault(address, []).append(command)
            for address, group in outgoing.items():
                self._node(address).send(group)
            order = sorted(by_node, key=lambda a: a == blocking)  # the blocking node last
            answers: dict[int, Any] = {}
            for address in order:
                node = self._node(address)
                got = node.pipeline((), last_blocks=address == blocking, keep_owed=True)
                wanted = iter(by_node[address])
                asking_at = {i for i, a, _, k in todo if a == address and k}
                position = iter(got)
                for i in wanted:
                    if i in asking_at:
                        next(position)  # ASKING's +OK
                    answers[i] = next(position)
            again = []
            for i, address, command, _ in todo:
                reply = answers[i]
                moved = redirection(reply)
                if moved is None or time.monotonic() >= deadline:
                    replies[i] = reply
                elif moved.kind == "MOVED" and moved.address is not None:
                    self._map.move(moved.slot, moved.address)
                    self._stale = True
                    again.append((i, moved.address, command, False))
                elif moved.kind == "ASK" and moved.address is not None:
                    again.append((i, moved.address, command, True))
                else:
                    again.append((i, address, command, False))
            if not again:
                return replies
            if any(_is_retry(answers[i]) for i, *_ in again):
                time.sleep(RETRY_PAUSE_S)
            todo, written = again, 0
            blocking = next((a for i, a, _, _ in todo if i == last_index), None)
        for i, *_ in todo:
            replies[i] = answers[i]
        return replies


def _is_retry(reply: object) -> bool:
    moved = redirection(reply)
    return moved is not None and moved.kind == "RETRY"


def _grouped(routed: list[tuple[Address, Command]]) -> dict[Address, list[Command]]:
    groups: dict[Address, list[Command]] = {}
    for address, command in routed:
        groups.setdefault(address, []).append(command)
    return groups
