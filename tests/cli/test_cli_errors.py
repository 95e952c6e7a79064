"""Exit statuses and error lines: one line on stderr that says what to do, never a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from repl_cli.api import client as cli_client
from session.errors import Code
from tests.helpers import (
    InProcDaemon,
    Repl,
    assert_one_error_line,
    each_at_once,
    eventually,
    free_port,
    repl_argv,
)


def test_no_daemon_is_one_line_saying_how_to_start_one(tmp_path: Path) -> None:
    addr = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "REPL_ADDR": addr, "REPL_HOME": str(tmp_path)}

    def run(args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(repl_argv(*args), capture_output=True, text=True, env=env, timeout=30)

    commands = (
        ["ping"],
        ["read", "s"],
        ["wait", "s", "--reconnect", "0"],
        ["send", "s", "x"],
        ["sessions"],
    )
    for done in each_at_once(run, commands):  # independent runs, side by side
        assert done.returncode == 75  # unavailable: try again later
        assert_one_error_line(done.stderr)
        assert done.stderr.startswith(f"repl: no daemon at {addr}")
        assert "`repl daemon`" in done.stderr


def test_no_such_session_is_status_1_for_every_verb(repl: Repl) -> None:
    verbs = [
        ["read", "nope"],
        ["wait", "nope"],
        ["follow", "nope"],
        ["poll", "nope"],
        ["send", "nope", "x"],
        ["ack", "nope", "0"],
        ["cursors", "nope"],
        ["buffer", "nope", "3"],
        ["stop", "nope"],
        ["stats", "nope"],
    ]
    errors = each_at_once(lambda args: repl.fails(1, *args), verbs)  # side by side
    for args, stderr in zip(verbs, errors, strict=True):
        assert "no session 'nope'" in stderr, args
        assert "`repl start nope`" in stderr


def test_wrong_token_says_where_the_token_was_read(repl: Repl, s: str, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "token").write_text("not-the-token\n")
    env = {**repl.env, "REPL_HOME": str(other)}
    done = repl.run("read", s, env=env)
    assert done.returncode == 77  # a token refused (SPEC §5)
    assert_one_error_line(done.stderr)
    assert "REPL_HOME" in done.stderr and f"{other / 'token'}" in done.stderr
    missing = repl.run("read", s, env={**repl.env, "REPL_HOME": str(tmp_path / "none")})
    assert missing.returncode == 1
    assert_one_error_line(missing.stderr)
    assert f"{tmp_path / 'none' / 'token'}" in missing.stderr


def test_usage_errors_are_status_64(repl: Repl, s: str) -> None:
    no_args = repl.run()
    assert no_args.returncode == 64
    assert "Usage: repl" in no_args.stderr
    usage = [
        ["frobnicate"],
        ["read"],
        ["read", s, "--cursor", "c", "--after", "0"],
        ["read", s, "--max", "0"],
        ["read", s, "--full", "--json"],
        ["wait", s, "--timeout", "-1"],
        ["wait"],
        ["ack", s, "x"],
        ["--addr", "nonsense", "ping"],
        ["start", "not an id!"],
        ["read", s, "--cursor", "has space"],
        ["send", s, "x", "--handler", ""],
    ]
    errors = each_at_once(lambda args: repl.fails(64, *args), usage)  # side by side
    for args, stderr in zip(usage, errors, strict=True):
        assert "Usage:" not in stderr, args


def test_cursor_after_head_is_status_1(repl: Repl, s: str) -> None:
    stderr = repl.fails(1, "read", s, "--after", "5")
    assert "after 5 is after head 0" in stderr


def test_wait_timeout_with_nothing_is_status_2_and_prints_nothing(repl: Repl, s: str) -> None:
    flags = ([], ["--full"], ["--json"])
    for done in each_at_once(lambda more: repl.run("wait", s, "--timeout", "0.05", *more), flags):
        assert (done.returncode, done.stdout, done.stderr) == (2, "", "")
    assert repl.cursor(s, "wait") is None


def test_stopping_the_session_ends_its_waiters_with_status_1(repl: Repl, s: str) -> None:
    with repl.popen("wait", s) as proc:
        eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
        repl.ok("stop", s)
        stdout, stderr = proc.communicate(timeout=15)
    assert proc.returncode == 1
    assert stdout == b""
    assert_one_error_line(stderr.decode())
    assert "stopped" in stderr.decode()


def test_a_daemon_that_goes_away_mid_wait_is_75_without_reconnect(inproc: InProcDaemon) -> None:
    repl = Repl(inproc)
    s = repl.session("s")
    with repl.popen("wait", s, "--reconnect", "0") as proc:
        eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
        inproc.close_clients()
        inproc.stop()
        stdout, stderr = proc.communicate(timeout=15)
    assert proc.returncode == 75  # unavailable: the shutting-down answer, or the closed link
    assert stdout == b""
    assert_one_error_line(stderr.decode())


def test_the_home_is_repl_home_then_xdg_state_then_local_state(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from repl_daemon import config as daemon_config
    from repl_daemon import locations

    # the CLI and the daemon look in the same place because they share the code
    assert cli_client.default_home is locations.default_home
    assert daemon_config.DEFAULT_ADDR == cli_client.DEFAULT_ADDR == "127.0.0.1:7427"
    for name in ("REPL_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert locations.default_home() == tmp_path / ".local" / "state" / "repl"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert locations.default_home() == tmp_path / "state" / "repl"
    monkeypatch.setenv("REPL_HOME", str(tmp_path / "h"))
    assert locations.default_home() == tmp_path / "h"


#: every wire code's exit status: 64 for the arguments the daemon found invalid, 77 for a
#: token refused or a right it lacks, 75 for what trying again mends, 1 for the rest
WIRE_STATUS = {
    **dict.fromkeys([c for c in Code if c.startswith("bad_") and c != Code.BAD_REQUEST], 64),
    Code.UNAUTHORIZED: 77,
    Code.FORBIDDEN: 77,
    Code.IDLE_TIMEOUT: 75,
    Code.SLOW_CONSUMER: 75,
    Code.STORE_FAILED: 75,
    Code.SHUTTING_DOWN: 75,
}


def test_each_wire_code_has_a_class_of_the_librarys_and_the_cli_one_exit_status() -> None:
    """The library gives each code a class (``BY_CODE``), never a status; the CLI's one table
    (``STATUS``) gives each class one, and a code newer than the client is a plain error."""
    from repl_cli.api import errors
    from repl_cli.cli.errors import STATUS, exit_status, line_of

    assert set(errors.BY_CODE) == set(Code)
    for code in Code:
        exc = errors.from_wire(code, "said")
        assert type(exc) is errors.BY_CODE[code] and exc.code == code
        assert exit_status(exc) == WIRE_STATUS.get(code, 1), code
    classes = {c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, Exception)}
    assert classes - {errors.AnswerLost} == set(STATUS)  # one status a class
    assert exit_status(errors.AnswerLost("lost")) == 75
    newer = errors.from_wire("from_the_future", "something")
    assert type(newer) is errors.Error and exit_status(newer) == 1
    assert line_of(newer) == "something"
    hinted = errors.from_wire(Code.NO_SUCH_TIMER, "no timer t")
    assert line_of(hinted) == "no timer t: `repl timers` lists the pending ones"
    told = errors.from_wire(Code.NO_SUCH_TIMER, "no timer t (`repl timers` lists them)")
    assert line_of(told) == told.message  # it says what to do already


@pytest.mark.parametrize(
    "args",
    [
        [b"send", b"S", b"a\xe9"],
        [b"send", b"S", b"x", b"--key", b"k\xe9"],
        [b"send", b"S", b"x", b"--handler", b"h\xe9"],
        [b"read", b"S", b"--cursor", b"c\xe9"],
        [b"read", b"s\xe9"],
    ],
    ids=["text", "key", "handler", "cursor", "id"],
)
def test_an_argument_that_is_not_utf8_is_refused_naming_it_as_stdin_is(
    repl: Repl, args: list[bytes]
) -> None:
    s = repl.session("s")
    argv = [os.fsencode(a) for a in repl_argv()] + [a.replace(b"S", s.encode()) for a in args]
    done = subprocess.run(argv, capture_output=True, env=repl.env, timeout=30)
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr  # refused input, as the same bytes on stdin are
    assert_one_error_line(stderr)
    bad = next(a for a in args if b"\xe9" in a)
    assert f"the argument '{repr(bad)[2:-1]}' is not UTF-8 text" in stderr
    assert "convert it first, for example with `iconv -f LATIN1 -t UTF-8`" in stderr
    assert repl.ask({"op": "stats", "session": s})[0]["sessions"][0]["head"] == 0  # nothing sent
