"""Hosts apart on one machine: Linux network namespaces joined by veth pairs to a bridge.

Each :class:`Host` is a network namespace with its own loopback and one address on a
private /24; its cable is a veth pair whose other end sits on a bridge in a hub
namespace (the switch). The test process, in the machine's own namespace, gets one more
port on that switch (the last address of the subnet), so ``tritonclient`` reaches the
gateways' addresses directly. Cutting a host's link sets its switch port down (a pulled
cable: the host's sockets stay open, packets stop); killing a host SIGKILLs every
process in its namespace (``ip netns pids``).

Needs root and iproute2 (``ip``); :func:`namespaces_unavailable` says why not otherwise.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: deadline of one ``ip`` command, in s
IP_TIMEOUT_S = 10.0


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", netns, "ip"] if netns else ["ip"]
    result = subprocess.run(
        [*prefix, *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None: they can).

    Tries what the tests do: a namespace, a veth pair and a bridge, removed at once.
    """
    if os.name != "posix" or not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "iproute2 ('ip') is not installed"
    probe = f"slp{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("link", "add", "a0", "type", "veth", "peer", "name", "a1", netns=probe)
            _ip("link", "add", "b0", "type", "bridge", netns=probe)
        finally:
            _ip("netns", "del", probe, check=False)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot make network namespaces, veth pairs and bridges here: {exc}"
    return None


@dataclass
class Host:
    """One simulated host: a network namespace with one address."""

    name: str
    netns: str
    address: str
    #: its switch port (in the hub namespace)
    port: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)


class HostNetwork:
    """A switch (a bridge in a hub namespace) and the hosts plugged into it.

    Names carry a random tag, so runs side by side do not meet; :meth:`close` removes
    every namespace and the test process's port, after killing what runs in them.

    Raises:
        RuntimeError: an ``ip`` command failed (the network made so far is removed).
    """

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.hub = f"sl{self.tag}hub"
        self.subnet = self._free_subnet()
        self.hosts: dict[str, Host] = {}
        self._root_port = f"sl{self.tag}r"
        try:
            _ip("netns", "add", self.hub)
            _ip("link", "add", "br0", "type", "bridge", netns=self.hub)
            _ip("link", "set", "br0", "up", netns=self.hub)
            # the test process's own port on the switch
            _ip("link", "add", self._root_port, "type", "veth", "peer", "name", "up0")
            _ip("link", "set", "up0", "netns", self.hub)
            _ip("link", "set", "up0", "master", "br0", netns=self.hub)
            _ip("link", "set", "up0", "up", netns=self.hub)
            _ip("addr", "add", f"{self.subnet}.254/24", "dev", self._root_port)
            _ip("link", "set", self._root_port, "up")
        except Exception:
            self.close()
            raise

    @staticmethod
    def _free_subnet() -> str:
        """``10.213.N`` for an N no route of this machine's namespace covers."""
        routes = _ip("route", "show").stdout
        for _ in range(50):
            candidate = f"10.213.{random.randint(1, 250)}"
            if f"{candidate}." not in routes:
                return candidate
        raise RuntimeError("no free 10.213.N.0/24 subnet")

    def add_host(self, name: str) -> Host:
        """Plug in a new host ``name`` (its address: the next one of the subnet)."""
        index = len(self.hosts) + 1
        netns = f"sl{self.tag}{name}"
        port = f"p{index}"
        address = f"{self.subnet}.{index}"
        _ip("netns", "add", netns)
        _ip("link", "set", "lo", "up", netns=netns)
        _ip("link", "add", "eth0", "type", "veth", "peer", "name", port, netns=netns)
        _ip("link", "set", port, "netns", self.hub, netns=netns)
        _ip("addr", "add", f"{address}/24", "dev", "eth0", netns=netns)
        _ip("link", "set", "eth0", "up", netns=netns)
        _ip("link", "set", port, "master", "br0", netns=self.hub)
        _ip("link", "set", port, "up", netns=self.hub)
        host = Host(name, netns, address, port)
        self.hosts[name] = host
        return host

    def cut(self, host: Host) -> None:
        """Pull ``host``'s cable: its switch port goes down."""
        _ip("link", "set", host.port, "down", netns=self.hub)

    def restore(self, host: Host) -> None:
        """Plug ``host``'s cable back in."""
        _ip("link", "set", host.port, "up", netns=self.hub)

    def run(
        self, host: Host, argv: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host`` (inside its namespace), output to ``log_path``."""
        full_env = {**os.environ, **(env or {})}
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, *argv],
                stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
            )  # fmt: skip
        host.processes.append(process)
        return process

    def pids(self, host: Host) -> list[int]:
        """Every process in ``host``'s namespace."""
        result = subprocess.run(
            ["ip", "netns", "pids", host.netns],
            capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False,
        )  # fmt: skip
        return [int(pid) for pid in result.stdout.split()]

    def kill(self, host: Host, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to every process on ``host`` (SIGKILL: the host dies); the
        processes the test started there are reaped (bounded)."""
        for pid in self.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig == signal.SIGKILL:
            for process in host.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(10)

    def stop(self, host: Host, timeout_s: float = 20.0) -> None:
        """SIGTERM the processes the test started on ``host``, wait (bounded), then
        SIGKILL whatever is left in its namespace."""
        for process in host.processes:
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + timeout_s
        for process in host.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        self.kill(host)

    def close(self) -> None:
        """Kill every process on every host and remove the namespaces and ports."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                self.kill(host)
        for host in self.hosts.values():
            _ip("netns", "del", host.netns, check=False)
        _ip("link", "del", self._root_port, check=False)
        _ip("netns", "del", self.hub, check=False)
