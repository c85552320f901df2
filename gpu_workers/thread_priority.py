"""Helper threads of a framework at idle priority (Linux ``SCHED_IDLE``).

A model instance's framework parallelizes one execution over a thread pool: ONNX
Runtime's intra-op pool runs each operator on the calling thread and ``n - 1``
helper threads. On a machine that also runs the gateway and Redis, helpers at
normal priority take the cores that turn a batch's answers around, so the next
batch forms smaller and every row costs more (ORT's per-call cost is mostly the
weights read once per call). At ``SCHED_IDLE`` a helper runs only on a CPU that
nothing else wants: where a core is free it speeds the execution as before, where
none is the calling thread does the helper's share itself (ORT's thread pool lets
the caller take the work items no helper has started). Where the gateway keeps the
cores busy, a helper at ``SCHED_IDLE`` serves more requests per second than one thread
or a helper at normal priority (batches form larger); where cores are idle, it takes
them as a normal helper would (docs/user-guide/backends.md, "Threads";
docs/performance.md).

The helpers are found as the threads a call started that Python does not know
(``/proc/self/task`` before and after, less ``threading.enumerate()``): frameworks
do not name their pool threads, and a Python thread (the heartbeat) must never be
slowed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)

__all__ = ["native_threads", "set_idle", "started_threads"]

_TASKS = "/proc/self/task"

T = TypeVar("T")


def native_threads() -> set[int]:
    """Thread ids (TIDs) of this process that Python's ``threading`` does not know.

    Returns an empty set where ``/proc`` is absent (not Linux).
    """
    try:
        tids = {int(name) for name in os.listdir(_TASKS)}
    except OSError:
        return set()
    known = {t.native_id for t in threading.enumerate() if t.native_id is not None}
    return tids - known


def started_threads(call: Callable[[], T]) -> tuple[T, set[int]]:
    """Run ``call`` and return its result with the native threads it started that still
    run (see :func:`native_threads`).

    Raises:
        Exception: whatever ``call`` raises.
    """
    before = native_threads()
    result = call()
    return result, native_threads() - before


def set_idle(tids: set[int], what: str) -> int:
    """Move each thread of ``tids`` to ``SCHED_IDLE`` (Linux ``sched_setscheduler``).

    Lowering a thread's priority needs no privilege; a thread that exited meanwhile is
    skipped. Where the platform has no ``SCHED_IDLE`` nothing changes (logged once).

    Args:
        tids: thread ids of this process.
        what: who owns them, for the log (e.g. ``"model 'mlp' instance 'mlp_0'"``).

    Returns:
        How many threads were moved.
    """
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        if tids:
            logger.info(
                "%s: SCHED_IDLE is not available here; helper threads left as they are", what
            )
        return 0
    moved = 0
    for tid in sorted(tids):
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:
            continue
        except OSError as exc:
            logger.warning("%s: cannot set thread %d to SCHED_IDLE (%s)", what, tid, exc)
            continue
        moved += 1
    if moved:
        logger.info("%s: %d framework helper thread(s) at SCHED_IDLE", what, moved)
    return moved
