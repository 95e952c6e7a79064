"""``repl`` as a user runs it: the installed command against a test daemon, in a shell too."""

from __future__ import annotations

import shlex
import subprocess
import sys
from itertools import count
from pathlib import Path
from typing import Any

from tests.helpers.client import Client
from tests.helpers.daemons import Daemon, _as_from_a_terminal

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


def assert_one_error_line(stderr: str) -> None:
    assert stderr.startswith("repl: "), stderr
    assert stderr.endswith("\n") and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr
