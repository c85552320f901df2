"""Redis URLs in log lines carry no password and no TLS file
(``broker.redis_server.redacted``)."""

from __future__ import annotations

import pytest

from sluice.broker.redis_server import redacted


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("unix://:s3cret@/tmp/r.sock?db=5", "unix://:***@/tmp/r.sock?db=5"),
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("unix:///tmp/r.sock?db=7&password=abc", "unix:///tmp/r.sock?db=7&password=***"),
        ("rediss://:p%40ss@h:1/2", "rediss://:***@h:1/2"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        (
            "rediss://h:1/0?ssl_ca_certs=/c/ca.crt&ssl_keyfile=/c/k&ssl_cert_reqs=none",
            "rediss://h:1/0?ssl_ca_certs=***&ssl_keyfile=***&ssl_cert_reqs=none",
        ),
        (
            "rediss+cluster://:pw@h:1,h:2?ssl_ca_file=/c/ca.crt&ssl_check_hostname=no",
            "rediss+cluster://:***@h:1,h:2?ssl_ca_file=***&ssl_check_hostname=no",
        ),
    ],
)
def test_the_password_is_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert redacted(url) == shown
