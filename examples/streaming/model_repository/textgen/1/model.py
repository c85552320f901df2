"""``textgen``: a decoupled Python model that streams generated text one character per
response.

Inputs (``max_batch_size: 0``, so shapes are as listed):

* ``text_input`` BYTES ``[1]``: the prompt (UTF-8).
* ``max_tokens`` INT32 ``[1]``, optional: characters to generate (default: the config
  parameter ``default_max_tokens``; at most ``max_tokens_limit``).
* ``temperature`` FP32 ``[1]``, optional: sampling temperature (default 0.8; 0 takes the
  most likely character every time).
* ``seed`` INT64 ``[1]``, optional: the sampler's seed (absent: a fresh one per request).

Each response carries ``text_output`` BYTES ``[1]``: the next character. The last one
carries the final flag; a request cancelled by its client (closed gRPC stream or SSE
connection) stops at the next character and ends with the final flag alone, and the
model logs how far it got. The characters come from ``textgen_ngram.CharNgram`` (next to
this file) with the counts in ``textgen.npz``, written by ``build_model.py``.
"""

import json
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import textgen_ngram
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _scalar(request: Any, name: str, default: Any) -> Any:
    """The single element of the optional input ``name``, or ``default`` when absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("textgen needs decoupled: true")
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.default_max_tokens = int(parameters.get("default_max_tokens", "64"))
        self.max_tokens_limit = int(parameters.get("max_tokens_limit", "100000"))
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        path = os.path.join(version_dir, "textgen.npz")
        if not os.path.isfile(path):
            raise pb_utils.TritonModelException(
                f"{path} not found: run `python examples/streaming/build_model.py` first"
            )
        self.model = textgen_ngram.CharNgram.load(path)

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt = _scalar(request, "text_input", b"").decode("utf-8", "replace")
                max_tokens = int(_scalar(request, "max_tokens", self.default_max_tokens))
                temperature = float(_scalar(request, "temperature", 0.8))
                seed = _scalar(request, "seed", None)
                if not 0 <= max_tokens <= self.max_tokens_limit:
                    raise ValueError(f"max_tokens must be 0..{self.max_tokens_limit}")
                if not math.isfinite(temperature):
                    raise ValueError("temperature must be a finite number")
                if seed is not None and seed < 0:
                    raise ValueError("seed must be >= 0")
            except (ValueError, AttributeError) as exc:
                error = pb_utils.TritonError(f"textgen: {exc}", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            tokens = self.model.generate(prompt, max_tokens, temperature, seed)
            threading.Thread(
                target=self._stream, args=(request, sender, tokens, max_tokens), daemon=True
            ).start()
        return None

    def _stream(self, request: Any, sender: Any, tokens: Iterator[str], max_tokens: int) -> None:
        """Send each character as soon as it is sampled; stop when the client cancels."""
        sent = 0
        try:
            for token in tokens:
                if request.is_cancelled():
                    name = f"'{request.request_id()}'" if request.request_id() else "(no id)"
                    pb_utils.Logger.log_info(
                        f"textgen: request {name} cancelled after {sent} of {max_tokens} tokens"
                    )
                    sender.send(flags=FINAL)
                    return
                text = np.array([token.encode()], dtype=np.object_)
                sent += 1
                sender.send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)]),
                    flags=FINAL if sent == max_tokens else 0,
                )
        except Exception as exc:  # the request must end: as an error response
            error = pb_utils.TritonError(f"textgen: generation failed: {exc!r}")
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        if max_tokens == 0:
            sender.send(flags=FINAL)
