"""Listening sockets that several gateway processes can share (``SO_REUSEPORT``)."""

from __future__ import annotations

import socket


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket with ``SO_REUSEPORT``: the kernel spreads connections over every
    gateway process listening on the same port (``sluice serve --gateway-processes N``).

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock
