"""BLS for Python models: ``pb_utils.InferenceRequest(...).exec()`` through Redis.

A Python model's instance installs a :class:`BlsExecutor` as ``pb_utils.bls.executor``.
Each call becomes an ordinary request on the callee model's stream (its priority level
from the request's ``priority`` parameter), so it queues and batches with the callee's
other traffic and is counted in its statistics; the answer comes back on a reply list
of the call's own, which the calling thread waits on with the call's deadline
(python_backend README, "Business Logic Scripting"; docs/user-guide/ensembles-and-bls.md).

A call never hangs: an unknown or unready model, a call to the calling model itself (its
instances may all be busy in this very call), a request its config refuses, a full
queue or a passed deadline each come back as a response whose ``has_error()`` is True.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import redis
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.cluster import sync_client
from sluice.broker.codec import CodecError, decode_response, encode_request
from sluice.broker.datatypes import from_numpy, to_numpy
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.keys import WORKER_GROUP, KeySchema
from sluice.broker.messages import (
    InferRequestMessage,
    InferResponseMessage,
    RequestedOutput,
    WireTensor,
)
from sluice.broker.model_store import ModelStore
from sluice.broker.producer import PAYLOAD_FIELD, QUEUE_FULL
from sluice.broker.request_checks import RequestRules, validate_request
from sluice.broker.response_stream import CANCELLED_CREDIT, CREDIT_EVERY
from sluice.broker.scheduling import stream_layout
from sluice.broker.scripts import BOUNDED_XADD
from sluice.broker.states import ModelState
from sluice.gpu_workers.backends.python import pb_utils
from sluice.repository.ensemble import is_ensemble_config

__all__ = ["DEFAULT_TIMEOUT_S", "BlsExecutor", "install_bls"]

logger = logging.getLogger(__name__)

#: how long a BLS call without a ``timeout`` waits for its answer, in s (the gateway's
#: default request timeout).
DEFAULT_TIMEOUT_S = 60.0
#: longest single blocking pop for an answer, in s.
_POP_S = 5.0
#: how long a callee's config and states are reused before Redis is read again, in s.
_VIEW_CACHE_S = 0.5


@dataclass(frozen=True, slots=True)
class _Callee:
    """What a call needs of its target model, read from Redis."""

    config: ModelConfig
    rules: RequestRules
    ready: tuple[int, ...]
    load_ids: dict[int, str]
    fetched_at: float


class BlsExecutor:
    """Runs BLS requests of one model instance.

    Args:
        client: a Redis client of the instance (a pool: each calling thread takes a
            connection of its own).
        keys: the deployment's key schema.
        model: the calling model's name.
        instance: the calling instance's name (reply keys carry it).
    """

    def __init__(self, client: redis.Redis, keys: KeySchema, model: str, instance: str) -> None:
        self._redis = client
        self._keys = keys
        self._store = ModelStore(client, keys)
        self._model = model
        self._instance = instance
        self._callees: dict[str, _Callee] = {}

    def __call__(
        self, request: pb_utils.InferenceRequest, decoupled: bool = False
    ) -> pb_utils.InferenceResponse | Iterator[pb_utils.InferenceResponse]:
        """Run ``request`` on its model; its answer, or an error response. With
        ``decoupled`` (``exec(decoupled=True)``): an iterator over its responses, the
        last one carrying the final flag (an empty response when the model sent the
        flag alone), as python_backend's response iterator."""
        try:
            message, callee = self._send(request)
        except SluiceError as exc:
            failed = _error(exc.code.value, exc.message)
            return iter([failed]) if decoupled else failed
        except redis.exceptions.RedisError as exc:
            failed = _error("UNAVAILABLE", f"BLS request to model '{request.model_name()}': {exc}")
            return iter([failed]) if decoupled else failed
        if decoupled:
            return self._responses(message)
        if callee.config.model_transaction_policy.decoupled:
            return _error(
                "INVALID_ARG",
                f"BLS request to model '{message.model}': the model is decoupled; call "
                "exec(decoupled=True) and iterate over its responses",
            )
        try:
            return self._answer(message)
        except SluiceError as exc:
            return _error(exc.code.value, exc.message)
        except redis.exceptions.RedisError as exc:
            return _error("UNAVAILABLE", f"BLS request to model '{message.model}': {exc}")

    def _responses(self, message: InferRequestMessage) -> Iterator[pb_utils.InferenceResponse]:
        """The responses of a call, up to the final one. The count taken is written to
        the call's credit key (the callee's flow control); an iterator dropped before the
        end cancels the call."""
        taken, finished = 0, False
        credit_key = self._keys.stream_credit(message.request_id)
        ttl_ms = max(1, (message.deadline_ns - time.time_ns()) // 1_000_000)
        try:
            while True:
                try:
                    response = self._pop(message)
                except SluiceError as exc:
                    finished = True
                    yield _error(exc.code.value, exc.message)
                    return
                taken += 1
                if taken % CREDIT_EVERY == 0:
                    self._redis.set(credit_key, taken, px=ttl_ms)
                finished = response.final or response.error is not None
                if response.error is not None:
                    yield _error(response.error.code, response.error.message)
                    return
                yield _response(response)
                if finished:
                    return
        finally:
            if not finished:
                with contextlib.suppress(redis.exceptions.RedisError):
                    self._redis.set(credit_key, CANCELLED_CREDIT, px=ttl_ms)

    def _answer(self, message: InferRequestMessage) -> pb_utils.InferenceResponse:
        response = self._pop(message)
        if response.error is not None:
            return _error(response.error.code, response.error.message)
        return _response(response)

    def _pop(self, message: InferRequestMessage) -> InferResponseMessage:
        """The next response on the call's reply list, within its deadline.

        Raises:
            SluiceError: UNAVAILABLE "Request timeout expired"; INTERNAL for an
                undecodable response.
        """
        popped = None
        while popped is None and (left_s := (message.deadline_ns - time.time_ns()) / 1e9) > 0:
            # in slices: one blocking pop stays well inside the client's socket timeout
            popped = self._redis.blpop([message.reply_to], timeout=max(0.01, min(left_s, _POP_S)))
        if popped is None:
            raise SluiceError(ErrorCode.UNAVAILABLE, "Request timeout expired", model=message.model)
        try:
            return decode_response(popped[1])
        except CodecError as exc:
            raise SluiceError(ErrorCode.INTERNAL, str(exc), model=message.model) from None

    def _send(self, request: pb_utils.InferenceRequest) -> tuple[InferRequestMessage, _Callee]:
        """Check and queue the call; the queued message and its callee.

        Raises:
            SluiceError: the call is refused (see the module docstring).
        """
        name = request.model_name()
        if name == self._model:
            raise SluiceError(
                ErrorCode.INVALID_ARG,
                f"BLS request from model '{name}' to itself is not allowed: its instances "
                "may all be waiting for this answer",
                model=name,
            )
        callee = self._callee(name)
        version = self._version(name, callee, request.model_version())
        inputs = tuple(_wire(t) for t in request.inputs())
        outputs = [RequestedOutput(n) for n in request.requested_output_names()]
        validate_request(callee.rules, inputs, outputs)
        parameters = json.loads(request.parameters() or "{}")
        timeout_s = request.timeout() / 1e6 if request.timeout() > 0 else DEFAULT_TIMEOUT_S
        now_ns = time.time_ns()
        reply_key = self._keys.reply(f"bls-{self._instance}-{uuid.uuid4().hex}")
        message = InferRequestMessage(
            request_id=uuid.uuid4().hex,
            client_id=request.request_id(),
            model=name,
            version=version,
            inputs=inputs,
            outputs=tuple(o.name for o in outputs),
            parameters={k: v for k, v in parameters.items() if not isinstance(v, dict | list)},
            reply_to=reply_key,
            deadline_ns=now_ns + int(timeout_s * 1e9),
            enqueued_ns=now_ns,
            load_id=callee.load_ids.get(version, ""),
        )
        self._queue(message, callee)
        return message, callee

    def _callee(self, name: str) -> _Callee:
        """The target model's config and READY versions (cached for a moment).

        Raises:
            SluiceError: NOT_FOUND for a model Redis does not know; UNSUPPORTED for an
                ensemble or a sequence model.
        """
        known = self._callees.get(name)
        if known is not None and time.monotonic() - known.fetched_at < _VIEW_CACHE_S:
            return known
        record = self._store.get(name)
        if not record.config_json:
            raise SluiceError(
                ErrorCode.NOT_FOUND,
                f"Request for unknown model: '{name}' is not found",
                model=name,
            )
        config = json_format.Parse(record.config_json, ModelConfig())
        if is_ensemble_config(config) or config.HasField("sequence_batching"):
            kind = "an ensemble" if is_ensemble_config(config) else "a sequence model"
            raise SluiceError(
                ErrorCode.UNSUPPORTED,
                f"BLS request to model '{name}': {kind} cannot be called with BLS in Sluice",
                model=name,
            )
        callee = _Callee(
            config,
            RequestRules.from_config(config),
            tuple(sorted(v for v, s in record.versions.items() if s.state is ModelState.READY)),
            {v: s.load_id for v, s in record.versions.items()},
            time.monotonic(),
        )
        self._callees[name] = callee
        return callee

    @staticmethod
    def _version(name: str, callee: _Callee, version: int) -> int:
        """The version a call for ``version`` (-1: the latest ready) runs on.

        Raises:
            SluiceError: NOT_FOUND / UNAVAILABLE, as the gateway answers.
        """
        if version < 0:
            if not callee.ready:
                raise SluiceError(
                    ErrorCode.NOT_FOUND,
                    f"Request for unknown model: '{name}' has no available versions",
                    model=name,
                )
            return callee.ready[-1]
        if version not in callee.ready:
            raise SluiceError(
                ErrorCode.UNAVAILABLE,
                f"Request for unknown model: '{name}' version {version} is not at ready state",
                model=name,
            )
        return version

    def _queue(self, message: InferRequestMessage, callee: _Callee) -> None:
        """``XADD`` the call on its priority level's stream (``max_queue_size`` kept).

        Raises:
            SluiceError: UNAVAILABLE "Exceeds maximum queue size".
        """
        layout = stream_layout(self._keys, message.model, message.version, callee.config)
        level = layout.level_of(int(message.parameters.get("priority", 0) or 0))
        max_queue_size = layout.shard_limit(layout.policy.queue_policy(level).max_queue_size)
        stream = layout.stream(level, random.randrange(layout.shards))
        payload = encode_request(message)
        if max_queue_size <= 0:
            self._redis.xadd(stream, {PAYLOAD_FIELD: payload})
            return
        entry = self._redis.eval(
            BOUNDED_XADD.body, 1, stream, max_queue_size, WORKER_GROUP, payload
        )
        if not entry:
            raise SluiceError(ErrorCode.UNAVAILABLE, QUEUE_FULL, model=message.model)


def _wire(tensor: pb_utils.Tensor) -> WireTensor:
    """A BLS input in the wire layout (its numpy dtype names the datatype; one that does
    not match the callee's config is refused by the config check, naming the tensor)."""
    datatype, shape, data = from_numpy(tensor.as_numpy())
    return WireTensor(tensor.name(), datatype, tuple(shape), data)


def _response(response: InferResponseMessage) -> pb_utils.InferenceResponse:
    tensors = [
        pb_utils.Tensor(t.name, to_numpy(t.datatype, t.shape, t.data)) for t in response.outputs
    ]
    return pb_utils.InferenceResponse(tensors, parameters=dict(response.parameters))


def _error(code: str, message: str) -> pb_utils.InferenceResponse:
    value = next((v for v, n in pb_utils.TritonError.CODE_NAMES.items() if n == code), 1)
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, value))


def install_bls(redis_url: str, keys: KeySchema, model: str, instance: str) -> None:
    """Let this process's Python model make BLS calls (``pb_utils.bls.executor``), with a
    Redis client of their own (its pool gives each calling thread a connection)."""
    from sluice.gpu_workers.backends.python.pb_utils import bls

    client = sync_client(redis_url, protocol=2, socket_timeout=30)
    bls.executor = BlsExecutor(client, keys, model, instance)
