"""Docker for the compose stack test: the engine (``dockerd`` started here when none runs,
stopped after), the compose tool (the ``docker compose`` plugin or Debian's
``docker-compose``), the local base image, and whether bridge networking works.

Every helper answers with a reason to skip where Docker cannot run, never a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
#: the base image made by compose/make-base-image.sh; SLUICE_TEST_BASE_IMAGE names another
#: (e.g. python:3.11-slim-bookworm where a registry is reachable)
BASE_IMAGE = os.environ.get("SLUICE_TEST_BASE_IMAGE", "sluice-base:bookworm")
#: how long dockerd may take to answer once started, in s
ENGINE_START_S = 60.0


class DockerUnavailable(Exception):
    """Docker cannot run here; the message says why (the test is skipped with it)."""


def _run(argv: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def engine_answers() -> bool:
    """Whether a Docker engine answers the ``docker`` client."""
    if shutil.which("docker") is None:
        return False
    try:
        return _run(["docker", "info", "--format", "{{.ServerVersion}}"], 20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@contextlib.contextmanager
def docker_engine(log_path: Path) -> Iterator[None]:
    """A Docker engine for the block: the running one, else ``dockerd`` started here (as
    root) and stopped at the end.

    Raises:
        DockerUnavailable: no client, no engine and none can be started.
    """
    if shutil.which("docker") is None:
        raise DockerUnavailable("no docker client (Debian: apt-get install docker.io)")
    if engine_answers():
        yield
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise DockerUnavailable("no Docker engine runs and dockerd is not installed")
    if os.geteuid() != 0:
        raise DockerUnavailable("no Docker engine runs and starting dockerd needs root")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [dockerd], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while not engine_answers():
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise DockerUnavailable(f"dockerd did not start here:\n{tail}")
            time.sleep(0.5)
        yield
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def compose_command() -> list[str]:
    """The compose tool: ``docker compose`` (v2 plugin) or ``docker-compose``.

    Raises:
        DockerUnavailable: neither is installed.
    """
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        if _run(["docker", "compose", "version"]).returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise DockerUnavailable("no compose tool (Debian: apt-get install docker-compose)")


def make_base_image(timeout_s: float = 900.0) -> str:
    """The base image, made by compose/make-base-image.sh when missing (kept after).

    Raises:
        DockerUnavailable: it could not be made (no debootstrap, no mirror).
    """
    if _run(["docker", "image", "inspect", BASE_IMAGE]).returncode == 0:
        return BASE_IMAGE
    result = _run(["bash", str(COMPOSE_DIR / "make-base-image.sh"), BASE_IMAGE], timeout_s)
    if result.returncode != 0:
        raise DockerUnavailable(
            f"base image {BASE_IMAGE} could not be made:\n{result.stdout}{result.stderr}"
        )
    return BASE_IMAGE


def bridge_works() -> bool:
    """Whether a bridge network can be made (else the services go on the host network)."""
    name = f"sluice-probe-{uuid.uuid4().hex[:8]}"
    if _run(["docker", "network", "create", name]).returncode != 0:
        return False
    _run(["docker", "network", "rm", name])
    return True


def project_leftovers(project: str) -> dict[str, list[str]]:
    """Containers, networks and volumes that still carry the compose project's label."""
    label = f"label=com.docker.compose.project={project}"
    found = {}
    for kind, argv in {
        "containers": ["docker", "ps", "-a", "-q", "--filter", label],
        "networks": ["docker", "network", "ls", "-q", "--filter", label],
        "volumes": ["docker", "volume", "ls", "-q", "--filter", label],
    }.items():
        found[kind] = _run(argv).stdout.split()
    return found
