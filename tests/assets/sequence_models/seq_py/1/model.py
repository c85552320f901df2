"""A stateful model written against Triton's python_backend API: OUTPUT is the running
sum of INPUT over the sequence, kept as implicit state (STATE_IN -> STATE_OUT); CONTROLS
echoes the control tensors the sequence batcher fed it (START, END, READY, CORRID)."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            controls = [
                pb_utils.get_input_tensor_by_name(request, name).as_numpy().astype(np.int64)
                for name in ("START", "END", "READY", "CORRID")
            ]
            total = (state + x).astype(np.int32)
            corrid = request.correlation_id()
            assert int(controls[3].reshape(-1)[0]) == corrid, (controls[3], corrid)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT", total),
                        pb_utils.Tensor("STATE_OUT", total),
                        pb_utils.Tensor("CONTROLS", np.concatenate(controls, axis=1)),
                        pb_utils.Tensor("PID", np.array([[os.getpid()]], dtype=np.int64)),
                    ]
                )
            )
        return responses
