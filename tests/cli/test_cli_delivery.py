"""The CLI acknowledges only what its reader took (SPEC rules 9, 10, 14), and Ctrl-C.

These run ``repl`` with its stdout on a pipe that the test (or ``head``)
reads, and look at the cursors in the daemon afterwards.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from repl_daemon.config import Limits
from tests.helpers import Repl, daemon_config, eventually, inproc_daemon, read_line, unread


def interrupt(proc: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    """Ctrl-C: SIGINT, then the exit status and what it wrote on stderr."""
    proc.send_signal(signal.SIGINT)
    status = proc.wait(15)
    assert proc.stderr is not None
    return status, proc.stderr.read()


def test_wait_into_head_acknowledges_only_the_line_head_took(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two")
    done = repl.shell(f'$REPL wait {s} | head -n 1; echo "status ${{PIPESTATUS[0]}}"')
    assert done.stdout == "on-message: one\nstatus 0\n"
    assert done.stderr == ""
    assert repl.cursor(s, "wait") == 1
    assert repl.ok("wait", s, "--timeout", "5") == "on-message: two\n"
    assert repl.cursor(s, "wait") == 2


def test_read_into_head_acknowledges_only_what_head_took(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two", "three")
    done = repl.shell(f"$REPL read {s} --seq | head -n 2")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "#1 on-message: one\n#2 on-message: two\n",
        "",
    )
    assert repl.cursor(s, "read") == 2
    assert repl.ok("read", s) == "on-message: three\n"


def test_follow_into_head_acknowledges_only_what_head_took(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two", "three")
    done = repl.shell(f"$REPL follow {s} | head -n 2")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "on-message: one\non-message: two\n",
        "",
    )
    assert repl.cursor(s, "follow") == 2


def test_full_header_alone_taken_acknowledges_no_firing(repl: Repl, s: str) -> None:
    repl.send(s, "one")
    done = repl.shell(f"$REPL wait {s} --full | head -n 1")
    assert done.stdout == "1 0\n"
    assert repl.cursor(s, "wait") is None


def test_wait_whose_reader_left_stops_without_waiting_for_a_firing(repl: Repl, s: str) -> None:
    done = repl.shell(f"$REPL wait {s} | true")
    assert (done.returncode, done.stderr) == (0, "")
    assert repl.cursor(s, "wait") is None


def test_ctrl_c_in_a_blocked_wait_exits_130_and_moves_nothing(repl: Repl, s: str) -> None:
    with repl.popen("wait", s) as proc:
        eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
        status, stderr = interrupt(proc)
    assert (status, stderr) == (130, b"")
    assert repl.cursor(s, "wait") is None
    eventually(lambda: repl.waiters(s) == 0, what="the waiter to be released")


def test_ctrl_c_in_wait_acknowledges_only_what_was_taken(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two", "three")
    with repl.popen("wait", s) as proc:
        assert read_line(proc) == b"on-message: one\n"
        # the second line is in the pipe, so the first counts as taken
        eventually(lambda: unread(proc) > 0, what="the second line")
        status, stderr = interrupt(proc)
    assert (status, stderr) == (130, b"")
    assert repl.cursor(s, "wait") == 1
    assert repl.ok("wait", s, "--timeout", "5") == "on-message: two\non-message: three\n"


def test_ctrl_c_in_follow_acknowledges_only_what_was_taken(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two", "three")
    with repl.popen("follow", s) as proc:
        assert read_line(proc) == b"on-message: one\n"
        eventually(lambda: unread(proc) > 0, what="the second line")
        status, stderr = interrupt(proc)
    assert (status, stderr) == (130, b"")
    assert repl.cursor(s, "follow") == 1


def test_ctrl_c_in_a_blocked_follow_keeps_what_it_printed(repl: Repl, s: str) -> None:
    with repl.popen("follow", s) as proc:
        eventually(lambda: repl.waiters(s) == 1, what="follow to block")
        repl.send(s, "one", "two")
        assert read_line(proc) == b"on-message: one\n"
        assert read_line(proc) == b"on-message: two\n"
        eventually(lambda: repl.cursor(s, "follow") == 2, what="the ack of the batch")
        eventually(lambda: repl.waiters(s) == 1, what="follow to block again")
        status, stderr = interrupt(proc)
    assert (status, stderr) == (130, b"")
    assert repl.cursor(s, "follow") == 2
    repl.send(s, "three")
    with repl.popen("follow", s) as again:
        assert read_line(again) == b"on-message: three\n"
        again.terminate()


def test_follow_streams_batch_after_batch(repl: Repl, s: str) -> None:
    with repl.popen("follow", s, "--seq") as proc:
        for n in range(1, 4):
            repl.send(s, f"m{n}")
            assert read_line(proc) == f"#{n} on-message: m{n}\n".encode()
        proc.terminate()


def test_follow_from_now_skips_what_was_recorded_before(repl: Repl, s: str) -> None:
    repl.send(s, "old", "older")
    with repl.popen("follow", s, "--from-now") as proc:
        eventually(lambda: repl.cursor(s, "follow") == 2, what="the cursor at the head")
        repl.send(s, "new")
        assert read_line(proc) == b"on-message: new\n"
        proc.terminate()
    assert repl.ok("read", s) == "on-message: old\non-message: older\non-message: new\n"


def test_follow_wait_and_read_do_not_interfere(repl: Repl, s: str) -> None:
    with repl.popen("follow", s) as follower:
        eventually(lambda: repl.waiters(s) == 1, what="follow to block")
        with repl.popen("wait", s) as waiter:
            eventually(lambda: repl.waiters(s) == 2, what="wait to block")
            repl.send(s, "for everyone")
            assert read_line(follower) == b"on-message: for everyone\n"
            assert waiter.communicate(timeout=15) == (b"on-message: for everyone\n", b"")
            assert waiter.returncode == 0
        assert repl.ok("read", s) == "on-message: for everyone\n"
        eventually(lambda: repl.cursor(s, "follow") == 1, what="follow's ack")
        assert repl.cursor(s, "wait") == 1
        assert repl.cursor(s, "read") == 1
        follower.terminate()


def test_wait_on_several_acknowledges_only_the_session_it_printed(repl: Repl, s: str) -> None:
    t = repl.session("t", "for t")
    assert repl.ok("wait", s, t, "--timeout", "5") == f"{t} on-message: for t\n"
    assert repl.cursor(t, "wait") == 1
    assert repl.cursor(s, "wait") is None


def test_wait_on_several_into_head_leaves_the_untaken_session_alone(repl: Repl, s: str) -> None:
    t = repl.session("t", "for t")
    repl.send(s, "for s")
    done = repl.shell(f"$REPL wait {s} {t} | head -n 1")
    assert done.stdout == f"{s} on-message: for s\n"
    assert repl.cursor(s, "wait") == 1
    assert repl.cursor(t, "wait") is None
    assert repl.ok("wait", s, t, "--timeout", "5") == f"{t} on-message: for t\n"


def test_a_wait_names_each_session_once_and_at_most_1024(repl: Repl, s: str) -> None:
    t = repl.session("t", "for t")
    repl.send(s, "for s")
    err = repl.fails(64, "wait", *[s] * 1_025, "--timeout", "5")
    assert "1,025 sessions named: one wait takes at most 1,024" in err
    assert repl.cursor(s, "wait") is None
    out = repl.ok("wait", t, s, t, s, "--timeout", "5")
    assert out == f"{t} on-message: for t\n{s} on-message: for s\n"  # each once, as named


def test_peek_acknowledges_nothing_and_wait_stays_ready(repl: Repl, s: str) -> None:
    repl.send(s, "one")
    assert repl.ok("wait", s, "--peek", "--timeout", "5") == "on-message: one\n"
    assert repl.cursor(s, "wait") is None
    assert repl.ok("wait", s, "--timeout", "5") == "on-message: one\n"
    assert repl.cursor(s, "wait") == 1


def test_wait_blocks_until_a_send_from_elsewhere(repl: Repl, s: str) -> None:
    with repl.popen("wait", s, "--cursor", "monitor") as proc:
        eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
        assert repl.ok("send", s, "wake up") == "1\n"
        assert proc.communicate(timeout=15) == (b"on-message: wake up\n", b"")
        assert proc.returncode == 0
    assert repl.cursor(s, "monitor") == 1


def test_a_reader_slower_than_the_idle_timeout_still_gets_its_ack(tmp_path: Path) -> None:
    # a daemon that closes connections quiet for 1 s: the CLI, kept waiting
    # by its reader between printing and acknowledging, must reconnect
    config = daemon_config(tmp_path / "home", limits=Limits(idle_timeout=1.0))
    with inproc_daemon(config) as d:
        repl = Repl(d)
        s = repl.session("slow", "one")

        def connections() -> int:
            (stats,) = repl.ask({"op": "stats"})
            count: int = stats["daemon"]["connections"]
            return count

        with repl.popen("read", s) as proc:
            eventually(lambda: unread(proc) > 0, what="the line in the pipe")
            # the daemon closed the waiting CLI's connection: only the one asking is left
            eventually(lambda: connections() == 1, what="the idle timeout to close the CLI's")
            assert read_line(proc) == b"on-message: one\n"
            assert proc.wait(15) == 0
            assert proc.stderr is not None
            assert proc.stderr.read() == b""
        assert repl.cursor(s, "read") == 1


def test_a_line_the_reader_took_just_before_it_left_counts_as_delivered() -> None:
    """The receipt looks at a pipe's unread bytes, then polls for a reader that left; a
    reader that took the line and left between the two (``head -n 2`` with the second)
    had it, so it is delivered (and acknowledged); a line left unread in the pipe of a
    reader that left is not. Once failing under load: ``follow | head -n 2`` acknowledged 1."""
    import os

    from repl_cli.api.receipt import ReaderGone, Receipt

    read_end, write_end = os.pipe()
    try:
        sink = Receipt(write_end)
        os.write(write_end, b"taken\n")
        assert os.read(read_end, 64) == b"taken\n"
        os.close(read_end)
        read_end = -1
        sink._reader_left()  # taken, then the reader left: delivered
    finally:
        if read_end >= 0:
            os.close(read_end)
        os.close(write_end)

    read_end, write_end = os.pipe()
    try:
        sink = Receipt(write_end)
        os.write(write_end, b"never read\n")
        os.close(read_end)
        with pytest.raises(ReaderGone):
            sink._reader_left()
    finally:
        os.close(write_end)
