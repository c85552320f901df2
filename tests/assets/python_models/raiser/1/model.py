"""Y = X; a negative X fails its own request, X == 13 fails the whole execute call,
X == 4077 answers with an output the config does not have, X == 4088 with no output at all."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x == 13).any():
                raise pb_utils.TritonModelException("unlucky number 13")
            if (x < 0).any():
                error = pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            if (x == 4088).any():
                responses.append(pb_utils.InferenceResponse(output_tensors=[]))
                continue
            name = "WRONG" if (x == 4077).any() else "Y"
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, x)]))
        return responses
