"""gpu_workers.thread_priority: a framework's helper threads found and moved to SCHED_IDLE."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from sluice.gpu_workers.thread_priority import native_threads, set_idle, started_threads

ort = pytest.importorskip("onnxruntime")

pytestmark = pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"),
    reason="Linux scheduling policies only",
)


def _mlp_session(threads: int):  # type: ignore[no-untyped-def]
    """A MatMul session; onnxruntime is imported before (its import starts threads of its
    own, as the backend imports it before it times the session's creation)."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((8, 4), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 8])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 4])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # an onnx newer than the onnxruntime beside it writes an IR it refuses
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(
        model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
    )


def test_an_ort_session_starts_one_helper_fewer_than_its_threads() -> None:
    session, helpers = started_threads(lambda: _mlp_session(3))
    assert len(helpers) == 2
    assert os.getpid() not in helpers  # the calling thread is never a helper
    assert all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in helpers)
    assert set_idle(helpers, "test") == 2
    assert all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in helpers)
    out = session.run(None, {"X": np.ones((2, 8), np.float32)})[0]
    np.testing.assert_array_equal(out, np.full((2, 4), 8.0, np.float32))
    del session


def test_one_thread_starts_no_helper() -> None:
    _, helpers = started_threads(lambda: _mlp_session(1))
    assert helpers == set()


def test_python_threads_are_never_taken_for_helpers() -> None:
    release = threading.Event()
    started: list[threading.Thread] = []

    def start_python_thread() -> None:
        thread = threading.Thread(target=release.wait, daemon=True)
        thread.start()
        started.append(thread)

    try:
        _, helpers = started_threads(start_python_thread)
        assert started[0].native_id not in helpers
        assert started[0].native_id not in native_threads()
        assert helpers == set()
    finally:
        release.set()
        started[0].join(5)


def test_a_thread_that_exited_is_skipped() -> None:
    assert set_idle({2**22 + 12345}, "test") == 0  # beyond pid_max's default: no such task
