"""A decoupled model: for a request whose IN is n it sends n responses, OUT = 0 .. n-1
(and PID, the instance's process id), then the final flag alone.

Request parameters change how: ``last_final`` sends the final flag with the last
response; ``error_at`` = k sends an error response (final) instead of response k;
``thread`` sends from a thread after ``execute`` returned; ``delay_ms`` waits between
responses and stops as soon as ``is_cancelled()`` turns true, writing how many it sent
to the file ``cancel_file``."""

import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _respond(request, sender, n, params):
    delay = float(params.get("delay_ms", 0)) / 1000
    error_at = int(params.get("error_at", -1))
    last_final = bool(params.get("last_final", False))
    for i in range(n):
        if delay:
            time.sleep(delay)
            if request.is_cancelled():
                with open(params["cancel_file"], "w") as f:
                    f.write(str(i))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
        if i == error_at:
            error = pb_utils.TritonError(f"failed at response {i}")
            sender.send(
                pb_utils.InferenceResponse(error=error),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        outputs = [
            pb_utils.Tensor("OUT", np.array([[i]], dtype=np.int32)),
            pb_utils.Tensor("PID", np.array([[os.getpid()]], dtype=np.int64)),
        ]
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last_final and i == n - 1 else 0
        sender.send(pb_utils.InferenceResponse(outputs), flags=flags)
    if not (last_final and n > 0):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        assert pb_utils.using_decoupled_model_transaction_policy(config)

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            params = json.loads(request.parameters())
            sender = request.get_response_sender()
            if params.get("thread") or params.get("delay_ms"):
                threading.Thread(target=_respond, args=(request, sender, n, params)).start()
            else:
                _respond(request, sender, n, params)
        return None
