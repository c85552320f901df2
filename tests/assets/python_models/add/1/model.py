"""SUM = A + B; EXEC_SIZE = how many requests the execute call that served it got."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        sum_config = pb_utils.get_output_config_by_name(self.model_config, "SUM")
        self.sum_dtype = pb_utils.triton_string_to_numpy(sum_config["data_type"])
        self.exec_sizes = []

    def execute(self, requests):
        self.exec_sizes.append(len(requests))
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B").as_numpy()
            total = (a + b).astype(self.sum_dtype)
            size = np.full((a.shape[0], 1), len(requests), dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("SUM", total),
                        pb_utils.Tensor("EXEC_SIZE", size),
                    ]
                )
            )
        return responses

    def finalize(self):
        pb_utils.Logger.log_info(f"add executed batches of sizes {self.exec_sizes}")
