"""A bulk job's rows: splitting a JSON-lines body, output and error lines, retries."""

from __future__ import annotations

import json

import orjson
import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.api.http.infer_request import HttpInferRequest
from sluice.api.models import ModelView
from sluice.batching import DynamicBatchingPolicy
from sluice.broker.errors import ErrorCode, SluiceError, invalid_arg
from sluice.broker.messages import RequestedOutput, WireTensor
from sluice.broker.request_checks import TensorSpec
from sluice.job_workers.rows import (
    Row,
    error_line,
    output_line,
    parse_request,
    retryable,
    split_rows,
)
from sluice.job_workers.settings import JobWorkerOptions

VIEW = ModelView(
    name="m",
    config=ModelConfig(),
    config_json={},
    versions={},
    inputs={"IN": TensorSpec("IN", "FP32", (2,))},
    outputs={},
    policy=DynamicBatchingPolicy(max_batch_size=4),
    max_batch_size=4,
)


def test_rows_are_numbered_by_line_and_checked_for_custom_ids() -> None:
    body = (
        b'{"custom_id": "a"}\n\n  \n{"custom_id": 7}\n{"x": 1}\n[1]\n{oops\n{"custom_id": "a"}\n'
        b'{"custom_id": ""}\n'
    )
    rows = split_rows(body, "m")
    assert [(r.line, r.custom_id) for r in rows] == [
        (1, "a"), (4, None), (5, None), (6, None), (7, None), (8, "a"), (9, None),
    ]  # fmt: skip
    problems = {r.line: r.problem.message if r.problem else None for r in rows}
    assert problems == {
        1: None,
        4: "line 4 of the bulk job of model 'm' has a 'custom_id' that is not a string",
        5: "line 5 of the bulk job of model 'm' has no 'custom_id'",
        6: None,  # not an object: the request parser words it
        7: None,  # not JSON: the request parser words it
        8: "line 8 of the bulk job of model 'm': 'custom_id' 'a' is also on line 1",
        9: "line 9 of the bulk job of model 'm' has an empty 'custom_id'",
    }


def test_a_row_parses_as_the_synchronous_endpoint_parses_its_body() -> None:
    line = {
        "custom_id": "a",
        "id": "r",
        "inputs": [{"name": "IN", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
    }
    (row,) = split_rows(json.dumps(line).encode(), "m")
    request = parse_request(row, VIEW)
    assert request.client_id == "r"
    assert request.inputs == (WireTensor("IN", "FP32", (1, 2), b"\x00\x00\x80?\x00\x00\x00@"),)
    (bad,) = split_rows(b"{oops", "m")
    with pytest.raises(SluiceError, match="failed to parse the request JSON buffer"):
        parse_request(bad, VIEW)
    (unnamed,) = split_rows(b'{"inputs": []}', "m")
    with pytest.raises(SluiceError, match="has no 'custom_id'"):
        parse_request(unnamed, VIEW)


def test_output_and_error_lines() -> None:
    request = HttpInferRequest("r", (), (RequestedOutput("OUT", binary=True),), {}, True)
    out = WireTensor("OUT", "INT32", (1, 2), b"\x01\x00\x00\x00\x02\x00\x00\x00")
    line = output_line("a", "m", 3, request, [out], {"p": 1})
    assert orjson.loads(line) == {
        "custom_id": "a",
        "response": {
            "model_name": "m", "model_version": "3", "id": "r", "parameters": {"p": 1},
            "outputs": [{"name": "OUT", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}],
        },
    }  # fmt: skip
    row = Row(7, b"", "a")
    assert orjson.loads(error_line(row, invalid_arg("bad"))) == {
        "custom_id": "a", "line": 7, "status": 400, "error": "bad",
    }  # fmt: skip
    assert (
        orjson.loads(error_line(Row(2, b"", None), SluiceError(ErrorCode.INTERNAL, "x")))["status"]
        == 500
    )


def test_what_is_tried_again() -> None:
    assert retryable(SluiceError(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size"))
    assert not retryable(SluiceError(ErrorCode.UNAVAILABLE, "Request timeout expired"))
    assert not retryable(SluiceError(ErrorCode.INTERNAL, "boom"))


def test_waits_are_shorter_than_the_visibility_timeout() -> None:
    with pytest.raises(ValueError, match="shorter than visibility_timeout_s"):
        JobWorkerOptions(visibility_timeout_s=5, retry_backoff_max_s=8)
    with pytest.raises(ValueError, match="shorter than visibility_timeout_s"):
        JobWorkerOptions(visibility_timeout_s=5, lease_s=5, retry_backoff_max_s=1)
    assert JobWorkerOptions().lease_s < JobWorkerOptions().visibility_timeout_s
