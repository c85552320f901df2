"""Doubles a BF16 tensor the way Triton's python_backend BF16 example does: as_numpy()
refuses BF16, so the data goes to torch through DLPack and comes back the same way.
AS_NUMPY_ERROR returns the text as_numpy() raised (empty if it did not raise).

torch is imported in execute(), so the model still loads where torch is missing."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        import torch

        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            try:
                tensor.as_numpy()
                error = b""
            except pb_utils.TritonModelException as exc:
                error = str(exc).encode()
            data = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
            doubled = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(data * 2))
            batch = data.shape[0]
            errors = pb_utils.Tensor("AS_NUMPY_ERROR", np.array([[error]] * batch, dtype=object))
            responses.append(pb_utils.InferenceResponse(output_tensors=[doubled, errors]))
        return responses
