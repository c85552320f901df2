"""SCALED = pyscale(X), NEGATED = pyneg(X): an ``async def execute`` that sends the BLS
calls of every request of its batch at once with ``async_exec``."""

import asyncio

import triton_python_backend_utils as pb_utils


async def call(model, x):
    request = pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor("X", x)], requested_output_names=["Y"]
    )
    response = await request.async_exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()


class TritonPythonModel:
    async def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        scaled = await asyncio.gather(*(call("pyscale", x) for x in xs))
        negated = await asyncio.gather(*(call("pyneg", x) for x in xs))
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("SCALED", s), pb_utils.Tensor("NEGATED", n)]
            )
            for s, n in zip(scaled, negated, strict=True)
        ]
