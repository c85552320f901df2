"""A real Redis Cluster for tests: 3 primaries and 3 replicas on free loopback ports.

Started with ``redis-server --cluster-enabled yes`` per node and joined by
``redis-cli --cluster create ... --cluster-replicas 1``; failovers and slot migrations
are driven with the cluster's own commands (``CLUSTER FAILOVER``, ``CLUSTER SETSLOT``,
``MIGRATE``). Every wait has a deadline. With certificates (``secure_redis``) the nodes
speak TLS only, to clients and to each other (``--tls-cluster``, ``--tls-replication``).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import redis
from redis.crc import key_slot
from secure_redis import Certificates

from sluice.broker.redis_server import free_port

#: how long a primary may be unreachable before its replica is promoted, in ms.
NODE_TIMEOUT_MS = 2000


@dataclass
class Cluster:
    """A running test cluster."""

    folder: Path
    ports: list[int]
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: TLS only (the ports are TLS ports), clients showing the client certificate
    certs: Certificates | None = None

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL naming every node (``rediss+cluster://`` with
        the CA and the client certificate and key for a TLS cluster)."""
        nodes = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        if self.certs is None:
            return f"redis+cluster://{nodes}"
        return f"rediss+cluster://{nodes}?{urlencode(self.tls_options(), safe='/')}"

    def tls_options(self) -> dict[str, str]:
        """redis-py's TLS options for this cluster's nodes (none without TLS)."""
        if self.certs is None:
            return {}
        return {
            "ssl_ca_certs": str(self.certs.ca),
            "ssl_certfile": str(self.certs.client_cert),
            "ssl_keyfile": str(self.certs.client_key),
        }

    def node(self, port: int) -> redis.Redis:
        """A plain (not cluster) client of one node."""
        tls = self.tls_options()
        return redis.Redis(
            port=port, socket_timeout=10, socket_connect_timeout=5, ssl=bool(tls), **tls
        )

    def node_argv(self, port: int) -> list[str]:
        """The ``redis-server`` command line of the node on ``port``."""
        argv = [
            "redis-server", "--bind", "127.0.0.1", "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--appendonly", "no",
            "--save", "", "--dir", str(self.folder / str(port)), "--protected-mode", "no",
        ]  # fmt: skip
        if self.certs is None:
            return [*argv, "--port", str(port)]
        return [
            *argv, "--port", "0", "--tls-port", str(port), "--tls-cluster", "yes",
            "--tls-replication", "yes", "--tls-cert-file", str(self.certs.server_cert),
            "--tls-key-file", str(self.certs.server_key),
            "--tls-ca-cert-file", str(self.certs.ca),
        ]  # fmt: skip

    def cli_tls(self) -> list[str]:
        """``redis-cli``'s TLS arguments for this cluster (none without TLS)."""
        if self.certs is None:
            return []
        certs = self.certs
        return ["--tls", "--cacert", str(certs.ca), "--cert", str(certs.client_cert),
                "--key", str(certs.client_key)]  # fmt: skip

    def slot_owner(self, slot: int) -> int:
        """The port of the primary serving ``slot`` (read from a live node)."""
        for port in self.ports:
            if port not in self.processes or self.processes[port].poll() is not None:
                continue
            try:
                for start, end, primary, *_ in self.node(port).execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        return int(primary[1])
            except redis.exceptions.RedisError:
                continue
        raise RuntimeError(f"no node knows slot {slot}")

    def replica_of(self, primary: int) -> int:
        """The port of a replica of ``primary``."""
        node_id = self.node(primary).execute_command("CLUSTER", "MYID").decode()
        for line in self.node(primary).execute_command("CLUSTER", "NODES").decode().splitlines():
            parts = line.split()
            if parts[3] == node_id and "slave" in parts[2]:
                return int(parts[1].split(":")[1].split("@")[0])
        raise RuntimeError(f"primary {primary} has no replica")

    def node_id(self, port: int) -> str:
        return self.node(port).execute_command("CLUSTER", "MYID").decode()

    def serving(self, command: str) -> list[int]:
        """Ports of the primaries with a client whose last command was ``command`` (e.g.
        ``blmpop``: the node of a gateway's reply list)."""
        found = []
        for port in self.primaries():
            clients = self.node(port).execute_command("CLIENT", "LIST").decode()
            if f" cmd={command} " in clients:
                found.append(port)
        return found

    def primaries(self) -> list[int]:
        """Ports of the primaries now."""
        found = []
        for port in self.ports:
            if self.processes[port].poll() is None:
                role = self.node(port).execute_command("ROLE")[0]
                if role == b"master":
                    found.append(port)
        return found


def model_slot(model: str) -> int:
    """The hash slot of every key of ``model`` (its ``{model}`` hash tag)."""
    return key_slot(f"{{{model}}}".encode())


def start_cluster(
    folder: Path, timeout_s: float = 60.0, certs: Certificates | None = None
) -> Cluster:
    """Start 6 nodes and join them as 3 primaries with a replica each; wait (bounded)
    until every node reports ``cluster_state:ok``. With ``certs`` (server certificate
    for 127.0.0.1, signed by their CA) the nodes speak TLS only and require client
    certificates.

    Raises:
        RuntimeError: ``redis-server``/``redis-cli`` missing, or the cluster not ok in time.
    """
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        raise RuntimeError("redis-server and redis-cli are needed for a Redis Cluster")
    ports: list[int] = []
    while len(ports) < 6:
        port = free_port()
        if port not in ports and port + 10000 < 65536:
            ports.append(port)
    cluster = Cluster(folder, ports, certs=certs)
    for port in ports:
        (folder / str(port)).mkdir(parents=True)
        cluster.processes[port] = subprocess.Popen(
            cluster.node_argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    deadline = time.monotonic() + timeout_s
    for port in ports:
        while True:
            try:
                cluster.node(port).ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    stop_cluster(cluster)
                    raise RuntimeError(f"cluster node {port} did not start") from None
                time.sleep(0.05)
    subprocess.run(
        ["redis-cli", *cluster.cli_tls(), "--cluster", "create",
         *(f"127.0.0.1:{p}" for p in ports),
         "--cluster-replicas", "1", "--cluster-yes"],
        check=True, capture_output=True, timeout=timeout_s,
    )  # fmt: skip
    wait_cluster_ok(cluster, deadline - time.monotonic())
    return cluster


def _settled(node: redis.Redis) -> bool:
    """The node says ``cluster_state:ok`` and sees 3 primaries and 3 replicas."""
    if b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
        return False
    flags = [line.split()[2] for line in node.execute_command("CLUSTER", "NODES").splitlines()]
    return sum(b"slave" in f for f in flags) == 3 and not any(b"fail" in f for f in flags)


def wait_cluster_ok(cluster: Cluster, timeout_s: float) -> None:
    """Wait until every live node says ``cluster_state:ok`` and sees 3 primaries and 3
    replicas (bounded).

    Raises:
        RuntimeError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            live = [p for p in cluster.ports if cluster.processes[p].poll() is None]
            if all(_settled(cluster.node(p)) for p in live):
                return
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.1)
    raise RuntimeError("Redis Cluster not ok in time")


def kill_primary(cluster: Cluster, primary: int, timeout_s: float = 30.0) -> int:
    """SIGKILL ``primary`` and wait (bounded) until a replica of it serves its slots;
    returns that replica's port. The node stays down (:func:`restart_node`)."""
    replica = cluster.replica_of(primary)
    cluster.processes[primary].kill()
    cluster.processes[primary].wait(10)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cluster.node(replica).execute_command("ROLE")[0] == b"master":
                return replica
        except redis.exceptions.RedisError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"replica {replica} of killed {primary} not promoted in time")


def restart_node(cluster: Cluster, port: int, timeout_s: float = 30.0) -> None:
    """Start a killed node again with its node file (it rejoins as a replica) and wait
    (bounded) until the cluster has 3 primaries and 3 replicas again."""
    cluster.processes[port] = subprocess.Popen(
        cluster.node_argv(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_cluster_ok(cluster, timeout_s)


def stop_cluster(cluster: Cluster) -> None:
    """Kill every node (bounded wait) and remove the folder's node files."""
    for process in cluster.processes.values():
        if process.poll() is None:
            process.kill()
    for process in cluster.processes.values():
        process.wait(10)
    shutil.rmtree(cluster.folder, ignore_errors=True)


def failover(cluster: Cluster, primary: int, timeout_s: float = 30.0) -> int:
    """Promote a replica of ``primary`` with ``CLUSTER FAILOVER`` (the replica catches
    up with its primary first, so no acknowledged write is lost); returns its port once
    it is a primary and the cluster is ok.

    Raises:
        RuntimeError: not promoted within ``timeout_s``.
    """
    replica = cluster.replica_of(primary)
    cluster.node(replica).execute_command("CLUSTER", "FAILOVER")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cluster.node(replica).execute_command("ROLE")[0] == b"master":
            wait_cluster_ok(cluster, deadline - time.monotonic())
            return replica
        time.sleep(0.05)
    raise RuntimeError(f"replica {replica} of {primary} not promoted in time")


def migrate_slot(cluster: Cluster, slot: int, target: int, timeout_s: float = 30.0) -> None:
    """Move ``slot`` to the primary ``target`` as ``redis-cli --cluster reshard`` does:
    ``SETSLOT IMPORTING``/``MIGRATING``, ``MIGRATE`` of its keys in batches, then
    ``SETSLOT NODE`` on both and on every other primary.

    Raises:
        RuntimeError: the source kept keys after ``timeout_s``.
    """
    source = cluster.slot_owner(slot)
    if source == target:
        return
    src, dst = cluster.node(source), cluster.node(target)
    src_id, dst_id = cluster.node_id(source), cluster.node_id(target)
    dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
    deadline = time.monotonic() + timeout_s
    while True:
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        if not keys:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"slot {slot} still has keys on {source}")
        src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 10000, "KEYS", *keys)
    for port in (target, source, *cluster.primaries()):
        cluster.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
