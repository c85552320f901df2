"""The instance loop: consume → execute → reply → acknowledge. Owns the real clock.

Triton's default scheduler (no ``dynamic_batching``): each request runs on its
own, on whichever instance takes it off the stream first. A request whose
deadline has passed is answered with UNAVAILABLE "Request timeout expired"
and not executed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import numpy as np

from broker.consumer import Delivery, StreamConsumer
from broker.datatypes import config_to_protocol, serialize_bytes, to_numpy
from broker.messages import ErrorInfo, InferResponseMessage, WireTensor
from gpu_workers.backends.base import Backend, InferError, InferRequest, InferResponse
from gpu_workers.backends.tensor_adapter import model_config_type_name

logger = logging.getLogger(__name__)

#: longest single blocking read, in ms, so a stop request is seen quickly.
HEARTBEAT_MS = 500


def _wire(name: str, datatype: str, array: np.ndarray) -> WireTensor:
    shape = tuple(int(d) for d in array.shape)
    if datatype == "BYTES":
        data = serialize_bytes(array.ravel())
    else:
        data = np.ascontiguousarray(array).tobytes()
    return WireTensor(name, datatype, shape, data)


class InstanceLoop:
    """Serves one model version with one backend instance until stopped.

    Args:
        consumer: this instance's stream consumer.
        backend: the initialized backend.
        model: model name.
        version: model version.
        output_datatypes: output name -> protocol datatype (from the config).
    """

    def __init__(
        self,
        consumer: StreamConsumer,
        backend: Backend,
        model: str,
        version: int,
        output_datatypes: dict[str, str],
    ) -> None:
        self._consumer = consumer
        self._backend = backend
        self._model = model
        self._version = version
        self._output_datatypes = output_datatypes
        self.stopping = threading.Event()

    @classmethod
    def output_datatypes_of(cls, config: object) -> dict[str, str]:
        """Output name -> protocol datatype of a ``ModelConfig``."""
        return {
            o.name: config_to_protocol(model_config_type_name(o.data_type))
            for o in config.output  # type: ignore[attr-defined]
        }

    def run(self) -> None:
        """Loop until :attr:`stopping` is set; the batch in hand is always finished."""
        while not self.stopping.is_set():
            deliveries = self._consumer.read(count=1, block_ms=HEARTBEAT_MS)
            if deliveries:
                self.serve(deliveries)

    def serve(self, deliveries: Sequence[Delivery]) -> None:
        """Execute each delivery on its own and answer all of them in one round trip."""
        replies: list[tuple[str, InferResponseMessage]] = []
        for delivery in deliveries:
            replies.append((delivery.message.reply_to, self._serve_one(delivery)))
        self._consumer.finish(replies, [d.entry_id for d in deliveries])

    def _error(self, request_id: str, code: str, message: str) -> InferResponseMessage:
        return InferResponseMessage(
            request_id, self._model, self._version, error=ErrorInfo(code, message)
        )

    def _serve_one(self, delivery: Delivery) -> InferResponseMessage:
        message = delivery.message
        start_ns = time.time_ns()
        if start_ns >= message.deadline_ns:
            return self._error(message.request_id, "UNAVAILABLE", "Request timeout expired")
        try:
            inputs = {t.name: to_numpy(t.datatype, t.shape, t.data) for t in message.inputs}
        except ValueError as exc:
            return self._error(message.request_id, "INVALID_ARG", f"model '{self._model}': {exc}")
        request = InferRequest(
            message.request_id, message.client_id, inputs, message.outputs, message.parameters
        )
        input_done_ns = time.time_ns()
        try:
            results = self._backend.execute([request])
        except Exception as exc:
            logger.exception("model '%s' execute raised", self._model)
            return self._error(message.request_id, "INTERNAL", str(exc))
        infer_done_ns = time.time_ns()
        if len(results) != 1:
            return self._error(
                message.request_id,
                "INTERNAL",
                f"model '{self._model}' returned {len(results)} responses for 1 request",
            )
        result = results[0]
        if isinstance(result, InferError):
            return self._error(message.request_id, result.code, result.message)
        assert isinstance(result, InferResponse)
        try:
            outputs = tuple(
                _wire(name, self._output_datatypes.get(name, "BYTES"), array)
                for name, array in result.outputs.items()
            )
        except Exception as exc:
            logger.exception("model '%s' produced an output that cannot be sent", self._model)
            return self._error(message.request_id, "INTERNAL", str(exc))
        done_ns = time.time_ns()
        timings = {
            "queue": start_ns - message.enqueued_ns,
            "compute_input": input_done_ns - start_ns,
            "compute_infer": infer_done_ns - input_done_ns,
            "compute_output": done_ns - infer_done_ns,
        }
        return InferResponseMessage(
            message.request_id,
            self._model,
            self._version,
            outputs,
            None,
            dict(result.parameters),
            timings,
        )
