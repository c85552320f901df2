"""Model instance process entry (``sluice worker`` or ``python -m sluice.gpu_workers.main``).

Reads the effective config the supervisor published in Redis, loads the
backend, reports the instance READY (or UNAVAILABLE with the reason, then
exits 1), and serves the model version's stream until SIGTERM/SIGINT; the
batch in hand is finished before the instance finalizes (graceful stop,
bounded by the supervisor's kill deadline).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import time
import zlib
from pathlib import Path
from threading import Event
from types import FrameType

import redis
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from sluice.broker.clock import check_clock
from sluice.broker.cluster import sync_client
from sluice.broker.consumer import StreamConsumer
from sluice.broker.deadline import exit_deadline
from sluice.broker.keys import KeySchema, hash_tag
from sluice.broker.logs import LogOptions, configure_logging
from sluice.broker.model_store import ModelStore
from sluice.broker.redis_access import exit_if_refused
from sluice.broker.request_checks import RequestRules
from sluice.broker.scheduling import ShapeKeys, stream_layout
from sluice.broker.settings import RedisSettings
from sluice.broker.states import InstanceState, ModelState
from sluice.broker.stats_store import fold_stats_shards, open_stats_shard
from sluice.gpu_workers.answers import output_datatypes
from sluice.gpu_workers.backends.base import InstanceContext, ModelCodeError
from sluice.gpu_workers.backends.registry import backend_class
from sluice.gpu_workers.classification import read_labels
from sluice.gpu_workers.liveness import Liveness
from sluice.gpu_workers.loop import DRAIN_LIMIT_NS, InstanceLoop
from sluice.gpu_workers.processes import EXIT_GRACE_S, HAND_OVER_SIGNAL, triton_instance_name
from sluice.gpu_workers.pulse import Pulse
from sluice.gpu_workers.sequence_assembly import SequenceAssembly, initial_states
from sluice.gpu_workers.warmup import run_warmup
from sluice.repository.sequence_config import sequence_spec

logger = logging.getLogger("gpu_workers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sluice worker", description=__doc__)
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument("--version", required=True, type=int, help="model version")
    parser.add_argument(
        "--instance",
        default=None,
        help="instance name, unique per version (default: this host's name, unique per "
        "container or pod)",
    )
    parser.add_argument("--kind", default="CPU", choices=["CPU", "GPU", "MODEL"])
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument(
        "--model-dir", required=True, type=Path, help="the model's directory (holding config.pbtxt)"
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("SLUICE_REDIS__URL", RedisSettings().url)
    )
    parser.add_argument(
        "--key-prefix",
        default=os.environ.get("SLUICE_REDIS__KEY_PREFIX", RedisSettings().key_prefix),
    )
    parser.add_argument("--log-verbose", type=int, default=0)
    parser.add_argument(
        "--config-key",
        default=None,
        help="Redis key of the config to start with (default: the model's published config)",
    )
    parser.add_argument(
        "--drain-timeout-secs",
        type=float,
        default=DRAIN_LIMIT_NS / 1e9,
        help="after SIGTERM, how long the instance keeps running queued requests",
    )
    parser.add_argument(
        "--load-id",
        default="",
        help="the load this instance belongs to (set by sluice serve), stamped on its "
        "answers so that the response cache stores each under the load that computed it",
    )
    parser.add_argument(
        "--stale-instance-secs",
        type=float,
        default=5.0,
        help="an instance whose heartbeat is older is taken for dead and its "
        "pending requests are claimed by a live one",
    )
    parser.add_argument(
        "--queue-shard",
        type=int,
        default=-1,
        help="of a model whose queue is split over several Redis Cluster slots "
        "(queue_shards), the shard this instance waits on when idle, modulo their number "
        "(default: from the hash of the instance name); give the instances of a version "
        "0, 1, 2, ... so that every shard has one waiting",
    )
    parser.add_argument(
        "--config-wait-secs",
        type=float,
        default=300.0,
        help="how long to wait for the model's config to be published (a worker started "
        "apart, before 'sluice serve' loaded the model)",
    )
    args = parser.parse_args(argv)
    if not args.instance:
        args.instance = socket.gethostname()
    return args


def main(argv: list[str] | None = None) -> int:
    """Run one model instance; returns the process exit code."""
    args = parse_args(argv)
    configure_logging(f"worker {args.instance}", LogOptions.from_env(verbose=args.log_verbose))
    exit_if_refused(args.redis_url, logger)
    keys = KeySchema(args.key_prefix)
    client = sync_client(args.redis_url, protocol=2, socket_timeout=30, health_check_interval=10)
    store = ModelStore(client, keys)
    check_clock(client, logger)

    def report(state: InstanceState, reason: str = "") -> None:
        store.set_instance(
            args.model,
            args.version,
            args.instance,
            {"state": state, "reason": reason, "pid": os.getpid()},
        )

    report(InstanceState.LOADING)
    try:
        if args.config_key:
            raw = client.get(args.config_key)
            if raw is None:
                raise RuntimeError(f"no config at {args.config_key}")
            config_json = raw.decode()
        else:
            config_json = _published_config(store, args.model, args.config_wait_secs)
        config = json_format.Parse(config_json, ModelConfig())
        ctx = InstanceContext(
            model_name=args.model,
            model_version=args.version,
            config=config,
            instance_name=triton_instance_name(args.instance),  # as Triton's, across reloads
            kind=args.kind,
            device_id=args.device_id,
            model_dir=args.model_dir,
            version_dir=args.model_dir / str(args.version),
            redis_url=args.redis_url,
            key_prefix=args.key_prefix,
            record_name=args.instance,
            load_id=args.load_id,
        )
        labels = {
            o.name: read_labels(args.model_dir, o.label_filename, args.model, o.name)
            for o in config.output
            if o.label_filename
        }
        sequences = _sequence_assembly(client, keys, args, config)
        backend = backend_class(config.backend, args.model)()
        if config.backend == "python":
            from sluice.gpu_workers.bls import install_bls

            # before initialize: a model may call other models from there too
            install_bls(args.redis_url, keys, args.model, args.instance)
        backend.initialize(ctx)
        run_warmup(backend, ctx)  # model_warmup runs before the instance is READY
    except Exception as exc:
        log_load_failure(args.instance, args.model, exc)
        report(InstanceState.UNAVAILABLE, str(exc) or type(exc).__name__)
        return 1

    keys_layout = stream_layout(keys, args.model, args.version, config)
    streams = keys_layout.streams()
    if sequences is not None:
        # a sequence's steps come on the stream of the instance it is bound to
        streams.append(keys.sequence_queue(args.model, args.version, args.instance))
    shard = args.queue_shard if args.queue_shard >= 0 else zlib.crc32(args.instance.encode())
    home = keys_layout.stream(keys_layout.levels()[0], shard % keys_layout.shards)
    consumer = StreamConsumer(
        client,
        streams,
        args.instance,
        home=home,
        shards=keys_layout.shards,
    )
    consumer.ensure_groups()
    loop = InstanceLoop(
        consumer,
        backend,
        keys_layout,
        ShapeKeys(config),
        output_datatypes(config),
        open_stats_shard(client, keys, args.model, args.version, args.instance, hash_tag(home)),
        batching=config.max_batch_size > 0,
        load_id=args.load_id,
        rules=RequestRules.from_config(config),
        sequences=sequences,
    )
    loop.drain_limit_ns = int(args.drain_timeout_secs * 1e9)
    liveness = Liveness(
        store,
        args.model,
        args.version,
        args.instance,
        consumer,
        stale_after_s=args.stale_instance_secs,
        # the heartbeat also from a process of its own: an execution holding the GIL
        # stops the thread's
        pulse=Pulse(args.redis_url, keys.instances(args.model, args.version), args.instance),
        sequence_stream=None
        if sequences is None
        else functools.partial(keys.sequence_queue, args.model, args.version),
    )
    loop.housekeeping = liveness.recover
    loop.labels = labels

    def stop(signum: int, _frame: FrameType | None) -> None:
        logger.info("signal %d: finishing the batch in hand, then what is queued", signum)
        if not loop.stopping.is_set():
            loop.stop_requested_ns = time.time_ns()
        loop.stopping.set()

    deadline: list[object] = []

    def terminate(signum: int, frame: FrameType | None) -> None:
        stop(signum, frame)
        if not deadline:
            # a drain held in calls to a Redis that answers nothing would keep the process
            # for the 30 s socket timeout and more, also after its sluice serve was killed
            # (nobody left to kill it); what it holds stays pending for another instance
            limit_s = args.drain_timeout_secs + EXIT_GRACE_S
            deadline.append(
                exit_deadline(
                    limit_s, f"still stopping {limit_s:.0f} s after the signal (Redis not "
                    "answering?): exiting"
                )
            )  # fmt: skip

    def hand_over(signum: int, frame: FrameType | None) -> None:
        logger.info("signal %d: a newer instance takes over; finishing what is held", signum)
        loop.handing_over = True
        stop(signum, frame)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    signal.signal(HAND_OVER_SIGNAL, hand_over)
    report(InstanceState.READY)
    liveness.start()
    logger.info(
        "instance %s of model '%s' version %d is ready", args.instance, args.model, args.version
    )
    try:
        if _await_publication(store, args, loop.stopping):
            loop.run()
        finish_streams = getattr(backend, "finish_streams", None)
        if finish_streams is not None:  # a decoupled model's streams still sending
            finish_streams(args.drain_timeout_secs)
        _fold_stats(client, keys, args)
    finally:
        liveness.stop()
        backend.finalize()
        try:
            report(InstanceState.STOPPED)
        except redis.exceptions.RedisError as exc:
            # its heartbeat stops: gateways take it for dead, and so does recovery
            logger.warning("instance %s: state STOPPED not written (%s)", args.instance, exc)
        finally:
            consumer.close()
            client.close()
    return 0


def _sequence_assembly(
    client: redis.Redis, keys: KeySchema, args: argparse.Namespace, config: ModelConfig
) -> SequenceAssembly | None:
    """The sequence batcher of this instance (None without ``sequence_batching``).

    Raises:
        ConfigError, ValueError: the block is invalid or an initial state file is wrong.
    """
    if not config.HasField("sequence_batching"):
        return None
    spec = sequence_spec(config, args.model_dir)
    return SequenceAssembly(
        client, keys, args.model, args.version, spec, config.max_batch_size,
        initial_states(spec), frozenset(t.name for t in config.output),
    )  # fmt: skip


#: how often a worker started apart looks for its model's config, in s.
CONFIG_POLL_S = 0.5


def _published_config(store: ModelStore, model: str, wait_s: float) -> str:
    """The model's published config, waited for up to ``wait_s`` (a worker started apart,
    in a container, may come up before ``sluice serve`` has loaded the model).

    Raises:
        RuntimeError: not published within ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    config_json = store.get(model).config_json
    if not config_json:
        logger.info("waiting for model '%s' to be published", model)
    while not config_json:
        if time.monotonic() >= deadline:
            raise RuntimeError(f"model '{model}' was not published within {wait_s:.0f} s")
        time.sleep(CONFIG_POLL_S)
        config_json = store.get(model).config_json
    return config_json


#: how often a READY instance looks for its load's publication, in s.
PUBLICATION_POLL_S = 0.02


def log_load_failure(instance: str, model: str, exc: BaseException) -> None:
    """Log why an instance failed to load: one error line naming the instance, the model
    and the reason, as Triton logs ``failed to load '<model>'``.

    The traceback comes with it for an exception of the model's own code
    (:class:`ModelCodeError`: a Python model's ``initialize``), and at ``--log-verbose`` 1
    (DEBUG) for the rest: a parameter out of range or a tensor the model file lacks is
    said in full by its message.
    """
    reason = str(exc) or type(exc).__name__
    if not isinstance(exc, (ValueError, RuntimeError, OSError, ImportError)):
        reason = f"{type(exc).__name__}: {reason}"  # e.g. a library's own exception type
    shown: BaseException | None = None
    if isinstance(exc, ModelCodeError):
        shown = exc.__cause__ or exc  # the model's own traceback, not the wrapper's too
    elif logger.isEnabledFor(logging.DEBUG):
        shown = exc
    logger.error(
        "instance %s of model '%s' failed to load: %s", instance, model, reason, exc_info=shown
    )


def _await_publication(store: ModelStore, args: argparse.Namespace, stopping: Event) -> bool:
    """Wait until the model manager has published this instance's load (the version READY
    with ``--load-id``), which it does once every instance of the load is READY; only
    then take requests. The instances of a reload that fails are stopped before that:
    they never answer a request, and the old model keeps serving (Triton: a load that
    fails serves nothing). An instance started without a load id does not wait.

    An instance of the published load started again (it died) while the version unloads
    also runs: the unload waits for the queue to drain.

    Returns:
        True once published; False when the instance was stopped first (a failed or
        cancelled load, an unload, the server exiting). Redis errors while waiting are
        retried at the next poll; the manager's load timeout bounds the wait.
    """
    if not args.load_id:
        return True
    while not stopping.is_set():
        try:
            state = store.version_state(args.model, args.version)
        except redis.exceptions.RedisError:
            state = None
        if (
            state is not None
            and state.state in (ModelState.READY, ModelState.UNLOADING)
            and state.load_id == args.load_id
        ):
            return True  # published, or draining for an unload: run what is queued
        stopping.wait(PUBLICATION_POLL_S)
    return False


def _fold_stats(client: redis.Redis, keys: KeySchema, args: argparse.Namespace) -> None:
    """A stopping instance hands its statistics to the version's gateway hash (instances
    come and go under new names with reloads and scaling: their shards must not pile up)."""
    try:
        fold_stats_shards(client, keys, args.model, args.version, [args.instance])
    except redis.exceptions.RedisError as exc:
        logger.warning(
            "instance %s: statistics not folded (%s); kept in its shard", args.instance, exc
        )


if __name__ == "__main__":
    sys.exit(main())
