"""Every Sluice process against a Redis that requires a password, an ACL user, or TLS
with client certificates: ``sluice serve`` (supervisor, gateway, instances, heartbeats,
job worker) answers an infer over HTTP and gRPC and runs an async job; the password is
on no process's command line and in no log line; the health checks log in too; a
refused login ends each kind of process with one error line and exit code 1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from e2e_support import (
    ROOT,
    instance_records,
    repository_of,
    start_server,
    stop_server,
    tree_cmdlines,
)
from jobs_support import add_sub_body, submit, wait_state
from secure_redis import ACL_PREFIX, ACL_USER, PASSWORD, SecuredRedis, secured_redis

from sluice.broker.redis_server import free_port

MODES = ("password", "acl", "tls")


@pytest.fixture(params=MODES)
def secured(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SecuredRedis]:
    with secured_redis(request.param, tmp_path / "redis") as server:
        yield server


def test_serve_infers_and_runs_jobs(
    secured: SecuredRedis, model_repository: Path, tmp_path: Path
) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    repo = repository_of(model_repository, tmp_path / "repo", "add_sub")
    prefix = ACL_PREFIX if "@" in secured.url and ACL_USER in secured.url else None
    server = start_server(
        repo, secured.url, tmp_path / "serve.log", url_in_env=True, key_prefix=prefix
    )
    try:
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        b = np.full((1, 16), 2.0, np.float32)
        for module, url in ((httpclient, server.http_url), (grpcclient, server.grpc_url)):
            client = module.InferenceServerClient(url)
            inputs = [module.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            client.close()
        body = add_sub_body([1.0] * 16, [3.0] * 16)
        job = wait_state(server.base, submit(server.base, "add_sub", body))
        assert job["state"] == "SUCCESS", job
        assert job["outputs"][0]["data"] == [4.0] * 16
        (instance,) = instance_records(server, "add_sub")
        for env_url, code in ((secured.url, 0), (secured.wrong_url, 1)):
            env = dict(os.environ, SLUICE_REDIS__URL=env_url)
            env["SLUICE_REDIS__KEY_PREFIX"] = server.key_prefix
            instance_check = ["instance", "--model", "add_sub", "--instance", instance]
            for check in (["control"], instance_check, ["jobs"]):
                done = subprocess.run(
                    [sys.executable, "-m", "sluice.healthcheck", *check],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert done.returncode == code, (check, done.stderr)
                assert PASSWORD not in done.stderr
        lines = tree_cmdlines(server.process.pid)
        # supervisor, gateway, job worker, instance and its heartbeat at least
        assert len([c for c in lines.values() if "sluice" in c]) >= 5, lines
        assert not [c for c in lines.values() if PASSWORD in c], lines
    finally:
        assert stop_server(server) == 0
    log = server.log()
    assert "serving on" in log
    assert PASSWORD not in log
    assert "NOPERM" not in log and "Traceback" not in log, log


def _one_error_line(log: str) -> str:
    """The one line of ``log``, an error line (Triton's format: ``E<date> ...``)."""
    lines = [line for line in log.splitlines() if line.strip()]
    assert len(lines) == 1, log
    assert lines[0].startswith("E"), log
    assert PASSWORD not in log
    return lines[0]


def test_a_refused_login_ends_each_process_with_one_line(
    secured: SecuredRedis, tmp_path: Path, model_repository: Path
) -> None:
    env = dict(os.environ, SLUICE_REDIS__URL=secured.wrong_url)
    repo = repository_of(model_repository, tmp_path / "repo", "add_sub")
    model_dir = str(repo / "add_sub")
    commands = {
        "serve": ["serve", "--model-repository", str(repo), "--http-port", str(free_port())],
        "gateway": ["gateway", "--http-port", str(free_port()), "--grpc-port", str(free_port())],
        "worker": ["worker", "--model", "add_sub", "--version", "1", "--model-dir", model_dir],
        "jobs": ["jobs"],
    }
    for name, argv in commands.items():
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "sluice.cli", *argv],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        log = done.stdout + done.stderr
        assert done.returncode == 1, (name, log)
        assert time.monotonic() - started < 30, name
        line = _one_error_line(log)
        assert "refused" in line or "TLS" in line, (name, line)
        assert ":***@" in line, (name, line)
