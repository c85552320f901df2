"""What the system and CUDA shared-memory e2e tests share: the ``add_sub`` operands they
place in regions, Triton's status for each error code on each protocol, and a request whose
inputs and outputs all lie in two registered regions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

A = np.arange(16, dtype=np.float32).reshape(1, 16)
B = np.full((1, 16), 0.5, dtype=np.float32)
NBYTES = A.nbytes  # 64
HTTP_STATUS = {"NOT_FOUND": "404", "INVALID_ARG": "400", "ALREADY_EXISTS": "400", "INTERNAL": "500"}
GRPC_STATUS = {
    "NOT_FOUND": "StatusCode.NOT_FOUND",
    "INVALID_ARG": "StatusCode.INVALID_ARGUMENT",
    "ALREADY_EXISTS": "StatusCode.ALREADY_EXISTS",
    "INTERNAL": "StatusCode.INTERNAL",
}


def raises(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    """The error ``call(*args, **kwargs)`` raises (the test fails when it raises none)."""
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def shm_request(module: Any, in_name: str, out_name: str) -> tuple[list[Any], list[Any]]:
    """``add_sub``'s inputs (INPUT0 at 0, INPUT1 at 64 of region ``in_name``) and requested
    outputs (OUTPUT0 at 0, OUTPUT1 at 64 of ``out_name``), built with ``module``
    (``tritonclient.http`` or ``tritonclient.grpc``)."""
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in range(2)]
    inputs[0].set_shared_memory(in_name, NBYTES)
    inputs[1].set_shared_memory(in_name, NBYTES, offset=NBYTES)
    outputs = [module.InferRequestedOutput(f"OUTPUT{i}") for i in range(2)]
    outputs[0].set_shared_memory(out_name, NBYTES)
    outputs[1].set_shared_memory(out_name, NBYTES, offset=NBYTES)
    return inputs, outputs


def by_protocol(
    protocol: str, http_client: Any, grpc_client: Any
) -> tuple[Any, Any, dict[str, str]]:
    """For ``protocol`` (``"http"`` or ``"grpc"``): its client of the two given, its
    tritonclient module (to build tensors with) and its status text per error code."""
    if protocol == "http":
        return http_client, httpclient, HTTP_STATUS
    return grpc_client, grpcclient, GRPC_STATUS
