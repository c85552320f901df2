"""Telling a refused Redis login apart from a Redis that is down.

Every Sluice process waits out a Redis outage (a restart, a network cut) and goes on
when Redis answers again. A wrong password, an ACL user without a permission, or a TLS
certificate Redis or the client rejects is not an outage: waiting never ends it. Each
process therefore checks its Redis once at start (:func:`check_redis_access`) and ends
with one error line and exit code 1 on such a refusal, instead of retrying in a loop.

The URL is the only place Redis credentials and TLS files are given
(``redis://[[user]:password@]host:port/db``, ``rediss://...?ssl_ca_certs=...&ssl_certfile=
...&ssl_keyfile=...``, ``unix:///path?db=N&password=...``): redis-py, Celery's broker and
result backend, and Sluice's own connections (:mod:`broker.direct`, :mod:`broker.takeover`,
opened through redis-py) all take it from there. See docs/user-guide/security.md.
"""

from __future__ import annotations

import logging
import ssl

import redis
import redis.exceptions

from sluice.broker.redis_server import redacted

__all__ = ["RedisAccessRefused", "access_refusal", "check_redis_access", "exit_if_refused"]

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
    client certificate missing or refused, TLS spoken to a plain port).
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
    if isinstance(exc, redis.exceptions.ConnectionError) and "SSL" in text:
        return f"TLS with Redis failed: {text}"
    return None


def check_redis_access(url: str, timeout_s: float = 10.0) -> None:
    """Log in to the Redis at ``url`` and send one ``PING``.

    An unreachable Redis is not an error here (each process waits for it as for any
    outage); only a refusal is.

    Raises:
        RedisAccessRefused: the login, the ``PING`` or TLS was refused; the message names
            the Redis (password masked) and the reason, fit for one log line.
    """
    client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        client.ping()
    except (redis.exceptions.RedisError, OSError) as exc:
        reason = access_refusal(exc)
        if reason is not None:
            raise RedisAccessRefused(f"{reason} (Redis at {redacted(url)})") from None
    finally:
        client.close()


def exit_if_refused(url: str, logger: logging.Logger) -> None:
    """:func:`check_redis_access`; on a refusal, log its one line and end the process
    with exit code 1 (a supervisor restarting it would be refused again).

    Raises:
        SystemExit: code 1, after a refusal.
    """
    try:
        check_redis_access(url)
    except RedisAccessRefused as exc:
        logger.error("%s", exc)
        raise SystemExit(1) from None
