"""Redis Cluster URLs, command keys, redirections and the slot map (``broker.cluster``)."""

from __future__ import annotations

import re

import pytest
from redis._parsers.base import BaseParser

from sluice.broker.cluster import (
    ClusterURL,
    SlotMap,
    command_key,
    is_cluster,
    parse_cluster_url,
    redacted,
    redirection,
    slot_of,
)
from sluice.broker.keys import KeySchema


def test_cluster_url_lists_nodes_and_credentials() -> None:
    url = parse_cluster_url("redis+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001")
    assert url == ClusterURL((("10.0.0.1", 7000), ("10.0.0.2", 7001)), False, "app", "s@cret")
    assert url.node_url(("10.0.0.2", 7001)) == "redis://app:s%40cret@10.0.0.2:7001/0"
    tls = parse_cluster_url("rediss+cluster://h:6379/0")
    assert tls.tls and tls.node_url(("h", 6379)) == "rediss://h:6379/0"
    assert is_cluster("REDIS+CLUSTER://h:1") and not is_cluster("redis://h:1/0")


def test_tls_options_reach_every_node_url_and_the_cluster_clients() -> None:
    url = parse_cluster_url(
        "rediss+cluster://:pw@h1:7000,h2:7001?ssl_ca_certs=/certs/ca.crt"
        "&ssl_certfile=/certs/c.crt&ssl_keyfile=/certs/c.key&ssl_cert_reqs=REQUIRED"
        "&ssl_check_hostname=no"
    )
    assert url.seeds == (("h1", 7000), ("h2", 7001))
    assert url.node_url(("10.0.0.9", 7002)) == (
        "rediss://:pw@10.0.0.9:7002/0?ssl_ca_certs=/certs/ca.crt&ssl_certfile=/certs/c.crt"
        "&ssl_keyfile=/certs/c.key&ssl_cert_reqs=required&ssl_check_hostname=no"
    )
    assert url.tls_kwargs() == {
        "ssl": True,
        "ssl_ca_certs": "/certs/ca.crt",
        "ssl_certfile": "/certs/c.crt",
        "ssl_keyfile": "/certs/c.key",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": False,
    }
    spaced = parse_cluster_url("rediss+cluster://h:1/0?ssl_ca_certs=/my%20certs/ca%26.crt")
    assert spaced.tls_kwargs()["ssl_ca_certs"] == "/my certs/ca&.crt"
    assert spaced.node_url(("h", 1)) == "rediss://h:1/0?ssl_ca_certs=/my+certs/ca%26.crt"
    assert parse_cluster_url("redis+cluster://h:1").tls_kwargs() == {}


@pytest.mark.parametrize(
    ("url", "text"),
    [
        (
            "rediss+cluster://h:1?ssl_ca_cert=/ca.crt",
            "unknown Redis Cluster URL option 'ssl_ca_cert' (known: ssl_ca_certs,",
        ),
        ("rediss+cluster://h:1?db=0", "unknown Redis Cluster URL option 'db'"),
        ("redis+cluster://h:1?ssl_ca_certs=/ca", "'ssl_ca_certs' needs a rediss+cluster://"),
        ("rediss+cluster://h:1?ssl_cert_reqs=maybe", "one of none, optional, required, not"),
        ("rediss+cluster://h:1?ssl_check_hostname=sure", "'ssl_check_hostname' must be one of"),
        ("rediss+cluster://h:1?ssl_keyfile=", "'ssl_keyfile' needs a value"),
        ("rediss+cluster://h:1?ssl_keyfile=/a&ssl_keyfile=/b", "'ssl_keyfile' given twice"),
    ],
)
def test_bad_cluster_url_options_are_named(url: str, text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(text)):
        parse_cluster_url(url)


def test_errors_and_log_lines_hide_passwords_and_tls_files() -> None:
    url = "rediss+cluster://u:s3cret@h:1,x?ssl_keyfile=/k/c.key&ssl_cert_reqs=none"
    shown = "rediss+cluster://u:***@h:1,x?ssl_keyfile=***&ssl_cert_reqs=none"
    assert redacted(url) == shown
    with pytest.raises(ValueError) as info:
        parse_cluster_url(url)
    assert "s3cret" not in str(info.value) and "/k/c.key" not in str(info.value)
    assert shown in str(info.value)


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("redis://h:1/0", "not a Redis Cluster URL"),
        ("redis+cluster://h:1/2", "database 0 only"),
        ("redis+cluster://h", "needs host:port"),
        ("redis+cluster://h:1,:2", "needs host:port"),
        ("redis+cluster://h:99999", "needs host:port"),
    ],
)
def test_bad_cluster_urls_say_why(url: str, text: str) -> None:
    with pytest.raises(ValueError, match=text):
        parse_cluster_url(url)


def test_command_key_is_the_routing_key_of_each_command_sluice_sends() -> None:
    keys = KeySchema("p:")
    stream = keys.queue("m", 1)
    read = ("XREADGROUP", "GROUP", "g", "c", "COUNT", 8, "BLOCK", 5, "STREAMS", stream, ">")
    assert command_key(read) == stream
    assert command_key(("EVALSHA", "ab", 2, stream, "x", "arg")) == stream
    assert command_key(("EVALSHA", "ab", 0, "arg")) is None
    assert command_key(("BLMPOP", 1.0, 1, "p:reply:g", "LEFT", "COUNT", 9)) == "p:reply:g"
    assert command_key(("RPUSH", "p:reply:g", b"x")) == "p:reply:g"
    assert command_key(("SCRIPT", "LOAD", "return 1")) is None


def test_one_models_keys_share_a_slot_and_reply_lists_do_not() -> None:
    keys = KeySchema("p:")
    model_keys = [
        keys.queue("m", 1),
        keys.queue("m", 1, 2),
        keys.sequence_queue("m", 1, "i"),
        keys.stats("m", 1),
        keys.stats_shard("m", 1, "i"),
        keys.instances("m", 1),
        keys.config("m"),
        keys.state("m"),
    ]
    assert len({slot_of(k) for k in model_keys}) == 1
    cache = [keys.cache_entry("d"), keys.cache_lru(), keys.cache_bytes(), keys.cache_stats()]
    assert len({slot_of(k) for k in cache}) == 1
    assert slot_of(keys.reply("g1")) != slot_of(keys.reply("g2"))


def test_redirections_are_read_from_error_replies() -> None:
    moved = redirection(BaseParser.parse_error("MOVED 3999 127.0.0.1:6381"))
    assert (moved.kind, moved.slot, moved.address) == ("MOVED", 3999, ("127.0.0.1", 6381))
    ask = redirection(BaseParser.parse_error("ASK 12 10.1.1.1:7000"))
    assert (ask.kind, ask.slot, ask.address) == ("ASK", 12, ("10.1.1.1", 7000))
    assert redirection(BaseParser.parse_error("TRYAGAIN Multiple keys")).kind == "RETRY"
    assert redirection(BaseParser.parse_error("CLUSTERDOWN The cluster is down")).kind == "RETRY"
    assert redirection(BaseParser.parse_error("ERR wrong")) is None
    assert redirection(b"OK") is None


def test_slot_map_follows_cluster_slots_and_moves() -> None:
    slots = SlotMap([("seed", 1)])
    assert slots.node_for("k") is None and slots.any_node() == ("seed", 1)
    slots.apply(
        [
            [0, 8191, [b"a", 7000, b"id1"], [b"ra", 7003, b"id4"]],
            [8192, 16383, [b"b", 7001, b"id2"]],
        ]
    )
    assert slots.node_for("{m}:q:1") == (("a", 7000) if slot_of("{m}") < 8192 else ("b", 7001))
    assert slots.primaries() == {("a", 7000), ("b", 7001)}
    assert ("ra", 7003) in slots.seeds
    slots.move(slot_of("{m}"), ("c", 7002))
    assert slots.node_for("{m}:config") == ("c", 7002)
