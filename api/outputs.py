"""Which outputs a response carries: the requested ones, in request order, else all."""

from __future__ import annotations

from collections.abc import Sequence

from broker.errors import ErrorCode, SluiceError
from broker.messages import RequestedOutput, WireTensor


def select_outputs(
    model: str, outputs: Sequence[WireTensor], requested: Sequence[RequestedOutput]
) -> list[tuple[WireTensor, RequestedOutput | None]]:
    """Pair each output to send with its request (None when the client listed none).

    KServe v2: with no ``outputs`` in the request every output is returned, in the order
    the model produced them; otherwise exactly the requested ones, in request order.

    Raises:
        SluiceError: INTERNAL when a requested output is missing from the model's answer.
    """
    if not requested:
        return [(tensor, None) for tensor in outputs]
    by_name = {tensor.name: tensor for tensor in outputs}
    selected: list[tuple[WireTensor, RequestedOutput | None]] = []
    for wanted in requested:
        tensor = by_name.get(wanted.name)
        if tensor is None:
            raise SluiceError(
                ErrorCode.INTERNAL,
                f"model '{model}' produced no output '{wanted.name}'",
                model=model,
                tensor=wanted.name,
            )
        selected.append((tensor, wanted))
    return selected
