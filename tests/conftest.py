"""Shared fixtures: a real Redis (started here when none answers) and test markers by folder."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from sluice.broker.cluster import sync_client
from sluice.broker.redis_server import redis_answers, start_private_redis, stop_private_redis

TESTS = Path(__file__).parent

# The fuzz tests' profile (``@settings(settings.get_profile("fuzz"))``): a few hundred
# examples each in CI; ``SLUICE_FUZZ_EXAMPLES`` sets more for a longer run.
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--redis-url",
        default="redis://127.0.0.1:6379/0",
        help="Redis used by integration and e2e tests; started privately if it does not answer",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(TESTS).parts
        if parts[0] == "integration":
            item.add_marker(pytest.mark.integration)
        elif parts[0] == "e2e":
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Redis that answers: the one named by ``--redis-url``, else a private redis-server."""
    url = request.config.getoption("--redis-url")
    if redis_answers(url):
        yield url
        return
    process: subprocess.Popen[bytes]
    process, private_url = start_private_redis()
    try:
        yield private_url
    finally:
        stop_private_redis(process)


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    prefix = f"sluice-test-{uuid.uuid4().hex[:8]}:"
    yield prefix
    client = sync_client(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
