"""Triton's sequence batcher as a sans-I/O state machine, for one model instance.

Every request of a sequence carries its correlation id and its step number ``n``
(1, 2, … in the order the gateways queued them, never reused for that id). Step ``n``
may run once every earlier step of its id has run (its ``done`` count is ``n - 1``),
never two steps of one sequence at once, and at most one step of a sequence per batch.
Where the step numbers come from and where ``done`` is kept (Redis) is the caller's
business; this module only decides what runs next. Time is passed in as ``now_ns``.

Rules (Triton ``docs/user_guide/model_configuration.md`` "Sequence Batcher" and
``src/sequence_batch_scheduler``):

* *Candidates*: an instance runs at most ``capacity`` live sequences at once — the
  batch slots of the ``direct`` strategy (``max(1, max_batch_size)``), or
  ``max_candidate_sequences`` of ``oldest``. A sequence becomes live when its first
  step is admitted and stops being live when its END step has run or it has been idle
  for ``max_sequence_idle_microseconds``. A step of a sequence that is not live waits
  (Triton's backlog) until a candidate frees up; backlogged sequences are admitted
  oldest first.
* *Batches*: ready steps are batched oldest first, up to ``max(1, max_batch_size)``.
  A batch leaves at once when it is full, reaches a preferred batch size, when every
  live sequence has its next step in it (no other step can join), or when the oldest
  step has waited ``max_queue_delay_microseconds``; otherwise the caller asks again at
  :meth:`SequenceScheduler.wake_at`.
* ``direct`` here does not pad a batch with filler rows for idle slots (Triton does,
  with READY false): every row of a batch is a real step. A model that keeps state by
  batch row (rather than by correlation id or implicit state) is not supported.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from sluice.batching.errors import BatchingPolicyError

__all__ = [
    "SequenceBatch",
    "SequencePolicy",
    "SequenceScheduler",
    "SequenceStep",
]

Strategy = Literal["direct", "oldest"]

#: Triton's default ``max_sequence_idle_microseconds`` (normalization fills 0 with it).
DEFAULT_IDLE_US = 1_000_000


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    """What the model config's ``sequence_batching`` block asks of one instance.

    Attributes:
        strategy: ``direct`` or ``oldest``.
        max_batch_size: the model's ``max_batch_size`` (0: one step per execution).
        capacity: live sequences at once: ``max(1, max_batch_size)`` for ``direct``,
            ``max_candidate_sequences`` for ``oldest``.
        preferred_batch_sizes: ``oldest.preferred_batch_size`` (may be empty).
        max_queue_delay_us: how long the oldest ready step may wait for a fuller batch.
        idle_us: ``max_sequence_idle_microseconds``.
    """

    strategy: Strategy
    max_batch_size: int
    capacity: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    idle_us: int = DEFAULT_IDLE_US

    def __post_init__(self) -> None:
        if self.strategy not in ("direct", "oldest"):
            raise BatchingPolicyError(f"unknown sequence batching strategy {self.strategy!r}")
        if self.max_batch_size < 0:
            raise BatchingPolicyError("max_batch_size must be >= 0")
        if self.capacity < 1:
            raise BatchingPolicyError("the number of candidate sequences must be >= 1")
        if self.max_queue_delay_us < 0 or self.idle_us <= 0:
            raise BatchingPolicyError("delays must be >= 0 and the idle time > 0")
        for size in self.preferred_batch_sizes:
            if size < 1 or size > max(1, self.max_batch_size):
                raise BatchingPolicyError(
                    f"preferred batch size {size} must be between 1 and max_batch_size"
                )

    @property
    def batch_limit(self) -> int:
        """Most steps in one execution: ``max(1, max_batch_size)``."""
        return max(1, self.max_batch_size)


@dataclass(slots=True)
class SequenceStep:
    """Scheduling metadata of one queued request of a sequence.

    Attributes:
        id: request id, unique among held steps.
        corrid: the correlation id (any hashable; the caller keeps ``1`` and ``"1"`` apart).
        n: the step's number within its correlation id, from 1.
        start: the request carries ``sequence_start``.
        end: the request carries ``sequence_end``.
        arrival_ns: when the caller took it, on the clock of ``now_ns``.
        known_done: steps of this id known to have run when it was queued (a lower
            bound of ``done``; ``n - 1`` when every earlier step had run).
    """

    id: str
    corrid: Hashable
    n: int
    start: bool
    end: bool
    arrival_ns: int
    known_done: int = 0


@dataclass(slots=True)
class SequenceBatch:
    """Steps to execute together, oldest first; never empty, one per sequence."""

    items: tuple[SequenceStep, ...]

    @property
    def size(self) -> int:
        return len(self.items)


@dataclass(slots=True)
class _Sequence:
    """What the scheduler knows of one correlation id."""

    done: int = 0
    held: list[tuple[int, str, SequenceStep]] = field(default_factory=list)  # heap by n
    live: bool = False
    running: bool = False
    last_active_ns: int = 0


class SequenceScheduler:
    """Decides which steps of which sequences one instance runs next.

    Args:
        policy: the model's sequence batching settings.

    Raises:
        BatchingPolicyError: from :class:`SequencePolicy` for an invalid policy.
    """

    def __init__(self, policy: SequencePolicy) -> None:
        self.policy = policy
        self._seqs: dict[Hashable, _Sequence] = {}
        self._live = 0
        self._steps = 0

    # facts fed in -----------------------------------------------------------------

    def offer(self, step: SequenceStep, now_ns: int) -> None:
        """Hold ``step`` until it can run (a step already run, ``n <= done``, is held
        too: :meth:`take_duplicates` hands it back)."""
        seq = self._seqs.setdefault(step.corrid, _Sequence(last_active_ns=now_ns))
        seq.done = max(seq.done, step.known_done)
        heapq.heappush(seq.held, (step.n, step.id, step))
        self._steps += 1

    def committed(self, corrid: Hashable, done: int) -> None:
        """Learn that ``done`` steps of ``corrid`` have run (read back from the store)."""
        seq = self._seqs.get(corrid)
        if seq is not None and done > seq.done:
            seq.done = done

    def complete(self, steps: Iterable[SequenceStep], now_ns: int) -> None:
        """Steps of a batch that :meth:`take` gave have run (or were answered with an
        error: either way the next step of their sequence may run). An END step's
        sequence stops being live."""
        for step in steps:
            seq = self._seqs[step.corrid]
            seq.running = False
            seq.done = max(seq.done, step.n)
            seq.last_active_ns = now_ns
            if step.end and seq.live:
                seq.live = False
                self._live -= 1
            self._forget_if_idle(step.corrid, seq)

    def drop(self, step_id: str, corrid: Hashable) -> SequenceStep | None:
        """Take a held step back (its request expired or was cancelled); the caller answers
        it and then reports it with :meth:`complete` so that later steps are not blocked."""
        seq = self._seqs.get(corrid)
        if seq is None:
            return None
        for i, (_, sid, step) in enumerate(seq.held):
            if sid == step_id:
                seq.held.pop(i)
                heapq.heapify(seq.held)
                self._steps -= 1
                seq.running = True  # until the caller's complete()
                return step
        return None

    # decisions --------------------------------------------------------------------

    def take_duplicates(self) -> list[SequenceStep]:
        """Held steps that have run already (``n <= done``: delivered again after a crash);
        the caller re-sends their stored answers instead of running them."""
        found: list[SequenceStep] = []
        for seq in self._seqs.values():
            while seq.held and seq.held[0][0] <= seq.done:
                found.append(heapq.heappop(seq.held)[2])
                self._steps -= 1
        return found

    def unknown(self) -> list[Hashable]:
        """Correlation ids whose next held step waits on a step this instance does not
        hold (run elsewhere, before a failover): the caller reads their ``done`` count
        from the store and reports it with :meth:`committed`."""
        return [
            corrid
            for corrid, seq in self._seqs.items()
            if seq.held and not seq.running and seq.held[0][0] > seq.done + 1
        ]

    def take(self, now_ns: int) -> SequenceBatch | None:
        """The batch to run now, or None (ask again at :meth:`wake_at`)."""
        self.release_idle(now_ns)
        ready = self._ready()
        if not ready:
            return None
        limit = self.policy.batch_limit
        chosen = ready[:limit]
        if not self._should_run(chosen, ready, now_ns):
            return None
        for step in chosen:
            seq = self._seqs[step.corrid]
            heapq.heappop(seq.held)
            self._steps -= 1
            seq.running = True
            seq.last_active_ns = now_ns
            if not seq.live:
                seq.live = True
                self._live += 1
        return SequenceBatch(tuple(chosen))

    def wake_at(self, now_ns: int) -> int | None:
        """When the caller should ask :meth:`take` again at the latest (None: only when a
        new fact arrives)."""
        times: list[int] = []
        ready = self._ready()
        if ready:
            times.append(ready[0].arrival_ns + self.policy.max_queue_delay_us * 1000)
        idle_ns = self.policy.idle_us * 1000
        for seq in self._seqs.values():
            if seq.live and not seq.running and not seq.held:
                times.append(seq.last_active_ns + idle_ns)
        return max(now_ns, min(times)) if times else None

    def release_idle(self, now_ns: int) -> list[Hashable]:
        """End the live sequences that have had no step for the idle time; returns them."""
        idle_ns = self.policy.idle_us * 1000
        released: list[Hashable] = []
        for corrid, seq in list(self._seqs.items()):
            if seq.running or seq.held or now_ns - seq.last_active_ns < idle_ns:
                continue
            if seq.live:
                seq.live = False
                self._live -= 1
                released.append(corrid)
            del self._seqs[corrid]
        return released

    # state ------------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Steps held, not yet taken."""
        return self._steps

    @property
    def live(self) -> int:
        """Sequences that hold a candidate now."""
        return self._live

    def is_live(self, corrid: Hashable) -> bool:
        seq = self._seqs.get(corrid)
        return bool(seq and seq.live)

    def _ready(self) -> list[SequenceStep]:
        """Next steps that may run now, oldest first: live sequences' next steps, then
        backlogged sequences' first steps while candidates are free."""
        live: list[SequenceStep] = []
        backlog: list[SequenceStep] = []
        for seq in self._seqs.values():
            if seq.running or not seq.held:
                continue
            step = seq.held[0][2]
            if step.n != seq.done + 1:
                continue
            (live if seq.live else backlog).append(step)
        backlog.sort(key=lambda s: s.arrival_ns)
        free = self.policy.capacity - self._live
        ready = live + backlog[: max(0, free)]
        ready.sort(key=lambda s: s.arrival_ns)
        return ready

    def _should_run(
        self, chosen: list[SequenceStep], ready: list[SequenceStep], now_ns: int
    ) -> bool:
        policy = self.policy
        size = len(chosen)
        if size >= policy.batch_limit or policy.max_queue_delay_us == 0:
            return True
        if policy.preferred_batch_sizes and size in policy.preferred_batch_sizes:
            return True
        # every live sequence (and every admissible one) has its next step here: no
        # other step can join this batch before one of them runs
        waiting_live = sum(
            1 for seq in self._seqs.values() if seq.live and not seq.running and not seq.held
        )
        if waiting_live == 0 and size == len(ready):
            return True
        return now_ns - chosen[0].arrival_ns >= policy.max_queue_delay_us * 1000

    def _forget_if_idle(self, corrid: Hashable, seq: _Sequence) -> None:
        if not seq.live and not seq.held and not seq.running:
            del self._seqs[corrid]
