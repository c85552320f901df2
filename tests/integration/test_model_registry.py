"""The gateway's model view cache against a real Redis: one read per stale view."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.api.app import build_dataplane
from sluice.api.models import ModelRegistry
from sluice.api.settings import GatewaySettings
from sluice.broker.errors import SluiceError
from sluice.broker.keys import KeySchema
from sluice.broker.model_store import (
    AsyncModelStore,
    ModelRecord,
    ModelState,
    ModelStore,
    VersionState,
)
from sluice.broker.settings import RedisSettings


class _CountingStore(AsyncModelStore):
    """The real store, counting its model reads."""

    reads = 0

    async def get(self, model: str) -> ModelRecord:
        self.reads += 1
        return await super().get(model)


def test_concurrent_requests_share_one_read_of_a_stale_view(
    redis_url: str, key_prefix: str
) -> None:
    keys = KeySchema(key_prefix)
    sync = redis.Redis.from_url(redis_url)
    store = ModelStore(sync, keys)
    config = ModelConfig(name="m", platform="onnxruntime_onnx", max_batch_size=4)
    store.publish_config("m", json_format.MessageToJson(config))
    store.set_state("m", 1, VersionState(ModelState.READY))

    async def scenario() -> tuple[int, int, list[str]]:
        client = redis.asyncio.Redis.from_url(redis_url)
        counting = _CountingStore(client, keys)
        registry = ModelRegistry(counting, cache_s=0.05)
        try:
            views = await asyncio.gather(*(registry.get("m") for _ in range(32)))
            first = counting.reads
            assert registry.cached("m") is views[0]
            await asyncio.sleep(0.06)  # stale: the next callers read again, once
            assert registry.cached("m") is None
            await asyncio.gather(*(registry.resolve("m", None) for _ in range(32)))
            errors = await asyncio.gather(
                *(registry.get("nope") for _ in range(8)), return_exceptions=True
            )
            return first, counting.reads, [str(e) for e in errors]
        finally:
            await client.aclose()

    try:
        first, total, errors = asyncio.run(scenario())
    finally:
        sync.close()
    assert first == 1
    assert total == 3  # one more for the stale view, one for the unknown model
    assert errors == ["Request for unknown model: 'nope' is not found"] * 8


def test_a_cancelled_caller_does_not_cancel_the_shared_read(
    redis_url: str, key_prefix: str
) -> None:
    keys = KeySchema(key_prefix)
    sync = redis.Redis.from_url(redis_url)
    ModelStore(sync, keys).publish_config(
        "m", json_format.MessageToJson(ModelConfig(name="m", max_batch_size=4))
    )
    ModelStore(sync, keys).set_state("m", 1, VersionState(ModelState.READY))

    async def scenario() -> str:
        client = redis.asyncio.Redis.from_url(redis_url)
        registry = ModelRegistry(AsyncModelStore(client, keys), cache_s=10)
        try:
            impatient = asyncio.ensure_future(registry.get("m"))
            patient = asyncio.ensure_future(registry.get("m"))
            await asyncio.sleep(0)
            impatient.cancel()
            view = await patient
            with pytest.raises(asyncio.CancelledError):
                await impatient
            return view.name
        finally:
            await client.aclose()

    try:
        assert asyncio.run(scenario()) == "m"
    finally:
        sync.close()


def test_unknown_model_is_not_found(redis_url: str, key_prefix: str) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            with pytest.raises(SluiceError, match="'ghost' is not found"):
                await ModelRegistry(AsyncModelStore(client, KeySchema(key_prefix)), 1).get("ghost")
        finally:
            await client.aclose()

    asyncio.run(scenario())


class _RepublishedBetweenReads(AsyncModelStore):
    """The real store; the first time the server's facts are read, the state a Redis that
    lost its data had lost is published again first (config, READY version, then the
    server record, as ``ModelManager.republish`` and the supervisor write them), as when
    the republish finishes between a gateway's model read and its facts read."""

    def __init__(self, client: redis.asyncio.Redis, keys: KeySchema, sync: redis.Redis) -> None:
        super().__init__(client, keys)
        self._sync = ModelStore(sync, keys)
        self.republished = False

    async def server(self) -> dict[str, str]:
        if not self.republished:
            self.republished = True
            config = ModelConfig(name="m", platform="onnxruntime_onnx", max_batch_size=4)
            self._sync.publish_config("m", json_format.MessageToJson(config))
            self._sync.set_state("m", 1, VersionState(ModelState.READY))
            self._sync.set_server(startup="done")
        return await super().server()


def test_a_model_published_again_between_the_two_reads_is_served_not_404(
    redis_url: str, key_prefix: str
) -> None:
    """After Redis lost its data, a request can read the model (gone) and then the server
    record, which the republish wrote back in between: read once, it would be answered
    404 for a model that is there again. It reads the model once more and runs; a model
    that is really unknown still gets the 404."""
    keys = KeySchema(key_prefix)
    sync = redis.Redis.from_url(redis_url)

    async def scenario() -> tuple[str, int, str]:
        client = redis.asyncio.Redis.from_url(redis_url, protocol=2)
        settings = GatewaySettings(redis=RedisSettings(url=redis_url, key_prefix=key_prefix))
        store = _RepublishedBetweenReads(client, keys, sync)
        registry = ModelRegistry(store, settings.model_cache_s)
        submission = build_dataplane(settings, client, registry).submission
        try:
            view, version = await submission.resolve_for_infer("m", None)
            assert store.republished
            with pytest.raises(SluiceError) as unknown:
                await submission.resolve_for_infer("ghost", None)
            return view.name, version, unknown.value.message
        finally:
            await client.aclose()

    try:
        name, version, unknown = asyncio.run(scenario())
    finally:
        sync.close()
    assert (name, version) == ("m", 1)
    assert unknown == "Request for unknown model: 'ghost' is not found"
