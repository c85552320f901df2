"""Upper-cases every BYTES element (written only against Triton's pb_utils API)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            upper = np.array([item.upper() for item in data.ravel()], dtype=np.object_)
            out = pb_utils.Tensor("OUTPUT0", upper.reshape(data.shape))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
