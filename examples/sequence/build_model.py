"""Train a small GRU forecaster with torch and write it as a stateful Triton model.

Usage::

    .venv/bin/python examples/sequence/build_model.py [--out DIR] [--iterations N] [--seed S]

``DIR`` defaults to ``examples/sequence/model_repository``. The model ``gru_stream`` is
written there (``config.pbtxt`` and ``1/model.onnx``, both rewritten every time).

The model reads a noisy sine wave one value per request and answers, after each value,
its prediction of the next clean value (``series.py`` makes the data). It is a GRU with
:data:`HIDDEN` units followed by a linear layer, trained on series made here with fixed
seeds (no download). The ONNX graph is ONE step of it, with the GRU's hidden state as an
explicit input and output that Triton's sequence batcher carries from one request of a
sequence to the next (implicit state, ``sequence_batching.state``):

* ``INPUT`` FP32 ``[batch, 1]``: the observation of this step.
* ``STATE_IN`` FP32 ``[batch, HIDDEN]``: the hidden state after the previous step (zeros
  on a sequence's first request: ``initial_state { zero_data: true }``).
* ``OUTPUT`` FP32 ``[batch, 1]``: the predicted clean value of the next step.
* ``STATE_OUT`` FP32 ``[batch, HIDDEN]``: the hidden state after this step.

The graph is written with ``onnx.helper`` from the trained weights (an ONNX ``GRU`` node
with ``linear_before_reset=1``, which is torch's GRU cell, then ``Gemm``), so it needs no
torch ONNX exporter. Before writing, the script checks that the ONNX step, run step by
step with its state fed back, gives the torch model's outputs over whole sequences.

Needs torch (CPU is enough; about 15 s on two cores). Exit code 2 when torch is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "model_repository"
MODEL = "gru_stream"

#: GRU hidden units: the implicit state is FP32 [HIDDEN] per sequence.
HIDDEN = 32
#: rows the model runs at once (one per sequence): ``max_batch_size`` in the config.
MAX_BATCH_SIZE = 8
OPSET = 17
IR_VERSION = 8
#: training batch: series per optimizer step, steps per series.
TRAIN_SERIES = 64
TRAIN_LENGTH = 48
#: the largest |ONNX - torch| accepted by the export check.
EXPORT_TOLERANCE = 1e-5

CONFIG = """\
name: "{model}"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
input [
  {{
    name: "INPUT"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }}
]
output [
  {{
    name: "OUTPUT"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }}
]
sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  oldest {{
    max_candidate_sequences: 16
    preferred_batch_size: [ {max_batch_size} ]
    max_queue_delay_microseconds: 2000
  }}
  state [
    {{
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_FP32
      dims: [ {hidden} ]
      initial_state {{
        name: "zero"
        data_type: TYPE_FP32
        dims: [ {hidden} ]
        zero_data: true
      }}
    }}
  ]
}}
instance_group [
  {{
    kind: KIND_CPU
    count: 1
  }}
]
"""


def load_series() -> ModuleType:
    """``series.py`` (next to this script), imported by path."""
    spec = importlib.util.spec_from_file_location("sluice_example_series", HERE / "series.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def import_torch() -> ModuleType | None:
    """torch, or None (with a message on stderr) where it is not installed."""
    try:
        import torch
    except ImportError as exc:
        print(
            f"error: this example trains its model with torch, which cannot be imported "
            f"({exc}). Install it (e.g. `.venv/bin/pip install torch`, a CPU build is "
            "enough) and run this script again.",
            file=sys.stderr,
        )
        return None
    return torch


def _predict(gru: Any, head: Any, observed: Any) -> Any:
    """torch forward over whole sequences: ``observed`` FP32 [n, T] -> predictions [n, T]."""
    hidden, _ = gru(observed.unsqueeze(-1))
    return head(hidden).squeeze(-1)


def train(torch: ModuleType, series: ModuleType, iterations: int, seed: int) -> tuple[Any, Any]:
    """Train ``(gru, head)``: ``torch.nn.GRU(1, HIDDEN)`` and ``torch.nn.Linear(HIDDEN, 1)``,
    mean squared error of the next clean value over the steps after the warm-up, Adam
    with the learning rate lowered twice. Prints the loss now and then."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gru = torch.nn.GRU(1, HIDDEN, batch_first=True)
    head = torch.nn.Linear(HIDDEN, 1)
    params = [*gru.parameters(), *head.parameters()]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    milestones = [int(iterations * 0.6), int(iterations * 0.85)]
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=0.3)
    start = time.monotonic()
    warmup = series.WARMUP_STEPS
    for it in range(iterations):
        observed, target = series.noisy_sines(rng, TRAIN_SERIES, TRAIN_LENGTH)
        predicted = _predict(gru, head, torch.from_numpy(observed))
        loss = ((predicted - torch.from_numpy(target))[:, warmup:] ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if it % 100 == 0 or it == iterations - 1:
            elapsed = time.monotonic() - start
            print(f"  iteration {it:4d}  mse {loss.item():.5f}  ({elapsed:.1f} s)")
    gru.eval()
    head.eval()
    return gru, head


def _gate_order(torch_rows: np.ndarray) -> np.ndarray:
    """torch stacks a GRU's gates as (reset, update, new) along axis 0; ONNX as
    (update, reset, hidden)."""
    r, z, n = np.split(torch_rows, 3, axis=0)
    return np.concatenate([z, r, n], axis=0)


def step_model(gru: Any, head: Any) -> Any:
    """The ONNX model of one step (``onnx.ModelProto``), from the trained weights.

    ``INPUT`` [b, 1] and ``STATE_IN`` [b, H] -> GRU over a sequence of length 1 ->
    ``STATE_OUT`` [b, H] -> Gemm with the head -> ``OUTPUT`` [b, 1]; all FP32.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    def weight(name: str) -> np.ndarray:
        return getattr(gru, name).detach().numpy().astype(np.float32)

    w = _gate_order(weight("weight_ih_l0"))[np.newaxis]  # [1, 3H, 1]
    r = _gate_order(weight("weight_hh_l0"))[np.newaxis]  # [1, 3H, H]
    b = np.concatenate([_gate_order(weight("bias_ih_l0")), _gate_order(weight("bias_hh_l0"))])
    initializers = [
        numpy_helper.from_array(w, "gru_W"),
        numpy_helper.from_array(r, "gru_R"),
        numpy_helper.from_array(b[np.newaxis], "gru_B"),  # [1, 6H]
        numpy_helper.from_array(head.weight.detach().numpy().astype(np.float32), "head_W"),
        numpy_helper.from_array(head.bias.detach().numpy().astype(np.float32), "head_B"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["INPUT", "axis0"], ["x_seq"]),  # [1, b, 1]
        helper.make_node("Unsqueeze", ["STATE_IN", "axis0"], ["h_prev"]),  # [1, b, H]
        helper.make_node(
            "GRU",
            ["x_seq", "gru_W", "gru_R", "gru_B", "", "h_prev"],
            ["", "h_next"],  # Y_h: [1, b, H]
            hidden_size=HIDDEN,
            linear_before_reset=1,
        ),
        helper.make_node("Squeeze", ["h_next", "axis0"], ["STATE_OUT"]),
        helper.make_node("Gemm", ["STATE_OUT", "head_W", "head_B"], ["OUTPUT"], transB=1),
    ]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        MODEL,
        [
            helper.make_tensor_value_info("INPUT", f, ["batch", 1]),
            helper.make_tensor_value_info("STATE_IN", f, ["batch", HIDDEN]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", f, ["batch", 1]),
            helper.make_tensor_value_info("STATE_OUT", f, ["batch", HIDDEN]),
        ],
        initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sluice-examples"
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def run_steps(model_path: Path, observed: np.ndarray) -> np.ndarray:
    """Run the ONNX step model over whole sequences in-process (onnxruntime), one step at
    a time, feeding ``STATE_OUT`` back as ``STATE_IN`` (zeros at the start).

    Args:
        model_path: the ``model.onnx`` of ``gru_stream``.
        observed: FP32 [n, T], ``n`` sequences run together as one batch.

    Returns:
        FP32 [n, T]: ``OUTPUT`` of every step.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    hidden = session.get_inputs()[1].shape[1]
    state = np.zeros((observed.shape[0], hidden), dtype=np.float32)
    outputs = np.empty_like(observed)
    for t in range(observed.shape[1]):
        feed = {"INPUT": np.ascontiguousarray(observed[:, t : t + 1]), "STATE_IN": state}
        out, state = session.run(["OUTPUT", "STATE_OUT"], feed)
        outputs[:, t] = out[:, 0]
    return outputs


def build(out_dir: Path, iterations: int = 500, seed: int = 0) -> Path:
    """Train, export, check and write ``out_dir/gru_stream``; returns that folder.

    Raises:
        RuntimeError: torch is missing, or the ONNX step does not reproduce torch.
    """
    torch = import_torch()
    if torch is None:
        raise RuntimeError("torch is not installed")
    import onnx

    series = load_series()
    print(f"{MODEL}: training a GRU ({HIDDEN} units) for {iterations} iterations")
    gru, head = train(torch, series, iterations, seed)

    model_dir = Path(out_dir) / MODEL
    model_path = model_dir / "1" / "model.onnx"
    model_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(step_model(gru, head), str(model_path))
    (model_dir / "config.pbtxt").write_text(
        CONFIG.format(model=MODEL, max_batch_size=MAX_BATCH_SIZE, hidden=HIDDEN)
    )

    observed, target = series.noisy_sines(np.random.default_rng(seed + 1), 64, 64)
    with torch.no_grad():
        reference = _predict(gru, head, torch.from_numpy(observed)).numpy()
    stepped = run_steps(model_path, observed)
    diff = float(np.abs(stepped - reference).max())
    if diff > EXPORT_TOLERANCE:
        raise RuntimeError(
            f"the ONNX step model run step by step differs from torch over whole sequences "
            f"by up to {diff:.3g} (> {EXPORT_TOLERANCE:g})"
        )
    print(
        f"{MODEL}: held-out RMSE of the next clean value {series.rmse(stepped, target):.4f} "
        f"(repeating the last observation: {series.rmse(observed, target):.4f}; "
        f"noise {series.NOISE}); ONNX step by step vs torch: max |diff| {diff:.2g}"
    )
    print(f"{MODEL}: wrote {model_dir / 'config.pbtxt'} and {model_path}")
    return model_dir


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (2: torch missing)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"model repository (default {DEFAULT_OUT})"
    )
    parser.add_argument("--iterations", type=int, default=500, help="optimizer steps (default 500)")
    parser.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be >= 1")
    if import_torch() is None:
        return 2
    build(args.out, args.iterations, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
