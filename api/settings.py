"""Gateway settings (pydantic-settings; ``SLUICE_`` prefix, ``__`` nests).

Example: ``SLUICE_REDIS__URL=redis://10.0.0.5:6379/0 SLUICE_HTTP__PORT=8000 sluice gateway``.
"""

from __future__ import annotations

import uuid

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from broker.settings import RedisSettings


class HttpSettings(BaseModel):
    """The HTTP/REST front end (Triton ``--http-*`` flags)."""

    enabled: bool = True
    """Triton ``--allow-http``."""
    address: str = "0.0.0.0"
    """Triton ``--http-address``."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Triton ``--http-port``."""
    max_body_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """Largest accepted request body, in bytes; a larger one is refused with 400."""


class GatewaySettings(BaseSettings):
    """Everything one gateway process needs."""

    model_config = SettingsConfigDict(
        env_prefix="SLUICE_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    redis: RedisSettings = RedisSettings()
    http: HttpSettings = HttpSettings()
    gateway_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Names this gateway's reply key; unique per process."""
    server_id: str = "triton"
    """Server metadata ``name`` (Triton ``--id``)."""
    request_timeout_s: float = Field(default=60.0, gt=0)
    """Longest a request may wait for its answer when the client sets no timeout, in seconds."""
    model_cache_s: float = Field(default=0.5, ge=0)
    """How long a gateway reuses a model's config and states before reading Redis again, in s."""
    strict_readiness: bool = True
    """Triton ``--strict-readiness``: ready only when every model with a state is READY."""
    log_verbose: int = 0
    """Triton ``--log-verbose``."""
