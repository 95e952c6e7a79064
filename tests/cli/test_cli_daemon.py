"""``repl daemon``: in the foreground, detached, and refusing a second one at an address."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repl_cli.cli.commands.daemon import daemon as daemon_command
from repl_cli.cli.launch import _last_words
from repl_daemon.__main__ import parser as daemon_parser
from repl_daemon.config import DEFAULTS, OPTIONS, Option, to_argv
from tests.helpers import InProcDaemon, assert_one_error_line, eventually, free_port, repl_argv


def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(repl_argv(*args), capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "REPL_HOME": str(tmp_path / "home")}
    env.pop("REPL_ADDR", None)
    return env


def gone(pid: int) -> bool:
    """Exited: no such process, or one that is only waiting to be reaped (a zombie)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return True
    return state in (b"Z", b"X")


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


def test_detach_with_http_says_both_addresses(env: dict[str, str]) -> None:
    done = run(
        "--addr", "127.0.0.1:0", "daemon", "--memory", "--detach", "--http", "127.0.0.1:0", env=env
    )
    assert done.returncode == 0, done.stderr
    found = re.match(
        r"repl daemon listening on (\S+), HTTP on 127\.0\.0\.1:(\d+) \(pid (\d+)\)", done.stdout
    )
    assert found, done.stdout
    addr, pid = found.group(1), int(found.group(3))
    try:
        assert run("--addr", addr, "ping", env=env).returncode == 0
    finally:
        os.kill(pid, signal.SIGTERM)
        eventually(lambda: gone(pid), what="the detached daemon to stop")


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


def option_values(option: Option) -> st.SearchStrategy[Any]:
    """Values ``repl daemon`` accepts for one option of the table."""
    if option.kind is bool:
        return st.booleans()
    if isinstance(option.kind, tuple):
        return st.sampled_from(option.kind)
    if option.kind is int:
        least = int(option.minimum or 0) + (1 if option.above else 0)
        return st.integers(min_value=least, max_value=10**12)
    if option.kind is float:
        return st.floats(
            min_value=option.minimum,
            exclude_min=option.above,
            max_value=1e9,
            allow_nan=False,
        )
    # any text, and what looks like an option of its own
    shaped = st.sampled_from(["redis://127.0.0.1:6379/0", "-x", "--memory", "", "a b"])
    return shaped | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"))


#: a value for some of the options (None: not given, so the default)
GIVEN = st.fixed_dictionaries(
    {option.dest: st.none() | option_values(option) for option in OPTIONS}
)


@given(GIVEN)
def test_repl_daemon_hands_every_option_on_as_it_was_given(values: dict[str, Any]) -> None:
    """`repl daemon`'s options, written by to_argv, parse back the same in python -m repl_daemon."""
    expected = {k: DEFAULTS[k] if v is None else v for k, v in values.items()}
    argv = to_argv(values)
    parsed = vars(daemon_parser().parse_args(["--addr", "127.0.0.1:0", *argv]))
    assert parsed.pop("addr") == "127.0.0.1:0" and parsed.pop("home") is None
    assert parsed == expected
    # and the click side reads the same argv as the same values
    clicked = daemon_command.make_context("daemon", list(argv)).params
    assert clicked.pop("detach") is False
    # the global options every command takes after its name too (none given here)
    assert all(clicked.pop(name) is None for name in ("addr", "home", "tls_ca", "token_file"))
    assert clicked == expected


def test_no_option_given_hands_on_nothing() -> None:
    assert to_argv({}) == []
    assert to_argv({option.dest: None for option in OPTIONS}) == []


def test_memory_and_store_together_is_a_usage_error(env: dict[str, str]) -> None:
    done = run("daemon", "--memory", "--store", "redis://127.0.0.1:1/0", env=env)
    assert done.returncode == 64
    assert_one_error_line(done.stderr)
    assert "give --memory or --store, not both" in done.stderr


def test_a_foreground_daemon_that_cannot_start_says_why_in_one_line(
    env: dict[str, str], tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = {**env, "REPL_HOME": str(blocker / "home")}
    done = run("--addr", f"127.0.0.1:{free_port()}", "daemon", "--memory", env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("repl daemon: cannot start: Not a directory")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_failed_detached_start_is_told_by_its_last_words() -> None:
    traceback = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in <module>',
        "  + Exception Group Traceback (most recent call last):",
        "  | ValueError: the reason",
        "  +------------------------------------",
        "",
    ]
    assert _last_words(traceback) == "ValueError: the reason"
    assert _last_words(["repl daemon: cannot listen on 127.0.0.1:1", ""]) == (
        "cannot listen on 127.0.0.1:1"
    )
    assert _last_words(["", "  +---", " | "]) == "it wrote nothing"


def test_python_m_repl_cli_is_repl(env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "repl_cli", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "repl 0.1.0\n", "")


def test_shutdown_stops_a_detached_daemon_and_its_waiters_reconnect_to_the_next(
    env: dict[str, str],
) -> None:
    """``repl shutdown`` returns once the daemon exited; a blocked ``repl wait`` rides it
    out and gets the firing sent to the daemon started next at the same address."""
    addr = f"127.0.0.1:{free_port()}"
    first = run("--addr", addr, "daemon", "--detach", "--settle-ms", "0", env=env)
    assert first.returncode == 0, first.stderr
    pid = int(re.search(r"\(pid (\d+)\)", first.stdout).group(1))  # type: ignore[union-attr]
    assert run("--addr", addr, "start", "inbox", env=env).returncode == 0
    waiter = subprocess.Popen(
        repl_argv("--addr", addr, "wait", "inbox"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        eventually(
            lambda: '"waiters": 1' in run("--addr", addr, "sessions", "--json", env=env).stdout,
            what="the wait blocks",
        )
        stopped = run("--addr", addr, "shutdown", env=env)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout == f"stopped the daemon at {addr} (pid {pid})\n"
        assert gone(pid)  # it returned once the daemon had exited
        assert run("--addr", addr, "ping", env=env).returncode == 75
        assert waiter.poll() is None  # still waiting: reconnecting
        again = run("--addr", addr, "daemon", "--detach", "--settle-ms", "0", env=env)
        assert again.returncode == 0, again.stderr
        assert run("--addr", addr, "send", "inbox", "hello", env=env).stdout == "1\n"
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0, err
        assert out == b"on-message: hello\n"
        assert b"the daemon is shutting down; reconnecting" in err
    finally:
        if waiter.poll() is None:
            waiter.kill()
        run("--addr", addr, "shutdown", env=env)


def test_shutdown_with_no_daemon_exits_75(env: dict[str, str]) -> None:
    done = run("--addr", f"127.0.0.1:{free_port()}", "shutdown", env=env)
    assert done.returncode == 75
    assert_one_error_line(done.stderr)
    assert "no daemon at" in done.stderr


def test_ping_shows_the_address_pid_and_store(
    env: dict[str, str], detached: tuple[str, int]
) -> None:
    addr, pid = detached
    text = run("--addr", addr, "ping", env=env)
    assert text.returncode == 0, text.stderr
    assert re.fullmatch(
        rf"repl daemon \S+ at {re.escape(addr)}, pid {pid}, store memory, up \S+ s\n", text.stdout
    ), text.stdout
    as_json = run("--addr", addr, "ping", "--json", env=env)
    pong = json.loads(as_json.stdout)
    assert sorted(pong) == ["addr", "pid", "store", "uptime_s", "version"]
    assert (pong["addr"], pong["pid"], pong["store"]) == (addr, pid, "memory")
    assert "repl shutdown" in run("--addr", addr, "daemon", "--memory", env=env).stderr
