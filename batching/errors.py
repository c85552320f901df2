"""Errors raised by the pure batching package.

`batching` imports nothing of Sluice, so the codes are plain strings with the
names of Triton's ``TRITONSERVER_Error_Code`` (docs/reference/errors.md); the worker
and the API layer map them to transport statuses. Scheduling *decisions* (queue full,
timeout expired) are return values, never exceptions: they are expected outcomes the
caller answers a request with, not faults.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["BatchingError", "BatchingPolicyError"]


class BatchingError(Exception):
    """A batching invariant is broken (e.g. a backend returned the wrong batch size).

    Attributes:
        code: Triton error code name; INTERNAL (HTTP 500) for broken invariants.
    """

    code: ClassVar[str] = "INTERNAL"


class BatchingPolicyError(BatchingError, ValueError):
    """A batching policy breaks a ``model_config.proto`` rule.

    Attributes:
        code: INVALID_ARG (HTTP 400), as Triton reports invalid model configs.
    """

    code: ClassVar[str] = "INVALID_ARG"
