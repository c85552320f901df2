"""Calls decoupled_repeat with BLS: ``exec(decoupled=True)`` iterated to the end (OUTS:
every OUT, EMPTY_FINAL: 1 when the last response was empty), and once with a plain
``exec()`` (PLAIN_ERROR: its error text)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(1, 1)
            call = pb_utils.InferenceRequest(
                model_name="decoupled_repeat",
                inputs=[pb_utils.Tensor("IN", n.astype(np.int32))],
                requested_output_names=["OUT"],
            )
            outs, empty_final = [], 0
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is None:
                    empty_final = 1
                else:
                    outs.append(int(out.as_numpy().reshape(-1)[0]))
            plain = call.exec()
            error = plain.error().message() if plain.has_error() else ""
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTS", np.array(outs, dtype=np.int32)),
                        pb_utils.Tensor("EMPTY_FINAL", np.array([empty_final], dtype=np.int32)),
                        pb_utils.Tensor("PLAIN_ERROR", np.array([error.encode()], dtype=object)),
                    ]
                )
            )
        return responses
