"""The private redis-server (``sluice serve``'s fallback when no Redis answers): reachable
by this user only, and gone with the process that started it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from sluice.broker.redis_server import (
    private_redis_url,
    remove_stale_folders,
    restart_private_redis,
    start_private_redis,
    stop_private_redis,
)
from sluice.supervisor.supervisor import ServeOptions, Supervisor

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


def test_a_ctrl_c_to_the_terminals_process_group_does_not_reach_it() -> None:
    """Ctrl-C signals the whole foreground group; redis-server shuts down on SIGINT, and
    the instances that drain the queues at an exit still need it."""
    code = (
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "from broker.redis_server import start_private_redis; "
        "p, u = start_private_redis(); print(p.pid, u, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert parent.stdout is not None
    pid_text, url = parent.stdout.readline().split()
    try:
        os.killpg(parent.pid, signal.SIGINT)
        time.sleep(0.5)
        assert _running(int(pid_text))
        client = redis.Redis.from_url(url, socket_timeout=5)
        assert client.ping() is True
        client.close()
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 5
    while _running(int(pid_text)):
        assert time.monotonic() < deadline, "redis-server outlived the process that started it"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child of init is reaped at once)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status and os.path.exists(f"/proc/{pid}")


def test_a_killed_one_is_started_again_at_the_same_url(tmp_path: Path) -> None:
    """``sluice serve``'s watch loop starts its private redis-server again when it dies
    (killed, out of memory): same socket, so every process reconnects; empty, so the
    supervisor publishes the deployment's state again."""
    process, url = start_private_redis()
    supervisor = Supervisor(ServeOptions(repositories=(tmp_path,), redis_url=url))
    supervisor.private_redis = process
    try:
        supervisor.store.set_server(startup="done", model_control_mode="none")
        client = redis.Redis.from_url(url)
        client.set("left-over", 1)
        supervisor._restart_private_redis_if_dead()  # alive: nothing happens
        assert supervisor.private_redis is process

        process.kill()
        process.wait(10)
        supervisor._restart_private_redis_if_dead()
        assert supervisor.private_redis is not process
        assert supervisor.private_redis.poll() is None
        assert private_redis_url(supervisor.private_redis) == url
        assert client.get("left-over") is None  # the same URL answers, empty
        assert client.config_get("port") == {"port": "0"}
        assert not client.exists(supervisor.keys.server())

        supervisor._republish_if_lost()
        assert client.exists(supervisor.keys.server())
        client.close()
    finally:
        supervisor.client.close()
        if supervisor.private_redis is not None:
            stop_private_redis(supervisor.private_redis)
    assert not Path(url[len("unix://") :].split("?")[0]).parent.exists()


def test_a_restart_that_fails_is_tried_again_with_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    process, url = start_private_redis()
    stop_private_redis(process)
    args = [str(a) for a in process.args]
    good = list(args)
    args[args.index("--loglevel") + 1] = "nonsense"  # redis-server refuses to start
    process.args = args
    with pytest.raises(RuntimeError, match="exited with code 1 at start"):
        restart_private_redis(process, timeout_s=5)

    supervisor = Supervisor(ServeOptions(repositories=(tmp_path,), redis_url=url))
    supervisor.private_redis = process
    try:
        supervisor._restart_private_redis_if_dead()
        supervisor._restart_private_redis_if_dead()  # within the backoff: not tried
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 2, errors
        assert errors[0].startswith("the private redis-server exited with code")
        assert errors[1].endswith("next try in 1 s")
        assert supervisor.private_redis is process

        process.args = good  # whatever stopped it is gone
        supervisor._redis_retry_at = 0.0  # the backoff has run out
        supervisor._restart_private_redis_if_dead()
        assert supervisor.private_redis is not process
        assert redis.Redis.from_url(url).ping()
    finally:
        supervisor.client.close()
        if supervisor.private_redis is not None:
            stop_private_redis(supervisor.private_redis)


def test_folders_left_by_a_killed_server_are_removed_at_the_next_start(tmp_path: Path) -> None:
    """A ``sluice serve`` killed with SIGKILL leaves its folder (its redis-server exits with
    it): the next private redis-server removes such folders, not a live server's, nor a
    folder that may belong to a server still starting."""
    live, url = start_private_redis()
    live_folder = Path(url[len("unix://") :].split("?")[0]).parent
    try:
        os.kill(live.pid, signal.SIGSTOP)  # alive but stopped: still counts as in use
        old = time.time() - 3600
        os.utime(live_folder, (old, old))
        stale = tmp_path / "sluice-redis-stale"
        stale.mkdir()
        (stale / "redis.sock").write_text("")  # a socket file nobody listens on
        os.utime(stale, (old, old))
        young = tmp_path / "sluice-redis-young"
        young.mkdir()
        other = tmp_path / "unrelated"
        other.mkdir()
        os.utime(other, (old, old))
        assert remove_stale_folders(str(tmp_path)) == [str(stale)]
        assert young.exists() and other.exists() and not stale.exists()
        assert str(live_folder) not in remove_stale_folders(str(live_folder.parent))
        assert live_folder.exists()
    finally:
        os.kill(live.pid, signal.SIGCONT)
        stop_private_redis(live)
