"""Triton and Sluice started side by side for the benchmarks that compare them: each
server on three ports in a row (HTTP, gRPC, metrics), in a session of its own, ready
before these return (:func:`bench_anchors.start_server`); stop them with
:func:`bench_anchors.stop_server`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench_anchors import BENCH, ROOT, start_server

__all__ = ["start_sluice", "start_triton"]


def start_triton(repo: Path, port: int, out: Path) -> subprocess.Popen[bytes]:
    """Triton on model repository ``repo`` (``start_triton.sh`` of the bench folder): HTTP
    on ``port``, gRPC on ``port + 1``, metrics on ``port + 2``; its output in
    ``out / "triton.log"`` and ``out / "triton-inner.log"``.

    Raises:
        SystemExit: it did not become ready.
    """
    command = [
        "bash", str(BENCH / "start_triton.sh"), str(repo),
        str(port), str(port + 1), str(port + 2), str(out / "triton-inner.log"),
    ]  # fmt: skip
    return start_server(command, out / "triton.log", port)


def start_sluice(
    repo: Path, port: int, redis_url: str, prefix: str, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    """``sluice serve`` of this checkout's ``.venv`` on model repository ``repo``: HTTP on
    ``port``, gRPC on ``port + 1``, metrics on ``port + 2``, its keys under ``prefix`` in
    the Redis at ``redis_url``, ``extra`` flags appended; its output in ``log``.

    Raises:
        SystemExit: it did not become ready.
    """
    command = [
        str(ROOT / ".venv" / "bin" / "sluice"), "serve", "--model-repository", str(repo),
        "--http-port", str(port), "--grpc-port", str(port + 1),
        "--metrics-port", str(port + 2), "--redis-url", redis_url, "--key-prefix", prefix,
        *extra,
    ]  # fmt: skip
    return start_server(command, log, port)
