"""The key schema: every key of a model under its ``{model}`` hash tag, and which keys a
restart keeps."""

from __future__ import annotations

from sluice.broker.keys import KeySchema


def test_keys_of_a_model_share_its_hash_tag() -> None:
    keys = KeySchema("p:")
    names = [
        keys.queue("m", 1), keys.queue("m", 1, 2), keys.sequence_queue("m", 1, "m_0_0"),
        keys.sequence("m", 1, "u:7"), keys.instances("m", 1), keys.stats("m", 1),
    ]  # fmt: skip
    assert names == [
        "p:{m}:q:1", "p:{m}:q:1:p2", "p:{m}:q:1:s:m_0_0", "p:{m}:seq:1:u:7",
        "p:{m}:instances:1", "p:{m}:stats:1",
    ]  # fmt: skip


def test_is_sequence_names_live_sequence_hashes_of_its_prefix_only() -> None:
    keys = KeySchema("p:")
    assert keys.is_sequence(keys.sequence("m", 1, "s:abc"))
    assert not keys.is_sequence(keys.sequence_queue("m", 1, "m_0_0"))
    assert not keys.is_sequence(keys.config("seq"))
    assert not keys.is_sequence(KeySchema("other:").sequence("m", 1, "u:7"))
