"""The private redis-server (``sluice serve``'s fallback when no Redis answers): reachable
by this user only, and gone with the process that started it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from broker.redis_server import start_private_redis, stop_private_redis

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _needs_redis_server() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")


def test_it_listens_on_a_unix_socket_only_and_leaves_nothing_behind() -> None:
    process, url = start_private_redis()
    folder = Path(url[len("unix://") :].split("?")[0]).parent
    try:
        client = redis.Redis.from_url(url)
        assert client.config_get("port") == {"port": "0"}  # no TCP port: it has no password
        assert client.config_get("unixsocketperm") == {"unixsocketperm": "700"}
        client.close()
        assert folder.name.startswith("sluice-redis-") and folder.is_dir()
    finally:
        stop_private_redis(process)
    assert process.returncode is not None
    assert not folder.exists()


def test_it_exits_when_the_process_that_started_it_is_killed() -> None:
    """A ``sluice serve`` killed with SIGKILL leaves no redis-server behind."""
    code = (
        "import time; from broker.redis_server import start_private_redis, stop_private_redis; "
        "p, u = start_private_redis(); print(p.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait(10)
    deadline = time.monotonic() + 5
    while _running(pid):
        assert time.monotonic() < deadline, "redis-server outlived the process that started it"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child of init is reaped at once)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status and os.path.exists(f"/proc/{pid}")
