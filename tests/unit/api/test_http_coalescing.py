"""CoalescingTransport: what one loop iteration writes leaves in one call, over a real socket."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from sluice.api.http.coalescing import CoalescingTransport


class _Recording:
    """A real transport that records which write calls reach it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.calls: list[tuple[str, list[bytes]]] = []

    def write(self, data: bytes) -> None:
        self.calls.append(("write", [data]))
        self.transport.write(data)

    def writelines(self, chunks: list[bytes]) -> None:
        self.calls.append(("writelines", list(chunks)))
        self.transport.writelines(chunks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def _pair() -> tuple[CoalescingTransport, _Recording, socket.socket]:
    loop = asyncio.get_running_loop()
    ours, peer = socket.socketpair()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    recording = _Recording(transport)  # type: ignore[arg-type]
    peer.settimeout(5)
    return CoalescingTransport(recording, loop), recording, peer  # type: ignore[arg-type]


def _read_all(peer: socket.socket) -> bytes:
    chunks = []
    while chunk := peer.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.asyncio
async def test_writes_of_one_iteration_leave_in_one_call() -> None:
    coalescing, recording, peer = await _pair()
    coalescing.write(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n")
    coalescing.write(b"")  # nothing to send: ignored
    coalescing.write(b"body")
    assert recording.calls == []  # held until the loop runs the flush
    await asyncio.sleep(0)
    assert recording.calls == [
        ("writelines", [b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n", b"body"])
    ]
    coalescing.write(b"next")
    await asyncio.sleep(0)
    assert recording.calls[-1] == ("write", [b"next"])  # a single chunk goes as it is
    coalescing.close()
    assert (
        await asyncio.to_thread(_read_all, peer)
    ) == b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbodynext"
    peer.close()


@pytest.mark.asyncio
async def test_close_sends_what_is_pending_and_abort_drops_it() -> None:
    coalescing, recording, peer = await _pair()
    coalescing.writelines([b"last ", b"words"])
    coalescing.close()  # before the loop ran the flush
    assert recording.calls == [("writelines", [b"last ", b"words"])]
    assert (await asyncio.to_thread(_read_all, peer)) == b"last words"
    peer.close()

    coalescing, recording, peer = await _pair()
    coalescing.write(b"never sent")
    coalescing.abort()
    await asyncio.sleep(0)  # the scheduled flush finds the transport closing
    assert recording.calls == []
    assert (await asyncio.to_thread(_read_all, peer)) == b""
    peer.close()
