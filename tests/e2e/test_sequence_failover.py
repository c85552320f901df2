"""Failover of live sequences: the instance that holds them is SIGKILLed while their
steps are in flight, and every sequence finishes on the other instance from the state
last committed in Redis, with exactly the values of an undisturbed run."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from e2e_support import (
    ROOT,
    Server,
    start_gateway,
    start_server,
    stop_server,
    wait_server_ready,
)
from tritonclient.utils import InferenceServerException

from sluice.broker.redis_server import delete_prefix

ASSETS = ROOT / "tests" / "assets" / "sequence_models"
STEPS = 14


@pytest.fixture(scope="module")
def server(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("seq-failover-repo")
    shutil.copytree(ASSETS / "seq_py", repo / "seq_py")
    started = start_server(repo, redis_url, repo.parent / "seq-failover.log")
    try:
        yield started
    finally:
        stop_server(started)


def _inputs(module: object, x: int) -> list[object]:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array([[x]], dtype=np.int32))
    return [tensor]


class Run:
    """What the clients saw: per sequence the (OUTPUT, PID, wall time) of every step."""

    def __init__(self) -> None:
        self.answers: dict[int, list[tuple[int, int, float]]] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        #: set by the test once it has killed an instance: clients then go on
        self.killed = threading.Event()
        self.steps_before_kill = 4

    def record(self, sid: int, output: int, pid: int) -> None:
        with self.lock:
            self.answers.setdefault(sid, []).append((output, pid, time.monotonic()))

    def pace(self, k: int) -> None:
        """Hold every client after its first steps until the kill, so that each sequence
        has state committed before it and steps after it."""
        if k == self.steps_before_kill:
            self.killed.wait(60)
        time.sleep(0.01)


def _value(sid: int, k: int) -> int:
    return sid * 7 + k * 3 + 1


def _waiting_client(server: Server, run: Run, sid: int, protocol: str) -> None:
    """One sequence sent step by step, each step waiting for its answer."""
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    try:
        for k in range(STEPS):
            run.pace(k)
            result = client.infer(
                "seq_py", _inputs(module, _value(sid, k)), sequence_id=sid,
                sequence_start=k == 0, sequence_end=k == STEPS - 1,
            )  # fmt: skip
            run.record(
                sid, int(result.as_numpy("OUTPUT").item()), int(result.as_numpy("PID").item())
            )
    except Exception as exc:  # the test asserts there were none
        with run.lock:
            run.errors.append(f"sequence {sid} ({protocol}): {exc}")
    finally:
        client.close()


def _stream_client(server: Server, run: Run, sids: list[int]) -> int:
    """Several sequences on one gRPC stream, each step sent when the previous answer of
    its sequence arrived. Returns how many responses arrived after the last expected one
    (within one second): answered twice would show here."""
    results: queue.Queue[object] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))

    def send(sid: int, k: int) -> None:
        client.async_stream_infer(
            "seq_py", _inputs(grpcclient, _value(sid, k)), request_id=f"{sid}:{k}",
            sequence_id=sid, sequence_start=k == 0, sequence_end=k == STEPS - 1,
        )  # fmt: skip

    held: list[int] = []
    try:
        for sid in sids:
            send(sid, 0)
        for _ in range(STEPS * len(sids)):
            item = results.get(timeout=60)
            if isinstance(item, Exception):
                with run.lock:
                    run.errors.append(f"stream: {item}")
                return 0
            sid, k = map(int, item.get_response().id.split(":"))  # type: ignore[attr-defined]
            run.record(sid, int(item.as_numpy("OUTPUT").item()), int(item.as_numpy("PID").item()))  # type: ignore[attr-defined]
            if k + 1 == run.steps_before_kill:
                held.append(sid)  # sent together once the kill happened
                if len(held) == len(sids):
                    run.killed.wait(60)
                    for each in held:
                        send(each, k + 1)
            elif k + 1 < STEPS:
                send(sid, k + 1)
        time.sleep(1.0)
        return results.qsize()
    finally:
        client.stop_stream()
        client.close()


def test_sequences_finish_exactly_on_the_other_instance_after_a_sigkill(server: Server) -> None:
    run = Run()
    waiting = [(sid, "http" if sid % 2 else "grpc") for sid in range(501, 513)]
    streamed = list(range(601, 605))
    extra: list[int] = []
    threads = [
        threading.Thread(target=_waiting_client, args=(server, run, sid, protocol))
        for sid, protocol in waiting
    ]
    threads.append(
        threading.Thread(target=lambda: extra.append(_stream_client(server, run, streamed)))
    )
    for thread in threads:
        thread.start()
    every = [sid for sid, _ in waiting] + streamed
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with run.lock:
            if all(len(run.answers.get(sid, [])) == run.steps_before_kill for sid in every):
                break
        time.sleep(0.02)
    with run.lock:
        holders = [pid for sid in every for _, pid, _ in run.answers.get(sid, [])[-1:]]
    assert len(holders) == len(every), run.errors
    # the instance holding the most live sequences dies; the clients go on at once, so
    # their next steps are in flight (queued for it, or taken by it) when it is gone
    victim = max(set(holders), key=holders.count)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    run.killed.set()
    for thread in threads:
        thread.join(120)
    assert not run.errors, run.errors
    assert extra == [0]
    moved = []
    for sid in every:
        answers = run.answers[sid]
        expected = np.cumsum([_value(sid, k) for k in range(STEPS)]).tolist()
        assert [output for output, _, _ in answers] == expected, sid
        if answers[run.steps_before_kill - 1][1] == victim:
            after = answers[run.steps_before_kill :]
            assert all(pid != victim for _, pid, _ in after), sid
            moved.append(after[0][2] - killed_at)
    assert len(moved) == holders.count(victim) >= 1
    print(f"failover: {len(moved)} sequences moved, first answer after the kill in "
          f"{min(moved):.2f}-{max(moved):.2f} s")  # fmt: skip


def test_live_sequences_continue_across_a_restart_of_sluice_serve(
    redis_url: str, tmp_path: Path
) -> None:
    """``sluice serve`` stopped and started again on the same Redis and key prefix: the
    sequences it was running continue from their committed state on the new instances,
    without START; one that ended before the restart is not live any more."""
    shutil.copytree(ASSETS / "seq_py", tmp_path / "seq_py")
    prefix = f"sluice-e2e-{uuid.uuid4().hex[:8]}:"
    first = start_server(tmp_path, redis_url, tmp_path / "one.log", key_prefix=prefix)
    try:
        client = httpclient.InferenceServerClient(first.http_url)
        for sid in (71, 72):
            for k in range(3):
                result = client.infer(
                    "seq_py", _inputs(httpclient, _value(sid, k)), sequence_id=sid,
                    sequence_start=k == 0, sequence_end=sid == 72 and k == 2,
                )  # fmt: skip
        before_pid = int(result.as_numpy("PID").item())
        client.close()
    finally:
        assert stop_server(first) == 0, first.log()
    second = start_server(tmp_path, redis_url, tmp_path / "two.log", key_prefix=prefix)
    try:
        client = httpclient.InferenceServerClient(second.http_url)
        outputs = []
        for k in range(3, 6):
            result = client.infer(
                "seq_py", _inputs(httpclient, _value(71, k)), sequence_id=71,
                sequence_end=k == 5,
            )  # fmt: skip
            outputs.append(int(result.as_numpy("OUTPUT").item()))
        assert outputs == np.cumsum([_value(71, k) for k in range(6)]).tolist()[3:]
        assert int(result.as_numpy("PID").item()) != before_pid
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            client.infer("seq_py", _inputs(httpclient, 1), sequence_id=72)
        client.close()
    finally:
        stop_server(second)
        delete_prefix(redis_url, prefix)


def test_steps_through_two_gateways_keep_their_order(server: Server, tmp_path: Path) -> None:
    """Each sequence's steps alternate between the server's gateway (HTTP) and a second
    ``sluice gateway`` (gRPC) on the same Redis; eight sequences at once, each step
    waiting for the previous answer: every running sum is exact."""
    process, _, grpc_port = start_gateway(server.redis_url, server.key_prefix, tmp_path / "gw.log")
    try:
        second = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        wait_server_ready(second)
        second.close()
        got: dict[int, list[int]] = {}

        def run(sid: int) -> None:
            clients = (
                httpclient.InferenceServerClient(server.http_url),
                grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}"),
            )
            out = got.setdefault(sid, [])
            for k in range(8):
                client = clients[(k + sid) % 2]
                module = httpclient if k % 2 == sid % 2 else grpcclient
                result = client.infer(
                    "seq_py", _inputs(module, _value(sid, k)), sequence_id=sid,
                    sequence_start=k == 0, sequence_end=k == 7,
                )  # fmt: skip
                out.append(int(result.as_numpy("OUTPUT").item()))
            for client in clients:
                client.close()

        threads = [threading.Thread(target=run, args=(sid,)) for sid in range(801, 809)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for sid in range(801, 809):
            assert got[sid] == np.cumsum([_value(sid, k) for k in range(8)]).tolist(), sid
    finally:
        process.terminate()
        process.wait(30)
