"""Pure scheduling policy: Triton's dynamic batcher as a sans-I/O state machine.

Imports only the stdlib and numpy, and time is passed in as ``now_ns``, so every
decision can be tested without I/O or a clock.
"""

from __future__ import annotations

from sluice.batching.dynamic import (
    Accepted,
    Admission,
    Batch,
    DynamicBatcher,
    Expired,
    Pending,
    Rejected,
)
from sluice.batching.errors import BatchingError, BatchingPolicyError
from sluice.batching.policy import DynamicBatchingPolicy, QueuePolicy, TimeoutAction
from sluice.batching.tensors import concat_input, concat_inputs, split_outputs

__all__ = [
    "Accepted",
    "Admission",
    "Batch",
    "BatchingError",
    "BatchingPolicyError",
    "DynamicBatcher",
    "DynamicBatchingPolicy",
    "Expired",
    "Pending",
    "QueuePolicy",
    "Rejected",
    "TimeoutAction",
    "concat_input",
    "concat_inputs",
    "split_outputs",
]
