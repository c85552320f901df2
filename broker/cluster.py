"""Redis Cluster URLs, clients and command routing.

A deployment names a Redis Cluster with a URL whose scheme is ``redis+cluster://`` (or
``rediss+cluster://`` for TLS) and whose host part lists one or more of the cluster's
nodes, comma separated: ``redis+cluster://[user:password@]host:port[,host:port...]``.
Any node answers ``CLUSTER SLOTS`` with the whole slot map, so one reachable seed is
enough; listing several survives the loss of one. A cluster has one database (0), so
the URL takes no path. A ``rediss+cluster://`` URL takes redis-py's TLS options in its
query string, as a ``rediss://`` URL does (:data:`TLS_OPTIONS`:
``?ssl_ca_certs=/certs/ca.crt&ssl_certfile=/certs/client.crt&ssl_keyfile=/certs/client.key``);
they reach the cluster clients and every connection to a single node
(:meth:`ClusterURL.node_url`).

:func:`sync_client` and :func:`async_client` return redis-py's ``Redis`` for a plain URL
and redis-py's ``RedisCluster`` (which follows ``MOVED``/``ASK`` itself) for a cluster URL.
The hot paths (``broker.multiplex``, ``broker.direct``, ``broker.replies``) keep their
own connections per node and use :class:`SlotMap` and :func:`redirection` to route each
command by its key's hash slot. The slot rule (CRC16 of the key, or of its ``{tag}``,
modulo 16384) and the redirections are Redis's cluster specification:
https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from redis.crc import key_slot

#: URL schemes that name a Redis Cluster (the ``s`` one: TLS).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: the attribute :func:`sync_client` leaves a cluster client's URL in.
URL_ATTRIBUTE = "sluice_cluster_url"
#: longest wait for one node's ``CLUSTER SLOTS`` answer when the slot map is read, in s:
#: a node that does not answer (its host cut off) costs this long before the next is
#: asked, however long the caller's own Redis timeout is.
MAP_TIMEOUT_S = 2.0
#: hash slots of a Redis Cluster.
SLOTS = 16384
#: the query options of a ``rediss+cluster://`` URL: redis-py's TLS options that every
#: cluster client and node connection (sync and asyncio) takes, to their parsers (the
#: value as passed on, or ValueError).
TLS_OPTIONS: dict[str, Callable[[str], str]] = {
    "ssl_ca_certs": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": lambda v: _choice(v, ("none", "optional", "required")),
    "ssl_check_hostname": lambda v: _choice(v, ("true", "false", "yes", "no", "1", "0")),
    "ssl_ciphers": str,
}
#: query options whose values a log line shows (numbers, switches); every other value
#: (a password, a TLS file's path, a misspelt option) shows as ``***``.
SHOWN_QUERY_OPTIONS = frozenset(
    {
        "db", "protocol", "timeout", "socket_timeout", "socket_connect_timeout",
        "socket_keepalive", "health_check_interval", "max_connections", "retry_on_timeout",
        "ssl_cert_reqs", "ssl_check_hostname", "ssl_min_version",
    }
)  # fmt: skip

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A parsed ``redis+cluster://`` URL.

    Attributes:
        seeds: the listed nodes, ``(host, port)``.
        tls: ``rediss+cluster``.
        username: ACL user, if any.
        password: password, if any.
        tls_options: the URL's TLS options (:data:`TLS_OPTIONS`), ``(name, value)`` in
            the URL's order, values as checked (``ssl_cert_reqs`` lower case).
    """

    seeds: tuple[Address, ...]
    tls: bool = False
    username: str | None = None
    password: str | None = None
    tls_options: tuple[tuple[str, str], ...] = ()

    def node_url(self, address: Address) -> str:
        """A plain Redis URL of one node (``redis://`` or ``rediss://``, credentials and
        TLS options kept)."""
        scheme = "rediss" if self.tls else "redis"
        auth = ""
        if self.username or self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        query = f"?{urlencode(self.tls_options, safe='/')}" if self.tls_options else ""
        return f"{scheme}://{auth}{address[0]}:{address[1]}/0{query}"

    def tls_kwargs(self) -> dict[str, Any]:
        """The TLS options as keyword arguments of redis-py's clients (``ssl=True`` for a
        ``rediss+cluster://`` URL; ``ssl_check_hostname`` a bool)."""
        if not self.tls:
            return {}
        out: dict[str, Any] = {"ssl": True}
        for name, value in self.tls_options:
            out[name] = value in ("true", "yes", "1") if name == "ssl_check_hostname" else value
        return out


def _choice(value: str, allowed: tuple[str, ...]) -> str:
    if value.lower() not in allowed:
        raise ValueError(f"one of {', '.join(allowed)}, not {value!r}")
    return value.lower()


def redacted(url: str) -> str:
    """``url`` fit for a log line: a password in its user part, and the values of its
    query options but those of :data:`SHOWN_QUERY_OPTIONS` (passwords, TLS files),
    replaced by ``***`` (``redis://:s3cret@host/0`` -> ``redis://:***@host/0``)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        name = user.split(":", 1)[0]
        netloc = f"{name}:***@{host}"
    query = "&".join(
        f"{key}={value}" if key in SHOWN_QUERY_OPTIONS or not value else f"{key}=***"
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


def is_cluster(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (:data:`CLUSTER_SCHEMES`)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse ``redis+cluster://[user:password@]host:port[,host:port...][/0][?options]``;
    the options (``rediss+cluster://`` only) are :data:`TLS_OPTIONS`.

    Raises:
        ValueError: not a cluster URL, no node, a node without a port or with a port
            outside 1-65535, a database other than 0 in the path, or a query option that
            is unknown, repeated, empty, has a bad value or comes without TLS. The message
            names the URL with its password and TLS files masked (:func:`redacted`).
    """
    shown = redacted(url)
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Redis Cluster URL (scheme {'/'.join(CLUSTER_SCHEMES)}): {shown!r}")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise ValueError(f"a Redis Cluster has database 0 only, not {path!r}: {shown!r}")
    tls = scheme.lower() == "rediss+cluster"
    options = _tls_options(query, tls, shown)
    auth, _, hosts = netloc.rpartition("@")
    username = password = None
    if auth:
        user, sep, secret = auth.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    seeds: list[Address] = []
    for part in hosts.split(","):
        parsed = urlsplit(f"//{part.strip()}")
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or port is None or not 0 < port < 65536:
            raise ValueError(f"a Redis Cluster node needs host:port, got {part!r} in {shown!r}")
        seeds.append((parsed.hostname, port))
    return ClusterURL(tuple(seeds), tls, username, password, options)


def _tls_options(query: str, tls: bool, shown: str) -> tuple[tuple[str, str], ...]:
    """The checked query options of a cluster URL (see :func:`parse_cluster_url`)."""
    options: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in TLS_OPTIONS:
            known = ", ".join(TLS_OPTIONS)
            raise ValueError(
                f"unknown Redis Cluster URL option {name!r} (known: {known}): {shown!r}"
            )
        if not tls:
            raise ValueError(f"option {name!r} needs a rediss+cluster:// URL (TLS): {shown!r}")
        if name in options:
            raise ValueError(f"option {name!r} given twice: {shown!r}")
        if not value:
            raise ValueError(f"option {name!r} needs a value: {shown!r}")
        try:
            options[name] = TLS_OPTIONS[name](value)
        except ValueError as exc:
            raise ValueError(f"option {name!r} must be {exc}: {shown!r}") from None
    return tuple(options.items())


def _cluster_kwargs(cluster: ClusterURL, kwargs: dict[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    out.pop("health_check_interval", None)  # checked per command by the cluster client
    if cluster.username:
        out["username"] = cluster.username
    if cluster.password:
        out["password"] = cluster.password
    out.update(cluster.tls_kwargs())
    return out


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A synchronous client of ``url``: redis-py's ``Redis.from_url``, or its
    ``RedisCluster`` for a cluster URL (``kwargs`` go to every node's connections).

    Raises:
        ValueError: a malformed cluster URL (:func:`parse_cluster_url`).
    """
    if not is_cluster(url):
        return redis.Redis.from_url(url, **kwargs)
    cluster = parse_cluster_url(url)
    nodes = [redis.cluster.ClusterNode(host, port) for host, port in cluster.seeds]
    client = redis.cluster.RedisCluster(startup_nodes=nodes, **_cluster_kwargs(cluster, kwargs))
    setattr(client, URL_ATTRIBUTE, url)
    return client  # type: ignore[return-value]


def is_cluster_client(client: object) -> bool:
    """Whether ``client`` was made by :func:`sync_client` for a cluster URL."""
    return isinstance(getattr(client, URL_ATTRIBUTE, None), str)


def cluster_url_of(client: object) -> str:
    """The ``redis+cluster://`` URL a client of :func:`sync_client` was made from.

    Raises:
        ValueError: ``client`` was not made by :func:`sync_client` for a cluster URL.
    """
    url = getattr(client, URL_ATTRIBUTE, None)
    if not isinstance(url, str):
        raise ValueError("not a Redis Cluster client made by sluice.broker.cluster")
    return url


def async_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """An asyncio client of ``url`` (as :func:`sync_client`, redis-py's asyncio clients).

    Raises:
        ValueError: a malformed cluster URL (:func:`parse_cluster_url`).
    """
    if not is_cluster(url):
        return redis.asyncio.Redis.from_url(url, **kwargs)
    cluster = parse_cluster_url(url)
    nodes = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in cluster.seeds]
    return redis.asyncio.cluster.RedisCluster(  # type: ignore[return-value]
        startup_nodes=nodes, **_cluster_kwargs(cluster, kwargs)
    )


# -- routing -------------------------------------------------------------------------------


def command_key(args: Sequence[object]) -> object | None:
    """The key that decides where ``args`` runs (the first key of the command), or None
    for a command without keys (``SCRIPT LOAD``, ``PING``, ``ASKING``).

    Every key of one of Sluice's commands shares its slot (one model's hash tag), so the
    first key routes the whole command.
    """
    name = str(args[0]).upper() if not isinstance(args[0], bytes) else args[0].decode().upper()
    if name in ("EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "FCALL"):
        return args[3] if int(args[2]) > 0 else None  # type: ignore[call-overload]
    if name in ("XREADGROUP", "XREAD"):
        for i, arg in enumerate(args):
            if (isinstance(arg, str) and arg.upper() == "STREAMS") or arg == b"STREAMS":
                return args[i + 1]
        return None
    if name in ("BLMPOP", "LMPOP", "ZMPOP", "BZMPOP"):
        offset = 2 if name.startswith("B") else 1
        return args[offset + 1]
    if name in ("SCRIPT", "PING", "ASKING", "CLUSTER", "INFO", "CLIENT", "READONLY"):
        return None
    return args[1] if len(args) > 1 else None


def slot_of(key: object) -> int:
    """The hash slot of ``key`` (its ``{tag}`` when it has one)."""
    raw = key if isinstance(key, bytes) else str(key).encode()
    return key_slot(raw)


_REDIRECT = re.compile(r"^(MOVED|ASK) (\d+) (\S+):(\d+)")


@dataclass(frozen=True, slots=True)
class Redirection:
    """A cluster's answer that a command must run elsewhere or later.

    Attributes:
        kind: ``MOVED`` (the slot lives at ``address`` now), ``ASK`` (this command only:
            send ``ASKING`` first), or ``RETRY`` (``TRYAGAIN`` during a migration,
            ``CLUSTERDOWN`` during a failover: send again after a pause).
        slot: the slot (MOVED / ASK).
        address: the node to send to (MOVED / ASK).
    """

    kind: str
    slot: int = -1
    address: Address | None = None


def redirection(reply: object) -> Redirection | None:
    """The :class:`Redirection` an error reply carries, or None for any other reply.

    redis-py's reply parser turns ``MOVED``/``ASK`` into ``MovedError``/``AskError``,
    ``TRYAGAIN`` into ``TryAgainError`` and ``CLUSTERDOWN`` into ``ClusterDownError``.
    """
    if not isinstance(reply, redis.exceptions.RedisError):
        return None
    if isinstance(reply, (redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)):
        return Redirection("RETRY")
    text = str(reply)
    if isinstance(reply, redis.exceptions.MovedError):
        text = f"MOVED {text}"
    elif isinstance(reply, redis.exceptions.AskError):
        text = f"ASK {text}"
    match = _REDIRECT.match(text)
    if match is None:
        if text.startswith(("TRYAGAIN", "CLUSTERDOWN")):
            return Redirection("RETRY")
        return None
    host = match.group(3)
    return Redirection(match.group(1), int(match.group(2)), (host, int(match.group(4))))


class SlotMap:
    """Which primary serves each hash slot, read with ``CLUSTER SLOTS``.

    Args:
        seeds: nodes asked for the map, in order, until one answers.
    """

    def __init__(self, seeds: Sequence[Address]) -> None:
        self.seeds: list[Address] = list(seeds)
        self._owner: list[Address | None] = [None] * SLOTS

    @property
    def known(self) -> bool:
        """Whether a map was read (or every slot was learnt from redirections)."""
        return any(owner is not None for owner in self._owner)

    def node_for(self, key: object) -> Address | None:
        """The primary serving ``key``'s slot, or None before the map is read."""
        return self._owner[slot_of(key)]

    def any_node(self) -> Address:
        """A primary (for commands without keys), or the first seed before the map is read."""
        for owner in self._owner:
            if owner is not None:
                return owner
        return self.seeds[0]

    def primaries(self) -> set[Address]:
        """Every primary the map names."""
        return {owner for owner in self._owner if owner is not None}

    def move(self, slot: int, address: Address) -> None:
        """Record a ``MOVED`` answer: ``slot`` lives at ``address`` now."""
        self._owner[slot] = address

    def apply(self, reply: Any) -> None:
        """Take a ``CLUSTER SLOTS`` reply (RESP2) as the whole map; the primaries it
        names become seeds too (a later refresh survives the loss of the first seeds)."""
        owner: list[Address | None] = [None] * SLOTS
        for entry in reply:
            start, end, primary = int(entry[0]), int(entry[1]), entry[2]
            host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
            address = (host, int(primary[1]))
            for slot in range(start, end + 1):
                owner[slot] = address
            for node in entry[2:]:
                host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
                if (host, int(node[1])) not in self.seeds:
                    self.seeds.append((host, int(node[1])))
        self._owner = owner

    def refresh(self, cluster: ClusterURL, timeout_s: float) -> None:
        """Read the map from the first seed that answers (synchronously).

        Raises:
            redis.exceptions.ConnectionError: no seed answered.
        """
        last: BaseException | None = None
        for address in list(self.seeds):
            client = redis.Redis.from_url(
                cluster.node_url(address),
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
            )
            try:
                self.apply(client.execute_command("CLUSTER", "SLOTS"))
                return
            except redis.exceptions.RedisError as exc:
                last = exc
            finally:
                client.close()
        raise redis.exceptions.ConnectionError(f"no Redis Cluster node answered: {last}")

    async def refresh_async(self, cluster: ClusterURL, timeout_s: float) -> None:
        """As :meth:`refresh`, with redis-py's asyncio client.

        Raises:
            redis.exceptions.ConnectionError: no seed answered.
        """
        last: BaseException | None = None
        for address in list(self.seeds):
            client = redis.asyncio.Redis.from_url(
                cluster.node_url(address),
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
            )
            try:
                self.apply(await client.execute_command("CLUSTER", "SLOTS"))
                return
            except (redis.exceptions.RedisError, OSError) as exc:
                last = exc
            finally:
                await client.aclose()
        raise redis.exceptions.ConnectionError(f"no Redis Cluster node answered: {last}")
