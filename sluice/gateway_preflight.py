"""Checks made before ``sluice serve`` starts anything: would its gateway start?

A bad gateway flag or a taken port would otherwise show as a gateway process restarted
in a loop; checked first, it ends ``sluice serve`` with one line.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pydantic

from sluice.api.gateway_args import add_gateway_arguments, check_access_specs, settings_from_args

__all__ = ["check_gateway_start", "ephemeral_port_range", "port_is_free"]


def check_gateway_start(argv: list[str]) -> str | None:
    """Why a gateway started with ``argv`` would fail at once, or None.

    Checked before anything starts, so a bad flag or a taken port ends ``sluice serve``
    with one line instead of a gateway restarted in a loop: the flags are validated as
    the gateway validates them, and every port it will listen on must be free. A port
    another server holds with ``SO_REUSEPORT`` (``--gateway-processes`` > 1) counts as
    taken, so two servers never split one port's traffic.
    """
    parser = argparse.ArgumentParser(prog="sluice gateway")
    add_gateway_arguments(parser)
    try:
        settings = settings_from_args(parser.parse_args(argv))
        check_access_specs(settings)
    except pydantic.ValidationError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return f"invalid gateway settings: {errors}"
    except ValueError as exc:
        return f"invalid gateway settings: {exc}"
    listeners = [("HTTP", settings.http.address, settings.http.port)]
    if settings.grpc.enabled:
        listeners.append(("gRPC", settings.grpc.address, settings.grpc.port))
    if settings.metrics.enabled:
        address = settings.metrics.address or settings.http.address
        listeners.append(("metrics", address, settings.metrics.port))
    for index, (what, address, port) in enumerate(listeners):
        for other, other_address, other_port in listeners[:index]:
            if port and port == other_port and _overlap(address, other_address):
                return (
                    f"the {other} and {what} ports are both {port} on {address}: each "
                    "listener needs a port of its own"
                )
    for what, address, port in listeners:
        if port and not port_is_free(address, port):
            reason = f"the {what} port {port} on {address} is in use by another process"
            low, high = ephemeral_port_range()
            if low <= port <= high:
                reason += (
                    f" or connection (it lies in this machine's range for the local ports of "
                    f"outgoing connections, {low}-{high}: a port outside it is never taken "
                    "by one)"
                )
            return reason
    return None


def _overlap(first: str, second: str) -> bool:
    """Whether listeners on these two addresses would take the same port (the same
    address, or either a wildcard)."""
    wildcards = ("0.0.0.0", "::", "")
    return first == second or first in wildcards or second in wildcards


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing TCP connections (Linux
    ``net.ipv4.ip_local_port_range``; (0, -1) where unknown)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 0, -1


def port_is_free(address: str, port: int) -> bool:
    """Whether a TCP listener could bind ``address:port`` (no other socket holds it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True
