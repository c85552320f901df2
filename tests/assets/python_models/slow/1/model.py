"""OUT = IN after sleeping the request parameter sleep_ms; echoes request id and parameters."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sleep_ms = max(
            (float(json.loads(r.parameters()).get("sleep_ms", 0)) for r in requests), default=0
        )
        if sleep_ms > 0:
            time.sleep(sleep_ms / 1000.0)
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            batch = data.shape[0]
            request_id = np.full((batch, 1), request.request_id().encode("utf-8"), dtype=np.object_)
            params = np.full((batch, 1), request.parameters().encode("utf-8"), dtype=np.object_)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", data),
                        pb_utils.Tensor("REQUEST_ID", request_id),
                        pb_utils.Tensor("PARAMS", params),
                    ]
                )
            )
        return responses
