"""Model repository extension: the index, and load / unload through the supervisor.

Rules: docs/reference/http-protocol.md (Repository extension) and
docs/reference/model-configuration.md (Model control modes); Triton
``src/http_server.cc`` (``HandleRepositoryIndex``, ``HandleRepositoryControl``). A load
or unload is a command on the deployment's control stream; the supervisor answers it on
this gateway's reply key once done (docs/architecture.md).
"""

from __future__ import annotations

import time
import uuid

import redis.asyncio

from sluice.api.models import ModelRegistry
from sluice.api.settings import GatewaySettings
from sluice.broker.control import ControlCommand, encode_command
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.replies import ReplyRouter
from sluice.broker.states import ModelState

__all__ = ["RepositoryControl"]


class RepositoryControl:
    """The repository index and explicit model control.

    Args:
        settings: the gateway settings (``control_timeout_s``).
        client: the gateway's Redis client.
        keys: the deployment's key schema.
        registry: cached model views (dropped for a model once it was loaded or unloaded).
        router: this gateway's reply router (the supervisor answers there).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        client: redis.asyncio.Redis,
        keys: KeySchema,
        registry: ModelRegistry,
        router: ReplyRouter,
    ) -> None:
        self._settings = settings
        self._redis = client
        self._keys = keys
        self._registry = registry
        self._router = router

    async def repository_index(self, ready_only: bool) -> list[dict[str, str]]:
        """Repository index entries, sorted by model name: one per version for models
        that ever loaded (``name``, ``version``, ``state``, ``reason`` when there is one),
        ``{"name"}`` alone for the others; with ``ready_only``, READY versions only."""
        entries: list[dict[str, str]] = []
        for record in await self._registry.records():
            if not record.versions:
                if not ready_only:
                    entries.append({"name": record.name})
                continue
            for version, state in sorted(record.versions.items()):
                if ready_only and state.state is not ModelState.READY:
                    continue
                entry = {"name": record.name, "version": str(version), "state": state.state.value}
                if state.reason:
                    entry["reason"] = state.reason
                entries.append(entry)
        return entries

    async def control_mode(self) -> str:
        """The supervisor's model control mode (``none``, ``poll`` or ``explicit``)."""
        return (await self._registry.server_facts()).get("model_control_mode", "none")

    async def load_model(
        self, model: str, config_json: str = "", files: dict[str, bytes] | None = None
    ) -> None:
        """Load or reload a model, blocking until done.

        Args:
            model: model name.
            config_json: Triton's ``config`` parameter (ModelConfig JSON), "" for none.
            files: Triton's ``file:<version>/<path>`` parameters, decoded: path -> bytes.

        Raises:
            SluiceError: UNAVAILABLE in ``none``/``poll`` mode (Triton's text); INTERNAL
                for a model in no repository; INVALID_ARG "load failed for model 'm': ...".
        """
        await self._refuse_control()
        await self._control(
            ControlCommand(
                uuid.uuid4().hex, "load", model, self._router.reply_key, config_json, files or {}
            )
        )

    async def unload_model(self, model: str, unload_dependents: bool = False) -> None:
        """Unload a model, blocking until no version is READY.

        Raises:
            SluiceError: UNAVAILABLE in ``none``/``poll`` mode (Triton's text).
        """
        await self._refuse_control()
        await self._control(
            ControlCommand(
                uuid.uuid4().hex,
                "unload",
                model,
                self._router.reply_key,
                unload_dependents=unload_dependents,
            )
        )

    async def _control(self, command: ControlCommand) -> None:
        deadline = time.time_ns() + int(self._settings.control_timeout_s * 1e9)
        future = self._router.expect(command.command_id, deadline)
        try:
            await self._redis.xadd(self._keys.control(), {b"c": encode_command(command)})
        except BaseException:
            future.cancel()  # its registration and timer go with it
            raise
        reply = await future
        self._registry.invalidate(command.model)
        if reply.error is not None:
            raise SluiceError(reply.error.code, reply.error.message, model=command.model)

    async def _refuse_control(self) -> None:
        if await self.control_mode() != "explicit":
            raise SluiceError(
                ErrorCode.UNAVAILABLE,
                "explicit model load / unload is not allowed if polling is enabled",
            )
