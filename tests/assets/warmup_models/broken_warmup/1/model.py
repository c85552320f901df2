"""Reports what it ran before the current call, so a client can see that warmup ran.

EXECUTIONS: execute calls before this one; REQUESTS: requests before this call;
IN_SUM: sum of every IN value before this call; LARGEST_CALL: the most requests
one earlier execute call got. Written only against Triton's pb_utils API.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ("EXECUTIONS", "REQUESTS", "IN_SUM", "LARGEST_CALL")


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0
        self.requests = 0
        self.in_sum = 0
        self.largest_call = 0

    def execute(self, requests):
        seen = [self.executions, self.requests, self.in_sum, self.largest_call]
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            self.in_sum += int(data.sum())
            batch = data.shape[0]
            outputs = [
                pb_utils.Tensor(name, np.full((batch, 1), value, dtype=np.int64))
                for name, value in zip(NAMES, seen, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        self.executions += 1
        self.requests += len(requests)
        self.largest_call = max(self.largest_call, len(requests))
        return responses
