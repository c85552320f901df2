"""Finding a Redis, starting a private ``redis-server`` when none answers, and clearing a
throwaway key prefix (tests and benchmarks)."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import redis

from sluice.broker.cluster import redacted, sync_client


def redis_answers(url: str, timeout_s: float = 1.0) -> bool:
    """Whether ``PING`` on ``url`` succeeds within ``timeout_s`` seconds."""
    client = sync_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    try:
        return bool(client.ping())
    except redis.exceptions.RedisError:
        return False
    finally:
        client.close()


def delete_prefix(url: str, prefix: str, timeout_s: float = 10.0) -> int:
    """Delete every key under ``prefix`` (SCAN + DEL, 1000 keys a batch); returns how many.

    For the throwaway prefixes of tests and benchmarks once their server stopped: a
    ``sluice serve`` keeps its queues on purpose, so that a restart loses no request.

    Raises:
        ValueError: an empty prefix (that would be the whole database).
        redis.exceptions.RedisError: Redis unreachable within ``timeout_s`` seconds.
    """
    if not prefix:
        raise ValueError("delete_prefix needs a non-empty prefix")
    client = sync_client(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            batch.append(key)
            if len(batch) == 1000:
                deleted += int(client.delete(*batch))
                batch.clear()
        if batch:
            deleted += int(client.delete(*batch))
    finally:
        client.close()
    return deleted


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up in the parent (the child between fork and exec only
    calls it: no dynamic loading there, where another thread may hold the loader's lock);
    None where libc cannot be loaded."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def _die_with_parent(prctl: Callable[..., int]) -> Callable[[], None]:
    """What the child runs before exec: SIGTERM when the parent thread exits (prctl 1,
    ``PR_SET_PDEATHSIG``)."""

    def arm() -> None:
        prctl(1, signal.SIGTERM, 0, 0, 0)

    return arm


def _spawn(command: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start a redis-server that dies with its parent, in a session of its own: a
    terminal's Ctrl-C reaches the whole foreground process group, and redis-server shuts
    down on SIGINT, which would take the queues away while the instances still drain
    them; the parent stops it last (:func:`stop_private_redis`)."""
    prctl = _prctl() if sys.platform == "linux" else None
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent(prctl) if prctl is not None else None,
        start_new_session=True,
    )


def _wait_answering(
    process: subprocess.Popen[bytes], url: str, timeout_s: float
) -> subprocess.Popen[bytes]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {process.returncode} at start")
        if redis_answers(url, 0.2):
            return process
        time.sleep(0.05)
    process.kill()
    process.wait(timeout_s)
    raise RuntimeError(f"redis-server at {redacted(url)} did not answer within {timeout_s}s")


#: name prefix of a private redis-server's temporary folder.
FOLDER_PREFIX = "sluice-redis-"
#: a folder younger than this, in s, may belong to a server that is starting.
STALE_AFTER_S = 60.0


def remove_stale_folders(parent: str | None = None) -> list[str]:
    """Remove this user's private redis-server folders that no server uses any more (left
    when the process that started one was killed: its redis-server exits with it, through
    ``PR_SET_PDEATHSIG``, but nothing removes the folder). A folder counts as stale when
    it is older than :data:`STALE_AFTER_S` and its socket takes no connection (a server
    that is alive but stopped still takes one: the kernel accepts it).

    Returns:
        The removed folders.
    """
    parent = parent or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        folder = os.path.join(parent, name)
        if not name.startswith(FOLDER_PREFIX):
            continue
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        if (
            not stat.S_ISDIR(info.st_mode)
            or info.st_uid != os.getuid()
            or now - info.st_mtime < STALE_AFTER_S
            or _listening(os.path.join(folder, "redis.sock"))
        ):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _listening(path: str) -> bool:
    """Whether a Unix socket at ``path`` takes a connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def start_private_redis(
    timeout_s: float = 10.0, unix_socket: bool = True
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``redis-server``, persisting nothing, as a child that gets SIGTERM when the
    thread that started it exits (Linux ``PR_SET_PDEATHSIG``: a ``sluice serve`` killed
    with SIGKILL leaves no Redis behind).

    Args:
        timeout_s: longest wait for its first ``PONG``, in seconds.
        unix_socket: listen only on a Unix socket in the server's own temporary folder
            (mode 700: this user only; no TCP port, which any local user could reach,
            as the server has no password) and return its URL; else on a free loopback
            port. The processes of one ``sluice serve`` all run on this host, and a
            request's Redis round trips cost less latency and CPU (Sluice's and Redis's)
            over a Unix socket than over loopback TCP.

    Returns:
        The process and its URL: ``unix://<folder>/redis.sock?db=0``, or
        ``redis://127.0.0.1:<port>/0`` without ``unix_socket``.

    Raises:
        RuntimeError: ``redis-server`` is not installed, or it did not answer within
            ``timeout_s`` seconds.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "no Redis answers and redis-server is not installed: install it "
            "(apt-get install redis-server) or pass --redis-url"
        )
    port = 0 if unix_socket else free_port()
    remove_stale_folders()
    workdir = tempfile.mkdtemp(prefix=FOLDER_PREFIX)
    command = [
        binary,
        "--port", str(port), "--bind", "127.0.0.1",
        "--save", "", "--appendonly", "no", "--dir", workdir,
        "--daemonize", "no", "--loglevel", "warning",
    ]  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    if unix_socket:
        path = os.path.join(workdir, "redis.sock")
        command += ["--unixsocket", path, "--unixsocketperm", "700"]
        url = f"unix://{path}?db=0"
    return _wait_answering(_spawn(command), url, timeout_s), url


def _option(process: subprocess.Popen[bytes], name: str) -> str | None:
    """The value of command-line option ``name`` (``--dir``) the server was started with."""
    args = [str(a) for a in process.args]  # type: ignore[union-attr]
    return args[args.index(name) + 1] if name in args[:-1] else None


def private_redis_url(process: subprocess.Popen[bytes]) -> str:
    """The URL of a redis-server :func:`start_private_redis` started (from its arguments)."""
    path = _option(process, "--unixsocket")
    if path is not None:
        return f"unix://{path}?db=0"
    return f"redis://127.0.0.1:{_option(process, '--port')}/0"


def restart_private_redis(
    process: subprocess.Popen[bytes], timeout_s: float = 10.0
) -> subprocess.Popen[bytes]:
    """Start a private redis-server that exited again, with the same arguments (the same
    socket or port, so every client's URL still holds), empty.

    Returns:
        The new process, answering ``PING``.

    Raises:
        RuntimeError: it could not be started, exited at start, or did not answer within
            ``timeout_s`` seconds.
    """
    workdir = _option(process, "--dir")
    try:
        if workdir is not None:
            os.makedirs(workdir, mode=0o700, exist_ok=True)
        started = _spawn([str(a) for a in process.args])  # type: ignore[union-attr]
    except OSError as exc:
        raise RuntimeError(f"cannot start redis-server: {exc}") from exc
    return _wait_answering(started, private_redis_url(process), timeout_s)


def stop_private_redis(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Stop a redis-server :func:`start_private_redis` started (SIGTERM, then SIGKILL after
    ``timeout_s`` seconds) and remove its temporary folder (socket and working files)."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)
    workdir = _option(process, "--dir")
    if workdir is not None and os.path.basename(workdir).startswith(FOLDER_PREFIX):
        shutil.rmtree(workdir, ignore_errors=True)
