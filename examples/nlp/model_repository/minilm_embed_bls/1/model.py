"""The ``minilm_embed`` ensemble written with BLS (business logic scripting).

``TEXT`` (BYTES ``[b, 1]``) -> ``minilm_tokenize`` -> ``minilm_encoder`` ->
``minilm_pool`` -> ``EMBEDDING`` (FP32 ``[b, 384]``, unit length), each step a BLS call
(``pb_utils.InferenceRequest(...).async_exec()``) that queues and batches with the
called model's other traffic. The calls of every request of a batch are sent at once
(``asyncio.gather``), so they batch in the called models too. A failing call fails its
request with the callee's error code and message, prefixed by the called model's name.
"""

from __future__ import annotations

import asyncio

import triton_python_backend_utils as pb_utils

#: each call's deadline, in microseconds
CALL_TIMEOUT_US = 30_000_000


class StepFailed(Exception):
    """A BLS call answered with an error: ``error`` is the callee's ``TritonError``."""

    def __init__(self, model: str, error: object) -> None:
        super().__init__(model)
        self.model = model
        self.error = error


async def _call(model: str, inputs: list, outputs: list[str]) -> dict:
    request = pb_utils.InferenceRequest(
        model_name=model,
        inputs=inputs,
        requested_output_names=outputs,
        timeout=CALL_TIMEOUT_US,
    )
    response = await request.async_exec()
    if response.has_error():
        raise StepFailed(model, response.error())
    return {name: pb_utils.get_output_tensor_by_name(response, name) for name in outputs}


async def _embed(text: object) -> object:
    tokens = await _call(
        "minilm_tokenize", [text], ["INPUT_IDS", "ATTENTION_MASK", "TOKEN_TYPE_IDS"]
    )
    ids, mask, types = (t.as_numpy() for t in tokens.values())
    hidden = await _call(
        "minilm_encoder",
        [
            pb_utils.Tensor("input_ids", ids),
            pb_utils.Tensor("attention_mask", mask),
            pb_utils.Tensor("token_type_ids", types),
        ],
        ["last_hidden_state"],
    )
    pooled = await _call(
        "minilm_pool",
        [
            pb_utils.Tensor("TOKEN_EMBEDDINGS", hidden["last_hidden_state"].as_numpy()),
            pb_utils.Tensor("ATTENTION_MASK", mask),
        ],
        ["EMBEDDING"],
    )
    return pooled["EMBEDDING"].as_numpy()


async def _respond(request: object) -> object:
    text = pb_utils.get_input_tensor_by_name(request, "TEXT")
    try:
        embedding = await _embed(text)
    except StepFailed as failed:
        return pb_utils.InferenceResponse(
            error=pb_utils.TritonError(
                f"minilm_embed_bls, call to '{failed.model}': {failed.error.message()}",
                failed.error.code(),
            )
        )
    return pb_utils.InferenceResponse([pb_utils.Tensor("EMBEDDING", embedding)])


class TritonPythonModel:
    async def execute(self, requests: list) -> list:
        return list(await asyncio.gather(*(_respond(r) for r in requests)))
