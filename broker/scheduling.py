"""From a model config to the scheduling facts every process agrees on.

The gateway uses them to pick the stream of a request's priority level and to
enforce ``max_queue_size``; the worker uses them to drive its batcher. Source:
Triton model_config.proto ``ModelDynamicBatching`` / ``ModelQueuePolicy``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelQueuePolicy

from sluice.batching import DynamicBatchingPolicy, QueuePolicy
from sluice.broker.keys import KeySchema
from sluice.broker.messages import WireTensor
from sluice.repository.validate import queue_shards


def _queue_policy(raw: ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        timeout_action="DELAY" if raw.timeout_action == ModelQueuePolicy.DELAY else "REJECT",
        default_timeout_us=int(raw.default_timeout_microseconds),
        allow_timeout_override=bool(raw.allow_timeout_override),
        max_queue_size=int(raw.max_queue_size),
    )


def scheduling_policy(config: ModelConfig) -> DynamicBatchingPolicy:
    """The batcher policy of ``config``.

    Without ``dynamic_batching`` this is Triton's default scheduler: every request is
    its own batch (``max_batch_size`` 0 for the batcher), no delay, no queue policy.

    Raises:
        batching.BatchingPolicyError: the config's batching fields contradict each other.
    """
    if not config.HasField("dynamic_batching"):
        return DynamicBatchingPolicy(max_batch_size=0)
    db = config.dynamic_batching
    return DynamicBatchingPolicy(
        max_batch_size=int(config.max_batch_size),
        preferred_batch_sizes=tuple(int(s) for s in db.preferred_batch_size),
        max_queue_delay_us=int(db.max_queue_delay_microseconds),
        preserve_ordering=bool(db.preserve_ordering),
        priority_levels=int(db.priority_levels),
        default_priority_level=int(db.default_priority_level),
        default_queue_policy=_queue_policy(db.default_queue_policy),
        priority_queue_policy={
            int(level): _queue_policy(policy) for level, policy in db.priority_queue_policy.items()
        },
    )


def stream_layout(keys: KeySchema, model: str, version: int, config: ModelConfig) -> StreamLayout:
    """The :class:`StreamLayout` of a version of ``config``'s model (its scheduling policy
    and ``queue_shards``).

    Raises:
        batching.BatchingPolicyError: the config's batching fields contradict each other.
        repository.ConfigError: a malformed ``queue_shards`` parameter.
    """
    return StreamLayout(keys, model, version, scheduling_policy(config), queue_shards(config))


@dataclass(frozen=True, slots=True)
class StreamLayout:
    """The streams of one model version: one per priority level (level 0 = no levels) and
    queue shard.

    A model whose queue is split (``queue_shards`` > 1) has one stream per level and
    shard, each shard's streams under a hash tag of its own (``broker.keys.shard_tag``),
    so that a Redis Cluster spreads them over its primaries; gateways spread requests over
    the shards, and every instance reads all of them.
    """

    keys: KeySchema
    model: str
    version: int
    policy: DynamicBatchingPolicy
    shards: int = 1

    def levels(self) -> tuple[int, ...]:
        """Priority levels that have a stream, highest priority (1) first; ``(0,)`` if none."""
        if self.policy.priority_levels <= 0:
            return (0,)
        return tuple(range(1, self.policy.priority_levels + 1))

    def stream(self, level: int, shard: int = 0) -> str:
        """Stream key of ``level`` in queue shard ``shard``."""
        return self.keys.queue(self.model, self.version, level, shard, self.shards)

    def streams(self) -> list[str]:
        """Every stream key, highest priority first (each level's shards in order)."""
        return [
            self.stream(level, shard) for level in self.levels() for shard in range(self.shards)
        ]

    def shard_limit(self, max_queue_size: int) -> int:
        """The ``max_queue_size`` of one shard's stream: the level's limit split evenly,
        rounded up (0 stays unbounded)."""
        return -(-max_queue_size // self.shards)

    def level_of(self, priority: int) -> int:
        """Triton: priority 0 or above ``priority_levels`` → ``default_priority_level``."""
        return self.policy.level_of(priority) if self.policy.priority_levels > 0 else 0


class ShapeKeys:
    """Builds the batcher's ``shape_key``: requests with equal keys may share a batch.

    Triton ``dynamic_batch_scheduler.cc``: inputs whose ``dims`` contain -1 and that are not
    ``allow_ragged_batch`` must have equal shapes across a batch; the set of supplied inputs
    must be equal (optional inputs); shape tensors must have equal contents.
    """

    def __init__(self, config: ModelConfig) -> None:
        self._compared = frozenset(
            t.name
            for t in config.input
            if (-1 in t.dims and not t.allow_ragged_batch) or t.is_shape_tensor
        )
        self._shape_tensors = frozenset(t.name for t in config.input if t.is_shape_tensor)

    def key(self, inputs: Sequence[WireTensor]) -> Hashable:
        """Key of one request from its input tensors (shapes batch dim first, raw data).

        A model with no variable-size input and no shape tensor gives every request
        the key of its sorted input names (only the set of supplied inputs matters).
        """
        if not self._compared:
            if len(inputs) == 1:
                return inputs[0].name
            return tuple(sorted(t.name for t in inputs))
        parts: list[tuple[str, object]] = []
        for tensor in sorted(inputs, key=_name):
            name = tensor.name
            if name in self._shape_tensors:
                parts.append((name, tensor.data))
            elif name in self._compared:
                parts.append((name, tuple(tensor.shape[1:])))
            else:
                parts.append((name, None))
        return tuple(parts)


def _name(tensor: WireTensor) -> str:
    return tensor.name
