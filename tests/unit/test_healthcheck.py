"""``python -m sluice.healthcheck``: exit 1 with one line saying why when unhealthy."""

from __future__ import annotations

import pytest

from sluice.broker.redis_server import free_port
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
    assert capsys.readouterr().err.count("unhealthy: Redis at redis://127.0.0.1:") == 2
