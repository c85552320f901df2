"""A GRU cell as a stateful Triton Python model, one sequence step per request.

INPUT [1, 64] FP32 -> OUTPUT [1, H] FP32, the sequence's new hidden state (also
returned as STATE_OUT); H is the config parameter ``hidden`` (default 256). The previous
state comes from the STATE_IN input where the config declares implicit state, else from
this model's own table by correlation id (as a model must keep it under Triton's Python
backend, which does not feed implicit state back); START gives zeros.
``benchmarks/bench_sequences.py`` serves it and uses :func:`weights` and :func:`cell` to
check answers.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

FEATURES = 64


def weights(hidden: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """The input and recurrent weights, [64, 3H] and [H, 3H] FP32 (fixed seed)."""
    rng = np.random.default_rng(7)
    wx = rng.standard_normal((FEATURES, 3 * hidden)) / np.sqrt(FEATURES)
    wh = rng.standard_normal((hidden, 3 * hidden)) / np.sqrt(hidden)
    return wx.astype(np.float32), wh.astype(np.float32)


def cell(x: np.ndarray, h: np.ndarray, wx: np.ndarray, wh: np.ndarray) -> np.ndarray:
    """One GRU step for a batch: x [B, 64], h [B, H] -> new h [B, H], FP32."""
    hidden = h.shape[1]
    gx, gh = x @ wx, h @ wh
    z = 1 / (1 + np.exp(-(gx[:, :hidden] + gh[:, :hidden])))
    r = 1 / (1 + np.exp(-(gx[:, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden])))
    n = np.tanh(gx[:, 2 * hidden :] + r * gh[:, 2 * hidden :])
    return ((1 - z) * n + z * h).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.hidden_size = int(parameters.get("hidden", {}).get("string_value", "256"))
        self.wx, self.wh = weights(self.hidden_size)
        self.hidden: dict[object, np.ndarray] = {}

    def execute(self, requests: list) -> list:
        xs, hs, keys, ends = [], [], [], []
        implicit = False
        zeros = np.zeros((1, self.hidden_size), np.float32)
        for request in requests:
            xs.append(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy())
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN")
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy()
            key = request.correlation_id()
            if state is not None:
                implicit = True
                hs.append(state.as_numpy())
            elif int(start.reshape(-1)[0]):
                hs.append(zeros)
            else:
                hs.append(self.hidden.get(key, zeros))
            keys.append(key)
            ends.append(int(end.reshape(-1)[0]))
        new = cell(np.concatenate(xs), np.concatenate(hs), self.wx, self.wh)
        responses = []
        for i, key in enumerate(keys):
            row = new[i : i + 1]
            if ends[i]:
                self.hidden.pop(key, None)
            else:
                self.hidden[key] = row
            outputs = [pb_utils.Tensor("OUTPUT", row)]
            if implicit:
                outputs.append(pb_utils.Tensor("STATE_OUT", row))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
