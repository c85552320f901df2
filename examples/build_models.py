"""Build the example Triton model repository for Sluice.

Usage::

    python examples/build_models.py [--out DIR]

``DIR`` defaults to ``examples/model_repository`` next to this script. Two models
are written:

* ``digits``: a handwritten-digit classifier (scikit-learn ``LogisticRegression``
  trained on the bundled ``load_digits`` data set, exported with skl2onnx).
  Input ``input`` FP32 [-1, 64]; outputs ``label`` INT64 (the graph's [-1], served
  as [-1, 1]: ``dims: [ 1 ]`` with ``reshape { shape: [ ] }``, Triton's reshape rule)
  and ``probabilities`` FP32 [-1, 10]. Dynamic batching, ``max_batch_size: 64``.
* ``add_sub``: built with ``onnx.helper``. Inputs ``INPUT0``/``INPUT1`` FP32
  [-1, 16]; outputs ``OUTPUT0 = INPUT0 + INPUT1`` and
  ``OUTPUT1 = INPUT0 - INPUT1``. ``max_batch_size: 8``, no dynamic batching.

Both ``config.pbtxt`` files and ``model.onnx`` files are (re)written every time.
Everything uses fixed seeds, so two runs give the same model and accuracy.
No data or model is downloaded: the digits data ship with scikit-learn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "model_repository"

#: ONNX opset / IR version for the hand-built model (onnxruntime 1.32 loads both).
ADD_SUB_OPSET = 17
ADD_SUB_IR_VERSION = 8
#: target opset for skl2onnx (main domain); onnxruntime >= 1.15 supports it.
DIGITS_TARGET_OPSET = 17
DIGITS_SEED = 0

DIGITS_CONFIG = """\
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "input"
    data_type: TYPE_FP32
    dims: [ 64 ]
  }
]
output [
  {
    name: "label"
    data_type: TYPE_INT64
    dims: [ 1 ]
    reshape { shape: [ ] }
  },
  {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 500
}
instance_group [
  {
    kind: KIND_CPU
    count: 1
  }
]
"""

ADD_SUB_CONFIG = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
  }
]
instance_group [
  {
    kind: KIND_CPU
    count: 1
  }
]
"""


def _digits_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(X_train, X_test, y_train, y_test)``: float32 features /16, int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=0, stratify=y
    )
    return (
        np.ascontiguousarray(x_train, dtype=np.float32),
        np.ascontiguousarray(x_test, dtype=np.float32),
        np.ascontiguousarray(y_train, dtype=np.int64),
        np.ascontiguousarray(y_test, dtype=np.int64),
    )


def digits_test_split() -> tuple[np.ndarray, np.ndarray]:
    """Return the held-out digits images and labels.

    Returns:
        ``(X, y)``: ``X`` float32 of shape [450, 64] scaled to [0, 1] (pixel / 16),
        ``y`` int64 of shape [450].
    """
    _, x_test, _, y_test = _digits_split()
    return x_test, y_test


def _write(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path``, creating parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    else:
        path.write_bytes(data)


def _check_io(
    model_path: Path,
    inputs: dict[str, tuple[str, list[int | str | None]]],
    outputs: dict[str, tuple[str, list[int | str | None]]],
) -> None:
    """Load ``model_path`` in onnxruntime and check input/output names, types and ranks.

    Dimensions given as ``None`` must be symbolic/dynamic; integers must match.
    Raises ``RuntimeError`` on any mismatch.
    """
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    for kind, expected, actual in (
        ("input", inputs, sess.get_inputs()),
        ("output", outputs, sess.get_outputs()),
    ):
        got = {a.name: (a.type, list(a.shape)) for a in actual}
        if set(got) != set(expected):
            raise RuntimeError(f"{model_path}: {kind} names {sorted(got)} != {sorted(expected)}")
        for name, (etype, eshape) in expected.items():
            gtype, gshape = got[name]
            ok = gtype == etype and len(gshape) == len(eshape)
            if ok:
                for g, e in zip(gshape, eshape, strict=True):
                    dim_ok = (not isinstance(g, int)) if e is None else g == e
                    ok = ok and dim_ok
            if not ok:
                raise RuntimeError(
                    f"{model_path}: {kind} {name} is {gtype} {gshape}, expected {etype} {eshape}"
                )


def build_digits(out_dir: Path) -> None:
    """Train the digits classifier and write ``digits/`` (model + config) under ``out_dir``.

    Also verifies the exported model with onnxruntime (I/O names, types, shapes, and
    that its labels equal scikit-learn's on the held-out split) and prints accuracy.
    """
    import onnxruntime as ort
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.linear_model import LogisticRegression

    out_dir = Path(out_dir)
    x_train, x_test, y_train, y_test = _digits_split()
    clf = LogisticRegression(max_iter=2000, random_state=DIGITS_SEED)
    clf.fit(x_train, y_train)

    onx = to_onnx(
        clf,
        initial_types=[("input", FloatTensorType([None, 64]))],
        options={id(clf): {"zipmap": False}},
        target_opset=DIGITS_TARGET_OPSET,
    )
    # Stable output names regardless of the skl2onnx version's defaults.
    names = [o.name for o in onx.graph.output]
    rename = {names[0]: "label", names[1]: "probabilities"}
    for node in onx.graph.node:
        node.output[:] = [rename.get(n, n) for n in node.output]
    for o in onx.graph.output:
        o.name = rename.get(o.name, o.name)
    onx.graph.name = "digits"
    # skl2onnx may list the default domain twice in opset_import; keep one entry per domain.
    opsets: dict[str, int] = {}
    for imp in onx.opset_import:
        opsets[imp.domain] = max(opsets.get(imp.domain, 0), imp.version)
    del onx.opset_import[:]
    for domain, version in sorted(opsets.items()):
        onx.opset_import.add(domain=domain, version=version)

    model_path = out_dir / "digits" / "1" / "model.onnx"
    _write(model_path, onx.SerializeToString())
    _write(out_dir / "digits" / "config.pbtxt", DIGITS_CONFIG)

    _check_io(
        model_path,
        inputs={"input": ("tensor(float)", [None, 64])},
        outputs={
            "label": ("tensor(int64)", [None]),
            "probabilities": ("tensor(float)", [None, 10]),
        },
    )
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    label, proba = sess.run(["label", "probabilities"], {"input": x_test})
    if label.shape != (len(x_test),) or label.dtype != np.int64:
        raise RuntimeError(f"digits label output is {label.dtype} {label.shape}")
    if proba.shape != (len(x_test), 10) or proba.dtype != np.float32:
        raise RuntimeError(f"digits probabilities output is {proba.dtype} {proba.shape}")
    one, _ = sess.run(None, {"input": x_test[:1]})
    if one.shape != (1,):
        raise RuntimeError(f"digits label output for batch 1 is {one.shape}")
    sk_pred = clf.predict(x_test)
    n_diff = int((sk_pred != label).sum())
    correct = int((label == y_test).sum())
    print(
        f"digits: onnxruntime accuracy {correct / len(y_test):.4f} ({correct}/{len(y_test)}), "
        f"sklearn/onnx label mismatches: {n_diff} -> {model_path}"
    )


def build_add_sub(out_dir: Path) -> None:
    """Write ``add_sub/`` (an ``onnx.helper``-built model + config) under ``out_dir``."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    out_dir = Path(out_dir)
    dims: list[int | str] = ["batch", 16]
    graph = helper.make_graph(
        nodes=[
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        name="add_sub",
        inputs=[
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, dims),
            helper.make_tensor_value_info("INPUT1", TensorProto.FLOAT, dims),
        ],
        outputs=[
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, dims),
            helper.make_tensor_value_info("OUTPUT1", TensorProto.FLOAT, dims),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ADD_SUB_OPSET)],
        producer_name="sluice-examples",
    )
    model.ir_version = ADD_SUB_IR_VERSION
    onnx.checker.check_model(model)

    model_path = out_dir / "add_sub" / "1" / "model.onnx"
    _write(model_path, model.SerializeToString())
    _write(out_dir / "add_sub" / "config.pbtxt", ADD_SUB_CONFIG)

    spec: dict[str, tuple[str, list[int | str | None]]] = {
        "INPUT0": ("tensor(float)", [None, 16]),
        "INPUT1": ("tensor(float)", [None, 16]),
    }
    _check_io(
        model_path,
        inputs=spec,
        outputs={
            "OUTPUT0": ("tensor(float)", [None, 16]),
            "OUTPUT1": ("tensor(float)", [None, 16]),
        },
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 16), dtype=np.float32)
    b = rng.standard_normal((3, 16), dtype=np.float32)
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    o0, o1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    if not (np.array_equal(o0, a + b) and np.array_equal(o1, a - b)):
        raise RuntimeError("add_sub model computes the wrong values")
    print(f"add_sub: OK -> {model_path}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"model repository folder to write (default: {DEFAULT_OUT})",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    build_digits(out)
    build_add_sub(out)
    print(f"model repository ready: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
