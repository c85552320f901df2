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


def test_queue_shards_have_tags_of_their_own_spread_round_the_slot_ring() -> None:
    """Shard 0 keeps the model's tag; shard k of n lands k/n of the way round the 16384
    slots from it (within a few slots), so n primaries with equal slot ranges hold one
    shard each, for any model name."""
    from redis.crc import key_slot

    from sluice.broker.keys import SLOTS, hash_tag, shard_tag

    keys = KeySchema("p:")
    assert keys.queue("m", 1, 0, 0, 3) == "p:{m}:q:1"
    assert keys.queue("m", 1, 2, 1, 3) == f"p:{{{shard_tag('m', 1, 3)}}}:q:1:p2"
    assert hash_tag(keys.queue("m", 1, 2, 1, 3)) == shard_tag("m", 1, 3) != "m"
    thirds = [(0, 5460), (5461, 10922), (10923, 16383)]  # what --cluster create gives 3
    spread = 0
    for i in range(200):
        model = f"model-{i}"
        home = key_slot(model.encode())
        for shard in range(3):
            slot = key_slot(shard_tag(model, shard, 3).encode())
            aim = (home + shard * SLOTS // 3) % SLOTS
            assert min(abs(slot - aim), SLOTS - abs(slot - aim)) <= 16
        owners = {
            next(n for n, (lo, hi) in enumerate(thirds) if lo <= s <= hi)
            for s in (key_slot(shard_tag(model, k, 3).encode()) for k in range(3))
        }
        spread += len(owners) == 3
    assert spread >= 196  # only a model within a few slots of a range's edge may miss


def test_hash_tag_is_what_a_cluster_hashes() -> None:
    from sluice.broker.keys import hash_tag

    assert hash_tag("p:{m#1.7}:q:1") == "m#1.7"
    assert hash_tag("p:reply:g1") == "p:reply:g1"
    assert hash_tag("p:{}:x{y}") == "p:{}:x{y}"  # an empty first tag: the whole key
