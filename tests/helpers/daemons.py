"""Test daemons: in this process (``InProcDaemon``, ``running_daemon``) or a child process
(``DaemonProc``), the clocks a test moves, and daemons that share a store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from functools import partial
from pathlib import Path

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.store import Store
from repl_daemon.config import DEFAULTS, Config, Limits
from repl_daemon.daemon import serve_daemon
from repl_daemon.engine.clock import REAL, Clock, ms_to_utc
from tests.helpers.client import Client

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
    a whole second of the real time, so stamps look like today's. A settle's
    calls (``call_at``) are made, in the loop that asked for each, when the
    clock is moved to them; ``monotonic`` counts from the clock's making.
    """

    def __init__(self, ms: int | None = None) -> None:
        self.ms = time.time_ns() // 1_000_000_000 * 1000 if ms is None else ms
        self._origin = self.ms
        self._lock = threading.Lock()
        self._sleepers: dict[int, tuple[anyio.Event, asyncio.AbstractEventLoop]] = {}
        self._calls: list[_MovedCall] = []

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

    def monotonic(self) -> float:
        return (self.ms - self._origin) / 1000

    def call_at(self, when: float, callback: Callable[[], None]) -> _MovedCall:
        # in whole ms, as the clock moves (rounded: a float sum of seconds may be off by a hair)
        call = _MovedCall(self._origin + round(when * 1000), callback, asyncio.get_running_loop())
        with self._lock:
            if call.due_ms > self.ms:
                self._calls.append(call)
                return call
        call.loop.call_soon(call.run)  # due already
        return call

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` on, wake every timer task asleep on it and make the calls
        due by then, soonest first; the new time."""
        assert ms >= 0, "a moved clock only goes forward"
        with self._lock:
            self.ms += ms
            sleepers = list(self._sleepers.values())
            due = sorted((c for c in self._calls if c.due_ms <= self.ms), key=lambda c: c.due_ms)
            self._calls = [c for c in self._calls if c.due_ms > self.ms]
        for wake, loop in sleepers:
            with contextlib.suppress(RuntimeError):  # its loop closed meanwhile: nothing sleeps
                loop.call_soon_threadsafe(wake.set)
        for call in due:
            with contextlib.suppress(RuntimeError):
                call.loop.call_soon_threadsafe(call.run)
        return self.ms


class _MovedCall:
    """A ``MovedClock.call_at``: made when the clock is moved to ``due_ms``, unless cancelled."""

    def __init__(
        self, due_ms: int, callback: Callable[[], None], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.due_ms = due_ms
        self.callback = callback
        self.loop = loop
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def run(self) -> None:
        if not self.cancelled:
            self.callback()


class DaemonProc(Daemon):
    """A daemon child process; ``restart`` keeps its home (and so its state)."""

    #: the module it runs (``repl_cli.cli.daemon_entry``: as ``repl daemon`` runs it, with /mcp)
    module = "repl_daemon"

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
                self.module,
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
