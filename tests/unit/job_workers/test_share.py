"""A bulk job's fair share of a queue it shares with synchronous traffic."""

from __future__ import annotations

import pytest

from sluice.job_workers.share import FairShare, share_window


@pytest.mark.parametrize(
    "others, seconds, wait_s, expected",
    [
        (0, 0.25, 0.02, 128),  # nobody else: the full window
        (-3, 0.25, 0.02, 128),  # own rows counted before Redis saw them
        (500, 0.25, 0.02, 40),  # 2000/s others waiting 20 ms: 40 of theirs in the queue
        (10, 0.25, 0.002, 8),  # a trickle: the least
        (10_000, 0.25, 0.05, 128),  # a flood: never past the full window
    ],
)
def test_share_window(others: int, seconds: float, wait_s: float, expected: int) -> None:
    assert share_window(others, seconds, wait_s, full=128, least=8) == expected


def test_the_share_follows_the_streams_traffic() -> None:
    share = FairShare(full=128, least=8)
    assert share.limit == 8  # until a look says more
    share.look(added=1000, sent=100, now_s=10.0)
    assert share.limit == 8  # one look: no interval yet
    share.look(added=1100, sent=200, now_s=10.25)  # only its own rows were added
    assert share.limit == 128
    for _ in range(3):
        share.answered(0.02)
    assert share.wait_s == pytest.approx(0.02)
    share.look(added=1700, sent=300, now_s=10.5)  # 500 others in 0.25 s
    assert share.limit == 40
    share.look(added=None, sent=300, now_s=10.75)  # a Redis that does not say
    assert share.limit == 128
