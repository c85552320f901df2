"""Model control commands (Triton's model repository extension) between gateways and the supervisor.

A gateway puts a load or unload command on the control stream and waits on its
own reply key; the supervisor, the one process that starts and stops model
instances, runs commands one at a time and answers with an
``InferResponseMessage`` whose ``request_id`` is the command id (``error`` set
on failure), so the gateway's one reply reader serves both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack
import redis
import redis.exceptions

from sluice.broker.codec import CodecError, encode_response
from sluice.broker.messages import ErrorInfo, InferResponseMessage

#: consumer group of the supervisor on the control stream.
CONTROL_GROUP = "supervisor"


@dataclass(frozen=True, slots=True)
class ControlCommand:
    """One load or unload request.

    Attributes:
        command_id: unique id; the reply carries it as ``request_id``.
        op: ``load`` or ``unload``.
        model: model name.
        reply_to: the gateway's reply key.
        config_json: Triton load ``config`` parameter (ModelConfig JSON), "" if none.
        files: Triton load ``file:<version>/<path>`` parameters: path -> content.
        unload_dependents: Triton unload ``unload_dependents``.
    """

    command_id: str
    op: str
    model: str
    reply_to: str
    config_json: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    unload_dependents: bool = False


def encode_command(command: ControlCommand) -> bytes:
    """msgpack of a command (file contents as ``bin``)."""
    return msgpack.packb(
        [
            command.command_id,
            command.op,
            command.model,
            command.reply_to,
            command.config_json,
            command.files,
            command.unload_dependents,
        ],
        use_bin_type=True,
    )


def decode_command(payload: bytes) -> ControlCommand:
    """Inverse of :func:`encode_command`.

    Raises:
        CodecError: not a control command.
    """
    try:
        command_id, op, model, reply_to, config_json, files, unload_dependents = msgpack.unpackb(
            payload, raw=False
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CodecError(f"undecodable control command: {exc}") from exc
    return ControlCommand(
        command_id, op, model, reply_to, config_json, dict(files), bool(unload_dependents)
    )


def ensure_control_group(client: redis.Redis, stream: str) -> None:
    """Create the supervisor's consumer group on the control stream if missing."""
    try:
        client.xgroup_create(stream, CONTROL_GROUP, id="0", mkstream=True)
    except redis.exceptions.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def read_commands(client: redis.Redis, stream: str, block_ms: int) -> list[tuple[bytes, bytes]]:
    """Take new commands (entry id, payload), waiting at most ``block_ms``."""
    reply = client.xreadgroup(
        CONTROL_GROUP, "supervisor", {stream: ">"}, count=16, block=max(1, block_ms)
    )
    return [(entry_id, fields[b"c"]) for _s, entries in reply or () for entry_id, fields in entries]


def answer(
    client: redis.Redis,
    stream: str,
    entry_id: bytes,
    command: ControlCommand,
    error: ErrorInfo | None,
) -> None:
    """Reply to the gateway that sent ``command`` and drop the command from the stream."""
    reply = InferResponseMessage(command.command_id, command.model, 0, error=error)
    pipe = client.pipeline(transaction=False)
    pipe.rpush(command.reply_to, encode_response(reply))
    pipe.expire(command.reply_to, 300)
    pipe.xack(stream, CONTROL_GROUP, entry_id)
    pipe.xdel(stream, entry_id)
    pipe.execute()
