"""A decoupled Triton Python model for benchmarks: a request whose IN is n gets n
responses, OUT = 0 .. n-1 (INT32 [1] each), sent from ``execute``, then the final flag
alone. ``benchmarks/bench_decoupled.py`` serves it in Triton and in Sluice."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests: list) -> None:
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            sender = request.get_response_sender()
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
