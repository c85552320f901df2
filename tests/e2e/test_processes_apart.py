"""``sluice serve --start-gateway=false --start-instances=false`` with its gateway and its
instances started apart, as the compose stack and the Kubernetes manifests run them
(``sluice gateway``, ``sluice worker`` under its default instance name, the host's),
checked by ``python -m sluice.healthcheck``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from e2e_support import repository_of, start_gateway, start_server, stop_server


def _healthcheck(server_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.healthcheck", *args],
        capture_output=True, text=True, env=server_env, timeout=30, check=False,
    )  # fmt: skip


def _until(check: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError("not within the time")


def test_serve_publishes_and_processes_started_apart_serve(
    model_repository: Path, redis_url: str, tmp_path: Path
) -> None:
    repo = repository_of(model_repository, tmp_path / "models", "add_sub")
    server = start_server(
        repo, redis_url, tmp_path / "serve.log", "--start-gateway=false",
        "--start-instances=false", wait_ready=False,
    )  # fmt: skip
    env = {
        **os.environ,
        "SLUICE_REDIS__URL": redis_url,
        "SLUICE_REDIS__KEY_PREFIX": server.key_prefix,
    }
    processes: list[subprocess.Popen[bytes]] = []
    try:
        _until(lambda: _healthcheck(env, "control").returncode == 0)
        worker = [sys.executable, "-m", "sluice.cli", "worker", "--model", "add_sub",
                  "--version", "1", "--model-dir", str(repo / "add_sub")]  # fmt: skip
        with (tmp_path / "worker.log").open("wb") as log:
            processes.append(
                subprocess.Popen(worker, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
        gateway, port, _ = start_gateway(redis_url, server.key_prefix, tmp_path / "gw.log")
        processes.append(gateway)
        ready = f"http://127.0.0.1:{port}/v2/health/ready"
        _until(lambda: _healthcheck(env, "ready", ready).returncode == 0)
        check = _healthcheck(env, "instance", "--model", "add_sub")
        assert check.returncode == 0, check.stderr
        assert socket.gethostname() in (tmp_path / "worker.log").read_text()

        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "FP32"),
            httpclient.InferInput("INPUT1", [1, 16], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(np.ones_like(a))
        result = client.infer("add_sub", inputs)
        client.close()
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + 1)
        # the checks say why when unhealthy
        missing = _healthcheck(env, "instance", "--model", "add_sub", "--instance", "nobody")
        assert missing.returncode == 1 and "no instance 'nobody'" in missing.stderr
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        assert stop_server(server) == 0, server.log()


@pytest.mark.parametrize("mode", ["explicit", "poll"])
def test_instances_started_apart_need_control_mode_none(
    model_repository: Path, redis_url: str, tmp_path: Path, mode: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "serve", "--model-repository", str(tmp_path),
         "--redis-url", redis_url, "--start-instances=false", "--model-control-mode", mode],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--start-instances=false needs --model-control-mode=none" in result.stderr
