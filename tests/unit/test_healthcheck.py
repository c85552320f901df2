"""``python -m sluice.healthcheck``: exit 1 with one line saying why when unhealthy."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid

import pytest

from sluice.broker.redis_server import delete_prefix, free_port
from sluice.healthcheck import main


def test_a_gateway_that_does_not_answer_is_unhealthy(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/v2/health/ready"
    assert main(["ready", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"unhealthy: {url}: ") and err.count("\n") == 1


def test_an_unreachable_redis_is_unhealthy(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_REDIS__URL", f"redis://127.0.0.1:{free_port()}/0")
    assert main(["control"]) == 1
    assert main(["instance", "--model", "m"]) == 1
    assert main(["jobs"]) == 1
    assert capsys.readouterr().err.count("unhealthy: Redis at redis://127.0.0.1:") == 3


@pytest.mark.integration
def test_a_job_worker_answers_the_jobs_check(
    redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ``sluice jobs`` on a prefix of its own: healthy for this host once it
    runs; a host with no job worker, or a prefix with none, is unhealthy and says why."""
    prefix = f"hc-jobs-{uuid.uuid4().hex[:8]}:"
    monkeypatch.setenv("SLUICE_REDIS__URL", redis_url)
    monkeypatch.setenv("SLUICE_REDIS__KEY_PREFIX", prefix)
    worker = subprocess.Popen(
        [sys.executable, "-m", "sluice.job_workers.main", "--concurrency", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while main(["jobs"]) != 0:
            assert time.monotonic() < deadline, capsys.readouterr().err
            assert worker.poll() is None, "the job worker exited"
        assert main(["jobs", "--host", "elsewhere"]) == 1
        err = capsys.readouterr().err.splitlines()[-1]
        assert err.startswith("unhealthy: no job worker on host 'elsewhere' answered a ping")
        assert f"@{socket.gethostname()}" in err
        monkeypatch.setenv("SLUICE_REDIS__KEY_PREFIX", prefix + "other:")
        assert main(["jobs"]) == 1
        assert capsys.readouterr().err.endswith("(answered: none)\n")
    finally:
        worker.terminate()
        worker.wait(30)
        delete_prefix(redis_url, prefix)
