"""``sluice serve`` on a Redis Cluster that speaks TLS only and requires client
certificates (3 primaries, 3 replicas, started here with a throwaway CA).

The ``rediss+cluster://`` URL carries the CA and the client certificate and key in its
query string and reaches every process through ``SLUICE_REDIS__URL``: add_sub answers
exactly over HTTP and gRPC, and neither the URL's files nor its nodes' TLS options show on
any process's command line or in the log. The same URL without the CA ends ``sluice
serve`` with one error line and exit code 1, and so does an unknown option.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import redis.exceptions
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cluster_support import Cluster, model_slot, start_cluster, stop_cluster
from e2e_support import ROOT, Server, load_examples, start_server, stop_server, tree_cmdlines
from secure_redis import make_certificates

from sluice.broker.cluster import sync_client

pytestmark = pytest.mark.e2e


def _tls_missing() -> str | None:
    """Why this machine cannot run a TLS cluster, or None."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        return "redis-server and redis-cli are needed for a Redis Cluster"
    cli = subprocess.run(["redis-cli", "--help"], capture_output=True, text=True, timeout=10)
    if "--tls" not in cli.stdout + cli.stderr:
        return "redis-cli is built without TLS"
    probe = subprocess.run(
        ["redis-server", "--port", "0", "--tls-port", "1", "--save", ""],
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    text = probe.stdout + probe.stderr
    if "not available" in text or "Bad directive" in text:
        return "redis-server is built without TLS (BUILD_TLS=yes)"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = _tls_missing()
    if reason is not None:
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("tls-cluster")
    certs = make_certificates(folder / "certs")
    running = start_cluster(folder / "nodes", certs=certs)
    yield running
    stop_cluster(running)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls-cluster-models")
    load_examples().build_add_sub(out)  # type: ignore[attr-defined]
    return out


@pytest.fixture(scope="module")
def server(
    cluster: Cluster, repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("tls-cluster-logs") / "serve.log"
    srv = start_server(repo, cluster.url, log, "--job-workers", "0", url_in_env=True, timeout_s=120)
    yield srv
    assert stop_server(srv) == 0, srv.log()


def test_the_cluster_needs_tls_and_a_client_certificate(cluster: Cluster) -> None:
    assert cluster.url.startswith("rediss+cluster://127.0.0.1:")
    client = sync_client(cluster.url, socket_timeout=10)
    try:
        for key in ("{a}tls-check", "{b}tls-check", "{c}tls-check"):  # 15495, 3300, 7365
            client.set(key, key)
            assert client.get(key) == key.encode()
            client.delete(key)
    finally:
        client.close()
    assert len(cluster.primaries()) == 3
    plain = redis.Redis(port=cluster.ports[0], socket_timeout=5, socket_connect_timeout=5)
    with pytest.raises(redis.exceptions.ConnectionError):
        plain.ping()  # a TLS port: a plain client is cut off


def test_serves_add_sub_over_http_and_grpc_exactly(server: Server, cluster: Cluster) -> None:
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    for value, module, url in ((7, httpclient, server.http_url), (-3, grpcclient, server.grpc_url)):
        client = module.InferenceServerClient(url)
        try:
            b = np.full((1, 16), float(value), np.float32)
            inputs = [module.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert client.is_server_ready()
        finally:
            client.close()
    # the instance's queue lives on the primary of add_sub's slot: its connections are TLS
    assert cluster.slot_owner(model_slot("add_sub")) in cluster.ports
    assert cluster.certs is not None
    secrets = [str(cluster.certs.ca), str(cluster.certs.client_key), "ssl_keyfile"]
    lines = tree_cmdlines(server.process.pid)
    # supervisor, gateway, instance and its heartbeat at least
    assert len([c for c in lines.values() if "sluice" in c]) >= 4, lines
    assert not [c for c in lines.values() if any(s in c for s in secrets)], lines
    log = server.log()
    assert "serving on" in log
    assert not [s for s in secrets if s in log], log
    assert "Traceback" not in log, log


def _serve_once(url: str, repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "serve", "--model-repository", str(repo)],
        env=dict(os.environ, SLUICE_REDIS__URL=url, SLUICE_REDIS__KEY_PREFIX="sluice-tls-bad:"),
        capture_output=True, text=True, timeout=90, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ("no CA", "TLS with Redis failed"),
        ("unknown option", "bad --redis-url: unknown Redis Cluster URL option 'ssl_ca_file'"),
    ],
)
def test_a_bad_tls_url_is_one_error_line(
    cluster: Cluster, repo: Path, change: str, text: str
) -> None:
    assert cluster.certs is not None
    ca = f"ssl_ca_certs={cluster.certs.ca}&"
    assert ca in cluster.url
    replaced = "" if change == "no CA" else f"ssl_ca_file={cluster.certs.ca}&"
    done = _serve_once(cluster.url.replace(ca, replaced), repo)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log
    lines = [line for line in log.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("E"), log
    assert text in lines[0], lines[0]
    assert str(cluster.certs.client_key) not in log and str(cluster.certs.ca) not in log
    assert "ssl_keyfile=***" in lines[0], lines[0]
