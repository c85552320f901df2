"""ModelStreamInfer with tritonclient.grpc's streaming API: order, in-band errors, final flag."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

pytestmark = pytest.mark.e2e


def _slow_input(value: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("IN", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], np.float32))
    return [tensor]


def _add_sub_inputs(value: float) -> list[grpcclient.InferInput]:
    a = np.full((1, 16), value, np.float32)
    inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a)
    return inputs


def _collect(results: queue.Queue, count: int) -> list[tuple[object, object]]:
    return [results.get(timeout=30) for _ in range(count)]


def test_stream_answers_in_request_order_with_errors_in_band(grpc_client) -> None:
    results: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        # The slow request finishes last but is answered first; the bad one in between
        # fails alone and the stream stays open for the last one.
        grpc_client.async_stream_infer(
            "slow", _slow_input(7.0), request_id="slow-1", parameters={"sleep_ms": 600}
        )
        grpc_client.async_stream_infer("add_sub", _add_sub_inputs(1.0), request_id="fast-1")
        grpc_client.async_stream_infer("nope", _add_sub_inputs(1.0), request_id="bad-1")
        bad_shape = grpcclient.InferInput("INPUT0", [1, 15], "FP32")
        bad_shape.set_data_from_numpy(np.ones((1, 15), np.float32))
        grpc_client.async_stream_infer(
            "add_sub", [bad_shape, _add_sub_inputs(1.0)[1]], request_id="bad-2"
        )
        grpc_client.async_stream_infer("add_sub", _add_sub_inputs(2.5), request_id="fast-2")
        got = _collect(results, 5)
    finally:
        grpc_client.stop_stream()

    (r0, e0), (r1, e1), (r2, e2), (r3, e3), (r4, e4) = got
    assert e0 is None and r0.get_response().id == "slow-1"
    assert r0.as_numpy("OUT").tolist() == [[7.0]]
    assert e1 is None and r1.get_response().id == "fast-1"
    np.testing.assert_array_equal(r1.as_numpy("OUTPUT0"), np.full((1, 16), 2.0, np.float32))
    assert r2 is None and e2.message() == "Request for unknown model: 'nope' is not found"
    assert r3 is None and e3.message() == (
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [-1,16], got [1,15]"
    )
    assert e4 is None and r4.get_response().id == "fast-2"
    np.testing.assert_array_equal(r4.as_numpy("OUTPUT0"), np.full((1, 16), 5.0, np.float32))
    for result in (r0, r1, r4):
        response = result.get_response()
        assert response.parameters["triton_final_response"].bool_param is True
        assert response.model_version == "1"


def test_stream_many_interleaved_requests_keep_order(grpc_client) -> None:
    results: queue.Queue = queue.Queue()
    grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for k in range(24):
            if k % 3 == 0:
                grpc_client.async_stream_infer(
                    "slow", _slow_input(float(k)), request_id=f"r{k}", parameters={"sleep_ms": 30}
                )
            else:
                grpc_client.async_stream_infer("add_sub", _add_sub_inputs(k), request_id=f"r{k}")
        got = _collect(results, 24)
    finally:
        grpc_client.stop_stream()
    assert [error for _, error in got] == [None] * 24
    assert [result.get_response().id for result, _ in got] == [f"r{k}" for k in range(24)]
    for k, (result, _) in enumerate(got):
        if k % 3 == 0:
            assert result.as_numpy("OUT").tolist() == [[float(k)]]
        else:
            assert result.as_numpy("OUTPUT0")[0, 0] == 2 * k


def test_stream_can_be_reopened_and_empty_final_flag_accepted(grpc_client) -> None:
    results: queue.Queue = queue.Queue()
    for round_ in range(2):
        grpc_client.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            grpc_client.async_stream_infer(
                "add_sub",
                _add_sub_inputs(float(round_)),
                request_id=f"round-{round_}",
                enable_empty_final_response=True,
            )
            ((result, error),) = _collect(results, 1)
        finally:
            grpc_client.stop_stream()
        assert error is None
        assert result.get_response().id == f"round-{round_}"
        assert result.get_response().parameters["triton_final_response"].bool_param is True
