"""Y = -X (FP32 [16]); a request with an element above 1e6 fails with INVALID_ARG."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            if (x > 1e6).any():
                error = pb_utils.TritonError(
                    "value too large for pyneg", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", -x)]))
        return responses
