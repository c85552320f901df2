"""Telling a refused Redis login apart from a Redis that is down.

Every Sluice process waits out a Redis outage (a restart, a network cut) and goes on
when Redis answers again. A wrong password, an ACL user without a permission, a TLS
certificate Redis or the client rejects, or a URL whose scheme does not fit the port
(``redis://`` for a TLS port, ``rediss://`` for a plain one) is not an outage: waiting
never ends it. Each process therefore checks its Redis once at start
(:func:`check_redis_access`) and ends with one error line and exit code 1 on such a
refusal, instead of retrying in a loop.

The URL is the only place Redis credentials and TLS files are given
(``redis://[[user]:password@]host:port/db``, ``rediss://...?ssl_ca_certs=...&ssl_certfile=
...&ssl_keyfile=...``, ``unix:///path?db=N&password=...``): redis-py, Celery's broker and
result backend, and Sluice's own connections (:mod:`broker.direct`, :mod:`broker.takeover`,
opened through redis-py) all take it from there. See docs/user-guide/security.md.
"""

from __future__ import annotations

import logging
import socket
import ssl
from urllib.parse import urlsplit

import redis
import redis.exceptions

from sluice.broker.cluster import sync_client
from sluice.broker.redis_server import redacted

__all__ = [
    "RedisAccessRefused",
    "access_refusal",
    "check_redis_access",
    "exit_if_refused",
    "unusable_redis",
]

#: error reply prefixes of a login or permission refusal (Redis ``AUTH`` / ACL).
_REFUSAL_PREFIXES = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid username-password")


class RedisAccessRefused(RuntimeError):
    """Redis refused this process's login or a command (not an outage)."""


def access_refusal(exc: BaseException) -> str | None:
    """Why ``exc`` is a refusal that retrying cannot end, or None (an outage or another
    error).

    Refusals: redis-py's ``AuthenticationError`` (wrong password or user),
    ``AuthorizationError`` / ``NoPermissionError`` (an ACL user without the command or
    key), an error reply starting with ``NOAUTH`` (a password is required and none was
    given), ``WRONGPASS`` or ``NOPERM``, and a TLS failure (certificate not trusted,
    client certificate missing or refused, TLS spoken to a plain port; for a Redis
    Cluster, also when no node could be reached for such a reason).
    """
    if isinstance(
        exc,
        redis.exceptions.AuthenticationError
        | redis.exceptions.AuthorizationError
        | redis.exceptions.NoPermissionError,
    ):
        return f"Redis refused the login: {exc}"
    text = str(exc)
    if isinstance(exc, redis.exceptions.ResponseError) and text.startswith(_REFUSAL_PREFIXES):
        return f"Redis refused the login: {text}"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLError):
            return f"TLS with Redis failed: {text}"
        cause = cause.__cause__ or cause.__context__
    if (
        isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.RedisClusterException)
        and "SSL" in text
    ):  # a cluster client that reached no node keeps only the nodes' errors' text
        return f"TLS with Redis failed: {text}"
    return None


def unusable_redis(url: str, exc: BaseException) -> str:
    """One log line saying why the Redis at ``url`` (password masked) cannot be used.

    A plain ``redis://`` URL that names a node of a Redis Cluster gets a redirection
    (``MOVED`` / ``ASK``) for the first key it touches: the line says to use a
    ``redis+cluster://`` URL instead of showing the bare redirection.
    """
    if isinstance(exc, redis.exceptions.MovedError | redis.exceptions.AskError):
        return (
            f"the Redis at {redacted(url)} is a node of a Redis Cluster (it redirected a key "
            f"to {exc.host}:{exc.port}): give a redis+cluster:// URL"
        )
    return f"cannot use Redis at {redacted(url)}: {exc}"


def check_redis_access(url: str, timeout_s: float = 10.0, strict_cluster: bool = False) -> None:
    """Log in to the Redis at ``url`` and send one ``PING``.

    An unreachable Redis is not an error here (each process waits for it as for any
    outage); only a refusal is. With ``strict_cluster``, a malformed ``redis+cluster://``
    URL and a cluster none of whose nodes answers are refusals too (redis-py's cluster
    client cannot be made without a node: a process that needs one cannot wait).

    Raises:
        RedisAccessRefused: the login, the ``PING`` or TLS was refused; the message names
            the Redis (password masked) and the reason, fit for one log line.
    """
    client = None
    try:
        # a cluster client reads the slot map (logging in to a node) when it is made
        client = sync_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        client.ping()
    except ValueError as exc:
        if strict_cluster:  # a malformed cluster URL (its text masks the password)
            raise RedisAccessRefused(f"bad --redis-url: {exc}") from None
        return  # the caller's first use says so
    except redis.exceptions.RedisClusterException as exc:
        reason = access_refusal(exc)  # else unreachable: the caller's first use says so
        if reason is not None:
            raise RedisAccessRefused(f"{reason} (Redis at {redacted(url)})") from None
        if strict_cluster:
            raise RedisAccessRefused(unusable_redis(url, exc)) from None
    except (redis.exceptions.RedisError, OSError) as exc:
        reason = access_refusal(exc)
        parts = urlsplit(url)
        if (
            reason is None
            and isinstance(exc, redis.exceptions.ConnectionError)
            and not isinstance(exc, redis.exceptions.TimeoutError)
            and parts.scheme == "redis"
            and _speaks_tls(parts.hostname or "127.0.0.1", parts.port or 6379, timeout_s)
        ):
            reason = "Redis speaks TLS on this port: use a rediss:// URL"
        elif (
            reason is None
            and isinstance(exc, redis.exceptions.TimeoutError)
            and parts.scheme == "rediss"
            and _speaks_plain(parts.hostname or "127.0.0.1", parts.port or 6379, timeout_s)
        ):
            reason = "Redis does not speak TLS on this port: use a redis:// URL"
        if reason is not None:
            raise RedisAccessRefused(f"{reason} (Redis at {redacted(url)})") from None
    finally:
        if client is not None:
            client.close()


def _speaks_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether the server at ``host:port`` answers a TLS handshake (unverified: only the
    protocol is asked), which a plain Redis answers with a protocol error instead: a
    ``redis://`` URL then names a TLS port, where Redis resets the connection on the
    first plain command, as an outage would look."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=timeout_s) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return True
    except ssl.SSLError as exc:  # a TLS alert (a client certificate asked for) is TLS too
        return "ALERT" in str(exc.reason or "")
    except OSError:
        return False


def _speaks_plain(host: str, port: int, timeout_s: float) -> bool:
    """Whether the server at ``host:port`` answers an inline ``PING`` in plain RESP
    (``+PONG`` or an error such as ``-NOAUTH``): a ``rediss://`` URL then names a plain
    port, where Redis waits for the end of a line that the TLS handshake never sends, as
    a stalled Redis would."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(1)[:1] in (b"+", b"-")
    except OSError:
        return False


def exit_if_refused(url: str, logger: logging.Logger, timeout_s: float = 5.0) -> None:
    """:func:`check_redis_access` (a Redis that does not answer delays the start by at
    most ``timeout_s`` seconds, twice where a probe of the other protocol follows; a
    malformed or unreachable cluster URL counts as a refusal); on a refusal, log its one
    line and end the process with exit code 1 (a supervisor
    restarting it would be refused again).

    Raises:
        SystemExit: code 1, after a refusal.
    """
    try:
        check_redis_access(url, timeout_s, strict_cluster=True)
    except RedisAccessRefused as exc:
        logger.error("%s", exc)
        raise SystemExit(1) from None
