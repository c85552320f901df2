"""Which outputs a response carries: the requested ones, in request order, else all."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.broker.messages import RequestedOutput, WireTensor


def select_outputs(
    outputs: Sequence[WireTensor], requested: Sequence[RequestedOutput]
) -> list[tuple[WireTensor, RequestedOutput | None]]:
    """Pair each output to send with its request (None when the client listed none).

    KServe v2: with no ``outputs`` in the request every output is returned, in the order
    the model produced them; otherwise the requested ones, in request order. A requested
    output the model did not produce is left out, not an error: Triton's front ends
    write the outputs a response holds (a Python model may answer without some), and
    tritonclient's ``as_numpy`` then gives None for it.
    """
    if not requested:
        return [(tensor, None) for tensor in outputs]
    by_name = {tensor.name: tensor for tensor in outputs}
    return [(by_name[w.name], w) for w in requested if w.name in by_name]
