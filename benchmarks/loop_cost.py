"""The instance loop's own cost per batch: everything but the framework call.

Builds a real :class:`gpu_workers.loop.InstanceLoop` (real ``StreamConsumer``, statistics
shard, latency recorder, ``TensorBackendAdapter``) around a framework that answers at
once, and times, per batch of ``--batch`` MLP-shaped requests (INPUT0 FP32 [1, 512] →
OUTPUT0 FP32 [1, 10]): decoding the ``XREADGROUP`` reply, admitting the requests, forming
the batch, concatenating and splitting, building and encoding the answers and the
statistics, and packing the pipeline that would carry them. Nothing reaches Redis (the
finish commands are only packed), so the figure is the Python the instance adds to every
batch on top of the model, the serial part of its cycle besides the model and the round
trip.

    .venv/bin/python benchmarks/loop_cost.py                 # µs per batch (min/median of 14)
    .venv/bin/python benchmarks/loop_cost.py --callgrind     # instructions per batch

Wall time on a shared 2-vCPU VM moves by half between minutes; ``--callgrind`` runs the
loop under ``valgrind --tool=callgrind`` twice (0 and ``--iterations`` batches) and prints
the difference per batch, which is the same from run to run for the same code.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = """name: "mlp" max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { kind: KIND_CPU count: 1 } ]"""


class _Instant:
    """A framework whose run answers zeros at once (OUTPUT0 FP32 [n, 10])."""

    def load(self, ctx: object) -> None:
        pass

    def run(self, inputs: dict, outputs: list[str]) -> dict:
        import numpy as np

        rows = next(iter(inputs.values())).shape[0]
        return {"OUTPUT0": np.zeros((rows, 10), np.float32)}

    def close(self) -> None:
        pass


def _harness(batch: int, batches: int):  # type: ignore[no-untyped-def]
    """One batch's work as a callable of the batch index (0 to ``batches - 1``, each a
    prepared ``XREADGROUP`` reply) that returns the packed pipeline."""
    import numpy as np
    import redis
    from google.protobuf import text_format
    from tritonclient.grpc.model_config_pb2 import ModelConfig

    from sluice.broker.codec import encode_request
    from sluice.broker.consumer import StreamConsumer
    from sluice.broker.keys import KeySchema
    from sluice.broker.messages import InferRequestMessage, WireTensor
    from sluice.broker.producer import PAYLOAD_FIELD
    from sluice.broker.resp import pack_pipeline
    from sluice.broker.scheduling import ShapeKeys, StreamLayout, scheduling_policy
    from sluice.broker.stats_store import StatsShard
    from sluice.gpu_workers.answers import output_datatypes
    from sluice.gpu_workers.backends.base import InstanceContext
    from sluice.gpu_workers.backends.tensor_adapter import TensorBackendAdapter
    from sluice.gpu_workers.loop import InstanceLoop

    config = text_format.Parse(CONFIG, ModelConfig())
    layout = StreamLayout(KeySchema("loopcost:"), "mlp", 1, scheduling_policy(config))
    # never connected: the finish commands are deferred and only packed
    client = redis.Redis.from_url("redis://127.0.0.1:1/0", protocol=2)
    consumer = StreamConsumer(client, layout.streams(), "instance-0")
    sent: list[tuple[object, ...]] = []
    consumer.send_ahead = sent.extend  # type: ignore[method-assign]  # the answers' write
    backend = TensorBackendAdapter(_Instant())
    backend.initialize(
        InstanceContext("mlp", 1, config, "mlp_0", "CPU", 0, Path("/tmp"), Path("/tmp/1"))
    )
    stats = StatsShard("loopcost:shard", "loopcost:shards")
    stats.registered = True
    loop = InstanceLoop(
        consumer, backend, layout, ShapeKeys(config), output_datatypes(config), stats, True
    )
    data = np.random.default_rng(0).random((1, 512), np.float32).tobytes()
    stream = layout.stream(0).encode()
    read = ("XREADGROUP", "GROUP", "g", "instance-0", "COUNT", 64, "STREAMS", stream, ">")

    def reply(k: int) -> list:
        enqueued = time.time_ns() - 3_000_000  # past the delay window: the batch runs now
        entries = []
        for i in range(batch):
            message = InferRequestMessage(
                request_id=f"gw-{k}-{i}", client_id="", model="mlp", version=1,
                inputs=(WireTensor("INPUT0", "FP32", (1, 512), data),), outputs=("OUTPUT0",),
                parameters={}, reply_to="loopcost:reply:gw", deadline_ns=enqueued + 6 * 10**10,
                enqueued_ns=enqueued,
            )  # fmt: skip
            entries.append((f"{k}-{i}".encode(), [PAYLOAD_FIELD, encode_request(message)]))
        return [[stream, entries]]

    replies = [reply(k) for k in range(batches)]

    def one(k: int) -> bytes:
        loop.admit(consumer._decode(replies[k]))
        taken = loop._assembly.take(time.time_ns())
        assert taken is not None and len(taken.items) == batch, taken
        loop._execute(taken)
        commands, consumer._deferred = consumer._deferred, []
        answers = pack_pipeline(sent)
        sent.clear()
        return answers + pack_pipeline([*commands, read])

    return one


def _instructions(args: argparse.Namespace, iterations: int) -> int:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        subprocess.run(
            [
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                sys.executable, __file__, "--iterations", str(iterations),
                "--batch", str(args.batch), "--run-only", "--build", str(args.iterations),
            ],
            check=True, capture_output=True, timeout=1800,
        )  # fmt: skip
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        assert found is not None, "callgrind wrote no totals"
        return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=15, help="requests per batch")
    parser.add_argument("--iterations", type=int, default=300, help="batches per measurement")
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument("--run-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--build", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.callgrind:
        base, more = _instructions(args, 0), _instructions(args, args.iterations)
        print(f"{(more - base) / args.iterations:,.0f} instructions per batch of {args.batch}")
        return
    if args.run_only:  # under callgrind: the same set-up in both runs, the batches in one
        one = _harness(args.batch, args.build)
        for k in range(args.iterations):
            one(k)
        return
    warm = 200
    one = _harness(args.batch, warm + 14 * args.iterations)
    for k in range(warm):
        one(k)
    runs = []
    for rep in range(14):
        start = time.perf_counter_ns()
        first = warm + rep * args.iterations
        for k in range(first, first + args.iterations):
            one(k)
        runs.append((time.perf_counter_ns() - start) / args.iterations / 1000)
    print(
        f"per batch of {args.batch}: min {min(runs):.1f} µs, median {statistics.median(runs):.1f}"
        f" µs (14 runs of {args.iterations}; pid {os.getpid()})"
    )


if __name__ == "__main__":
    main()
