"""Redis connection settings (``SLUICE_REDIS__URL``, ``SLUICE_REDIS__KEY_PREFIX``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RedisSettings(BaseModel):
    """Where the broker lives.

    Attributes:
        url: Redis URL, e.g. ``redis://127.0.0.1:6379/0``.
        key_prefix: prefix of every key of this deployment.
        socket_timeout_s: bound on any single Redis call that is not a blocking read.
    """

    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL, e.g. ``redis://127.0.0.1:6379/0``."""
    key_prefix: str = "sluice:"
    """Prefix of every key of this deployment."""
    socket_timeout_s: float = Field(default=10.0, gt=0)
    """Bound on a single Redis call, in seconds (blocking reads add their block time)."""
