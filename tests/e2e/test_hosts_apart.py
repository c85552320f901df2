"""Gateways and instances on separate hosts (network namespaces), under load.

Redis and the ``sluice serve`` control plane (``--start-gateway=false
--start-instances=false``) run on one host, a ``sluice gateway`` on each of two more, and
a ``sluice worker`` on each of two (three) more, every host with its own address on one
switch (:mod:`hosts_support`). ``tritonclient.http`` clients drive both gateways from
the test's own namespace while hosts are cut off and restored, or killed
(:mod:`hosts_load`: the model, the load, the checks).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from hosts_load import (
    CONFIG,
    MODEL,
    MODEL_PY,
    PREFIX,
    STALE_S,
    Deployment,
    Load,
    check_answers,
    check_statistics_add_up,
    ready_status,
    until,
)
from hosts_support import HostNetwork, namespaces_unavailable

_UNAVAILABLE = namespaces_unavailable()
pytestmark = pytest.mark.skipif(_UNAVAILABLE is not None, reason=_UNAVAILABLE or "")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Redis + control plane on host ``redis``, gateways on ``gw1`` and ``gw2``,
    instances on ``in1`` and ``in2``, an empty host ``in3``; all ready. Every process
    and namespace is removed afterwards, also when the test failed."""
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        pytest.skip("redis-server is not installed")
    repo = tmp_path / "models"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "1/model.py").write_text(MODEL_PY)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    logs = tmp_path / "logs"
    logs.mkdir()
    net = HostNetwork()
    try:
        for name in ("redis", "gw1", "gw2", "in1", "in2", "in3"):
            net.add_host(name)
        redis_host = net.hosts["redis"]
        url = f"redis://{redis_host.address}:6379/0"
        deployment = Deployment(net, repo, logs, url)
        net.run(
            redis_host,
            [redis_server, "--bind", "0.0.0.0", "--port", "6379", "--protected-mode", "no",
             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
            logs / "redis.log",
        )  # fmt: skip
        until(lambda: redis.Redis.from_url(url, socket_timeout=1).ping(), 30, "Redis answers")
        net.run(
            redis_host,
            [sys.executable, "-m", "sluice.cli", "serve", "--model-repository", str(repo),
             "--start-gateway=false", "--start-instances=false", "--job-workers", "0",
             "--redis-url", url, "--key-prefix", PREFIX, "--exit-timeout-secs", "10"],
            logs / "serve.log",
        )  # fmt: skip
        for name in ("in1", "in2"):
            deployment.start_worker(name)
        for name in ("gw1", "gw2"):
            deployment.start_gateway(name)
        for name in ("gw1", "gw2"):
            host = net.hosts[name]
            try:
                until(lambda h=host: ready_status(h) == 200, 120, f"{name} ready", 0.2)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{deployment.logs_text()}") from None
        yield deployment
    finally:
        for host in net.hosts.values():
            net.stop(host, timeout_s=10)
        net.close()


def test_host_cut_and_killed_under_load(deployment: Deployment) -> None:
    """Cut an instance host and a gateway host off and back, then kill an instance host
    and a gateway host, all under load: every request answered once and correctly (but
    those the killed gateway held), readiness true on every reachable gateway, and the
    work moves to the instance host that remains."""
    net = deployment.net
    gw1, gw2 = deployment.host("gw1"), deployment.host("gw2")
    in1, in2 = deployment.host("in1"), deployment.host("in2")
    with Load([gw1, gw2]) as load:
        start = time.monotonic()
        until(lambda: load.answered_by("in1", start) and load.answered_by("in2", start),
               20, "both instance hosts used")  # fmt: skip

        # an instance host cut off for longer than the heartbeat bound, then back
        net.cut(in1)
        cut_at = time.monotonic()
        while time.monotonic() < cut_at + STALE_S + 2.0:
            assert ready_status(gw1) == 200 and ready_status(gw2) == 200
            time.sleep(0.5)
        # what was sent during the cut and answered before the restore, in2 ran
        recent = [o for o in load.snapshot() if o.sent > cut_at and o.who]
        assert recent and {o.who for o in recent} == {"in2"}, recent[-5:]
        net.restore(in1)
        restored_at = time.monotonic()
        until(lambda: load.answered_by("in1", restored_at), 20, "in1 used again after restore")

        # a gateway host cut off and back: its clients wait, the other gateway serves
        net.cut(gw1)
        gw_cut_at = time.monotonic()
        assert ready_status(gw1) is None
        assert ready_status(gw2) == 200
        time.sleep(2.0)
        net.restore(gw1)
        until(lambda: ready_status(gw1) == 200, 20, "gw1 ready after restore")
        until(lambda: any(o.gateway == "gw1" and o.sent > gw_cut_at + 3 and o.who
                           for o in load.snapshot()), 20, "gw1 serves again")  # fmt: skip

        # an instance host killed: the work moves to in1
        net.kill(in2)
        killed_at = time.monotonic()
        time.sleep(STALE_S + 2.0)
        assert ready_status(gw1) == 200 and ready_status(gw2) == 200
        after_kill = [o for o in load.snapshot() if o.sent > killed_at and o.who]
        assert after_kill and {o.who for o in after_kill} == {"in1"}

        # a gateway host killed: its clients fail, the other gateway goes on
        gw2_killed_from = time.monotonic()
        net.kill(gw2)
        assert ready_status(gw2) is None and ready_status(gw1) == 200
        time.sleep(2.0)
    outcomes = load.snapshot()
    answered = check_answers(outcomes)
    failed = [o for o in outcomes if o.error is not None]
    # the only failures: requests the killed gateway held or that reached it after
    assert all(o.gateway == "gw2" and o.done >= gw2_killed_from for o in failed), failed[:5]
    assert not [o for o in outcomes if o.gateway == "gw1" and o.error], "gw1 failed requests"
    assert len(answered) > 100, len(answered)
    late = [o for o in answered if o.done - o.sent > 2.0]
    longest = max(o.done - o.sent for o in answered)
    assert longest < 30.0
    print(
        f"{len(answered)} answered, {len(failed)} failed at the killed gateway, "
        f"{len(late)} held > 2 s across a cut or kill, longest {longest:.1f} s"
    )
    # requests held across a cut or a kill waited, and were answered once, correctly
    assert late, "no request was held across the cuts"
    check_statistics_add_up(deployment, len(answered), reruns=len(late) + 8 * len(failed))

    # no instance left: the gateway says not ready, then a joining host brings it back
    net.kill(in1)
    # (Triton answers "not ready" with 400)
    until(lambda: ready_status(gw1) == 400, STALE_S + 5, "gw1 not ready without instances")
    deployment.start_worker("in3")
    until(lambda: ready_status(gw1) == 200, 120, "gw1 ready once in3 joined", 0.2)


def test_membership_join_and_leave(deployment: Deployment) -> None:
    """A host that joins is used within a second of its instance reporting READY; one
    that leaves (SIGTERM) or dies (SIGKILL) gets no more work; the statistics every
    gateway reports add up to the requests answered."""
    net = deployment.net
    gw1, gw2 = deployment.host("gw1"), deployment.host("gw2")
    with Load([gw1, gw2], threads_per_gateway=4) as load:
        start = time.monotonic()
        until(lambda: load.answered_by("in1", start) and load.answered_by("in2", start),
               20, "both instance hosts used")  # fmt: skip
        deployment.start_worker("in3")
        ready_at = until(
            lambda: (deployment.instance_record("in3") or {}).get("state") == "READY",
            120, "in3 READY", 0.02,
        )  # fmt: skip
        used_at = until(lambda: load.answered_by("in3", ready_at - 1.0), 5, "in3 used")
        assert used_at - ready_at < 1.0, f"in3 first used {used_at - ready_at:.2f} s after READY"
        print(f"in3 first used {used_at - ready_at:.3f} s after its READY record was seen")

        # a clean leave: SIGTERM, it drains and exits; nothing sent after goes to it
        net.stop(deployment.host("in3"))
        left_at = time.monotonic()
        assert deployment.instance_record("in3")["state"] == "STOPPED"
        # a death: SIGKILL; nothing sent after goes to it
        net.kill(deployment.host("in2"))
        killed_at = time.monotonic()
        until(lambda: load.answered_by("in1", killed_at + STALE_S), STALE_S + 10, "in1 serves")
        time.sleep(1.0)
    outcomes = load.snapshot()
    answered = check_answers(outcomes)
    assert len(answered) == len(outcomes), [o for o in outcomes if o.error][:5]
    assert not [o for o in answered if o.who == "in3" and o.sent > left_at]
    assert not [o for o in answered if o.who == "in2" and o.sent > killed_at]
    assert {o.who for o in answered} == {"in1", "in2", "in3"}
    claimed = [o for o in answered if o.done - o.sent > 2.0]
    check_statistics_add_up(deployment, len(answered), reruns=len(claimed))


def test_redis_host_cut_under_load(deployment: Deployment) -> None:
    """The Redis host cut off for a few seconds and back, under load: both gateways
    answer not ready (400) within the health deadline while they cannot reach it and
    ready again after; every request, those sent during the cut included, is answered
    once and correctly (the packets wait; no connection is refused or reset)."""
    net = deployment.net
    gw1, gw2 = deployment.host("gw1"), deployment.host("gw2")
    with Load([gw1, gw2]) as load:
        start = time.monotonic()
        until(lambda: load.answered_by("in1", start) and load.answered_by("in2", start),
               20, "both instance hosts used")  # fmt: skip
        net.cut(deployment.host("redis"))
        cut_at = time.monotonic()
        for gateway in (gw1, gw2):
            until(lambda g=gateway: ready_status(g) == 400, 5, f"{gateway.name} not ready")
        time.sleep(max(0.0, cut_at + 4.0 - time.monotonic()))
        net.restore(deployment.host("redis"))
        restored_at = time.monotonic()
        for gateway in (gw1, gw2):
            until(lambda g=gateway: ready_status(g) == 200, 20, f"{gateway.name} ready again")
        back_at = time.monotonic()
        until(lambda: load.answered_by("in1", back_at) and load.answered_by("in2", back_at),
               20, "both instance hosts used again")  # fmt: skip
        time.sleep(1.0)
    outcomes = load.snapshot()
    answered = check_answers(outcomes)
    assert len(answered) == len(outcomes), [o for o in outcomes if o.error][:5]
    held = [o for o in answered if o.sent < restored_at < o.done]
    assert held, "no request waited across the cut"
    print(
        f"{len(answered)} answered, {len(held)} across the Redis cut; ready again "
        f"{back_at - restored_at:.1f} s after the restore"
    )
    check_statistics_add_up(deployment, len(answered), reruns=0)
