"""Running the installed ``repl`` as a user does, for the CLI tests (no tests here).

``Repl`` runs the console script found next to this interpreter (or
``python -m repl_cli`` when it is missing) against a test daemon, with
REPL_ADDR and REPL_HOME in its environment. Each CLI test module makes a
``repl`` fixture from it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Client, DaemonProc

SCRIPT = Path(sys.executable).with_name("repl")
RUN_TIMEOUT = 30


_ids = count(1)


def module_daemon(factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """A daemon for a whole test module (start-up is most of a CLI test's cost).

    Tests that share it each work in sessions of their own (``Repl.session``).
    """
    d = DaemonProc(factory.mktemp("cli") / "home", "--memory", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


def repl_argv(*args: str) -> list[str]:
    if SCRIPT.exists():
        return [str(SCRIPT), *args]
    return [sys.executable, "-m", "repl_cli", *args]


def repl_shell() -> str:
    """The command to type in a shell for ``repl``."""
    return shlex.join(repl_argv())


class Repl:
    """``repl`` pointed at one daemon."""

    def __init__(self, daemon: DaemonProc) -> None:
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
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
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
