"""The output formats of read, wait, follow and poll (SPEC §5), and the listings on a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess

import pytest

from repl_cli.cli import output
from tests.helpers import Repl, read_line, repl_argv

AWKWARD = 'say "hi"\\ \ttab\nnewline é 日本'


@pytest.fixture
def a(repl: Repl) -> str:
    """A session of the test's own with three firings: two handled, one not."""
    session = repl.session("a", "hello", AWKWARD)
    repl.send(session, "tock", handler="on-build")
    return session


TEXT = f"on-message: hello\non-message: {AWKWARD}\non-build (unhandled): tock\n"
SEQ = f"#1 on-message: hello\n#2 on-message: {AWKWARD}\n#3 on-build (unhandled): tock\n"
FULL = (
    "3 0\n"
    '(1 "on-message" "hello")\n'
    f'(2 "on-message" {json.dumps(AWKWARD, ensure_ascii=False)})\n'
    '(3 "on-build" nil "tock")\n'
)


def json_lines(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def test_text_is_handler_colon_result(repl: Repl, a: str) -> None:
    assert repl.ok("read", a, "--after", "0") == TEXT
    assert repl.ok("read", a, "--after", "0", "--seq") == SEQ


def test_full_is_one_line_a_firing_with_json_string_literals(repl: Repl, a: str) -> None:
    out = repl.ok("read", a, "--after", "0", "--full")
    assert out == FULL
    assert len(out.splitlines()) == 4


def test_json_is_a_header_then_one_object_a_firing(repl: Repl, a: str) -> None:
    got = json_lines(repl.ok("read", a, "--after", "0", "--json"))
    assert got[0] == {"next": 3, "lost": 0}
    fields = {"seq", "handler", "result", "event", "ts", "tags", "by"}
    assert [set(f) for f in got[1:]] == [fields] * 3
    assert {f["by"] for f in got[1:]} == {"root"}
    assert got[2]["result"] == AWKWARD and got[2]["event"] is None
    assert got[3]["result"] is None and got[3]["event"] == "tock"
    assert str(got[1]["ts"]).endswith("Z")


def test_full_and_json_together_is_a_usage_error(repl: Repl, a: str) -> None:
    repl.fails(64, "read", a, "--full", "--json")


def test_every_reading_verb_prints_the_same(repl: Repl, a: str) -> None:
    for n, (flags, expected) in enumerate((([], TEXT), (["--seq"], SEQ), (["--full"], FULL))):
        assert repl.ok("read", a, "--peek", *flags) == expected
        assert repl.ok("wait", a, "--peek", "--timeout", "5", *flags) == expected
        # follow prints the same batch, then is stopped
        # a cursor of its own each time: an earlier follow may have acked on its cursor
        with repl.popen("follow", a, "--cursor", f"f{n}", *flags) as follow:
            got = b"".join(read_line(follow) for _ in expected.splitlines())
            follow.terminate()
        assert got.decode() == expected
    assert repl.ok("poll", a, "--full") == FULL
    as_json = json_lines(repl.ok("read", a, "--json"))
    assert as_json == json_lines(repl.ok("wait", a, "--json", "--timeout", "5"))


def test_lost_is_told_once_in_each_format(repl: Repl) -> None:
    b = repl.session("b")
    repl.ok("buffer", b, "1")
    repl.send(b, "1", "2", "3")
    assert repl.ok("read", b, "--peek") == "(2 earlier firings dropped)\non-message: 3\n"
    assert repl.ok("read", b, "--peek", "--full") == '3 2\n(3 "on-message" "3")\n'
    assert json_lines(repl.ok("read", b, "--peek", "--json"))[0] == {"next": 3, "lost": 2}
    repl.ok("buffer", b, "0")
    assert repl.ok("read", b) == "(3 earlier firings dropped)\n"
    assert repl.cursor(b, "read") == 3  # told once: acknowledged with the loss line
    assert repl.ok("read", b, "--full") == "3 0\n"


def test_several_sessions_prefix_every_line_with_the_id(repl: Repl) -> None:
    x = repl.session("x", "to x")
    y = repl.session("y", "to y")
    text = repl.ok("wait", x, y, "--peek", "--seq")
    assert text == f"{x} #1 on-message: to x\n{y} #1 on-message: to y\n"
    full = repl.ok("wait", x, y, "--peek", "--full")
    assert full == (f'{x} 1 0\n{x} (1 "on-message" "to x")\n{y} 1 0\n{y} (1 "on-message" "to y")\n')
    got = json_lines(repl.ok("wait", x, y, "--peek", "--json"))
    assert got[0] == {"session": x, "next": 1, "lost": 0}
    assert [o["session"] for o in got] == [x, x, y, y]
    assert got[1]["result"] == "to x"


def run_on_terminal(repl: Repl, *args: str, env: dict[str, str]) -> str:
    """Run with stdout on a pseudo-terminal; what it printed."""
    leader, follower = pty.openpty()
    try:
        with subprocess.Popen(
            repl_argv(*args), stdout=follower, stdin=subprocess.DEVNULL, env=env
        ) as proc:
            os.close(follower)
            chunks = []
            while True:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            assert proc.wait(30) == 0
    finally:
        os.close(leader)
    return b"".join(chunks).decode()


def test_colour_on_a_terminal_unless_no_color(repl: Repl, a: str) -> None:
    env = {**repl.env, "TERM": "xterm-256color", "COLUMNS": "100"}
    coloured = run_on_terminal(repl, "read", a, "--peek", env=env)
    assert "\x1b[" in coloured
    assert "hello" in coloured
    plain = run_on_terminal(repl, "read", a, "--peek", env={**env, "NO_COLOR": "1"})
    assert "\x1b[" not in plain
    assert plain.replace("\r\n", "\n") == TEXT


def test_listings_are_aligned_tables_on_a_terminal(repl: Repl, a: str) -> None:
    env = {**repl.env, "TERM": "xterm-256color", "COLUMNS": "100", "NO_COLOR": "1"}
    table = re.sub(r"\x1b\[[0-9;]*m", "", run_on_terminal(repl, "sessions", env=env))
    assert "\t" not in table
    rows = [line.split() for line in table.splitlines()]
    assert ["id", "head", "retained", "limit", "cursors", "waiters"] in rows
    assert [a, "3", "3", "256", "0", "0"] in rows


@pytest.mark.parametrize(
    ("seconds", "reads"),
    [
        (12.54, "12.5 s"),
        (200.9, "3m 20s"),
        (2 * 3600 + 5 * 60, "2h 5m 0s"),
        (4 * 86400 + 3600 + 30 * 60 + 59, "4d 1h 30m"),
    ],
)
def test_a_pings_uptime_reads_as_people_read_it(seconds: float, reads: str) -> None:
    assert output.duration(seconds) == reads
