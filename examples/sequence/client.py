"""Stream noisy sine waves through Sluice's sequence batcher step by step and compare every
answer with the same model run in-process.

Usage::

    .venv/bin/python examples/sequence/build_model.py      # once: trains, writes the model
    .venv/bin/sluice serve --model-repository examples/sequence/model_repository
    .venv/bin/python examples/sequence/client.py [--url localhost:8001] [--sequences 8]
        [--steps 24] [--pipelined] [--tolerance 1e-5]

``--sequences`` series (``series.py``, seed ``--seed``) are sent to ``gru_stream`` over
ONE gRPC stream (``tritonclient.grpc``: ``start_stream`` / ``async_stream_infer``), one
observation per request, with ``sequence_id`` (``--first-id`` + i), ``sequence_start``
on its first step and ``sequence_end`` on its last. Sequence ``i`` has ``--steps - i % 4``
steps, so sequences end at different rounds. The sequences are interleaved: each round
sends the next step of every live sequence, in a shuffled order, and waits for those
answers (``--pipelined``: every step of every sequence is sent at once, without waiting;
Sluice keeps each sequence's steps in order). Between requests the GRU's hidden state
lives in Sluice (implicit state in Redis), not in the client.

The same ``model.onnx`` is run in-process with onnxruntime over each whole sequence, one
step at a time with its state fed back. The client prints, per sequence, the largest
|Sluice - in-process| difference and the prediction error against the clean signal, a
few steps of one sequence, and a result line. Exit code 0 when every answer is within
``--tolerance``, 1 when one is not, 2 when the server or the model file cannot be used.
"""

from __future__ import annotations

import argparse
import importlib.util
import queue
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np

HERE = Path(__file__).resolve().parent
MODEL = "gru_stream"
DEFAULT_REPOSITORY = HERE / "model_repository"


def load_series() -> ModuleType:
    """``series.py`` (next to this script), imported by path."""
    spec = importlib.util.spec_from_file_location("sluice_example_series", HERE / "series.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class StreamError(RuntimeError):
    """The server refused or failed a step, or the stream broke."""


@dataclass
class Comparison:
    """Every step of every sequence: what Sluice answered and what the in-process run gave.

    Attributes:
        ids: the sequence ids sent (uint64).
        observed: per sequence, FP32 [T_i]: the inputs sent.
        target: per sequence, FP32 [T_i]: the clean next values the predictions aim at.
        served: per sequence, FP32 [T_i]: ``OUTPUT`` of each step as Sluice answered it.
        local: per sequence, FP32 [T_i]: ``OUTPUT`` of each step from in-process
            onnxruntime.
        pipelined: whether all steps were sent without waiting.
        executions: model executions the server counted for ``gru_stream`` while the
            steps ran (fewer than :attr:`steps`: steps of several sequences ran as one
            batch), None when the statistics could not be read.
    """

    ids: list[int]
    observed: list[np.ndarray]
    target: list[np.ndarray]
    served: list[np.ndarray] = field(default_factory=list)
    local: list[np.ndarray] = field(default_factory=list)
    pipelined: bool = False
    executions: int | None = None

    @property
    def steps(self) -> int:
        """Requests sent in all."""
        return sum(len(x) for x in self.observed)

    def max_diff(self, i: int | None = None) -> float:
        """max |served - local| of sequence ``i``, or over all sequences."""
        chosen = range(len(self.served)) if i is None else [i]
        return max(
            float(np.abs(self.served[j].astype(np.float64) - self.local[j]).max()) for j in chosen
        )


def run_in_process(model_path: Path, observed: list[np.ndarray]) -> list[np.ndarray]:
    """Each sequence alone (batch 1) through the ONNX step model with onnxruntime, its
    ``STATE_OUT`` fed back as the next ``STATE_IN`` (zeros first, as the config's
    ``initial_state``).

    Args:
        model_path: ``gru_stream/1/model.onnx``.
        observed: per sequence, FP32 [T_i].

    Returns:
        Per sequence, FP32 [T_i]: ``OUTPUT`` of every step.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    hidden = int(session.get_inputs()[1].shape[1])
    results = []
    for series in observed:
        state = np.zeros((1, hidden), dtype=np.float32)
        outputs = np.empty_like(series)
        for t, value in enumerate(series):
            feed = {"INPUT": np.array([[value]], dtype=np.float32), "STATE_IN": state}
            out, state = session.run(["OUTPUT", "STATE_OUT"], feed)
            outputs[t] = out[0, 0]
        results.append(outputs)
    return results


def stream_through_sluice(
    url: str,
    ids: list[int],
    observed: list[np.ndarray],
    pipelined: bool = False,
    seed: int = 0,
    timeout_s: float = 30.0,
) -> tuple[list[np.ndarray], int | None]:
    """Send every step of every sequence to ``gru_stream`` over one gRPC stream.

    Args:
        url: the server's gRPC ``host:port``.
        ids: the sequence ids, one per sequence.
        observed: per sequence, FP32 [T_i]: one value per request (``INPUT`` [1, 1]).
        pipelined: send everything at once instead of round by round.
        seed: the shuffle of each round's sending order.
        timeout_s: the longest wait for one answer.

    Returns:
        Per sequence, FP32 [T_i]: ``OUTPUT`` of each step; and the model executions the
        server counted meanwhile (None: statistics not readable).

    Raises:
        StreamError: the server or the model is not ready, more sequences than the
            model keeps live at once are asked for round by round, or a step was
            answered with an error, twice, or not in time.
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    rng = np.random.default_rng(seed)
    served = [np.full(len(x), np.nan, dtype=np.float32) for x in observed]
    answers: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        ready = client.is_model_ready(MODEL)
    except InferenceServerException as exc:
        client.close()
        raise StreamError(f"cannot reach the server at {url}: {exc.message()}") from None
    if not ready:
        client.close()
        raise StreamError(
            f"model '{MODEL}' is not ready at {url} (is the server serving "
            "examples/sequence/model_repository?)"
        )
    slots = _sequence_slots(client)
    if not pipelined and slots is not None and len(ids) > slots:
        client.close()
        raise StreamError(
            f"{len(ids)} sequences sent round by round need {len(ids)} live sequences at "
            f"once, but '{MODEL}' holds {slots} (max_candidate_sequences x instances); the "
            "others wait for a sequence to end, which never comes while the client waits "
            "for their answers (Triton behaves the same). Use --pipelined or at most "
            f"{slots} sequences."
        )
    executions_before = _executions(client)

    def send(i: int, k: int) -> None:
        tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[observed[i][k]]], dtype=np.float32))
        client.async_stream_infer(
            MODEL,
            [tensor],
            request_id=f"{i}/{k}",
            sequence_id=ids[i],
            sequence_start=k == 0,
            sequence_end=k == len(observed[i]) - 1,
        )

    def receive(count: int) -> None:
        for _ in range(count):
            try:
                item = answers.get(timeout=timeout_s)
            except queue.Empty:
                raise StreamError(f"no answer within {timeout_s} s") from None
            if isinstance(item, Exception):
                raise StreamError(f"the server answered an error: {item}")
            i, k = (int(p) for p in item.get_response().id.split("/"))  # type: ignore[attr-defined]
            if not np.isnan(served[i][k]):
                raise StreamError(f"step {k} of sequence {ids[i]} was answered twice")
            served[i][k] = item.as_numpy("OUTPUT").reshape(-1)[0]  # type: ignore[attr-defined]

    client.start_stream(callback=lambda result, error: answers.put(error or result))
    try:
        rounds = max(len(x) for x in observed)
        for k in range(rounds):
            live = [i for i in range(len(observed)) if k < len(observed[i])]
            for i in rng.permutation(live):
                send(int(i), k)
            if not pipelined:
                receive(len(live))
        if pipelined:
            receive(sum(len(x) for x in observed))
        executions_after = _executions(client)
    finally:
        client.stop_stream()
        client.close()
    if executions_before is None or executions_after is None:
        return served, None
    return served, executions_after - executions_before


def _sequence_slots(client: object) -> int | None:
    """How many sequences ``gru_stream`` keeps live at once on the server: the sequence
    batcher's candidates (``oldest``) or batch slots (``direct``) per instance, times
    the instances (None: the config could not be read)."""
    from tritonclient.utils import InferenceServerException

    try:
        config = client.get_model_config(MODEL, as_json=True)["config"]  # type: ignore[attr-defined]
    except (InferenceServerException, KeyError):
        return None
    batcher = config.get("sequence_batching", {})
    if "oldest" in batcher:
        per_instance = int(batcher["oldest"].get("max_candidate_sequences", 1))
    else:
        per_instance = max(1, int(config.get("max_batch_size", 1)))
    instances = sum(int(group.get("count", 1)) for group in config.get("instance_group", []))
    return per_instance * max(1, instances)


def _executions(client: object) -> int | None:
    """The server's execution count of ``gru_stream`` (None: not readable)."""
    from tritonclient.utils import InferenceServerException

    try:
        stats = client.get_inference_statistics(MODEL)  # type: ignore[attr-defined]
    except InferenceServerException:
        return None
    return sum(int(m.execution_count) for m in stats.model_stats)


def compare(
    url: str,
    model_path: Path,
    sequences: int = 8,
    steps: int = 24,
    first_id: int = 1000,
    seed: int = 7,
    pipelined: bool = False,
) -> Comparison:
    """Make ``sequences`` series (sequence ``i``: ``steps - i % 4`` steps, at least 1), stream
    them through Sluice and run them in-process; see :class:`Comparison`."""
    series = load_series()
    length = max(steps, 1)
    observed_all, target_all = series.noisy_sines(np.random.default_rng(seed), sequences, length)
    lengths = [max(1, length - i % 4) for i in range(sequences)]
    result = Comparison(
        ids=[first_id + i for i in range(sequences)],
        observed=[observed_all[i, :n] for i, n in enumerate(lengths)],
        target=[target_all[i, :n] for i, n in enumerate(lengths)],
        pipelined=pipelined,
    )
    result.local = run_in_process(model_path, result.observed)
    result.served, result.executions = stream_through_sluice(
        url, result.ids, result.observed, pipelined, seed
    )
    return result


def report(result: Comparison, url: str, tolerance: float) -> bool:
    """Print the comparison; whether every answer is within ``tolerance``."""
    series = load_series()
    lengths = [len(x) for x in result.observed]
    how = "all sent at once (pipelined)" if result.pipelined else "one round of steps at a time"
    print(
        f"{MODEL} at {url}: {len(result.ids)} sequences (ids {result.ids[0]}-{result.ids[-1]}, "
        f"{min(lengths)}-{max(lengths)} steps), {result.steps} requests interleaved on one "
        f"gRPC stream, {how}"
    )
    print("  sequence  steps  max |Sluice - in-process|  RMSE Sluice  RMSE last value")
    for i, sid in enumerate(result.ids):
        print(
            f"  {sid:8d}  {lengths[i]:5d}  {result.max_diff(i):25.2e}  "
            f"{series.rmse(result.served[i], result.target[i]):11.4f}  "
            f"{series.rmse(result.observed[i], result.target[i]):15.4f}"
        )
    shown = min(6, lengths[0])
    print(f"  sequence {result.ids[0]}, first {shown} steps: observed -> Sluice's prediction of")
    print("  the next clean value (in-process prediction, true next clean value)")
    for k in range(shown):
        print(
            f"    step {k}: {result.observed[0][k]:+.4f} -> {result.served[0][k]:+.6f} "
            f"({result.local[0][k]:+.6f}, {result.target[0][k]:+.4f})"
        )
    if result.executions is not None:
        print(
            f"  Sluice ran the {result.steps} steps in {result.executions} model executions "
            "(the oldest-strategy sequence batcher runs steps of several sequences together)"
        )
    worst = result.max_diff()
    skip = series.WARMUP_STEPS
    ok = worst <= tolerance
    verdict = "OK" if ok else "MISMATCH"
    print(
        f"result: {verdict}: max |Sluice - in-process| over {result.steps} steps is "
        f"{worst:.3g} (tolerance {tolerance:g}); after each sequence's first {skip} steps "
        f"the model's RMSE is {pooled_rmse(result.served, result.target, skip):.4f}, "
        "repeating the last value gives "
        f"{pooled_rmse(result.observed, result.target, skip):.4f}"
    )
    return ok


def pooled_rmse(predicted: list[np.ndarray], target: list[np.ndarray], skip: int) -> float:
    """RMSE of ``predicted`` against ``target`` (per sequence, FP32 [T_i]) over every
    sequence's steps after its first ``skip`` (NaN when there are none)."""
    errors = [(p.astype(np.float64) - t)[skip:] for p, t in zip(predicted, target, strict=True)]
    joined = np.concatenate(errors) if errors else np.empty(0)
    return float(np.sqrt(np.mean(joined**2))) if joined.size else float("nan")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default="localhost:8001", help="server gRPC host:port (default localhost:8001)"
    )
    parser.add_argument("--sequences", type=int, default=8, help="sequences (default 8)")
    parser.add_argument(
        "--steps", type=int, default=24, help="steps of the longest sequence (default 24)"
    )
    parser.add_argument(
        "--pipelined", action="store_true", help="send every step at once, without waiting"
    )
    parser.add_argument("--first-id", type=int, default=1000, help="first sequence id")
    parser.add_argument("--seed", type=int, default=7, help="data seed (default 7)")
    parser.add_argument(
        "--tolerance", type=float, default=1e-5, help="largest accepted |difference|"
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help=f"repository holding {MODEL}/1/model.onnx (default {DEFAULT_REPOSITORY})",
    )
    args = parser.parse_args(argv)
    if args.sequences < 1 or args.steps < 1 or args.first_id < 1:
        parser.error("--sequences, --steps and --first-id must be >= 1")
    model_path = args.model_repository / MODEL / "1" / "model.onnx"
    if not model_path.is_file():
        print(
            f"error: {model_path} not found; run "
            "`.venv/bin/python examples/sequence/build_model.py` first",
            file=sys.stderr,
        )
        return 2
    from tritonclient.utils import InferenceServerException

    try:
        result = compare(
            args.url, model_path, args.sequences, args.steps, args.first_id, args.seed,
            args.pipelined,
        )  # fmt: skip
    except (StreamError, InferenceServerException, OSError) as exc:
        print(f"error: streaming to {MODEL} at {args.url} failed: {exc}", file=sys.stderr)
        return 2
    return 0 if report(result, args.url, args.tolerance) else 1


if __name__ == "__main__":
    sys.exit(main())
