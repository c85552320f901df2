"""A stateful model that keeps its state itself, by correlation id (direct strategy, no
implicit state): it relies on every request of a sequence reaching the same instance,
as Triton's sequence batcher guarantees. Four batch slots, so four live sequences."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            corrid = request.correlation_id()
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().flat[0])
            x = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().flat[0])
            if start:
                self.sums[corrid] = 0
            self.sums[corrid] = self.sums.get(corrid, 0) + x
            given = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT", np.array([[self.sums[corrid]]], dtype=np.int32)),
                        pb_utils.Tensor("CORRID_OUT", given.astype(np.object_)),
                    ]
                )
            )
        return responses
