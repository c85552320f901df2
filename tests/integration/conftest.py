"""Integration fixtures: a started MultiplexedConnection on the test Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from sluice.broker.multiplex import MultiplexedConnection


@pytest.fixture
async def connection(redis_url: str) -> AsyncIterator[MultiplexedConnection]:
    """A started connection (5 s timeout), stopped after the test."""
    conn = MultiplexedConnection(redis_url, timeout_s=5.0)
    await conn.start()
    yield conn
    await conn.stop()
