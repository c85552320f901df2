"""The ``sluice.jobs`` client's request encoding, answer decoding and progress line."""

from __future__ import annotations

import json

import numpy as np

from sluice.jobs import decode_outputs, encode_request, progress_text


def test_inputs_go_as_binary_tensor_data() -> None:
    a = np.array([[1.0, 2.0]], np.float32)
    s = np.array([[b"ab", b"c"]], dtype=object)
    body, headers = encode_request({"A": a, "S": s}, request_id="r", parameters={"priority": 1})
    length = int(headers["Inference-Header-Content-Length"])
    assert headers["Content-Type"] == "application/octet-stream"
    header = json.loads(body[:length])
    assert header == {
        "id": "r",
        "parameters": {"priority": 1, "binary_data_output": True},
        "inputs": [
            {
                "name": "A",
                "shape": [1, 2],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 8},
            },
            {
                "name": "S",
                "shape": [1, 2],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": 11},
            },
        ],
    }
    assert body[length:] == a.tobytes() + b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"


def test_inputs_go_as_json_when_asked() -> None:
    body, headers = encode_request({"X": np.array([[3]], np.int32)}, ["Y"], binary=False)
    assert headers == {"Content-Type": "application/json"}
    assert json.loads(body) == {
        "inputs": [{"name": "X", "shape": [1, 1], "datatype": "INT32", "data": [3]}],
        "outputs": [{"name": "Y", "parameters": {"binary_data": False}}],
    }


def test_answers_decode_binary_and_json_outputs() -> None:
    header = json.dumps(
        {
            "state": "SUCCESS",
            "outputs": [
                {
                    "name": "B",
                    "datatype": "INT64",
                    "shape": [2],
                    "parameters": {"binary_data_size": 16},
                },
                {"name": "J", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.5]},
                {
                    "name": "S",
                    "datatype": "BYTES",
                    "shape": [1],
                    "parameters": {"binary_data_size": 6},
                },
            ],
        }
    ).encode()
    body = header + np.array([7, 8], np.int64).tobytes() + b"\x02\x00\x00\x00hi"
    document, arrays = decode_outputs(body, len(header))
    assert document["state"] == "SUCCESS"
    np.testing.assert_array_equal(arrays["B"], [7, 8])
    np.testing.assert_array_equal(arrays["J"], np.array([[0.5, 1.5]], np.float32))
    assert arrays["J"].dtype == np.float32
    assert arrays["S"].tolist() == [b"hi"]


def test_progress_lines() -> None:
    assert progress_text({"id": "j", "state": "STARTED"}, 1.25) == "job j STARTED (1.2 s)"
    bulk = {
        "id": "j",
        "state": "STARTED",
        "request_counts": {"total": 200, "completed": 90, "failed": 10},
    }
    assert progress_text(bulk, 4.0, width=10) == (
        "[#####.....]  50% 100/200 rows, 10 failed, 25 rows/s, STARTED"
    )
