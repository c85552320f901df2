"""Closed-loop client load for the benchmarks beside Triton: simulated users, each one
thread that sends its next request when the last is answered, spread over up to four
client processes (one Python process cannot keep many gRPC users busy by itself).

A benchmark supplies one user loop, a module-level function (client processes may be
spawned, so it must pickle by name) called as ``user(*user_args, index, stop_at, tally)``:
it opens its own client, sends until ``time.monotonic()`` passes ``stop_at``, records a
latency per request (seconds) in ``tally.samples_s`` and the answers it got in
``tally.answers``, and raises on a failure (which ends that user only).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Load", "Tally", "drive", "run_users"]

#: client processes at the most
PROCESSES = 4


@dataclass
class Tally:
    """What one user has seen so far."""

    samples_s: list[float] = field(default_factory=list)
    answers: int = 0


@dataclass(frozen=True)
class Load:
    """All users of one run: their latencies (s, sorted), answers, and the run's length."""

    samples_s: list[float]
    answers: int
    elapsed_s: float

    @property
    def per_s(self) -> float:
        """Answers per second."""
        return self.answers / self.elapsed_s

    def ms(self, q: float) -> float:
        """The latency (ms) at quantile ``q`` (0.5: p50; 0.99: p99) of the samples."""
        return 1000 * self.samples_s[min(len(self.samples_s) - 1, int(len(self.samples_s) * q))]


def run_users(
    user: Callable[..., None], user_args: tuple, users: int, seconds: float
) -> tuple[list[float], int, list[str]]:
    """``users`` threads in this process, each running ``user`` for ``seconds`` (each
    thread is waited for ``seconds`` + 120 s at the most): (latencies in s, answers,
    errors as ``repr`` texts)."""
    stop_at = time.monotonic() + seconds
    samples: list[float] = []
    answers = [0]
    errors: list[str] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        tally = Tally()
        try:
            user(*user_args, index, stop_at, tally)
        except Exception as exc:
            errors.append(repr(exc))
        finally:
            with lock:
                samples.extend(tally.samples_s)
                answers[0] += tally.answers

    threads = [threading.Thread(target=run, args=(i,)) for i in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 120)
    return samples, answers[0], errors


def _client_process(
    user: Callable[..., None],
    user_args: tuple,
    users: int,
    seconds: float,
    out: multiprocessing.Queue,
) -> None:
    """One client process: puts :func:`run_users`'s result on ``out``."""
    out.put(run_users(user, user_args, users, seconds))


def drive(
    user: Callable[..., None], user_args: tuple, conc: int, seconds: float, against: str
) -> Load:
    """``conc`` users of ``user`` over up to :data:`PROCESSES` client processes for
    ``seconds``.

    Raises:
        SystemExit: naming ``against`` and the first three errors, when any user failed.
    """
    processes = min(conc, PROCESSES)
    share = [conc // processes + (1 if i < conc % processes else 0) for i in range(processes)]
    results: multiprocessing.Queue = multiprocessing.Queue()
    started = time.monotonic()
    workers = [
        multiprocessing.Process(target=_client_process, args=(user, user_args, n, seconds, results))
        for n in share
    ]
    for worker in workers:
        worker.start()
    collected = [results.get(timeout=seconds + 180) for _ in workers]
    for worker in workers:
        worker.join(30)
    elapsed = time.monotonic() - started
    errors = [e for _, _, errs in collected for e in errs]
    if errors:
        raise SystemExit(f"client errors against {against}: {errors[:3]}")
    return Load(
        sorted(t for ts, _, _ in collected for t in ts),
        sum(n for _, n, _ in collected),
        elapsed,
    )
