"""HTTP inference responses: JSON outputs, or a JSON header and binary tensor data.

Pure functions, no I/O. Rules: docs/reference/http-protocol.md (Inference, Binary
tensor data extension); Triton ``src/http_server.cc`` (``WriteDataToJson``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from sluice.api.http.json_tensors import wire_to_json
from sluice.api.parameters import select_outputs
from sluice.api.shared_memory import RegionSlice
from sluice.api.shm_tensors import write_output
from sluice.broker.messages import RequestedOutput, WireTensor

__all__ = ["HEADER_LENGTH_HEADER", "encode_infer_response"]

#: the header giving the JSON header's length when binary tensor data follows it.
HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"


def encode_infer_response(
    *,
    model: str,
    version: str,
    client_id: str,
    outputs: Sequence[WireTensor],
    requested: Sequence[RequestedOutput],
    binary_data_output: bool,
    parameters: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    shm_outputs: Mapping[str, RegionSlice] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Build an HTTP inference response body.

    Args:
        model: model name (``model_name``).
        version: model version that ran it (``model_version``, a string).
        client_id: the request's ``id``; echoed only when non-empty.
        outputs: tensors the model produced, wire layout.
        requested: the request's ``outputs``; empty = every entry of ``outputs``
            in that order, each encoded per ``binary_data_output``. Otherwise
            only these, in this order, each per its ``binary`` flag. The caller
            guarantees each name is in ``outputs``.
        binary_data_output: the request-level default encoding.
        parameters: response parameters; the member is left out when empty.
        extra: members written first in the JSON object (an async job's ``id``,
            ``state`` and times: docs/reference/http-protocol.md, Async jobs).
        shm_outputs: outputs to write into client shared memory, by name: their
            entries carry name, datatype and shape but no data and no
            ``parameters``, as Triton's (``src/http_server.cc``, an output whose
            allocation is shared memory gets neither).

    Returns:
        ``(body, headers)``. With at least one binary output the body is the
        JSON followed by the binary chunks in output order and the headers
        carry ``Inference-Header-Content-Length`` and
        ``Content-Type: application/octet-stream``; otherwise the body is JSON
        and ``Content-Type`` is ``application/json``. JSON floats that are NaN
        or infinite are written ``NaN``, ``Infinity`` and ``-Infinity``, as Triton
        writes them (triton common ``TritonJson::Write``, rapidjson's
        ``kWriteNanAndInfFlag``); tritonclient reads them back.

    Raises:
        SluiceError: INVALID_ARG for FP16/BF16 or non-UTF-8 BYTES asked for as
            JSON; INTERNAL when a tensor's bytes do not fit its shape, a
            requested output is missing or an output is larger than its
            shared-memory slice.
    """
    selected = [
        (tensor, binary_data_output if wanted is None else wanted.binary)
        for tensor, wanted in select_outputs(outputs, requested)
    ]
    shm_outputs = shm_outputs or {}

    response: dict[str, Any] = dict(extra) if extra else {}
    response["model_name"] = model
    response["model_version"] = version
    if client_id:
        response["id"] = client_id
    if parameters:
        response["parameters"] = dict(parameters)
    json_outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for tensor, binary in selected:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if tensor.name in shm_outputs:
            write_output(shm_outputs[tensor.name], tensor)
        elif binary:
            entry["parameters"] = {"binary_data_size": len(tensor.data)}
            chunks.append(tensor.data)
        else:
            entry["data"] = wire_to_json(tensor, model)
        json_outputs.append(entry)
    response["outputs"] = json_outputs

    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:  # no binary output
        return header, {"Content-Type": "application/json"}
    headers = {
        HEADER_LENGTH_HEADER: str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return b"".join([header, *chunks]), headers
