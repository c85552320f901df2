"""The answers an instance sends: backend results and errors as response messages.

Outputs travel as wire tensors in the datatype the model config declares (BYTES for
an output it does not); an output the request asked to classify travels as Triton's
``"value:index[:label]"`` strings (:mod:`sluice.gpu_workers.classification`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from sluice.broker.datatypes import config_to_protocol, serialize_bytes
from sluice.broker.errors import FailureReason
from sluice.broker.messages import ErrorInfo, InferRequestMessage, InferResponseMessage, WireTensor
from sluice.gpu_workers.backends.base import InferError, InferResponse, Streamed
from sluice.gpu_workers.batch_assembly import Held
from sluice.gpu_workers.classification import classify

logger = logging.getLogger(__name__)


def wire(name: str, datatype: str, array: np.ndarray) -> WireTensor:
    """``array`` as the wire tensor ``name`` of protocol ``datatype``."""
    # tobytes() writes C order whatever the array's layout
    data = serialize_bytes(array.reshape(-1)) if datatype == "BYTES" else array.tobytes()
    return WireTensor(name, datatype, array.shape, data)


class Answers:
    """Builds the answers of one model version's instance.

    Args:
        model: the model's name.
        version: the version served.
        load_id: the model load the instance belongs to, stamped on its answers
            (``InferResponseMessage.load_id``).
        output_datatypes: output name -> protocol datatype (from the config).
        batching: whether the model has a batch dimension (``max_batch_size`` > 0).
    """

    def __init__(
        self,
        model: str,
        version: int,
        load_id: str,
        output_datatypes: dict[str, str],
        batching: bool,
    ) -> None:
        self._model = model
        self._version = version
        self._load_id = load_id
        self._output_datatypes = output_datatypes
        self._batching = batching

    def error(self, request_id: str, code: str, message: str) -> InferResponseMessage:
        """The answer failing ``request_id`` with a Triton error code and text."""
        return InferResponseMessage(
            request_id, self._model, self._version, error=ErrorInfo(code, message)
        )

    def final_flag(self, request_id: str) -> InferResponseMessage:
        """A decoupled model's final flag sent without a response."""
        return InferResponseMessage(request_id, self._model, self._version, empty=True)

    def of_batch(
        self,
        held: Sequence[Held],
        results: Sequence[InferResponse | InferError | Streamed],
        decode_errors: dict[int, str],
        labels: dict[str, list[str]],
    ) -> tuple[
        list[InferResponseMessage | None],
        list[tuple[int, Held]],
        list[tuple[Held, FailureReason]],
    ]:
        """The answers of one execution's requests (``results``: one per request that ran,
        those with an input that could not be decoded left out), with the successes
        (index, request) and failures (request, reason) among them. Triton counts an
        error the backend returned as reason BACKEND. A request the backend answers
        itself (:class:`Streamed`) has no answer here (None) and counts as a success."""
        answers: list[InferResponseMessage | None] = []
        successes: list[tuple[int, Held]] = []
        failures: list[tuple[Held, FailureReason]] = []
        result_iter = iter(results)
        for index, item in enumerate(held):
            message = item.delivery.message
            if index in decode_errors:
                answers.append(self.error(message.request_id, "INVALID_ARG", decode_errors[index]))
                failures.append((item, FailureReason.OTHER))
                continue
            result = next(result_iter)
            if isinstance(result, Streamed):  # the model sends its responses itself
                answers.append(None)
                successes.append((index, item))
                continue
            answer = self.answer(message, result, labels)
            answers.append(answer)
            if answer.error is None:
                successes.append((index, item))
                continue
            failures.append((item, FailureReason.BACKEND))
            logger.debug(
                "request %s (client id '%s') of model '%s' failed: %s: %s",
                message.request_id, message.client_id, self._model, answer.error.code,
                answer.error.message,
            )  # fmt: skip
        return answers, successes, failures

    def answer(
        self,
        message: InferRequestMessage,
        result: InferResponse | InferError,
        labels: dict[str, list[str]],
    ) -> InferResponseMessage:
        """The answer to ``message`` from its backend ``result``; ``labels``: output
        name -> class labels (Triton ``label_filename``), for classification. An output
        that cannot be sent fails the request with INTERNAL."""
        return self.response(message.request_id, result, message.classification, labels)

    def response(
        self,
        request_id: str,
        result: InferResponse | InferError,
        classification: dict[str, int],
        labels: dict[str, list[str]],
    ) -> InferResponseMessage:
        """:meth:`answer` from the request's id and classification requests
        (output name -> k)."""
        if isinstance(result, InferError):
            return self.error(request_id, result.code, result.message)
        # an answer without outputs is sent as such (Triton's python_backend sends a
        # response with the outputs the model gave, none included)
        try:
            wires = []
            for name, array in result.outputs.items():
                k = classification.get(name, 0)
                if k > 0:
                    classes = classify(array, k, self._batching, labels.get(name, []))
                    wires.append(wire(name, "BYTES", classes))
                else:
                    wires.append(wire(name, self._output_datatypes.get(name, "BYTES"), array))
            outputs = tuple(wires)
        except Exception as exc:
            logger.exception("model '%s' produced an output that cannot be sent", self._model)
            return self.error(request_id, "INTERNAL", str(exc))
        return InferResponseMessage(
            request_id,
            self._model,
            self._version,
            outputs,
            None,
            dict(result.parameters),
            load_id=self._load_id,
        )


def output_datatypes(config: object) -> dict[str, str]:
    """Output name -> protocol datatype of a ``ModelConfig``."""
    from sluice.gpu_workers.backends.tensor_adapter import model_config_type_name

    return {
        o.name: config_to_protocol(model_config_type_name(o.data_type))
        for o in config.output  # type: ignore[attr-defined]
    }
