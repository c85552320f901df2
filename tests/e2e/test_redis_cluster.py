"""``sluice serve`` on a real Redis Cluster (3 primaries, 3 replicas, started here).

Three models whose hash tags land on the three primaries are served over HTTP and gRPC
with exact answers; then, under a bounded load, a primary is failed over to its replica
and a model's slot is migrated to another primary: every request is answered once,
correctly, and the instances ran each exactly once (the statistics count them). A model
whose queue is split over three shards (``queue_shards``) has a shard on each primary,
its load spread evenly over them, and loses nothing when one shard's primary fails over.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cluster_support import (
    Cluster,
    failover,
    kill_primary,
    migrate_slot,
    model_slot,
    restart_node,
    start_cluster,
    stop_cluster,
)
from e2e_support import Server, load_examples, load_while, start_server, stop_server
from redis.crc import key_slot

from sluice.broker.cluster import sync_client
from sluice.broker.keys import KeySchema, shard_tag

pytestmark = pytest.mark.e2e

#: the models served, one per primary of a fresh cluster (their {model} slots: 6621,
#: 3313, 12149 of the ranges 0-5460, 5461-10922, 10923-16383 that --cluster create gives)
MODELS = ("add_sub", "add_sub_a", "digits")
#: add_sub with three instances and its queue split over three shards
SHARDED = "add_sub_sharded"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server and redis-cli are needed for a Redis Cluster")
    running = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield running
    stop_cluster(running)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """add_sub, a copy of it named add_sub_a, and digits."""
    out = tmp_path_factory.mktemp("cluster-models")
    examples = load_examples()
    examples.build_add_sub(out)  # type: ignore[attr-defined]
    examples.build_digits(out)  # type: ignore[attr-defined]
    shutil.copytree(out / "add_sub", out / "add_sub_a")
    config = out / "add_sub_a" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_sub"', 'name: "add_sub_a"'))
    shutil.copytree(out / "add_sub", out / SHARDED)
    config = out / SHARDED / "config.pbtxt"
    text = config.read_text().replace('name: "add_sub"', f'name: "{SHARDED}"')
    text = text.replace("count: 1", "count: 3")
    text += 'parameters { key: "queue_shards" value: { string_value: "3" } }\n'
    config.write_text(text)
    return out


@pytest.fixture(scope="module")
def server(
    cluster: Cluster, repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("cluster-logs") / "serve.log"
    srv = start_server(repo, cluster.url, log, "--job-workers", "0", timeout_s=120)
    yield srv
    assert stop_server(srv) == 0, srv.log()


def _add_sub_inputs(module: object, value: int) -> list[object]:
    a = np.full((1, 16), float(value), dtype=np.float32)
    b = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "FP32"),
        module.InferInput("INPUT1", [1, 16], "FP32"),
    ]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _expected(value: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.full((1, 16), float(value), dtype=np.float32)
    b = np.arange(16, dtype=np.float32).reshape(1, 16)
    return a + b, a - b


def _success_count(server: Server, model: str) -> int:
    stats = requests.get(f"{server.base}/v2/models/{model}/stats", timeout=10).json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_models_land_on_three_primaries(cluster: Cluster) -> None:
    owners = {cluster.slot_owner(model_slot(m)) for m in MODELS}
    assert len(owners) == 3


def test_serves_http_and_grpc_exactly(server: Server, repo: Path) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for model in ("add_sub", "add_sub_a"):
            for value, client, module in ((7, http, httpclient), (-3, grpc, grpcclient)):
                result = client.infer(model, _add_sub_inputs(module, value))
                total, diff = _expected(value)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), total)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), diff)
        import onnxruntime

        examples = load_examples()
        x, _ = examples.digits_test_split()  # type: ignore[attr-defined]
        x = np.ascontiguousarray(x[:16], dtype=np.float32)
        session = onnxruntime.InferenceSession(str(repo / "digits" / "1" / "model.onnx"))
        want = session.run(["label"], {"input": x})[0].reshape(-1)
        for client, module in ((http, httpclient), (grpc, grpcclient)):
            tensor = module.InferInput("input", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            got = client.infer("digits", [tensor]).as_numpy("label").reshape(-1)
            np.testing.assert_array_equal(got, want)
        assert http.is_server_ready() and grpc.is_server_ready()
    finally:
        http.close()
        grpc.close()


def _load_and_check(
    server: Server,
    disturb: object,
    seconds: float = 8.0,
    in_flight_lost: int = 0,
    model: str = "add_sub",
) -> int:
    """Run ``disturb`` under a bounded add_sub load (4 HTTP clients, one gRPC client);
    assert every request answered correctly and executed once; returns how many.

    ``in_flight_lost``: how many requests may instead fail with the gateway's 503 /
    UNAVAILABLE "sent before the connection was lost: it may have run" (their XADD was
    in flight to a node that died: not accepted, and not counted as executed)."""
    before = _success_count(server, model)
    grpc_answers: dict[int, object] = {}
    stop = threading.Event()

    def grpc_loop() -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        value = 500_000
        try:
            while not stop.is_set():
                try:
                    grpc_answers[value] = client.infer(
                        model, _add_sub_inputs(grpcclient, value), client_timeout=60
                    )
                except Exception as exc:
                    grpc_answers[value] = exc
                value += 1
        finally:
            client.close()

    def infer(client: object, value: int) -> object:
        return client.infer(model, _add_sub_inputs(httpclient, value))  # type: ignore[attr-defined]

    thread = threading.Thread(target=grpc_loop)
    thread.start()
    try:
        answers = load_while(server.http_url, infer, disturb, seconds, clients=4)  # type: ignore[arg-type]
    finally:
        stop.set()
        thread.join(90)
    assert not thread.is_alive(), "a gRPC request hung"
    answers.update(grpc_answers)
    failures = {v: a for v, a in answers.items() if isinstance(a, Exception)}
    unsent = [a for a in failures.values() if "it may have run" in str(a)]
    assert len(failures) == len(unsent) <= in_flight_lost, (
        f"{len(failures)} of {len(answers)} failed: {list(failures.items())[:3]}"
    )
    for value in failures:
        del answers[value]
    for value, result in answers.items():
        total, diff = _expected(value)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), total)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), diff)  # type: ignore[attr-defined]
    executed = _success_count(server, model) - before
    assert len(answers) <= executed <= len(answers) + len(failures)
    return len(answers)


def test_primary_failover_under_load(server: Server, cluster: Cluster) -> None:
    primary = cluster.slot_owner(model_slot("add_sub"))
    promoted: list[int] = []
    answered = _load_and_check(server, lambda: promoted.append(failover(cluster, primary)))
    assert promoted and cluster.slot_owner(model_slot("add_sub")) == promoted[0] != primary
    assert answered > 50


def test_reply_list_primary_failover_under_load(server: Server, cluster: Cluster) -> None:
    """The gateway's reply list (a slot of its own) loses its primary: the reply reader
    follows the slot to the promoted replica."""
    readers = cluster.serving("blmpop")
    assert len(readers) == 1, readers
    promoted: list[int] = []
    answered = _load_and_check(server, lambda: promoted.append(failover(cluster, readers[0])))
    assert promoted and cluster.serving("blmpop") == promoted
    assert answered > 50


def test_slot_migration_under_load(server: Server, cluster: Cluster) -> None:
    slot = model_slot("add_sub")
    source = cluster.slot_owner(slot)
    target = next(p for p in cluster.primaries() if p != source)
    answered = _load_and_check(server, lambda: migrate_slot(cluster, slot, target))
    assert cluster.slot_owner(slot) == target
    assert answered > 50


def test_primary_killed_under_load(server: Server, cluster: Cluster) -> None:
    """SIGKILL of add_sub's primary: commands not yet written wait for the promoted
    replica; only requests whose XADD was in flight fail, with 503 "it may have run"."""
    primary = cluster.slot_owner(model_slot("add_sub"))
    promoted: list[int] = []
    try:
        answered = _load_and_check(
            server,
            lambda: promoted.append(kill_primary(cluster, primary)),
            seconds=12.0,
            in_flight_lost=5,  # at most one per client
        )
    finally:
        restart_node(cluster, primary)
    assert promoted and cluster.slot_owner(model_slot("add_sub")) == promoted[0]
    assert answered > 50


def _shard_streams(server: Server) -> list[str]:
    keys = KeySchema(server.key_prefix)
    return [keys.queue(SHARDED, 1, 0, shard, 3) for shard in range(3)]


def test_sharded_queue_spreads_over_the_primaries(server: Server, cluster: Cluster) -> None:
    """The three shards of SHARDED's queue are on the three primaries, and a load through
    one gateway (HTTP and gRPC) lands within 20% of even on each: every request answered
    once, correctly."""
    streams = _shard_streams(server)
    owners = {cluster.slot_owner(key_slot(stream.encode())) for stream in streams}
    assert len(owners) == 3, streams
    client = sync_client(cluster.url)
    before = [_entries_added(client, s) for s in streams]
    answered = _load_and_check(server, lambda: None, seconds=6.0, model=SHARDED)
    added = [_entries_added(client, s) - b for s, b in zip(streams, before, strict=True)]
    assert sum(added) >= answered > 50
    even = sum(added) / 3
    assert all(abs(n - even) <= 0.2 * even for n in added), added
    # each instance counts under the tag of the shard it waits on (0, 1, 2 in turn): the
    # statistics the load was checked against were added up over the three slots
    keys = KeySchema(server.key_prefix)
    tags = {t.decode() for t in client.smembers(keys.stats_tags(SHARDED, 1))}
    assert tags == {shard_tag(SHARDED, 1, 3), shard_tag(SHARDED, 2, 3)}
    for tag in (None, *tags):
        assert client.scard(keys.stats_shards(SHARDED, 1, tag)) == 1
    client.close()


def test_sharded_queue_primary_failover_under_load(server: Server, cluster: Cluster) -> None:
    """One shard's primary fails over to its replica under load: the instances read that
    shard on the promoted replica and the others throughout; nothing lost or run twice."""
    stream = _shard_streams(server)[1]
    primary = cluster.slot_owner(key_slot(stream.encode()))
    promoted: list[int] = []
    answered = _load_and_check(
        server, lambda: promoted.append(failover(cluster, primary)), model=SHARDED
    )
    assert promoted and cluster.slot_owner(key_slot(stream.encode())) == promoted[0] != primary
    assert answered > 50


def _entries_added(client: object, stream: str) -> int:
    """How many entries were ever added to ``stream`` (answered ones are deleted)."""
    return int(client.xinfo_stream(stream)["entries-added"])  # type: ignore[attr-defined]


def test_async_jobs_refused_with_reason(server: Server) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16},
        ]
    }
    answer = requests.post(f"{server.base}/v2/models/add_sub/jobs", json=body, timeout=10)
    assert answer.status_code == 501
    assert "need a single Redis" in answer.json()["error"]
    assert "Redis Cluster" in answer.json()["error"]


@pytest.mark.parametrize(
    "command",
    [
        ["serve", "--model-repository", "examples/model_repository"],
        ["gateway", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
        ["worker", "--model", "add_sub", "--version", "1", "--model-dir", "examples"],
    ],
    ids=["serve", "gateway", "worker"],
)
@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("redis+cluster://localhost", "bad --redis-url: a Redis Cluster node needs host:port"),
        ("redis+cluster://127.0.0.1:1", "cannot use Redis at redis+cluster://127.0.0.1:1"),
    ],
)
def test_bad_or_unreachable_cluster_url_is_one_error_line(
    command: list[str], url: str, text: str
) -> None:
    """Every process started on its own, not only ``sluice serve``."""
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", *command, "--redis-url", url],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert text in done.stderr
    assert "Traceback" not in done.stderr
