"""Load and unload commands that gateways send the supervisor (explicit model control).

A gateway turns Triton's ``POST /v2/repository/models/{m}/load`` and ``.../unload`` into
a command on the control stream (:mod:`broker.control`); the supervisor runs it with its
:class:`~sluice.supervisor.model_manager.ModelManager` and answers it there. Outside
explicit mode every command is refused with Triton's UNAVAILABLE text.
"""

from __future__ import annotations

import contextlib
import logging
import time

import redis

from sluice.broker.codec import CodecError
from sluice.broker.control import answer, decode_command, ensure_control_group, read_commands
from sluice.broker.errors import ErrorCode, SluiceError, stream_gone
from sluice.broker.messages import ErrorInfo
from sluice.broker.outage import OutageLog
from sluice.supervisor.model_manager import LoadError, ModelManager

__all__ = ["ControlCommands"]

logger = logging.getLogger(__name__)


class ControlCommands:
    """Serves the control stream.

    Args:
        client: the supervisor's Redis client.
        stream: the control stream's key.
        manager: runs the loads and unloads.
        model_control_mode: Triton ``--model-control-mode``; commands run only in
            ``explicit`` mode.
    """

    def __init__(
        self, client: redis.Redis, stream: str, manager: ModelManager, model_control_mode: str
    ) -> None:
        self._client = client
        self._stream = stream
        self._manager = manager
        self._mode = model_control_mode
        self._outage = OutageLog(logger, "control stream")

    def serve(self, block_ms: int) -> None:
        """Run and answer the commands that arrive within ``block_ms`` ms (Redis
        unreachable: logged once per outage, and a sleep of ``block_ms`` instead)."""
        stream = self._stream
        try:
            commands = read_commands(self._client, stream, block_ms)
        except redis.exceptions.RedisError as exc:
            if stream_gone(exc):
                # the control stream went with Redis's data (FLUSHALL, a restart without
                # it): not an outage; the group is created again (the state within 1 s)
                with contextlib.suppress(redis.exceptions.RedisError):
                    ensure_control_group(self._client, stream)
                return
            self._outage.failed(exc)
            time.sleep(block_ms / 1000)
            return
        self._outage.ok()
        for entry_id, payload in commands:
            try:
                command = decode_command(payload)
            except CodecError:
                logger.exception("dropping an undecodable control command")
                self._client.xack(stream, "supervisor", entry_id)
                self._client.xdel(stream, entry_id)
                continue
            error: ErrorInfo | None = None
            try:
                if self._mode != "explicit":
                    raise SluiceError(
                        ErrorCode.UNAVAILABLE,
                        "explicit model load / unload is not allowed if polling is enabled",
                    )
                if command.op == "load":
                    self._manager.load(command.model, command.config_json, command.files)
                elif command.op == "unload":
                    self._manager.unload(command.model, command.unload_dependents)
                else:
                    raise SluiceError(ErrorCode.INVALID_ARG, f"unknown control op '{command.op}'")
            except (LoadError, SluiceError) as exc:
                error = ErrorInfo(exc.code.value, exc.message)
            except Exception as exc:
                logger.exception("control command %s for '%s' failed", command.op, command.model)
                error = ErrorInfo("INTERNAL", f"failed to {command.op} '{command.model}': {exc}")
            answer(self._client, stream, entry_id, command, error)
