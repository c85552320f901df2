"""``docker compose config`` accepts compose/docker-compose.yml under every profile (and
with the host-network test override), with the compose tool installed here; the services
each profile adds are there. Needs no Docker engine; skipped without a compose tool."""

from __future__ import annotations

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


def _config(*args: str) -> dict:
    try:
        compose = compose_command()
    except DockerUnavailable as exc:
        pytest.skip(str(exc))
    result = subprocess.run(
        [*compose, "-f", "docker-compose.yml", *args, "config"],
        capture_output=True, text=True, cwd=COMPOSE_DIR, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_validates(profile: str) -> None:
    config = _config(*(["--profile", profile] if profile else []))
    services = set(config["services"])
    assert PROFILES[""] <= services
    assert PROFILES[profile] <= services


def test_the_host_network_override_validates() -> None:
    override = Path(__file__).parent / "host-network.yml"
    config = _config("-f", str(override))
    for name in PROFILES[""]:  # the services the stack test starts
        assert config["services"][name]["network_mode"] == "host", name
