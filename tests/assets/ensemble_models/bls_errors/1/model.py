"""OUT = Y of the model named by the request parameter ``target`` (with its
``timeout_us``); a BLS error comes back as this request's error, with its code."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            bls = pb_utils.InferenceRequest(
                model_name=params["target"],
                inputs=[pb_utils.Tensor("X", x)],
                requested_output_names=["Y"],
                timeout=int(params.get("timeout_us", 0)),
            )
            response = bls.exec()
            if response.has_error():
                error = response.error()
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"BLS: {error.message()}", error.code())
                    )
                )
                continue
            y = pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", y)]))
        return responses
