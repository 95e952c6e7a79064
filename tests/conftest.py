"""Shared fixtures: a real daemon on a loopback port the OS chose, and a raw client.

``daemon`` / ``durable_daemon`` start ``python -m repl_daemon`` as a child
process (port 0, a fresh home), read the port from its first stdout line,
and stop it when the test ends. ``Client`` speaks the wire protocol over a
plain blocking socket, so tests see exactly the bytes a user's program would.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


class DaemonProc:
    """A daemon child process; ``restart`` keeps its home (and so its state)."""

    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.log = home / "daemon-test.log"
        self.clients: list[Client] = []
        self.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.home / "token").read_text().strip()

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
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

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


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    """A memory daemon with settle 0 and a short idle timeout."""
    d = DaemonProc(tmp_path / "home", "--memory", "--settle-ms", "0", "--idle-timeout", "5")
    yield d
    d.close_clients()
    d.stop()


@pytest.fixture
def durable_daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    """A daemon on the default (SQLite) store, settle 0."""
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0", "--idle-timeout", "5")
    yield d
    d.close_clients()
    d.stop()


class RedisProc:
    """A redis-server child on a free loopback port, in its own directory."""

    def __init__(self, workdir: Path, *, appendonly: bool = False) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.appendonly = appendonly
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is missing: apt-get install redis-server"
        for _ in range(20):
            port = self.port or _free_port()
            args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
            args += ["--save", "", "--daemonize", "no", "--logfile", str(self.dir / "redis.log")]
            if self.appendonly:
                args += ["--appendonly", "yes", "--appendfsync", "always"]
            else:
                args += ["--appendonly", "no"]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if _wait_for_port(port, self.proc):
                self.port = port
                return
            self.proc.wait(5)
        raise RuntimeError(f"redis-server did not start: {(self.dir / 'redis.log').read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def _free_port() -> int:
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


def require_redis() -> None:
    """Skip where redis-server is missing, but fail in CI, which must install it."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing in CI: .ci/run must install it")
        pytest.skip("redis-server is missing: apt-get install redis-server")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProc]:
    require_redis()
    server = RedisProc(tmp_path / "redis")
    yield server
    server.stop()
