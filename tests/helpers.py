"""What the test modules share: daemons to talk to, a raw client, and ``repl`` as a user runs it.

A test daemon listens on a loopback port the OS chose, in a fresh home, and
comes in two kinds with one face (``port``, ``home``, ``token``, ``addr``,
``client()``, ``env()``):

- ``InProcDaemon`` runs ``serve_daemon`` on an event loop thread of the test
  process (an anyio blocking portal): no subprocess, so it starts in a few
  milliseconds. Most tests over the wire use it. ``running_daemon`` is the
  same for async tests, in the test's own task group. Handed a
  ``MovedClock``, its timers are due by a clock that stands still until the
  test moves it, so a timer test moves the clock and checks exactly what
  fired, whatever the load on the machine.
- ``DaemonProc`` runs ``python -m repl_daemon`` as a child process, for the
  tests that need a real one: SIGTERM and its exit status, SIGKILL,
  restarts on the same home, its stderr and its log.

``Client`` speaks the wire protocol over a plain blocking socket, so tests
see exactly the bytes a user's program would. It is used from test threads
only, never from inside an in-process daemon's event loop. ``Repl`` runs
the installed ``repl`` against a test daemon, with REPL_ADDR and REPL_HOME
in its environment. ``RedisProc`` is a redis-server of the test's own,
``RedisClusterProcs`` a Redis Cluster of them on loopback, and
``SharedDaemons`` daemon processes that share one ``--store`` URL.

No tests and no fixtures live here: the fixtures are declared once, in
``tests/conftest.py`` or in the conftest of the one folder that uses them.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import importlib.util
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local import sqlite as sqlite_store
from repl_daemon.backends.local.store import Store
from repl_daemon.backends.redis.keys import session_keys
from repl_daemon.config import DEFAULTS, Config, Limits
from repl_daemon.daemon import serve_daemon
from repl_daemon.engine.clock import REAL, Clock, ms_to_utc
from session.delta import Delta
from session.session import Session, Snapshot

T = TypeVar("T")
R = TypeVar("R")

# -- the raw client ------------------------------------------------------------


class Client:
    """A blocking JSON-lines client, one request at a time unless told otherwise."""

    def __init__(self, port: int, token: str | None = None, timeout: float = 10) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        if token is not None:
            try:
                answer = self.call({"op": "auth", "token": token})
            except BaseException:
                self.sock.close()
                raise
            if not answer["ok"]:
                self.sock.close()
                raise AssertionError(answer)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(request).encode() + b"\n")

    def readline(self) -> bytes:
        """One line from the daemon, or b"" once it closed the connection."""
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                line, self.buffer = self.buffer, b""
                return line
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    def recv(self) -> dict[str, Any]:
        line = self.readline()
        if not line:
            raise ConnectionError("daemon closed the connection")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def pending(self, seconds: float) -> bool:
        """True when an answer arrives within ``seconds`` (without reading it)."""
        if self.buffer:
            return True
        ready, _, _ = select.select([self.sock], [], [], seconds)
        return bool(ready)

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return self.recv()

    def ok(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = self.call(request)
        assert answer["ok"], answer
        return answer

    def closed(self) -> bool:
        """True once the daemon has closed this connection (reads what is left)."""
        try:
            while self.readline():
                pass
        except (ConnectionResetError, TimeoutError):
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def answered(clients: list[Client], seconds: float = 0.2) -> list[Client]:
    """The clients that have an answer waiting after ``seconds`` (one wait for them all)."""
    time.sleep(seconds)
    return [c for c in clients if c.pending(0)]


def pipelined(c: Client, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every request, then read every answer (one commit takes many)."""
    c.send_raw(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    return [c.recv() for _ in requests]


# -- daemons -------------------------------------------------------------------


class Daemon:
    """What every test daemon offers: where it listens, its home and token, and clients."""

    home: Path
    port: int

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = 0
        self.clients: list[Client] = []

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    def client(self, *, auth: bool = True) -> Client:
        """A connected client; closed when the test's daemon stops."""
        client = Client(self.port, self.token if auth else None)
        self.clients.append(client)
        return client

    def close_clients(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()

    def env(self) -> dict[str, str]:
        """The environment for a ``repl`` subprocess pointed at this daemon."""
        env = {**os.environ, "REPL_ADDR": self.addr, "REPL_HOME": str(self.home)}
        env.pop("NO_COLOR", None)
        return env


#: what ``inproc`` can be parametrised with: the memory store, or the default SQLite one
DAEMON_STORES = ("memory", "durable")


def daemon_config(
    home: Path,
    *,
    durable: bool = False,
    settle: float = 0.0,
    limits: Limits | None = None,
    max_sessions: int = DEFAULTS["max_sessions"],
    store_url: str | None = None,
) -> Config:
    """A test daemon's Config: port 0, memory (or the default SQLite store, or the shared
    store at ``store_url``), settle 0.

    The idle timeout is 5 s unless ``limits`` says otherwise, as the
    ``daemon`` fixture's process has it.
    """
    return Config(
        home=home,
        host="127.0.0.1",
        port=0,
        memory=not durable and store_url is None,
        store_url=store_url,
        settle=settle,
        limits=limits or Limits(idle_timeout=5.0),
        max_sessions=max_sessions,
    )


class InProcDaemon(Daemon):
    """``serve_daemon`` on an event loop thread of this process (an anyio blocking portal).

    Started on construction; ``stop`` is the clean shutdown ``repl daemon``
    does on SIGTERM (the ``stop`` event is set: waiters are answered, the
    store is closed) and raises whatever the daemon raised, so a test whose
    daemon failed fails too. ``start`` again serves the same home (on a new
    port) and the same clock: the real one, or the ``MovedClock`` it was given.
    """

    def __init__(self, config: Config, clock: Clock = REAL) -> None:
        super().__init__(config.home)
        self.config = config
        self.clock = clock
        self._portal: BlockingPortal | None = None
        self._running = contextlib.ExitStack()
        self._stop: anyio.Event | None = None
        self._served: Future[None] | None = None
        self.start()

    def start(self) -> None:
        assert self._portal is None, "already running"
        with contextlib.ExitStack() as running:
            portal = running.enter_context(start_blocking_portal("asyncio"))
            stop: anyio.Event = portal.call(anyio.Event)
            self._served, self.port = portal.start_task(
                partial(serve_daemon, self.config, stop=stop, clock=self.clock)
            )
            self._portal, self._stop, self._running = portal, stop, running.pop_all()

    @property
    def started(self) -> bool:
        """Started and not yet stopped (it may have failed since: ``stop`` says)."""
        return self._portal is not None

    @property
    def running(self) -> bool:
        """Still serving: started, not stopped, and ``serve_daemon`` has not returned."""
        return self.started and self._served is not None and not self._served.done()

    def stop(self) -> None:
        """Shut down cleanly and wait for it; raises what the daemon raised."""
        portal, stop, served = self._portal, self._stop, self._served
        assert portal is not None and stop is not None and served is not None, "not running"
        self._portal = None
        try:
            portal.call(stop.set)
            served.result(timeout=15)
        except BaseException:
            served.cancel()  # one that will not stop is cancelled, so its thread can end
            raise
        finally:
            self._running.close()


def _as_from_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def inproc_daemon(config: Config, clock: Clock = REAL) -> Iterator[InProcDaemon]:
    """An in-process daemon for the ``with`` block; its clients closed, then stopped cleanly."""
    d = InProcDaemon(config, clock)
    try:
        yield d
    finally:
        d.close_clients()
        if d.started:
            d.stop()


@contextlib.asynccontextmanager
async def running_daemon(config: Config, *, store: Store | None = None) -> AsyncIterator[int]:
    """``serve_daemon`` in the calling task's own task group, for async tests; its port.

    Leaving the block sets the daemon's ``stop`` event, a clean shutdown.
    """
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        backend = None if store is None else LocalBackend(store)
        port: int = await tg.start(partial(serve_daemon, config, backend=backend, stop=stop))
        try:
            yield port
        finally:
            stop.set()


class MovedClock(Clock):
    """A daemon's clock that stands still until the test moves it (``advance``).

    Nothing fires by the wall clock: a timer is due when the test says so.
    A timer task asleep on it (``sleep_until``) is woken when it moves,
    whichever event loop it sleeps in, so several in-process daemons may
    share one, as daemons sharing a store share the wall clock. It starts on
    a whole second of the real time, so stamps look like today's.
    """

    def __init__(self, ms: int | None = None) -> None:
        self.ms = time.time_ns() // 1_000_000_000 * 1000 if ms is None else ms
        self._lock = threading.Lock()
        self._sleepers: dict[int, tuple[anyio.Event, asyncio.AbstractEventLoop]] = {}

    def now_ms(self) -> int:
        return self.ms

    def utc_now(self) -> str:
        return ms_to_utc(self.ms)

    def at(self, ms: int) -> str:
        """``ms`` since the epoch in RFC 3339, as ``--at`` and ``at`` take it."""
        return ms_to_utc(ms)

    async def sleep_until(self, due_ms: int | None, wake: anyio.Event) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if due_ms is not None and self.ms >= due_ms:
                return  # moved since the caller looked
            self._sleepers[id(wake)] = (wake, loop)
        try:
            await wake.wait()
        finally:
            with self._lock:
                self._sleepers.pop(id(wake), None)

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` on and wake every timer task asleep on it; the new time."""
        assert ms >= 0, "a moved clock only goes forward"
        with self._lock:
            self.ms += ms
            sleepers = list(self._sleepers.values())
        for wake, loop in sleepers:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: nothing sleeps
                loop.call_soon_threadsafe(wake.set)
        return self.ms


class DaemonProc(Daemon):
    """A daemon child process; ``restart`` keeps its home (and so its state)."""

    def __init__(self, home: Path, *extra: str) -> None:
        super().__init__(home)
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / "daemon-test.log"
        self.start()

    def start(self, port: int = 0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        log = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "repl_daemon",
                "--addr",
                f"127.0.0.1:{port}",
                "--home",
                str(self.home),
                *self.extra,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.proc.kill()
            raise RuntimeError(f"daemon did not start: {line!r}\n{self.log.read_text()}")
        self.port = int(line.rsplit(":", 1)[1])
        #: the HTTP port of a daemon started with ``--http`` (its second line says it)
        self.http_port: int | None = None
        if any(arg.startswith("--http") for arg in self.extra):
            second = self.proc.stdout.readline().decode()
            assert second.startswith("http on "), second
            self.http_port = int(second.rsplit(":", 1)[1])

    def stop(self) -> int:
        """SIGTERM, and the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(10)
        finally:
            if self.proc.stdout:
                self.proc.stdout.close()

    def kill(self) -> None:
        """SIGKILL: a crash."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()

    def restart(self, *, crash: bool = False) -> None:
        """Stop it (SIGKILL with ``crash``) and start it again on the same port, as a user's
        daemon comes back on its address."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start(self.port)


class SharedDaemons:
    """``count`` daemon processes sharing one store (``--store URL``, settle 0), each its own home.

    ``extra`` options go to every daemon. ``close`` stops the ones still running.
    """

    def __init__(self, tmp: Path, url: str, count: int, *extra: str) -> None:
        options = ("--store", url, "--settle-ms", "0", "--idle-timeout", "30", *extra)
        self.daemons: list[DaemonProc] = []
        try:
            for i in range(count):
                self.daemons.append(DaemonProc(tmp / f"d{i}", *options))
        except BaseException:
            self.close()
            raise

    def client(self, i: int) -> Client:
        return self.daemons[i].client()

    def close(self) -> None:
        for d in self.daemons:
            d.close_clients()
            if d.proc is not None and d.proc.poll() is None:
                d.stop()


class LoggedElsewhere(DaemonProc):
    """A durable daemon whose log lives outside its home (the home is the disk on trial)."""

    def __init__(self, home: Path, log: Path) -> None:
        self._outside = log
        super().__init__(home, "--settle-ms", "0", "--idle-timeout", "5")

    def start(self, port: int = 0) -> None:
        self.log = self._outside
        super().start(port)


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` for the test's duration."""
    path.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}); the file-size-limit test stands in")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], check=False)


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


def free_port() -> int:
    """A loopback port nobody listens on (at the moment of asking)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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


def require_redis(*, cluster: bool = False) -> None:
    """Skip where redis-server (or, for a cluster, redis-cli) is missing; fail in CI,
    which must install them (``.ci/run``)."""
    needed = ["redis-server", "redis-cli"] if cluster else ["redis-server"]
    missing = [name for name in needed if shutil.which(name) is None]
    if missing:
        what = f"{' and '.join(missing)} missing"
        if os.environ.get("CI"):
            pytest.fail(f"{what} in CI: .ci/run must install redis-server and redis-tools")
        pytest.skip(f"{what}: apt-get install redis-server redis-tools")


def require_chromium() -> str:
    """Debian's chromium, for the page's browser test: skipped where it is missing, failed in
    CI (``.ci/run`` installs it); its path."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium missing in CI: .ci/run must install Debian's chromium")
        pytest.skip("chromium missing: apt-get install chromium")
    return found


def require_tool(name: str) -> str:
    """A command a test runs (Debian's ``jq`` for the GUIDE's shell recipes): skipped where
    it is missing, failed in CI (``.ci/run`` installs it); its path."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing in CI: .ci/run must install Debian's {name}")
        pytest.skip(f"{name} missing: apt-get install {name}")
    return found


def require_build() -> None:
    """The ``build`` package and a setuptools that builds wheels (the ``test`` extra brings
    both), for building the wheel: skipped where they are missing, failed in CI."""
    missing = [name for name in ("build", "setuptools") if importlib.util.find_spec(name) is None]
    if missing:
        what = f"{' and '.join(missing)} missing"
        if os.environ.get("CI"):
            pytest.fail(f"{what} in CI: .ci/run must install the test extra")
        pytest.skip(f"{what}: pip install -e '.[test]'")


# -- stores --------------------------------------------------------------------

TS = "2026-01-02T03:04:05.678Z"


def counted(conn: Any) -> tuple[int, int]:
    """What the SQLite store's checks at open count: the log's rows and its live ones (what
    its compaction goes by), recounted on ``conn``."""
    return sqlite_store._read_pages(conn), sqlite_store._check_sessions(conn)


class Mirror:
    """A core session and the deltas it hands over, as the engine hands them."""

    def __init__(self, session_id: str, limit: int = 256) -> None:
        self.session = Session(session_id, limit)

    def record(self, text: str, key: str | None = None, handler: str = "on-message") -> int:
        return self.session.record(handler, text, TS, key).seq

    def delta(self) -> Delta:
        return self.session.take_delta()

    def snapshot(self) -> Snapshot:
        return self.session.snapshot()


# -- repl, as a user runs it -----------------------------------------------------

SCRIPT = Path(sys.executable).with_name("repl")
RUN_TIMEOUT = 30


_ids = count(1)


def repl_argv(*args: str) -> list[str]:
    """``repl`` and its arguments: the console script next to this interpreter, or -m."""
    if SCRIPT.exists():
        return [str(SCRIPT), *args]
    return [sys.executable, "-m", "repl_cli", *args]


def repl_shell() -> str:
    """The command to type in a shell for ``repl``."""
    return shlex.join(repl_argv())


class Repl:
    """``repl`` pointed at one daemon."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.env = daemon.env()
        self.env.pop("COLUMNS", None)
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run(
        self,
        *args: str,
        input: str | bytes | None = None,
        env: dict[str, str] | None = None,
        timeout: float = RUN_TIMEOUT,
    ) -> subprocess.CompletedProcess[str]:
        data = input.encode() if isinstance(input, str) else input
        done = subprocess.run(
            repl_argv(*args),
            input=data if data is not None else b"",
            capture_output=True,
            env=env or self.env,
            timeout=timeout,
        )
        return subprocess.CompletedProcess(
            done.args,
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def ok(self, *args: str, input: str | bytes | None = None) -> str:
        """Run, insist on exit 0 and a quiet stderr, and return stdout."""
        done = self.run(*args, input=input)
        assert done.returncode == 0, (args, done.returncode, done.stderr)
        assert done.stderr == "", (args, done.stderr)
        return done.stdout

    def fails(self, status: int, *args: str, input: str | None = None) -> str:
        """Run, insist on ``status`` and one line on stderr without a traceback; return it."""
        done = self.run(*args, input=input)
        assert done.returncode == status, (args, done.returncode, done.stdout, done.stderr)
        assert_one_error_line(done.stderr)
        return done.stderr

    def popen(self, *args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
        """The command as a terminal starts it: Ctrl-C (SIGINT) interrupts it even when the
        suite itself runs in the background of a shell, which starts it with SIGINT ignored
        (and an ignored signal stays ignored in every child)."""
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("preexec_fn", _as_from_a_terminal)
        return subprocess.Popen(repl_argv(*args), env=self.env, **kwargs)

    def shell(self, script: str) -> subprocess.CompletedProcess[str]:
        """Run ``script`` in bash, with ``$REPL`` the command for repl."""
        env = {**self.env, "REPL": repl_shell()}
        done = subprocess.run(
            ["bash", "-c", f"set -o pipefail; {script}"],
            capture_output=True,
            env=env,
            timeout=RUN_TIMEOUT,
        )
        return subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
        )

    # -- looking at the daemon directly ------------------------------------

    def ask(self, *requests: dict[str, Any]) -> list[dict[str, Any]]:
        """Answers to ``requests`` over a connection of their own, each insisted ok."""
        client = Client(self.daemon.port, self.daemon.token)
        try:
            return [client.ok(request) for request in requests]
        finally:
            client.close()

    def session(self, prefix: str = "s", *texts: str) -> str:
        """A new session of its own, with ``texts`` sent to it; its id."""
        session = f"{prefix}{next(_ids)}"
        self.ask({"op": "start", "session": session})
        self.send(session, *texts)
        return session

    def cursor(self, session: str, name: str) -> int | None:
        """Where cursor ``name`` is, None when the session has no such cursor."""
        (with_cursors,) = self.ask({"op": "cursors", "session": session})
        for cursor in with_cursors["cursors"]:
            if cursor["name"] == name:
                seq: int = cursor["seq"]
                return seq
        return None

    def waiters(self, session: str) -> int:
        (listed,) = self.ask({"op": "sessions"})
        for row in listed["sessions"]:
            if row["id"] == session:
                count: int = row["waiters"]
                return count
        raise AssertionError(f"no session {session}")

    def send(self, session: str, *texts: str, handler: str = "on-message") -> None:
        self.ask(
            *({"op": "send", "session": session, "text": t, "handler": handler} for t in texts)
        )


def examples(suite: int, variable: str) -> int:
    """How many examples a property test runs: ``suite`` in the suite (a few seconds' worth,
    far from the 60 s timeout under coverage on a loaded 2-core machine), or ``$variable``
    for a longer search."""
    return int(os.environ.get(variable, suite))


def assert_one_error_line(stderr: str) -> None:
    assert stderr.startswith("repl: "), stderr
    assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr


def eventually(check: Callable[[], bool], timeout: float = 15, what: str = "condition") -> None:
    """Poll ``check`` until it holds; a bounded wait, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def each_at_once(run: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``run`` of each item, as many at once as the machine has cores, in the items' order:
    for independent ``repl`` runs, each mostly an interpreter starting. What one raised is
    raised (the first in the items' order)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(run, items))


def read_line(proc: subprocess.Popen[bytes], timeout: float = 15) -> bytes:
    """One line from a child's stdout, read straight from the pipe (no read-ahead).

    Reading byte by byte takes exactly one line out of the pipe, so the
    child sees precisely what we have taken.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    got = b""
    deadline = time.monotonic() + timeout
    while not got.endswith(b"\n"):
        try:
            byte = os.read(fd, 1)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError(f"no line from {proc.args!r} (got {got!r})") from None
            time.sleep(0.005)
            continue
        if not byte:
            raise AssertionError(f"{proc.args!r} closed stdout after {got!r}")
        got += byte
    return got


def unread(proc: subprocess.Popen[bytes]) -> int:
    """Bytes the child wrote to its stdout pipe that we have not read yet."""
    assert proc.stdout is not None
    count = array.array("i", [0])
    fcntl.ioctl(proc.stdout.fileno(), termios.FIONREAD, count, True)
    return count[0]


class WatchedClock(MovedClock):
    """A ``MovedClock`` that keeps the due time of every sleep asked of it, in order
    (``slept``; None: no timer due), so a test sees what a timer task sleeps until: its
    soonest timer, and never a time of its own sooner (polling)."""

    def __init__(self, ms: int | None = None) -> None:
        super().__init__(ms)
        self.slept: list[int | None] = []

    async def sleep_until(self, due_ms: int | None, wake: anyio.Event) -> None:
        self.slept.append(due_ms)
        await super().sleep_until(due_ms, wake)
