"""``repl`` with its standard streams closed, full or a terminal: never a traceback.

A stdout closed from the start (``>&-``) is a reader that is gone: the
command stops quietly and acknowledges nothing. A stdout that fails for
another reason (a full disk, here ``/dev/full``) is one line on stderr and
status 1, with nothing acknowledged. A closed stderr still leaves the exit
status to tell what happened, and a closed stdin is one line, sending nothing.
"""

from __future__ import annotations

import array
import fcntl
import os
import pty
import subprocess
import termios
from typing import IO

from tests.helpers import Repl, assert_one_error_line, each_at_once, eventually, repl_argv

FULL = "repl: cannot write to stdout (No space left on device)\n"


def head(repl: Repl, session: str) -> int:
    (listed,) = repl.ask({"op": "stats", "session": session})
    value: int = listed["sessions"][0]["head"]
    return value


def acked(repl: Repl, session: str, cursor: str) -> int:
    """How far ``cursor`` was acknowledged (0 when it does not exist)."""
    return repl.cursor(session, cursor) or 0


def test_a_stdout_closed_from_the_start_stops_quietly_and_acknowledges_nothing(
    repl: Repl, s: str
) -> None:
    repl.send(s, "one", "two")
    readers = ("read", "wait", "poll --max 1", "follow")  # independent runs, side by side
    shells = each_at_once(lambda command: repl.shell(f"$REPL {command} {s} >&-"), readers)
    for command, done in zip(readers, shells, strict=True):
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), command
    for cursor in ("read", "wait", "follow"):
        assert acked(repl, s, cursor) == 0, cursor
    assert repl.waiters(s) == 0
    # poll is the at-most-once drain: it took its firing, with no reader to show it to
    assert acked(repl, s, "poll") == 1
    others = ("sessions", "cursors " + s, "stats --json", "ping")
    shells = each_at_once(lambda command: repl.shell(f"$REPL {command} >&-"), others)
    for command, done in zip(others, shells, strict=True):
        assert (done.returncode, done.stderr) == (0, ""), command


def test_a_send_whose_stdout_is_closed_still_records_the_firing(repl: Repl, s: str) -> None:
    done = repl.shell(f"$REPL send {s} kept >&-")
    assert (done.returncode, done.stderr) == (0, "")
    assert repl.ok("read", s, "--after", "0") == "on-message: kept\n"


def test_a_full_stdout_is_one_line_and_acknowledges_nothing(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two")
    readers = (f"read {s}", f"wait {s}", f"read {s} --json", f"follow {s}")  # side by side
    shells = each_at_once(lambda command: repl.shell(f"$REPL {command} >/dev/full"), readers)
    for command, done in zip(readers, shells, strict=True):
        assert (done.returncode, done.stderr) == (1, FULL), command
    for cursor in ("read", "wait", "follow"):
        assert acked(repl, s, cursor) == 0, cursor
    others = ("sessions", "sessions --json", f"cursors {s}", "stats", "ping")
    shells = each_at_once(lambda command: repl.shell(f"$REPL {command} >/dev/full"), others)
    for command, done in zip(others, shells, strict=True):
        assert (done.returncode, done.stderr) == (1, FULL), command


def test_a_send_into_a_full_stdout_records_the_firing_and_says_it_cannot_print(
    repl: Repl, s: str
) -> None:
    for command in (f"send {s} one", f"send {s} --lines <<< two"):
        done = repl.shell(f"$REPL {command} >/dev/full")
        assert (done.returncode, done.stderr) == (1, FULL), command
    assert head(repl, s) == 2


def test_a_closed_stderr_leaves_the_exit_status_to_tell(repl: Repl, s: str) -> None:
    assert repl.shell("$REPL frobnicate 2>&-").returncode == 64
    assert repl.shell("$REPL read no-such-session 2>&-").returncode == 1
    assert repl.shell(f"$REPL wait {s} --timeout 0 2>&-").returncode == 2


def test_a_stderr_whose_reader_left_leaves_the_exit_status_to_tell(repl: Repl) -> None:
    reader, writer = os.pipe()
    os.close(reader)
    try:
        for args, status in ((["frobnicate"], 64), (["read", "no-such-session"], 1)):
            done = subprocess.run(
                repl_argv(*args), stdin=subprocess.DEVNULL, stderr=writer, env=repl.env, timeout=30
            )
            assert done.returncode == status, args
    finally:
        os.close(writer)


def test_a_closed_stdin_is_one_line_and_sends_nothing(repl: Repl, s: str) -> None:
    for command, hint in (
        (f"send {s}", "give the TEXT as an argument, or pipe it in"),
        (f"send {s} -", "give the TEXT as an argument, or pipe it in"),
        (f"send {s} --lines", "--lines sends the lines of stdin: pipe them in"),
    ):
        done = repl.shell(f"$REPL {command} <&-")
        assert done.returncode == 1, command
        assert done.stderr == f"repl: stdin is closed: {hint}\n"
    assert head(repl, s) == 0


def test_text_that_is_not_utf8_is_refused_naming_where(repl: Repl, s: str) -> None:
    done = repl.run("send", s, input=b"caf\xe9\n")
    assert done.returncode == 1
    assert_one_error_line(done.stderr)
    assert "stdin is not UTF-8 text (invalid continuation byte at byte 3)" in done.stderr
    assert "convert it first, for example with `iconv -f LATIN1 -t UTF-8`" in done.stderr
    lines = repl.run("send", s, "--lines", input=b"fine\ncaf\xe9\n")
    assert lines.returncode == 1
    assert_one_error_line(lines.stderr)
    assert "line 2 of stdin is not UTF-8 text" in lines.stderr
    assert head(repl, s) == 0  # a chunk is checked whole before any of it is sent


def in_pipe(pipe: IO[bytes]) -> int:
    """Bytes written to ``pipe`` that its reader has not taken yet."""
    count = array.array("i", [0])
    fcntl.ioctl(pipe.fileno(), termios.FIONREAD, count, True)
    return count[0]


def test_send_lines_joins_a_line_that_arrives_in_pieces(repl: Repl, s: str) -> None:
    with repl.popen("send", s, "--lines", stdin=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(b"first\nhalf")  # one write: the child reads it in one piece
        proc.stdin.flush()
        eventually(lambda: head(repl, s) == 1, what="the first line to be sent")
        proc.stdin.write(b" a ")  # a piece with no end of line at all
        proc.stdin.flush()
        eventually(lambda: in_pipe(proc.stdin) == 0, what="the child to read the piece")
        proc.stdin.write(b"line\n")
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert (proc.stdout.read(), proc.stderr.read()) == (b"1\n2\n", b"")
    assert repl.ok("read", s) == "on-message: first\non-message: half a line\n"


def test_send_from_a_terminal_says_how_to_end_the_text(repl: Repl, s: str) -> None:
    leader, follower = pty.openpty()
    try:
        with subprocess.Popen(
            repl_argv("send", s),
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=repl.env,
        ) as proc:
            os.close(follower)
            os.write(leader, b"typed\n\x04")  # a line, then Ctrl-D
            stdout, stderr = proc.communicate(timeout=30)
    finally:
        os.close(leader)
    assert proc.returncode == 0
    assert stdout == b"1\n"
    assert stderr == b"repl: reading the text from the terminal: end it with Ctrl-D\n"
    assert repl.ok("read", s) == "on-message: typed\n"


def test_a_peek_into_a_pipe_nobody_reads_exits_once_written(repl: Repl, s: str) -> None:
    """``--peek`` (and ``--after``) acknowledge nothing, so they need not wait for the pipe's
    reader to take the lines: written is delivered. A plain ``read`` waits (rule 9)."""
    repl.send(s, "one", "two")
    for args in (["wait", s, "--peek"], ["read", s, "--peek"], ["read", s, "--after", "0"]):
        proc = repl.popen(*args)  # stdout a pipe this test does not read yet
        try:
            assert proc.wait(10) == 0, args
        finally:
            out, err = proc.communicate(timeout=10)
        assert out == b"on-message: one\non-message: two\n" and err == b"", args
    assert acked(repl, s, "wait") == 0 and acked(repl, s, "read") == 0
    reader = repl.popen("read", s)
    try:
        written = reader.stdout
        assert written is not None
        eventually(lambda: in_pipe(written) > 0, what="the read to write")
        # a read of the same lines that acknowledges nothing, started only now, writes them
        # both and exits: one that did not wait for its reader would have written and
        # acknowledged them by then
        other = repl.popen("read", s, "--after", "0")
        assert other.wait(10) == 0
        assert other.communicate(timeout=10) == (b"on-message: one\non-message: two\n", b"")
        assert reader.poll() is None  # waits until its lines are taken, to acknowledge them
        assert acked(repl, s, "read") == 0
    finally:
        out, _ = reader.communicate(timeout=10)
    assert reader.returncode == 0 and out == b"on-message: one\non-message: two\n"
    assert acked(repl, s, "read") == 2
