"""``docker compose config`` accepts compose/docker-compose.yml under every profile (and
with the host-network test override), with the compose tool installed here; the services
each profile adds are there, and every gateway restricts the model-repository, logging
and trace APIs to the secret of compose/.env, refusing to start without one. Needs no
Docker engine; skipped without a compose tool."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from docker_support import COMPOSE_DIR, DockerUnavailable, compose_command

PROFILES = {
    "": {"redis", "sluice", "gateway", "digits", "add_sub", "jobs", "proxy"},
    "gpu": {"digits-gpu"},
    "monitoring": {"prometheus", "grafana"},
    "flower": {"flower"},
}


#: the secret the restricted APIs ask for in these tests (compose/.env leaves it empty)
ADMIN_KEY = "0123abcd"


def _compose(*args: str, admin_key: str | None = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    try:
        compose = compose_command()
    except DockerUnavailable as exc:
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_ADMIN_KEY"}
    if admin_key is not None:
        env["SLUICE_ADMIN_KEY"] = admin_key
    return subprocess.run(
        [*compose, "-f", "docker-compose.yml", *args, "config"],
        capture_output=True, text=True, cwd=COMPOSE_DIR, timeout=60, check=False, env=env,
    )  # fmt: skip


def _config(*args: str) -> dict:
    result = _compose(*args)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_validates(profile: str) -> None:
    config = _config(*(["--profile", profile] if profile else []))
    services = set(config["services"])
    assert PROFILES[""] <= services
    assert PROFILES[profile] <= services
    environment = config["services"]["gateway"]["environment"]
    spec = "model-repository,logging,trace:admin-key=" + ADMIN_KEY
    assert json.loads(environment["SLUICE_HTTP__RESTRICTED_APIS"]) == [spec]
    assert json.loads(environment["SLUICE_GRPC__RESTRICTED_PROTOCOLS"]) == [spec]
    command = " ".join(config["services"]["gateway"]["command"])
    assert ADMIN_KEY not in command  # a secret stays off the command line


def test_the_stack_refuses_to_start_without_a_secret() -> None:
    result = _compose(admin_key=None)
    assert result.returncode != 0
    assert "set SLUICE_ADMIN_KEY in compose/.env" in result.stderr


def test_the_host_network_override_validates() -> None:
    override = Path(__file__).parent / "host-network.yml"
    config = _config("-f", str(override))
    for name in PROFILES[""]:  # the services the stack test starts
        assert config["services"][name]["network_mode"] == "host", name
