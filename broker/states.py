"""Lifecycle states of model versions and model instances, and their transitions.

Both are kept in Redis (``sluice.broker.model_store``) and read by every gateway, so the
names are the wire values too.

Model version (:class:`ModelState`), Triton's ``ModelReadyState`` names as the repository
index reports them (docs/reference/http-protocol.md, "Repository extension")::

    (none) ──load──▶ LOADING ──every instance READY──▶ READY ──unload──▶ UNLOADING ──▶ UNAVAILABLE
                        │                              │  ▲
                        └──load failed──▶ UNAVAILABLE  └──┘ reload (new load_id)

A version is served only while READY; UNAVAILABLE carries the reason (the load error,
or "unloaded"). UNKNOWN is what a reader reports for a version Redis has no state for.

Model instance (:class:`InstanceState`), one record per instance process::

    LOADING ──backend initialized, warm-up done──▶ READY ──SIGTERM, drained──▶ STOPPED
       │                                             │
       └──load failed──▶ UNAVAILABLE                 └──heartbeat stale──▶ (dead)

An instance is live while READY with a fresh heartbeat. A peer claims the pending
requests of an instance that is STOPPED, UNAVAILABLE or whose heartbeat is stale. A
retired instance that still holds requests is written STOPPED with the reason
:data:`RETIRED_HOLDING` until a peer has taken them.

Async job (:class:`JobState`), Celery's state names (docs/user-guide/jobs.md)::

    PENDING ──a job worker takes it──▶ STARTED ──▶ SUCCESS | FAILURE
       │  └──deadline passed, input unreadable──▶ FAILURE      │
       └──DELETE──▶ REVOKED ◀──DELETE─────────────────────────┘

A job worker that dies leaves its job STARTED; the next one to take the job's task
starts it again (STARTED -> STARTED). SUCCESS, FAILURE and REVOKED are final: a job
reaches one of them once (``broker.job_store``, a compare-and-set in Redis).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["JOB_TRANSITIONS", "RETIRED_HOLDING", "InstanceState", "JobState", "ModelState"]


class ModelState(StrEnum):
    """A model version's state: Triton's repository index ``state`` values."""

    UNKNOWN = "UNKNOWN"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


class InstanceState(StrEnum):
    """A model instance process's state, written by the instance itself."""

    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    STOPPED = "STOPPED"

    @property
    def gone(self) -> bool:
        """True when the instance will take no more requests (its pending ones may be claimed)."""
        return self in (InstanceState.STOPPED, InstanceState.UNAVAILABLE)


#: Reason of the STOPPED record the supervisor keeps for an instance of a replaced
#: generation that still owns pending requests (a reload's old instance that was killed
#: or stopped past its drain timeout): a peer claims them at once, then the record goes.
RETIRED_HOLDING = "retired holding requests"


class JobState(StrEnum):
    """An async job's state (Celery's task state names)."""

    PENDING = "PENDING"
    STARTED = "STARTED"
    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    REVOKED = "REVOKED"

    @property
    def final(self) -> bool:
        """True for SUCCESS, FAILURE and REVOKED: nothing changes the job any more."""
        return self not in (JobState.PENDING, JobState.STARTED)


#: The states a job may move to from each state (a final state moves nowhere).
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTED, JobState.FAILURE, JobState.REVOKED}),
    JobState.STARTED: frozenset(
        {JobState.STARTED, JobState.SUCCESS, JobState.FAILURE, JobState.REVOKED}
    ),
    JobState.SUCCESS: frozenset(),
    JobState.FAILURE: frozenset(),
    JobState.REVOKED: frozenset(),
}
