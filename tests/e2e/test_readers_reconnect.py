"""Readers that outlive a restart (SPEC §8), with the installed ``repl`` in a real shell.

A blocked ``repl wait`` and a running ``repl follow`` ride out a SIGTERM
restart and a ``kill -9`` of their daemon (a durable one: the sessions come
back), get the firing sent after it, and say once on stderr that they are
reconnecting and once that they are back; nothing printed before is lost,
nothing unprinted acknowledged. A daemon that went away for good: after
``--reconnect 1`` they give up with exit 75. With no daemon at all, they
exit 75 at once, as every other command does.
"""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

import pytest

from tests.helpers import (
    DaemonProc,
    RedisProc,
    Repl,
    SharedDaemons,
    each_at_once,
    eventually,
    free_port,
    repl_argv,
    require_redis,
)

UNAVAILABLE = 75


def _lines(proc: subprocess.Popen[bytes], count: int, timeout: float = 20) -> list[str]:
    """``count`` lines of the child's stdout, each within ``timeout`` seconds."""
    assert proc.stdout is not None
    out: list[str] = []
    for _ in range(count):
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        assert ready, f"no line from {proc.args} after {out}"
        out.append(proc.stdout.readline().decode().rstrip("\n"))
    return out


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "kill-9"])
def test_a_blocked_wait_rides_out_a_restart_and_gets_the_next_firing(
    durable_daemon: DaemonProc, crash: bool
) -> None:
    repl = Repl(durable_daemon)
    s = repl.session("w", "before")
    assert repl.ok("wait", s) == "on-message: before\n"  # acknowledged on cursor `wait`
    waiter = repl.popen("wait", s)
    eventually(lambda: repl.waiters(s) == 1, what="the wait blocks")
    durable_daemon.restart(crash=crash)
    repl.send(s, "after")
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, err
    assert out.decode() == "on-message: after\n"
    notes = err.decode().splitlines()
    assert len(notes) == 2, notes
    addr = f"127.0.0.1:{durable_daemon.port}"
    lost = "the daemon is shutting down" if not crash else f"the daemon at {addr} closed"
    assert notes[0].startswith(f"repl: {lost}"), notes
    assert notes[0].endswith("; reconnecting for up to 300 s"), notes
    assert notes[1] == f"repl: reconnected to the daemon at 127.0.0.1:{durable_daemon.port}"
    assert repl.cursor(s, "wait") == 2  # what it printed after the restart, acknowledged


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "kill-9"])
def test_a_follow_keeps_going_across_a_restart_losing_nothing(
    durable_daemon: DaemonProc, crash: bool
) -> None:
    repl = Repl(durable_daemon)
    s = repl.session("f", "one")
    follower = repl.popen("follow", s, "--seq")
    try:
        assert _lines(follower, 1) == ["#1 on-message: one"]
        eventually(lambda: repl.waiters(s) == 1, what="the follow blocks")
        durable_daemon.restart(crash=crash)
        repl.send(s, "two", "three")
        assert _lines(follower, 2) == ["#2 on-message: two", "#3 on-message: three"]
        eventually(lambda: repl.waiters(s) == 1, what="the follow blocks again")
        assert repl.cursor(s, "follow") == 3  # carried by the wait it now blocks in
    finally:
        follower.terminate()
        _, err = follower.communicate(timeout=10)
    notes = err.decode().splitlines()
    assert notes[0].endswith("reconnecting for up to 300 s"), notes
    assert notes[1].startswith("repl: reconnected to the daemon at "), notes


def _nowhere(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """An address no daemon listens on, and the environment that names it."""
    addr = f"127.0.0.1:{free_port()}"
    (tmp_path / "token").write_text("t\n")
    return addr, {**os.environ, "REPL_ADDR": addr, "REPL_HOME": str(tmp_path)}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(repl_argv(*args), capture_output=True, text=True, env=env, timeout=60)


def test_with_no_daemon_at_all_readers_are_75_at_once(tmp_path: Path) -> None:
    """Riding out is for a daemon that was there: a reader whose very first connection
    fails exits 75 at once (a wait's --timeout does not turn it into 2), as every other
    command does."""
    addr, env = _nowhere(tmp_path)
    commands = (
        ["wait", "s"],
        ["follow", "s"],
        ["wait", "s", "--timeout", "30"],
        ["ping"],
        ["send", "s", "x"],
        ["read", "s"],
        ["sessions"],
    )
    answers = each_at_once(lambda command: _run(env, *command), commands)
    for command, done in zip(commands, answers, strict=True):
        assert done.returncode == UNAVAILABLE, (command, done)
        assert done.stderr.startswith(f"repl: no daemon at {addr} (from REPL_ADDR)"), done
        assert done.stderr.count("\n") == 1 and "reconnecting" not in done.stderr, done


def _gone_for_good(tmp_path: Path, *wait: str) -> tuple[str, subprocess.Popen[bytes]]:
    """A reader blocked on a daemon that then goes away and never comes back: its address,
    and the reader's process."""
    d = DaemonProc(tmp_path / "home", "--memory", "--settle-ms", "0")
    repl = Repl(d)
    s = repl.session("gone")
    reader = repl.popen(*(arg.replace("{}", s) for arg in wait))
    eventually(lambda: repl.waiters(s) == 1, what="the reader to block")
    d.kill()
    return f"127.0.0.1:{d.port}", reader


@pytest.mark.parametrize("verb", ["wait", "follow"])
def test_a_reader_gives_up_after_reconnect_secs_with_75(tmp_path: Path, verb: str) -> None:
    addr, reader = _gone_for_good(tmp_path, verb, "{}", "--reconnect", "1")
    _, err = reader.communicate(timeout=30)
    assert reader.returncode == UNAVAILABLE, err
    notes = err.decode().splitlines()
    assert notes[0].startswith(f"repl: the daemon at {addr} closed the connection"), notes
    assert notes[0].endswith("reconnecting for up to 1 s"), notes
    assert notes[1].startswith("repl: gave up after 1 s: no daemon at"), notes
    assert len(notes) == 2 and "Traceback" not in err.decode()


def test_a_waits_timeout_still_bounds_it_while_the_daemon_is_away(tmp_path: Path) -> None:
    _, reader = _gone_for_good(tmp_path, "wait", "{}", "--timeout", "2")
    _, err = reader.communicate(timeout=30)
    assert reader.returncode == 2, err  # --timeout passed, nothing printed
    assert "reconnecting" in err.decode()


def test_a_stopped_session_is_no_outage(durable_daemon: DaemonProc) -> None:
    repl = Repl(durable_daemon)
    s = repl.session("x")
    waiter = repl.popen("wait", s)
    eventually(lambda: repl.waiters(s) == 1, what="the wait blocks")
    repl.ask({"op": "stop", "session": s})
    _, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 1, err
    assert "reconnect" not in err.decode()


def test_a_wait_rides_out_an_outage_of_its_daemons_redis(tmp_path: Path) -> None:
    """The store's outage, not the daemon's: a ``repl wait`` already blocked keeps waiting
    inside the daemon; one started while Redis is down is answered store_failed, says it
    is reconnecting, and goes on once Redis is back; other commands meanwhile exit 75.
    Redis keeps its data here (AOF, fsync always), so the session is still there."""
    require_redis()
    redis = RedisProc(tmp_path / "redis", appendonly=True)
    group = SharedDaemons(tmp_path / "daemons", redis.url, 1)
    started: list[subprocess.Popen[bytes]] = []  # ended below whatever fails first
    try:
        daemon = group.daemons[0]
        repl = Repl(daemon)
        s = repl.session("o", "before")
        assert repl.ok("wait", s) == "on-message: before\n"

        def looks() -> int:
            (listed,) = repl.ask({"op": "stats", "session": s})
            count: int = listed["sessions"][0]["evaluations"]
            return count

        before = looks()
        blocked = repl.popen("wait", s)
        started.append(blocked)
        # blocked: listed as a waiter, and its first look answered (counted), so the outage
        # meets it blocked, not with that look in flight (which fails with the link, and
        # was this test's flake under load: the wait said "reconnecting")
        eventually(lambda: repl.waiters(s) == 1 and looks() > before, what="the wait blocks")
        redis.kill()
        late = repl.popen("wait", s, "--cursor", "late")  # starts during the outage
        started.append(late)
        down = repl.run("send", s, "lost?")
        assert down.returncode == UNAVAILABLE, down
        assert "redis" in down.stderr and "Traceback" not in down.stderr
        assert late.stderr is not None
        note = late.stderr.readline().decode()
        assert "reconnecting for up to 300 s" in note, note
        redis.start()
        eventually(lambda: repl.run("send", s, "after").returncode == 0, what="Redis is back")
        out, err = blocked.communicate(timeout=30)
        assert blocked.returncode == 0, err
        assert out.decode().splitlines()[-1] == "on-message: after"
        assert err == b""  # the outage was the daemon's to ride out, not the reader's
        out, err = late.communicate(timeout=30)
        assert late.returncode == 0, err
        # a new cursor: it answers with what is there when it is back (perhaps before "after")
        assert out.decode().startswith("on-message: before\n")
        assert err.decode().startswith("repl: reconnected to the daemon at ")
    finally:
        for proc in started:  # a failure above leaves them waiting: the next test's warning
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        group.close()
        redis.stop()
