"""A refused Redis login told apart from an outage, and the TLS options Celery gets from
a ``rediss://`` URL."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import redis.exceptions
from secure_redis import PASSWORD, secured_redis

from sluice.broker.celery_app import celery_tls
from sluice.broker.redis_access import (
    RedisAccessRefused,
    access_refusal,
    check_redis_access,
    unusable_redis,
)
from sluice.broker.redis_server import free_port


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.AuthenticationError("invalid username-password pair"),
        redis.exceptions.AuthorizationError("not allowed"),
        redis.exceptions.NoPermissionError("NOPERM this user has no permissions"),
        redis.exceptions.ResponseError("NOAUTH Authentication required."),
        redis.exceptions.ResponseError("WRONGPASS invalid username-password pair"),
    ],
)
def test_login_refusals(exc: Exception) -> None:
    assert access_refusal(exc) == f"Redis refused the login: {exc}"


def test_tls_failures_are_refusals() -> None:
    error = redis.exceptions.ConnectionError("Error 1 connecting to 127.0.0.1:6380.")
    error.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    assert access_refusal(error) == f"TLS with Redis failed: {error}"


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ConnectionError(
            "Error 111 connecting to 127.0.0.1:1. Connection refused."
        ),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
        redis.exceptions.ResponseError("LOADING Redis is loading the dataset in memory"),
    ],
)
def test_outages_are_not_refusals(exc: Exception) -> None:
    assert access_refusal(exc) is None


def test_an_unreachable_redis_is_not_refused() -> None:
    check_redis_access(f"redis://:pw@127.0.0.1:{free_port()}/0", timeout_s=1.0)  # no raise


def test_a_wrong_password_is_refused_with_the_password_masked(tmp_path: Path) -> None:
    with secured_redis("password", tmp_path) as server:
        check_redis_access(server.url, timeout_s=5.0)  # the right one: no raise
        with pytest.raises(RedisAccessRefused) as info:
            check_redis_access(server.wrong_url, timeout_s=5.0)
    assert PASSWORD not in str(info.value)
    assert str(info.value).startswith("Redis refused the login: ")
    assert "(Redis at redis://:***@127.0.0.1:" in str(info.value)


def test_celery_tls_options() -> None:
    url, tls = celery_tls(
        "rediss://:pw@h:6380/2?ssl_ca_certs=/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/c.key"
        "&health_check_interval=5"
    )
    assert url == "rediss://:pw@h:6380/2?health_check_interval=5"
    assert tls == {
        "ssl_ca_certs": "/ca.pem",
        "ssl_certfile": "/c.pem",
        "ssl_keyfile": "/c.key",
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
    }
    assert celery_tls("rediss://h/0?ssl_cert_reqs=CERT_NONE")[1] == {"ssl_cert_reqs": ssl.CERT_NONE}
    assert celery_tls("redis://:pw@h/0") == ("redis://:pw@h/0", None)
    with pytest.raises(ValueError, match="ssl_cert_reqs must be"):
        celery_tls("rediss://h/0?ssl_cert_reqs=maybe")


def test_the_wrong_scheme_is_refused(tmp_path: Path) -> None:
    """``redis://`` for a TLS port, ``rediss://`` for a plain one: refused, not waited for."""
    with secured_redis("tls", tmp_path / "tls") as server:
        plain = server.url.replace("rediss://", "redis://").split("?")[0]
        with pytest.raises(RedisAccessRefused, match="Redis speaks TLS on this port: use a rediss"):
            check_redis_access(plain, timeout_s=5.0)
    wrong = "Redis does not speak TLS on this port: use a redis:// URL"
    with (
        secured_redis("password", tmp_path / "plain") as server,
        pytest.raises(RedisAccessRefused, match=wrong),
    ):
        check_redis_access(server.url.replace("redis://", "rediss://"), timeout_s=2.0)


def test_a_cluster_node_behind_a_plain_url_is_named_as_such() -> None:
    moved = redis.exceptions.MovedError("9817 127.0.0.1:18702")
    line = unusable_redis("redis://:secret@127.0.0.1:18701/0", moved)
    assert line == (
        "the Redis at redis://:***@127.0.0.1:18701/0 is a node of a Redis Cluster (it "
        "redirected a key to 127.0.0.1:18702): give a redis+cluster:// URL"
    )
    other = unusable_redis("redis://127.0.0.1:1/0", redis.exceptions.ResponseError("ERR x"))
    assert other == "cannot use Redis at redis://127.0.0.1:1/0: ERR x"
