"""RESP encoding of command pipelines, straight through hiredis.

redis-py's ``pack_commands`` re-examines every argument of every command in Python
(``isinstance`` per argument, buffer cut-offs) before handing it to hiredis; on the
request path of a gateway or an instance loop that costs more CPU than the Redis
call. The commands Sluice sends on those paths are built by Sluice itself, with
``str``/``bytes``/``int``/``float`` arguments only, so they go to
``hiredis.pack_command`` as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import hiredis


def pack_pipeline(commands: Iterable[Sequence[object]]) -> bytes:
    """RESP bytes of ``commands``, in order, ready for one socket write.

    Args:
        commands: each a command name then its arguments (``str``, ``bytes``,
            ``int`` or ``float``; a multi-word name such as ``"CLIENT REPLY"`` must be
            given as separate arguments).

    Raises:
        TypeError: an argument of another type (``memoryview``, ``None``, ...).
    """
    pack = hiredis.pack_command
    return b"".join([pack(tuple(command)) for command in commands])
