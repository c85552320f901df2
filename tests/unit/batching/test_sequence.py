"""sluice.batching.sequence: which steps of which sequences an instance runs next."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.batching.errors import BatchingPolicyError
from sluice.batching.sequence import SequencePolicy, SequenceScheduler, SequenceStep

MS = 1_000_000


def policy(**kw: object) -> SequencePolicy:
    base: dict[str, object] = {"strategy": "oldest", "max_batch_size": 4, "capacity": 4}
    base.update(kw)
    return SequencePolicy(**base)  # type: ignore[arg-type]


def step(corrid: object, n: int, at: int = 0, *, start: bool = False, end: bool = False,
         known: int | None = None) -> SequenceStep:  # fmt: skip
    return SequenceStep(
        id=f"{corrid}-{n}",
        corrid=corrid,  # type: ignore[arg-type]
        n=n,
        start=start,
        end=end,
        arrival_ns=at,
        known_done=n - 1 if known is None else known,
    )


def ids(batch: object) -> list[str]:
    assert batch is not None
    return [s.id for s in batch.items]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"strategy": "fifo"}, "unknown sequence batching strategy"),
        ({"capacity": 0}, "candidate sequences must be >= 1"),
        ({"preferred_batch_sizes": (5,)}, "preferred batch size 5"),
        ({"idle_us": 0}, "idle time > 0"),
    ],
)
def test_invalid_policy_is_refused(kw: dict[str, object], message: str) -> None:
    with pytest.raises(BatchingPolicyError, match=message):
        policy(**kw)


def test_steps_of_one_sequence_run_one_at_a_time_in_order() -> None:
    s = SequenceScheduler(policy())
    s.offer(step("a", 2, 1, known=0), 1)
    s.offer(step("a", 1, 2, start=True), 2)
    first = s.take(3)
    assert ids(first) == ["a-1"]
    assert s.take(4) is None  # a-2 waits for a-1
    s.complete(first.items, 5)  # type: ignore[union-attr]
    assert ids(s.take(6)) == ["a-2"]


def test_one_step_per_sequence_per_batch_oldest_first() -> None:
    s = SequenceScheduler(policy())
    for i, c in enumerate("abc"):
        s.offer(step(c, 1, 10 - i, start=True), 10)
    s.offer(step("a", 2, 0, known=0), 10)
    assert ids(s.take(11)) == ["c-1", "b-1", "a-1"]


def test_batch_is_capped_by_max_batch_size() -> None:
    s = SequenceScheduler(policy(max_batch_size=2, capacity=4))
    for i, c in enumerate("abc"):
        s.offer(step(c, 1, i, start=True), 5)
    assert ids(s.take(5)) == ["a-1", "b-1"]


def test_backlog_waits_for_a_free_candidate() -> None:
    s = SequenceScheduler(policy(max_batch_size=4, capacity=2))
    for i, c in enumerate("abc"):
        s.offer(step(c, 1, i, start=True), 5)
    batch = s.take(5)
    assert ids(batch) == ["a-1", "b-1"]
    s.complete(batch.items, 6)  # type: ignore[union-attr]
    assert s.take(7) is None  # a and b hold both candidates
    s.offer(step("a", 2, 8, end=True), 8)
    batch = s.take(9)
    assert ids(batch) == ["a-2"]
    s.complete(batch.items, 10)  # a ended: c gets its candidate
    assert ids(s.take(11)) == ["c-1"]


def test_idle_sequence_frees_its_candidate() -> None:
    s = SequenceScheduler(policy(max_batch_size=1, capacity=1, idle_us=1000))
    s.offer(step("a", 1, 0, start=True), 0)
    batch = s.take(0)
    s.complete(batch.items, 1)  # type: ignore[union-attr]
    s.offer(step("b", 1, 2, start=True), 2)
    assert s.take(2) is None
    assert s.wake_at(2) == 1 + 1000 * 1000
    assert ids(s.take(1 + 1000 * 1000)) == ["b-1"]


def test_delay_waits_for_a_fuller_batch_unless_every_live_sequence_is_in() -> None:
    s = SequenceScheduler(policy(max_queue_delay_us=100, preferred_batch_sizes=(4,)))
    s.offer(step("a", 1, 0, start=True), 0)
    s.offer(step("b", 1, 0, start=True), 0)
    batch = s.take(0)  # nothing live yet: both admitted, no other step can join
    assert ids(batch) == ["a-1", "b-1"]
    s.complete(batch.items, 1)
    s.offer(step("a", 2, 2), 2)
    assert s.take(3) is None  # b is live and may send its next step
    assert s.wake_at(3) == 2 + 100_000
    s.offer(step("b", 2, 4), 4)
    assert ids(s.take(5)) == ["a-2", "b-2"]


def test_delay_expires() -> None:
    s = SequenceScheduler(policy(max_queue_delay_us=100))
    s.offer(step("a", 1, 0, start=True), 0)
    s.offer(step("b", 1, 0, start=True), 0)
    s.complete(s.take(0).items, 1)  # type: ignore[union-attr]
    s.offer(step("a", 2, 2), 2)
    assert s.take(2 + 99_999) is None
    assert ids(s.take(2 + 100_000)) == ["a-2"]


def test_unknown_predecessor_is_asked_for_then_runs() -> None:
    s = SequenceScheduler(policy())
    s.offer(step("a", 5, 0, known=2), 0)  # steps 3-4 ran on another instance
    assert s.take(1) is None
    assert s.unknown() == ["a"]
    s.committed("a", 4)
    assert s.unknown() == []
    assert ids(s.take(2)) == ["a-5"]


def test_duplicate_delivery_is_handed_back_not_run() -> None:
    s = SequenceScheduler(policy())
    s.offer(step("a", 1, 0, start=True), 0)
    s.complete(s.take(0).items, 1)  # type: ignore[union-attr]
    s.offer(step("a", 1, 2, start=True, known=1), 2)
    assert [d.id for d in s.take_duplicates()] == ["a-1"]
    assert s.take(3) is None


def test_dropped_step_unblocks_the_next_once_completed() -> None:
    s = SequenceScheduler(policy())
    s.offer(step("a", 1, 0, start=True), 0)
    s.offer(step("a", 2, 0, known=0), 0)
    dropped = s.drop("a-1", "a")
    assert dropped is not None and dropped.n == 1
    assert s.take(1) is None
    s.complete([dropped], 2)
    assert ids(s.take(3)) == ["a-2"]


def test_restart_after_end_reuses_the_id() -> None:
    s = SequenceScheduler(policy())
    s.offer(step("a", 1, 0, start=True, end=True), 0)
    s.complete(s.take(0).items, 1)  # type: ignore[union-attr]
    assert s.live == 0
    s.offer(step("a", 2, 2, start=True, known=1), 2)
    assert ids(s.take(3)) == ["a-2"]
    assert s.live == 1


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    capacity=st.integers(1, 4),
    max_batch=st.integers(0, 4),
    delay_us=st.sampled_from([0, 50]),
    order_seed=st.randoms(use_true_random=False),
)
def test_every_step_runs_once_in_order_never_two_at_once(
    lengths: list[int], capacity: int, max_batch: int, delay_us: int, order_seed: object
) -> None:
    s = SequenceScheduler(
        SequencePolicy("oldest", max_batch, capacity, (), delay_us, idle_us=10_000)
    )
    pending = [step(c, n, 0, start=n == 1, end=n == length, known=0)
               for c, length in enumerate(lengths) for n in range(1, length + 1)]  # fmt: skip
    order_seed.shuffle(pending)  # type: ignore[attr-defined]
    ran: dict[object, list[int]] = {c: [] for c in range(len(lengths))}
    now = 0
    for _ in range(10_000):
        if pending and order_seed.random() < 0.5:  # type: ignore[attr-defined]
            s.offer(pending.pop(), now)
        batch = s.take(now)
        if batch is not None:
            corrids = [x.corrid for x in batch.items]
            assert len(corrids) == len(set(corrids)), "two steps of one sequence in a batch"
            assert batch.size <= max(1, max_batch)
            for x in batch.items:
                assert x.n == len(ran[x.corrid]) + 1, "a step ran out of order"
                ran[x.corrid].append(x.n)
            s.complete(batch.items, now)
        if not pending and s.held == 0:
            break
        now += 20_000  # 20 µs
    assert all(ran[c] == list(range(1, n + 1)) for c, n in enumerate(lengths))
    assert s.live == 0
