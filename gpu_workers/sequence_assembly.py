"""Sequence batching in a model instance: the steps it holds, the control and implicit
state tensors it feeds the model, and the state it commits with each answer.

The pure :class:`~sluice.batching.sequence.SequenceScheduler` decides which steps run
together; this module does the I/O around it (Redis, tensors). It takes the place of
:class:`~sluice.gpu_workers.batch_assembly.BatchAssembly` in the instance loop for a
model with ``sequence_batching`` (same methods), plus three hooks the loop calls around
an execution: :meth:`SequenceAssembly.prepare` (add controls and state to the
requests), :meth:`SequenceAssembly.keep_states` (take the new state out of the
results) and :meth:`SequenceAssembly.settle` (the commands that commit each step with
its answer, ``broker.sequences.SEQ_COMMIT``).

Control values and shapes follow Triton (docs/reference/model-configuration.md,
Sequence batcher): one element per request, shape ``[1]`` (``[1, 1]`` with the batch
dimension); START/END/READY carry the configured false/true value; CORRID the
correlation id in its configured type (the low 32 bits for 32-bit types, a string id
as BYTES). A step's state input is the state its previous step produced, or the
initial state (zeros, or the ``initial_state`` data file) on START.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import redis
import redis.exceptions

from sluice.batching.sequence import SequencePolicy, SequenceScheduler, SequenceStep
from sluice.broker.consumer import Delivery
from sluice.broker.datatypes import NUMPY_DTYPES, config_to_protocol
from sluice.broker.errors import TIMEOUT_TEXT
from sluice.broker.keys import WORKER_GROUP, KeySchema
from sluice.broker.messages import InferResponseMessage
from sluice.broker.sequences import SEQ_COMMIT, corrid_tag, decode_state, encode_state
from sluice.gpu_workers.backends.base import InferError, InferRequest, InferResponse
from sluice.gpu_workers.batch_assembly import MAX_DELIVERIES, Admission, Held
from sluice.repository.sequence_config import ControlSpec, SequenceSpec, StateSpec

logger = logging.getLogger(__name__)

#: how often steps waiting on a step run elsewhere look up its ``done`` count, in ns.
UNKNOWN_POLL_NS = 2_000_000

_CORRID_DTYPES = {
    "TYPE_UINT64": np.uint64,
    "TYPE_INT64": np.int64,
    "TYPE_UINT32": np.uint32,
    "TYPE_INT32": np.int32,
}
_BOOL_DTYPES = {"TYPE_INT32": np.int32, "TYPE_FP32": np.float32, "TYPE_BOOL": np.bool_}


def sequence_policy(spec: SequenceSpec, max_batch_size: int) -> SequencePolicy:
    """The scheduler policy of one instance for ``spec``."""
    capacity = spec.candidates if spec.strategy == "oldest" else max(1, max_batch_size)
    return SequencePolicy(
        spec.strategy,
        max_batch_size,
        capacity,
        spec.preferred_batch_sizes,
        spec.max_queue_delay_us,
        spec.idle_us,
    )


def _corrid(delivery: Delivery) -> int | str:
    value = delivery.message.parameters.get("sequence_id", 0)
    return value if isinstance(value, str) else int(value)


def _flag(delivery: Delivery, name: str) -> bool:
    return bool(delivery.message.parameters.get(name))


class SequenceAssembly:
    """The steps one instance holds and runs, for a model with sequence batching.

    Args:
        client: a synchronous Redis client (state reads, duplicate answers).
        keys: the deployment's key schema.
        model: the model name.
        version: the version served.
        spec: the config's sequence batching block.
        max_batch_size: the model's ``max_batch_size``.
        initial_states: state input name -> its initial value (without batch dimension).
        config_outputs: the outputs the config lists (a state output among them is also
            answered to the client).
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: KeySchema,
        model: str,
        version: int,
        spec: SequenceSpec,
        max_batch_size: int,
        initial_states: dict[str, np.ndarray],
        config_outputs: frozenset[str] = frozenset(),
    ) -> None:
        self._redis = client
        self._keys = keys
        self._model = model
        self._version = version
        self._spec = spec
        self._batching = max_batch_size > 0
        self._scheduler = SequenceScheduler(sequence_policy(spec, max_batch_size))
        self._initial = initial_states
        self._config_outputs = config_outputs
        self.held: dict[str, Held] = {}
        #: request id -> its step, from admission until it is settled
        self._steps: dict[str, SequenceStep] = {}
        #: correlation id -> (done count, state input name -> array) after that step
        self._states: dict[int | str, tuple[int, dict[str, np.ndarray]]] = {}
        #: request id -> the state its execution produced (state input name -> array)
        self._produced: dict[str, dict[str, np.ndarray]] = {}
        self._next_poll_ns = 0
        self._idle_ms = max(1, spec.idle_us // 1000)

    def __len__(self) -> int:
        return len(self.held)

    # -- the BatchAssembly interface ---------------------------------------------------------

    def admit(self, deliveries: Sequence[Delivery], now: int) -> Admission:
        """Hold each step for the scheduler; a step delivered too often (its instance died
        each time) is refused; a step that ran before (delivered again after a crash) gets
        its stored answer again."""
        result = Admission()
        for delivery in deliveries:
            message = delivery.message
            if message.request_id in self.held or message.request_id in self._steps:
                continue
            if delivery.step <= 0:
                result.refused.append(
                    (delivery, "INTERNAL", f"model '{self._model}': not a sequence step")
                )
                continue
            step = SequenceStep(
                message.request_id,
                _corrid(delivery),
                delivery.step,
                _flag(delivery, "sequence_start"),
                _flag(delivery, "sequence_end"),
                now,
                delivery.known_done,
            )
            self._scheduler.offer(step, now)
            self._steps[message.request_id] = step
            self.held[message.request_id] = Held(delivery, 1 if self._batching else 0)
            if delivery.deliveries > MAX_DELIVERIES:
                self._scheduler.drop(step.id, step.corrid)
                del self.held[message.request_id]
                result.refused.append(
                    (
                        delivery,
                        "INTERNAL",
                        f"model '{self._model}': an instance exited while running this "
                        f"request ({delivery.deliveries - 1} attempts); not running it again",
                    )
                )
        self._answer_duplicates()
        return result

    def expire(self, now: int) -> list[tuple[Delivery, str, str]]:
        """Take out the held steps whose deadline passed; they are answered UNAVAILABLE
        and settled (the steps after them run)."""
        failures = []
        for request_id, held in list(self.held.items()):
            if held.delivery.message.deadline_ns <= now:
                step = self._steps[request_id]
                if self._scheduler.drop(step.id, step.corrid) is not None:
                    del self.held[request_id]
                    failures.append((held.delivery, "UNAVAILABLE", TIMEOUT_TEXT))
        return failures

    def take(self, now: int) -> object | None:
        """The batch to run now (its steps stay held until :meth:`release`)."""
        self._learn_done(now)
        return self._scheduler.take(now)

    def wake_at(self, now: int) -> int | None:
        wake = self._scheduler.wake_at(now)
        if self._scheduler.unknown():
            poll = max(now, self._next_poll_ns)
            wake = poll if wake is None else min(wake, poll)
        return wake

    def release(self, batch: object) -> list[Held]:
        """What a taken batch holds, no longer held (it runs now)."""
        return [self.held.pop(item.id) for item in batch.items]  # type: ignore[attr-defined]

    # -- around an execution -----------------------------------------------------------------

    def prepare(self, held: Sequence[Held], requests: list[InferRequest]) -> list[InferRequest]:
        """The requests with their control and state inputs added."""
        states = self._load_states([self._steps[h.delivery.message.request_id] for h in held])
        prepared = []
        for item, request in zip(held, requests, strict=True):
            step = self._steps[item.delivery.message.request_id]
            inputs = dict(request.inputs)
            for control in self._spec.controls:
                inputs[control.name] = self._control(control, step)
            inputs.update(states[step.id])
            prepared.append(replace(request, inputs=inputs))
        return prepared

    def keep_states(
        self, request_ids: Sequence[str], results: list[InferResponse | InferError]
    ) -> list[InferResponse | InferError]:
        """Take the state outputs out of each result (kept for :meth:`settle`); a state
        output stays in the answer only where the config lists it as an output too."""
        if not self._spec.states:
            return results
        kept = []
        for request_id, result in zip(request_ids, results, strict=True):
            if isinstance(result, InferError):
                kept.append(result)
                continue
            outputs = dict(result.outputs)
            produced: dict[str, np.ndarray] = {}
            for state in self._spec.states:
                array = outputs.get(state.output_name)
                if array is None:
                    continue
                produced[state.input_name] = np.asarray(array)
                if state.output_name not in self._config_outputs:
                    del outputs[state.output_name]
            self._produced[request_id] = produced
            kept.append(InferResponse(outputs, result.parameters))
        return kept

    def settle(
        self, answered: Sequence[tuple[Delivery, InferResponseMessage]], now: int
    ) -> list[tuple[object, ...]]:
        """Each step is done (run, failed or expired): the scheduler frees its sequence
        for the next step, and the commands that commit it with its answer (its new
        state where it ran) are returned, to go out before the answers."""
        commands: list[tuple[object, ...]] = []
        settled = []
        for delivery, answer in answered:
            step = self._steps.pop(delivery.message.request_id, None)
            if step is None:
                continue
            settled.append(step)
            previous = self._states.get(step.corrid, (0, {}))[1]
            if step.start:
                previous = {}
            produced = self._produced.pop(step.id, None)
            state = previous if produced is None or answer.error else {**previous, **produced}
            args: list[object] = [
                step.n, self._idle_ms, _encoded(answer), int(step.end),
            ]  # fmt: skip
            if step.end:
                self._states.pop(step.corrid, None)
            else:
                self._states[step.corrid] = (step.n, state)
                for spec in self._spec.states:
                    if spec.input_name in state:
                        args += [f"s:{spec.input_name}", encode_state(state[spec.input_name],
                                 config_to_protocol(spec.data_type))]  # fmt: skip
            key = self._keys.sequence(self._model, self._version, corrid_tag(step.corrid))
            commands.append(("EVAL", SEQ_COMMIT.body, 1, key, *args))
        self._scheduler.complete(settled, now)
        return commands

    # -- state -------------------------------------------------------------------------------

    def _load_states(self, steps: Sequence[SequenceStep]) -> dict[str, dict[str, np.ndarray]]:
        """Step id -> its state inputs (with the batch dimension where the model has one)."""
        if not self._spec.states:
            return {s.id: {} for s in steps}
        found: dict[str, dict[str, np.ndarray]] = {}
        missing: list[SequenceStep] = []
        for step in steps:
            cached = self._states.get(step.corrid)
            if step.start:
                found[step.id] = self._initial_inputs()
            elif cached is not None and cached[0] == step.n - 1:
                found[step.id] = {**self._initial_inputs(), **cached[1]}
            else:
                missing.append(step)
        if missing:
            fields = [f"s:{s.input_name}" for s in self._spec.states]
            with self._redis.pipeline(transaction=False) as pipe:
                for step in missing:
                    key = self._keys.sequence(self._model, self._version, corrid_tag(step.corrid))
                    pipe.hmget(key, fields)
                rows = pipe.execute()
            for step, row in zip(missing, rows, strict=True):
                state = self._initial_inputs()
                for spec, raw in zip(self._spec.states, row, strict=True):
                    if raw is not None:
                        state[spec.input_name] = decode_state(raw)
                found[step.id] = state
                self._states[step.corrid] = (step.n - 1, dict(state))
        return found

    def _initial_inputs(self) -> dict[str, np.ndarray]:
        if self._batching:
            return {name: value[np.newaxis] for name, value in self._initial.items()}
        return dict(self._initial)

    def _control(self, control: ControlSpec, step: SequenceStep) -> np.ndarray:
        shape = (1, 1) if self._batching else (1,)
        if control.kind == "CORRID":
            if control.data_type == "TYPE_STRING":
                array = np.empty(1, dtype=object)
                array[0] = str(step.corrid).encode()
                return array.reshape(shape)
            dtype = _CORRID_DTYPES[control.data_type]
            value = int(step.corrid) & (0xFFFFFFFF if dtype in (np.uint32, np.int32) else -1)
            return np.array([value], dtype=np.uint64).astype(dtype).reshape(shape)
        on = {"START": step.start, "END": step.end, "READY": True}[control.kind]
        value = control.true_value if on else control.false_value
        return np.full(shape, value, dtype=_BOOL_DTYPES[control.data_type])

    # -- Redis round trips off the hot path --------------------------------------------------

    def _learn_done(self, now: int) -> None:
        """Read the ``done`` count of sequences whose next step waits on a step run
        elsewhere (at most every :data:`UNKNOWN_POLL_NS`)."""
        unknown = self._scheduler.unknown()
        if not unknown or now < self._next_poll_ns:
            return
        self._next_poll_ns = now + UNKNOWN_POLL_NS
        with self._redis.pipeline(transaction=False) as pipe:
            for corrid in unknown:
                pipe.hget(
                    self._keys.sequence(self._model, self._version, corrid_tag(corrid)), "done"
                )
            rows = pipe.execute()
        for corrid, done in zip(unknown, rows, strict=True):
            self._scheduler.committed(corrid, int(done or 0))

    def _answer_duplicates(self) -> None:
        """Steps that ran before (delivered again after a crash between their commit and
        their acknowledgement): their stored answer is sent again, and they are
        acknowledged."""
        duplicates = self._scheduler.take_duplicates()
        if not duplicates:
            return
        with self._redis.pipeline(transaction=False) as pipe:
            for step in duplicates:
                key = self._keys.sequence(self._model, self._version, corrid_tag(step.corrid))
                pipe.hmget(key, ["ansn", "ans"])
            rows = pipe.execute()
        with self._redis.pipeline(transaction=False) as pipe:
            for step, (ansn, ans) in zip(duplicates, rows, strict=True):
                held = self.held.pop(step.id)
                self._steps.pop(step.id, None)
                delivery = held.delivery
                if ans is not None and int(ansn or 0) == step.n:
                    pipe.rpush(delivery.message.reply_to, ans)
                pipe.xack(delivery.stream, WORKER_GROUP, delivery.entry_id)
                pipe.xdel(delivery.stream, delivery.entry_id)
            pipe.execute()
        logger.info("model '%s': %d sequence step(s) had run already", self._model,
                    len(duplicates))  # fmt: skip


def _encoded(answer: InferResponseMessage) -> bytes:
    from sluice.broker.codec import encode_response

    return encode_response(answer)


def initial_states(spec: SequenceSpec) -> dict[str, np.ndarray]:
    """State input name -> its value at a sequence's start (without batch dimension).

    Raises:
        ValueError: an ``initial_state`` data file does not hold the state's element
            count.
    """
    return {state.input_name: _initial(state) for state in spec.states}


def _initial(state: StateSpec) -> np.ndarray:
    dtype = NUMPY_DTYPES[config_to_protocol(state.data_type)]
    if state.initial_file is None:
        return np.zeros(state.initial_dims, dtype=dtype)
    data = np.fromfile(state.initial_file, dtype=dtype)
    count = int(np.prod(state.initial_dims))
    if data.size != count:
        raise ValueError(
            f"initial_state data_file '{state.initial_file}' of state '{state.input_name}' "
            f"holds {data.size} elements, dims {list(state.initial_dims)} need {count}"
        )
    return data.reshape(state.initial_dims)
