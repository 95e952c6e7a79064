"""``repl daemon``: in the foreground, detached, and refusing a second one at an address."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import InProcDaemon, assert_one_error_line, eventually, repl_argv


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(repl_argv(*args), capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "REPL_HOME": str(tmp_path / "home")}
    env.pop("REPL_ADDR", None)
    return env


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_foreground_daemon_serves_until_ctrl_c(env: dict[str, str]) -> None:
    argv = repl_argv("--addr", "127.0.0.1:0", "daemon", "--memory", "--settle-ms", "0")
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("listening on 127.0.0.1:")
        addr = line.split()[-1]
        pinged = run("--addr", addr, "ping", env=env)
        assert pinged.returncode == 0, pinged.stderr
        assert run("--addr", addr, "start", "a", env=env).stdout == "a\n"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    assert (Path(env["REPL_HOME"]) / "token").stat().st_mode & 0o777 == 0o600


def test_a_second_daemon_at_the_same_address_is_refused(inproc: InProcDaemon) -> None:
    for flags in ([], ["--detach"]):
        done = run("daemon", "--memory", *flags, env=inproc.env())
        assert done.returncode == 1
        assert_one_error_line(done.stderr)
        assert f"already running at {inproc.addr}" in done.stderr


@pytest.fixture
def detached(env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """A daemon started with --detach; its address and pid. Stopped at the end."""
    done = run("--addr", "127.0.0.1:0", "daemon", "--memory", "--detach", env=env)
    assert done.returncode == 0, done.stderr
    log = Path(env["REPL_HOME"]) / "daemon.log"
    found = re.fullmatch(
        rf"repl daemon listening on (\S+) \(pid (\d+)\); log: {re.escape(str(log))}\n",
        done.stdout,
    )
    assert found, done.stdout
    addr, pid = found.group(1), int(found.group(2))
    yield addr, pid
    if not gone(pid):
        os.kill(pid, signal.SIGTERM)
        eventually(lambda: gone(pid), what="the detached daemon to stop")


def test_detach_returns_once_the_daemon_accepts_connections(
    env: dict[str, str], detached: tuple[str, int]
) -> None:
    addr, pid = detached
    assert run("--addr", addr, "ping", env=env).returncode == 0
    assert run("--addr", addr, "start", "a", env=env).stdout == "a\n"
    assert run("--addr", addr, "send", "a", "hi", env=env).stdout == "1\n"
    assert "listening on" in (Path(env["REPL_HOME"]) / "daemon.log").read_text()
    again = run("--addr", addr, "daemon", "--memory", "--detach", env=env)
    assert again.returncode == 1
    assert "already running" in again.stderr
    os.kill(pid, signal.SIGTERM)
    eventually(lambda: gone(pid), what="the detached daemon to stop")
    assert "no daemon at" in run("--addr", addr, "ping", env=env).stderr


def test_detach_reports_a_daemon_that_could_not_start(env: dict[str, str]) -> None:
    home = Path(env["REPL_HOME"])
    home.mkdir()
    (home / "token").write_text("secret\n")
    (home / "token").chmod(0o644)  # readable by others: the daemon refuses it
    done = run("--addr", "127.0.0.1:0", "daemon", "--memory", "--detach", env=env)
    assert done.returncode == 1
    assert_one_error_line(done.stderr)
    assert "chmod 600" in done.stderr
    assert str(home / "daemon.log") in done.stderr


def test_daemon_limits_are_options_of_repl_daemon(env: dict[str, str]) -> None:
    """`repl daemon --max-sessions N --detach` hands the limit to the daemon it starts."""
    done = run(
        "--addr", "127.0.0.1:0", "daemon", "--memory", "--detach", "--max-sessions", "2", env=env
    )
    assert done.returncode == 0, done.stderr
    found = re.match(r"repl daemon listening on (\S+) \(pid (\d+)\)", done.stdout)
    assert found, done.stdout
    addr, pid = found.group(1), int(found.group(2))
    try:
        assert run("--addr", addr, "start", "a", env=env).returncode == 0
        assert run("--addr", addr, "start", "b", env=env).returncode == 0
        third = run("--addr", addr, "start", "c", env=env)
        assert third.returncode == 1
        assert_one_error_line(third.stderr)
        assert "2 sessions" in third.stderr
    finally:
        os.kill(pid, signal.SIGTERM)
        eventually(lambda: gone(pid), what="the detached daemon to stop")


def test_daemon_limit_options_are_checked(env: dict[str, str]) -> None:
    done = run("daemon", "--memory", "--max-connections", "0", env=env)
    assert done.returncode == 64
    assert_one_error_line(done.stderr)
