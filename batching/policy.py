"""Frozen batching policies, built by the worker from a model's ``config.pbtxt``.

These mirror Triton's ``ModelQueuePolicy`` and ``ModelDynamicBatching`` messages
(``model_config.proto``; docs/reference/model-configuration.md, dynamic batcher) as
plain dataclasses so that `batching` never imports protobuf. Units are in the field names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from sluice.batching.errors import BatchingPolicyError

__all__ = ["DynamicBatchingPolicy", "QueuePolicy", "TimeoutAction"]

TimeoutAction = Literal["REJECT", "DELAY"]


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton ``ModelQueuePolicy`` for one priority level (or the single queue).

    Attributes:
        timeout_action: What happens to a request older than its timeout when the
            batcher next examines it: ``"REJECT"`` fails it with ``Request timeout
            expired`` (UNAVAILABLE), ``"DELAY"`` moves it behind all non-expired
            requests of its level (it still runs).
        default_timeout_us: Queue timeout in microseconds; 0 means no timeout.
        allow_timeout_override: Whether a request's ``timeout`` parameter may
            shorten ``default_timeout_us`` (it can never lengthen it).
        max_queue_size: Most requests the level may hold; 0 means unbounded.

    Raises:
        BatchingPolicyError: For an unknown action or a negative number.
    """

    timeout_action: TimeoutAction = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def __post_init__(self) -> None:
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise BatchingPolicyError(
                f"queue policy timeout_action must be 'REJECT' or 'DELAY', "
                f"got {self.timeout_action!r}"
            )
        if self.default_timeout_us < 0:
            raise BatchingPolicyError(
                f"queue policy default_timeout_microseconds must be >= 0, "
                f"got {self.default_timeout_us}"
            )
        if self.max_queue_size < 0:
            raise BatchingPolicyError(
                f"queue policy max_queue_size must be >= 0, got {self.max_queue_size}"
            )


@dataclass(frozen=True, slots=True)
class DynamicBatchingPolicy:
    """Triton ``dynamic_batching`` settings plus the model's ``max_batch_size``.

    Attributes:
        max_batch_size: Model ``max_batch_size``; 0 means the model does not batch
            and every request is its own batch (queueing, priorities and timeouts
            still apply).
        preferred_batch_sizes: ``preferred_batch_size``; each in
            ``[1, max_batch_size]``. Empty means the largest preferred size is
            ``max_batch_size``.
        max_queue_delay_us: ``max_queue_delay_microseconds``: how long the oldest
            pending request may wait for a bigger batch.
        preserve_ordering: Responses leave in arrival order (enforced by the
            worker; this policy rejects the combinations that would reorder).
        priority_levels: Number of levels, 1 = highest; 0 = one queue and the
            request priority is ignored.
        default_priority_level: Level of requests with priority 0 or above
            ``priority_levels``; must be in ``[1, priority_levels]`` when levels > 0.
        default_queue_policy: Policy of the single queue and of levels without an
            entry in ``priority_queue_policy``.
        priority_queue_policy: Per-level policies; keys in ``[1, priority_levels]``.
            Stored as a read-only mapping and left out of the hash.

    Raises:
        BatchingPolicyError: For any combination Triton refuses at load time.
    """

    max_batch_size: int
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: Mapping[int, QueuePolicy] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "preferred_batch_sizes", tuple(self.preferred_batch_sizes))
        object.__setattr__(
            self,
            "priority_queue_policy",
            MappingProxyType(dict(sorted(self.priority_queue_policy.items()))),
        )
        if self.max_batch_size < 0:
            raise BatchingPolicyError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        for size in self.preferred_batch_sizes:
            # model_config_utils.cc: "dynamic batching preferred size must be positive"
            # and "... must be <= max batch size" (so none is allowed when it is 0).
            if not 1 <= size <= self.max_batch_size:
                raise BatchingPolicyError(
                    f"dynamic batching preferred size {size} must be in "
                    f"[1, max_batch_size={self.max_batch_size}]"
                )
        if self.max_queue_delay_us < 0:
            raise BatchingPolicyError(
                f"max_queue_delay_microseconds must be >= 0, got {self.max_queue_delay_us}"
            )
        if self.priority_levels < 0:
            raise BatchingPolicyError(f"priority_levels must be >= 0, got {self.priority_levels}")
        if self.priority_levels > 0 and not (
            1 <= self.default_priority_level <= self.priority_levels
        ):
            raise BatchingPolicyError(
                f"default priority level {self.default_priority_level} must be in "
                f"range [1, {self.priority_levels}]"
            )
        for level in self.priority_queue_policy:
            if not 1 <= level <= self.priority_levels:
                raise BatchingPolicyError(
                    f"priority queue policy must have priority level in range "
                    f"[1, {self.priority_levels}], got {level}"
                )
        if self.preserve_ordering:
            if self.priority_levels > 1:
                raise BatchingPolicyError(
                    "preserve_ordering cannot be combined with priority_levels > 1"
                )
            for policy in (self.default_queue_policy, *self.priority_queue_policy.values()):
                if policy.timeout_action == "DELAY" and policy.default_timeout_us > 0:
                    raise BatchingPolicyError(
                        "preserve_ordering cannot be combined with a DELAY queue policy "
                        "that has a timeout"
                    )

    @property
    def max_preferred_batch_size(self) -> int:
        """Largest preferred size (``PMAX``), ``max_batch_size`` when none is given."""
        return max(self.preferred_batch_sizes, default=self.max_batch_size)

    def level_of(self, priority: int) -> int:
        """Map a request priority to its queue level (Triton ``priority_levels``).

        Triton: priority 0, or greater than ``priority_levels``, maps to
        ``default_priority_level``; with ``priority_levels: 0`` priority is ignored.

        Args:
            priority: The request's ``priority`` parameter (0 = not given).

        Returns:
            The level, 1 = highest; 0 when the model has a single queue.
        """
        if self.priority_levels == 0:
            return 0
        if priority <= 0 or priority > self.priority_levels:
            return self.default_priority_level
        return priority

    def queue_policy(self, level: int) -> QueuePolicy:
        """The ``ModelQueuePolicy`` of a level (``priority_queue_policy`` or the default).

        Args:
            level: A level from `level_of`.

        Returns:
            The level's own policy, else ``default_queue_policy``.
        """
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    def timeout_ns(self, level: int, requested_timeout_us: int | None) -> int | None:
        """The queue timeout of a request in nanoseconds (Triton ``ModelQueuePolicy``).

        Triton: with ``allow_timeout_override`` the request ``timeout`` may only
        shorten the level's default (``min(default, request)``); a request value
        of 0 means "not given"; a default of 0 means no timeout at all, and the
        request value is then ignored.

        Args:
            level: A level from `level_of`.
            requested_timeout_us: The request's ``timeout`` parameter in
                microseconds, or None when absent.

        Returns:
            The timeout in nanoseconds, or None when the request never times out.
        """
        policy = self.queue_policy(level)
        timeout_us = policy.default_timeout_us
        if timeout_us == 0:
            return None
        if (
            policy.allow_timeout_override
            and requested_timeout_us is not None
            and requested_timeout_us > 0
        ):
            timeout_us = min(timeout_us, requested_timeout_us)
        return timeout_us * 1000
