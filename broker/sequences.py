"""Sequences in Redis: binding a correlation id to a model instance, step numbers,
implicit state and the last answer, for Triton's sequence batcher.

Every live sequence has a hash (``KeySchema.sequence``) under its model's ``{model}`` hash
tag, so one Redis Cluster slot holds it with the model's streams:

| field | holds |
| --- | --- |
| ``inst`` | the model instance the sequence is bound to |
| ``live`` | ``1`` from a START until an END is queued (what the START rule checks) |
| ``enq`` | steps queued so far (the last step number given out) |
| ``done`` | steps run so far; step ``n`` runs only when ``done`` is ``n - 1`` |
| ``s:<name>`` | implicit state tensor ``<name>`` after step ``done`` (:func:`encode_state`) |
| ``ans`` / ``ansn`` | the encoded answer of step ``ansn`` (sent again on a redelivery) |

A gateway queues a step with :data:`SEQ_SUBMIT` (one script: the START rule, the
binding, the step number, the ``XADD`` to the instance's stream); the instance that runs
it commits the new state, ``done`` and the answer with :data:`SEQ_COMMIT` (one script,
so no crash leaves a state ahead of or behind the answer a client got). The hash
expires after the sequence's idle time (``max_sequence_idle_microseconds``), counted
from its last step queued or run; a later step without START then gets Triton's error.

When the instance holding a sequence is gone (its record STOPPED, UNAVAILABLE or
without a fresh heartbeat), the next step binds the sequence to a live instance, which
continues from the committed state (``done`` and ``s:*``). Steps still queued for the
gone instance are run by a live instance that adopts its stream (``gpu_workers``);
the step numbers keep them in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.datatypes import config_to_protocol, to_numpy
from sluice.broker.errors import ErrorCode, SluiceError
from sluice.broker.messages import ParameterValue, WireTensor
from sluice.broker.scripts import Script
from sluice.repository.sequence_config import SequenceSpec, sequence_spec

__all__ = [
    "SEQ_COMMIT",
    "SEQ_SUBMIT",
    "SequenceRules",
    "SequenceStepInfo",
    "corrid_tag",
    "decode_state",
    "encode_state",
    "missing_start",
]

#: fields of a sequence stream entry besides the request: its step number and the
#: sequence's ``done`` count when it was queued.
STEP_FIELD = b"n"
DONE_FIELD = b"d"

#: Queue one step of a sequence. KEYS[1]: the sequence hash; KEYS[2]: the version's
#: instances hash. ARGV: start (0/1), end (0/1), now (wall-clock ns), stale (ns: heartbeat
#: age past which an instance is gone), pick (a random integer: which live instance a new
#: binding takes), expire (ms), the encoded request, the sequence stream key without the
#: instance name. Returns ``{entry id, step number, instance}``; ``{0}`` when the step
#: has no START and the sequence is not live; ``{-1}`` when the model has no instance.
SEQ_SUBMIT = Script(
    """
local start, finish = ARGV[1] == '1', ARGV[2] == '1'
if not start and redis.call('HGET', KEYS[1], 'live') ~= '1' then return {0} end
local now, stale = tonumber(ARGV[3]), tonumber(ARGV[4])
local function alive(name)
  if not name then return false end
  local raw = redis.call('HGET', KEYS[2], name)
  if not raw then return false end
  local ok, info = pcall(cjson.decode, raw)
  if not ok or type(info) ~= 'table' or info['state'] ~= 'READY' then return false end
  return now - tonumber(info['heartbeat_ns'] or 0) <= stale
end
local inst = redis.call('HGET', KEYS[1], 'inst')
if not alive(inst) then
  local names, any = {}, {}
  local all = redis.call('HKEYS', KEYS[2])
  table.sort(all)
  for _, name in ipairs(all) do
    if alive(name) then table.insert(names, name) end
    table.insert(any, name)
  end
  if #names == 0 then
    if inst then names = {inst} else names = any end
  end
  if #names == 0 then return {-1} end
  inst = names[(tonumber(ARGV[5]) % #names) + 1]
  redis.call('HSET', KEYS[1], 'inst', inst)
end
local n = redis.call('HINCRBY', KEYS[1], 'enq', 1)
local done = redis.call('HGET', KEYS[1], 'done') or '0'
if finish then
  redis.call('HSET', KEYS[1], 'live', '0')
elseif start then
  redis.call('HSET', KEYS[1], 'live', '1')
end
local id = redis.call('XADD', ARGV[8] .. inst, '*', 'm', ARGV[7], 'n', n, 'd', done)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return {id, n, inst}
"""
)

#: Commit one step that ran. KEYS[1]: the sequence hash. ARGV: step number, idle time
#: (ms), the encoded answer, end (0/1), then the state fields and values (``s:<name>``,
#: encoded tensor), if any. Returns 1; 0 when ``done`` already counts the step (it ran
#: before: nothing is written). The state goes on an END step (the sequence is over);
#: the hash expires after the idle time once no queued step is left.
SEQ_COMMIT = Script(
    """
local n = tonumber(ARGV[1])
local done = tonumber(redis.call('HGET', KEYS[1], 'done') or '0')
if n <= done then return 0 end
redis.call('HSET', KEYS[1], 'done', n, 'ans', ARGV[3], 'ansn', n)
if ARGV[4] == '1' then
  local fields = redis.call('HKEYS', KEYS[1])
  for _, field in ipairs(fields) do
    if string.sub(field, 1, 2) == 's:' then redis.call('HDEL', KEYS[1], field) end
  end
else
  for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
local enq = tonumber(redis.call('HGET', KEYS[1], 'enq') or '0')
if enq <= n then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""
)


def corrid_tag(value: int | str) -> str:
    """The correlation id as it names keys: ``u:<int>`` or ``s:<string>`` (so that 5 and
    "5" stay two sequences, as Triton keeps them)."""
    return f"s:{value}" if isinstance(value, str) else f"u:{value}"


def encode_state(tensor: np.ndarray, datatype: str) -> bytes:
    """An implicit state tensor as stored: msgpack ``[datatype, shape, raw bytes]``."""
    array = np.ascontiguousarray(tensor)
    return msgpack.packb([datatype, list(array.shape), array.tobytes()])


def decode_state(raw: bytes) -> np.ndarray:
    """The tensor :func:`encode_state` stored."""
    datatype, shape, data = msgpack.unpackb(raw)
    return to_numpy(datatype, tuple(shape), data)


@dataclass(frozen=True, slots=True)
class SequenceStepInfo:
    """The sequence facts of one request: its correlation id and flags."""

    corrid: int | str
    start: bool
    end: bool

    @property
    def tag(self) -> str:
        return corrid_tag(self.corrid)


class SequenceRules:
    """What a gateway checks of a request to a model with sequence batching (Triton
    ``src/sequence_batch_scheduler``; docs/reference/model-configuration.md, Sequence
    batcher).

    Args:
        model: the model name (for messages).
        spec: the config's sequence batching block.
        batching: whether the model has a batch dimension.
    """

    def __init__(self, model: str, spec: SequenceSpec, batching: bool) -> None:
        self.model = model
        self.spec = spec
        self.batching = batching
        corrid = spec.corrid_type
        self._corrid_kind = (
            None if corrid is None else ("string" if corrid == "TYPE_STRING" else "int")
        )

    @classmethod
    def from_config(cls, config: ModelConfig) -> SequenceRules | None:
        """The rules of ``config`` (None without ``sequence_batching``); the config was
        checked at load, so ``initial_state`` files are not looked for again."""
        if not config.HasField("sequence_batching"):
            return None
        from pathlib import Path

        stripped = ModelConfig()
        stripped.CopyFrom(config)
        for state in stripped.sequence_batching.state:
            del state.initial_state[:]
        return cls(config.name, sequence_spec(stripped, Path(".")), config.max_batch_size > 0)

    def check(
        self, parameters: dict[str, ParameterValue], inputs: tuple[WireTensor, ...]
    ) -> SequenceStepInfo:
        """The sequence facts of a request, or Triton's error.

        Raises:
            SluiceError: INVALID_ARG when the request has no (or a zero / empty)
                correlation id, a batch size above 1, or a correlation id of the other
                kind than the model's CORRID control (a string for an integer CORRID or
                the reverse; never converted).
        """
        corrid = parameters.get("sequence_id", 0)
        if isinstance(corrid, bool) or corrid in (0, "") or not isinstance(corrid, int | str):
            raise SluiceError(
                ErrorCode.INVALID_ARG,
                f"inference request to model '{self.model}' must specify a non-zero or "
                "non-empty correlation ID",
                model=self.model,
            )
        if self.batching and inputs and inputs[0].shape and inputs[0].shape[0] > 1:
            raise SluiceError(
                ErrorCode.INVALID_ARG,
                f"inference request to model '{self.model}' must specify batch-size 1 due "
                "to requirements of sequence batcher",
                model=self.model,
            )
        kind = "string" if isinstance(corrid, str) else "int"
        if self._corrid_kind is not None and kind != self._corrid_kind:
            raise SluiceError(
                ErrorCode.INVALID_ARG,
                f"inference request for sequence {corrid} to model '{self.model}': the "
                f"correlation ID is {'a string' if kind == 'string' else 'an integer'} but "
                f"the model's CONTROL_SEQUENCE_CORRID is {self.spec.corrid_type}",
                model=self.model,
            )
        return SequenceStepInfo(
            corrid, bool(parameters.get("sequence_start")), bool(parameters.get("sequence_end"))
        )


def missing_start(model: str, corrid: int | str) -> SluiceError:
    """Triton's answer to a step without START of a sequence that is not live."""
    return SluiceError(
        ErrorCode.INVALID_ARG,
        f"inference request for sequence {corrid} to model '{model}' must specify the "
        "START flag on the first request of the sequence",
        model=model,
    )


def state_datatype(config_type: str) -> str:
    """The protocol datatype of a state's config type (``TYPE_FP32`` -> ``FP32``)."""
    return config_to_protocol(config_type)
