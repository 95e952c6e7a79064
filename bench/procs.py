"""The processes a benchmark run starts and measures: the daemon, redis-server, the floor.

Each is a child of the benchmark, on a loopback port, with its state in a
temporary directory, and is stopped when its figure is done. What the
benchmark reads about a child (CPU time, resident memory) comes from
``/proc/PID``, so it measures the server alone, not the client driving it.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

CLK_TCK = os.sysconf("SC_CLK_TCK")
HOST = "127.0.0.1"
CLUSTER_BUS_OFFSET = 10_000  # a cluster node also listens on its port + 10000
FLOOR_SCRIPT = Path(__file__).with_name("floor.py")
TIMER_FLOOR_SCRIPT = Path(__file__).with_name("timer_floor.py")
WAKE_FLOOR_SCRIPT = Path(__file__).with_name("wake_floor.py")


class BenchError(Exception):
    """A figure could not be measured; the message says why."""


def raise_nofile(wanted: int) -> int:
    """Raise this process's soft RLIMIT_NOFILE towards ``wanted``; returns the new soft limit.

    Children inherit the soft limit, so raising it here once before any
    server starts covers the daemon and redis-server too.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        soft = ceiling
    return soft


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far (fields 14 and 15 of /proc/PID/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_ns(pid: int) -> int:
    """CPU time of ``pid`` so far, in ns: the scheduler's own count of each of its threads'
    time on a CPU (the first field of /proc/PID/task/TID/schedstat), where ``cpu_seconds``
    counts in clock ticks (10 ms); from ``cpu_seconds`` where the kernel keeps no schedstat.
    """
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return round(cpu_seconds(pid) * 1e9)
    return total


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise BenchError(f"no VmRSS for pid {pid}")


def free_port() -> int:
    """A loopback port that was free a moment ago (for servers that cannot take port 0)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Child:
    """A server child process with a log file; a context manager that stops it."""

    name = "child"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._announced = b""  # what the child wrote to stdout and no line has taken yet

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _spawn(self, argv: list[str], *, announce: bool) -> None:
        self._announced = b""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE if announce else log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def _read_line(self, deadline_s: float) -> str:
        """The child's next stdout line, or "" when none came within ``deadline_s``.

        Read from the pipe's descriptor, not its buffered file: a child that
        announces two lines may write both at once, and a buffered readline
        would take the second out of select's sight.
        """
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        end = time.monotonic() + deadline_s
        while b"\n" not in self._announced and (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([fd], [], [], left)
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                break
            self._announced += chunk
        line, newline, rest = self._announced.partition(b"\n")
        if not newline:
            return ""
        self._announced = rest
        return line.decode(errors="replace")

    def _read_announced_port(self, deadline_s: float, prefix: str = "listening on ") -> int:
        """The port of the child's next stdout line, ``listening on HOST:PORT`` (or ``prefix``)."""
        line = self._read_line(deadline_s)
        if not line.startswith(prefix):
            self.kill()
            raise BenchError(
                f"{self.name} did not start within {deadline_s:g} s (said {line!r}):\n"
                + _tail(self.log)
            )
        return int(line.rsplit(":", 1)[1])

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._close_pipes()

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"{self.name} exited:\n" + _tail(self.log))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Daemon(Child):
    """``python -m repl_daemon`` on port 0 with a fresh (or kept) home.

    ``store`` (a ``redis://`` URL) shares sessions with the other daemons on
    that Redis instead of keeping them in the home's SQLite file. ``http``
    serves HTTP too (``--http 127.0.0.1:0``, which needs the ``http``
    extra), on the port the daemon announces second: ``http_port``. ``quiet_ms``
    is ``--quiet-ms`` (the daemon's default when None). ``loop`` is
    ``--loop`` (``asyncio`` or ``uvloop``; the daemon's own ``auto`` when None).
    """

    name = "daemon"

    def __init__(
        self,
        workdir: Path,
        *,
        memory: bool,
        settle_ms: int = 0,
        quiet_ms: int | None = None,
        max_connections: int | None = None,
        store: str | None = None,
        http: bool = False,
        loop: str | None = None,
    ) -> None:
        super().__init__(workdir)
        self.home = workdir / "home"
        self.memory = memory
        self.settle_ms = settle_ms
        self.quiet_ms = quiet_ms
        self.max_connections = max_connections
        self.store = store
        self.http = http
        self.http_port = 0
        self.loop = loop

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "repl_daemon", "--addr", f"{HOST}:0"]
        argv += ["--home", str(self.home), "--settle-ms", str(self.settle_ms)]
        if self.quiet_ms is not None:
            argv += ["--quiet-ms", str(self.quiet_ms)]
        if self.memory:
            argv.append("--memory")
        if self.store is not None:
            argv += ["--store", self.store]
        if self.max_connections is not None:
            argv += ["--max-connections", str(self.max_connections)]
        if self.http:
            argv += ["--http", f"{HOST}:0"]
        if self.loop is not None:
            argv += ["--loop", self.loop]
        return argv

    def start(self, deadline_s: float = 300.0) -> Self:
        self._spawn(self.argv(), announce=True)
        self.port = self._read_announced_port(deadline_s)
        if self.http:  # the second line: ``http on HOST:PORT``
            self.http_port = self._read_announced_port(deadline_s, "http on ")
        return self

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()

    def env(self) -> dict[str, str]:
        """The environment for a ``repl`` command aimed at this daemon."""
        return {**os.environ, "REPL_ADDR": f"{HOST}:{self.port}", "REPL_HOME": str(self.home)}


class Floor(Child):
    """bench/floor.py: the bare asyncio JSON-lines server."""

    name = "floor"

    def start(self) -> Self:
        self._spawn([sys.executable, str(FLOOR_SCRIPT), "--port", "0"], announce=True)
        self.port = self._read_announced_port(30.0)
        return self


class LoopFloor(Child):
    """A floor script of ``script`` on the daemon's kind of loop (uvloop when installed;
    ``loop`` "asyncio" forces the standard one), announcing its port."""

    script: Path

    def __init__(self, workdir: Path, *, loop: str = "auto") -> None:
        super().__init__(workdir)
        self.loop = loop

    def start(self) -> Self:
        argv = [sys.executable, str(self.script), "--port", "0", "--loop", self.loop]
        self._spawn(argv, announce=True)
        self.port = self._read_announced_port(30.0)
        return self


class TimerFloor(LoopFloor):
    """bench/timer_floor.py: a bare event loop firing timers."""

    name = "timer-floor"
    script = TIMER_FLOOR_SCRIPT


class WakeFloor(LoopFloor):
    """bench/wake_floor.py: a bare event loop doing a blocked wait's work."""

    name = "wake-floor"
    script = WAKE_FLOOR_SCRIPT


def free_cluster_port() -> int:
    """A free loopback port whose cluster bus port (the port + 10000) is free too."""
    for _attempt in range(100):
        port = free_port()
        if port + CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port + CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port
    raise BenchError("no free pair of loopback ports for a cluster node")


class RedisServer(Child):
    """redis-server on a free loopback port, persistence off or AOF with fsync always.

    With ``cluster`` it is a Redis Cluster node (``--cluster-enabled yes``),
    not yet part of a cluster: ``RedisClusterNodes`` joins three of them.
    """

    name = "redis"
    MAX_CLIENTS = 10_200

    def __init__(self, exe: str, workdir: Path, *, durable: bool, cluster: bool = False) -> None:
        super().__init__(workdir)
        self.exe = exe
        self.durable = durable
        self.cluster = cluster
        self.data = workdir / "data"
        self.data.mkdir(exist_ok=True)

    def argv(self) -> list[str]:
        argv = [self.exe, "--port", str(self.port), "--bind", HOST, "--save", ""]
        argv += ["--dir", str(self.data), "--maxclients", str(self.MAX_CLIENTS)]
        if self.durable:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        if self.cluster:
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            argv += ["--cluster-node-timeout", "5000"]
        return argv

    @property
    def url(self) -> str:
        """The ``redis://`` URL of database 0, for a daemon's ``--store``."""
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> Self:
        """Start on a free port and wait for PONG (a few tries: the port may be taken)."""
        for _attempt in range(5):
            self.spawn(free_cluster_port() if self.cluster else free_port())
            if self._wait_ready(10.0):
                return self
            self.kill()
        raise BenchError("redis-server did not start:\n" + _tail(self.log))

    def spawn(self, port: int) -> None:
        """Start the process and return at once (a restart times its own readiness)."""
        self.port = port
        self._spawn(self.argv(), announce=False)

    def _wait_ready(self, deadline_s: float) -> bool:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((HOST, self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return True
            except OSError:
                pass
            time.sleep(0.01)
        return False

    def version(self) -> str:
        out = subprocess.run([self.exe, "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()


class RedisClusterNodes:
    """A Redis Cluster of ``primaries`` nodes with no replicas, on loopback; stops them all.

    Each node is a ``RedisServer`` with ``--cluster-enabled yes`` in a
    directory of its own; ``redis-cli --cluster create`` splits the 16,384
    slots between them, and ``start`` returns once every node reports
    ``cluster_state:ok`` and knows all the others.
    """

    def __init__(self, exe: str, cli: str, workdir: Path, primaries: int = 3) -> None:
        self.cli = cli
        self.nodes = [
            RedisServer(exe, workdir / f"node-{i}", durable=False, cluster=True)
            for i in range(primaries)
        ]

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """The daemons' ``--store``: ``redis+cluster://`` with every node."""
        return "redis+cluster://" + ",".join(f"{HOST}:{port}" for port in self.ports)

    def start(self, deadline_s: float = 60.0) -> Self:
        for node in self.nodes:
            node.start()
        argv = [self.cli, "--cluster", "create", *(f"{HOST}:{p}" for p in self.ports)]
        argv += ["--cluster-replicas", "0", "--cluster-yes"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=deadline_s)
        except subprocess.TimeoutExpired:
            raise BenchError(f"redis-cli --cluster create took over {deadline_s:g} s") from None
        if done.returncode != 0:
            raise BenchError(f"redis-cli --cluster create failed: {done.stdout[-500:]}")
        end = time.monotonic() + deadline_s
        while not all(self._ok(port) for port in self.ports):
            if time.monotonic() > end:
                raise BenchError(f"the cluster was not ok after {deadline_s:g} s")
            time.sleep(0.1)
        return self

    def _ok(self, port: int) -> bool:
        argv = [self.cli, "-h", HOST, "-p", str(port), "cluster", "info"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
        return "cluster_state:ok" in out and f"cluster_known_nodes:{len(self.nodes)}" in out

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
