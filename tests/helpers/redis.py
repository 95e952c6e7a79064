"""redis-servers and Redis Clusters of a test's own, on loopback ports, and the ``--store``
URL of each.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from repl_daemon.backends.redis.keys import session_keys
from tests.helpers.common import eventually, free_port

# -- redis-server --------------------------------------------------------------


class RedisProc:
    """A redis-server child on a free loopback port, in its own directory.

    ``cluster=True`` makes it a Redis Cluster node (``--cluster-enabled yes``,
    its ``nodes.conf`` in its directory, its bus on a second free port, node
    timeout ``node_timeout_ms``): ``RedisClusterProcs`` joins several into a
    cluster. A restart keeps the ports (and a cluster node its ``nodes.conf``,
    so it comes back as the same node of the same cluster). ``replica_of``: the
    port of a (non-cluster) primary this one replicates (``--replicaof``).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        appendonly: bool = False,
        cluster: bool = False,
        node_timeout_ms: int = 1000,
        replica_of: int | None = None,
    ) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.cluster = cluster
        self.replica_of = replica_of
        self.node_timeout_ms = node_timeout_ms
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.bus_port = 0
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def servers(self) -> list[RedisProc]:
        """Every server of this store (itself), as for a cluster."""
        return [self]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is missing: apt-get install redis-server"
        for _ in range(20):
            port = self.port or free_port()
            args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
            args += ["--save", "", "--daemonize", "no", "--logfile", str(self.dir / "redis.log")]
            if self.appendonly:
                args += ["--appendonly", "yes", "--appendfsync", "always"]
            else:
                args += ["--appendonly", "no"]
            # a replica's first sync starts at once, not after the default 5 s
            args += ["--repl-diskless-sync-delay", "0"]
            if self.cluster:
                bus = self.bus_port or free_port()
                args += ["--cluster-enabled", "yes", "--cluster-port", str(bus)]
                args += ["--cluster-config-file", str(self.dir / "nodes.conf")]
                args += ["--cluster-node-timeout", str(self.node_timeout_ms)]
            if self.replica_of is not None:
                args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if _wait_for_port(port, self.proc):
                self.port = port
                if self.cluster:
                    self.bus_port = bus
                return
            self.proc.wait(5)
        raise RuntimeError(f"redis-server did not start: {(self.dir / 'redis.log').read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a test may have left it stopped
            self.proc.terminate()
            self.proc.wait(10)

    def wait_synced(self, timeout: float = 15) -> None:
        """Until this replica's link to its primary is up and its first sync done."""

        def synced() -> bool:
            with self.admin() as admin:
                info = admin.info("replication")
            return info.get("master_link_status") == "up" and not info.get(
                "master_sync_in_progress"
            )

        eventually(synced, timeout, f"the replica on {self.port} to sync")

    def commands(self, name: str) -> int:
        """How many times this server has run the command ``name`` (``INFO commandstats``)."""
        with self.admin() as admin:
            stats = admin.info("commandstats")
        return int(stats.get(f"cmdstat_{name.lower()}", {}).get("calls", 0))

    def admin(self) -> Any:
        """A plain redis-py client of this server, for the test's own looks (close it)."""
        import redis

        return redis.Redis(port=self.port, socket_timeout=5)

    def flush(self) -> None:
        """Empty the store: what one test wrote is not there for the next."""
        with self.admin() as admin:
            admin.flushall()

    def dbsize(self) -> int:
        """How many keys the store holds."""
        with self.admin() as admin:
            size: int = admin.dbsize()
            return size


class RedisClusterProcs:
    """A Redis Cluster on loopback: ``primaries`` nodes, each with ``replicas`` of its own.

    Every node is a ``RedisProc(cluster=True)`` in a directory of its own;
    ``redis-cli --cluster create`` joins them and spreads the 16,384 slots,
    and the cluster is ready once every node says ``cluster_state:ok``,
    knows every other node, and every replica's link to its primary is up
    and synced. ``url`` names two of the nodes, as a user would (the rest
    are found from them).
    """

    def __init__(
        self, workdir: Path, *, primaries: int = 3, replicas: int = 0, node_timeout_ms: int = 1000
    ) -> None:
        cli = shutil.which("redis-cli")
        assert cli, "redis-cli is missing: apt-get install redis-tools"
        self.replicas = replicas
        self.nodes: list[RedisProc] = []
        try:
            for n in range(primaries * (1 + replicas)):
                self.nodes.append(
                    RedisProc(workdir / f"node{n}", cluster=True, node_timeout_ms=node_timeout_ms)
                )
            nodes = [f"127.0.0.1:{node.port}" for node in self.nodes]
            options = ["--cluster-replicas", str(replicas), "--cluster-yes"]
            created = subprocess.run(
                [cli, "--cluster", "create", *nodes, *options],
                capture_output=True,
                timeout=60,
            )
            if created.returncode:
                raise RuntimeError(f"redis-cli --cluster create failed: {created.stdout!r}")
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        first, second = self.nodes[0].port, self.nodes[1].port
        return f"redis+cluster://127.0.0.1:{first},127.0.0.1:{second}"

    @property
    def servers(self) -> list[RedisProc]:
        """Every node that runs, primaries and replicas."""
        return [node for node in self.nodes if node.running]

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.servers]

    def node(self, port: int) -> RedisProc:
        return next(node for node in self.nodes if node.port == port)

    def topology(self) -> dict[int, dict[str, Any]]:
        """What the first running node says of each node, by port: ``id``, ``role``,
        ``primary`` (a replica's primary), ``slots`` (a primary's ranges) and ``flags``."""
        with self.node(self.ports[0]).admin() as admin:
            nodes: dict[str, dict[str, Any]] = admin.cluster("NODES")
        port_of = {row["node_id"]: int(addr.rsplit(":", 1)[1]) for addr, row in nodes.items()}
        return {
            port_of[row["node_id"]]: {
                "id": row["node_id"],
                "role": "primary" if "master" in row["flags"] else "replica",
                "primary": port_of.get(row["master_id"]),
                "slots": [(int(r[0]), int(r[-1])) for r in row["slots"]],
                "flags": row["flags"].split(","),
            }
            for row in nodes.values()
        }

    def primaries(self) -> list[int]:
        """The ports of the primaries that hold slots (and are not failed), in slot order."""
        rows = self.topology()
        held = [
            (min(r["slots"]), port)
            for port, r in rows.items()
            if r["role"] == "primary" and r["slots"] and "fail" not in r["flags"]
        ]
        return [port for _, port in sorted(held)]

    def primary_of_slot(self, slot: int) -> int:
        for port, row in self.topology().items():
            held = any(low <= slot <= high for low, high in row["slots"])
            if held and row["role"] == "primary" and "fail" not in row["flags"]:
                return port
        raise AssertionError(f"no primary holds slot {slot}")

    def move_slot(self, slot: int, to: int) -> None:
        """Reshard: ``slot`` and its keys moved to the primary on port ``to``, as
        ``redis-cli --cluster reshard`` does it (IMPORTING, MIGRATING, MIGRATE, NODE on every
        primary), until every running node says so."""
        rows = self.topology()
        source = self.primary_of_slot(slot)
        with self.node(to).admin() as target, self.node(source).admin() as admin:
            target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", rows[source]["id"])
            admin.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", rows[to]["id"])
            while keys := admin.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                admin.execute_command("MIGRATE", "127.0.0.1", to, "", 0, 5000, "KEYS", *keys)
        for port in self.primaries():
            with self.node(port).admin() as admin:
                admin.execute_command("CLUSTER SETSLOT", slot, "NODE", rows[to]["id"])

        def seen(admin: Any) -> bool:
            row = next(r for r in admin.cluster("NODES").values() if r["node_id"] == rows[to]["id"])
            return any(int(r[0]) <= slot <= int(r[-1]) for r in row["slots"])

        def moved() -> bool:
            for server in self.servers:
                with server.admin() as admin:
                    if not seen(admin):
                        return False
            return True

        eventually(moved, 15, f"every node to see slot {slot} on {to}")

    def by_primary(self, sessions: list[str]) -> dict[int, list[str]]:
        """The sessions by the port of the primary that holds their slot (their keys' tag)."""
        spread: dict[int, list[str]] = {}
        for session in sessions:
            slot = self.keyslot(session_keys(session)[0])
            spread.setdefault(self.primary_of_slot(slot), []).append(session)
        return spread

    def keyslot(self, key: str) -> int:
        with self.node(self.ports[0]).admin() as admin:
            slot: int = admin.execute_command("CLUSTER KEYSLOT", key)
            return slot

    def wait_ready(self, timeout: float = 30) -> None:
        """Until every running node says the cluster is ok and every replica is synced."""
        deadline = time.monotonic() + timeout
        expected = len(self.ports)
        while True:
            problems = [p for p in (self._problem(port, expected) for port in self.ports) if p]
            if not problems:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster is not ready: {problems}")
            time.sleep(0.05)

    def _problem(self, port: int, expected: int) -> str | None:
        import redis

        try:
            with self.node(port).admin() as admin:
                state = admin.cluster("INFO")["cluster_state"]
                if state != "ok":
                    return f"{port}: cluster_state {state}"
                rows = [
                    row
                    for row in admin.cluster("NODES").values()
                    if not {"fail", "fail?", "handshake"} & set(row["flags"].split(","))
                ]
                if len(rows) < expected:
                    return f"{port}: knows {len(rows)} of {expected} nodes"
                if expected == len(self.nodes) and (shape := self._shape(rows)):
                    return f"{port}: {shape}"
                replication = admin.info("replication")
                if replication["role"] == "slave" and (
                    replication.get("master_link_status") != "up"
                    or replication.get("master_sync_in_progress")
                ):
                    return f"{port}: replica not synced"
        except redis.RedisError as exc:
            return f"{port}: {exc}"
        return None

    def _shape(self, rows: list[dict[str, Any]]) -> str | None:
        """What is wrong with the shape one node sees, with every node running: each primary
        has ``replicas`` replicas of its own (a primary killed and started again is seen as a
        primary without slots or replicas for a while before it is seen as its successor's
        replica, and a test that looks for each primary's replica then finds none)."""
        for node_id in (row["node_id"] for row in rows if "master" in row["flags"]):
            have = sum(1 for row in rows if row["master_id"] == node_id)
            if have != self.replicas:
                return f"{node_id[:8]} has {have} of {self.replicas} replicas"
        return None

    def flush(self) -> None:
        """FLUSHALL on every primary (the replicas follow)."""
        for port in self.primaries():
            with self.node(port).admin() as admin:
                admin.flushall()

    def dbsize(self) -> int:
        """How many keys the cluster holds (over its primaries)."""
        total = 0
        for port in self.primaries():
            with self.node(port).admin() as admin:
                total += admin.dbsize()
        return total

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


#: the Redis stores the shared committer's tests run on (``redis_any`` in tests/conftest.py)
REDIS_KINDS = ("single", "cluster", "cluster+replicas")


def store_url(server: RedisProc | RedisClusterProcs) -> str:
    """The ``--store`` URL a test uses for ``server``: a cluster with replicas is used with
    ``?replicas=N``, so every change also goes through ``WAIT`` on its primary's connection."""
    if isinstance(server, RedisClusterProcs) and server.replicas:
        return f"{server.url}?replicas={server.replicas}"
    return server.url


def _wait_for_port(port: int, proc: subprocess.Popen[bytes]) -> bool:
    for _ in range(200):
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return True
        except OSError:
            pass
        time.sleep(0.02)
    return False
