"""Scheduled firings end to end (SPEC §9): the real CLI, on a clock the test moves.

The semantics run against an in-process daemon on a ``MovedClock`` (the
``clock`` fixture): nothing comes due until the test moves the clock, so
each test moves it and checks exactly what fired. A firing ``--in 1s`` is
absent at 999 ms and there once at 1 s, and wakes a blocked ``repl wait``;
timers that came due while the daemon was down fire once when it is back
(a recurring one once for all its missed periods, then on its grid);
``every 1s`` fires once a second until it is cancelled; stopping a session
cancels its timers; a keyed schedule retried makes no second timer.

That nothing fired is seen through a *fence*: a timer due at the same
time, which the daemon's timer task fires in the same turn as everything
else due then. Once the fence has fired, whatever else was due has too.

Two cases run on a real daemon process by the real clock, with no window
of time in any assert: a firing in 1 s fires once, and timers that came
due while the daemon was killed fire once when it is back. Each waits for
the firing itself (with a generous bound) and then counts exactly.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.helpers import Client, DaemonProc, InProcDaemon, MovedClock, Repl, eventually

durable = pytest.mark.parametrize("inproc", ["durable"], indirect=True)


def firings(c: Client, session: str) -> list[dict[str, object]]:
    got: list[dict[str, object]] = c.ok({"op": "read", "session": session, "after": 0})["firings"]
    return got


def results(c: Client, session: str) -> list[object]:
    return [f["result"] for f in firings(c, session)]


def fired(c: Client, session: str, count: int) -> list[object]:
    """The session's results, once it holds at least ``count`` firings."""
    eventually(lambda: len(firings(c, session)) >= count, 30, f"{count} firings in {session}")
    return results(c, session)


def fence(c: Client, clock: MovedClock, session: str = "fence") -> None:
    """Fire a timer due now and wait for it: whatever else is due now has fired by then."""
    c.ok({"op": "start", "session": session, "exist_ok": True})
    count = len(firings(c, session))
    c.ok({"op": "schedule", "session": session, "text": "fence", "at": clock.at(clock.ms)})
    fired(c, session, count + 1)


def stamp_ms(firing: dict[str, object]) -> int:
    ts = str(firing["ts"]).replace("Z", "+00:00")
    return round(datetime.fromisoformat(ts).timestamp() * 1000)


# -- on a clock the test moves --------------------------------------------------


@durable
def test_a_firing_in_1s_is_absent_before_and_there_once_after(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    repl = Repl(inproc)
    repl.ok("start", "inbox")
    timer = repl.ok("send", "inbox", "remind me", "--in", "1s").strip()
    assert timer.startswith("t-")
    listed = json.loads(repl.ok("timers", "inbox", "--json"))
    assert [(t["timer"], t["text"], t["every_ms"], t["due_ms"]) for t in listed] == [
        (timer, "remind me", None, clock.ms + 1000)
    ]
    c = inproc.client()
    clock.advance(999)
    fence(c, clock)
    assert repl.ok("read", "inbox", "--after", "0") == ""
    # a monitor blocked on the session is woken by the timer's firing
    monitor = repl.popen("wait", "inbox", "--timeout", "30")
    eventually(lambda: repl.waiters("inbox") == 1, what="the wait to block")
    clock.advance(1)
    out, err = monitor.communicate(timeout=30)
    assert (monitor.returncode, out, err) == (0, b"on-message: remind me\n", b"")
    (firing,) = firings(c, "inbox")
    assert firing["result"] == "remind me"
    assert stamp_ms(firing) == listed[0]["due_ms"]  # stamped when it came due, not before
    assert repl.ok("timers", "inbox") == "timer\tsession\tdue\tevery\thandler\ttext\n"
    assert json.loads(repl.ok("timers", "--json")) == []
    clock.advance(60_000)
    fence(c, clock)
    assert len(firings(c, "inbox")) == 1


@durable
def test_timers_due_while_the_daemon_was_down_fire_once_when_it_is_back(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "s"})
    once = c.ok({"op": "schedule", "session": "s", "text": "once", "in": "1s"})
    every = c.ok({"op": "schedule", "session": "s", "text": "tick", "every": "1s"})
    assert (every["every_ms"], every["duplicate"], every["due_ms"]) == (
        1000,
        False,
        clock.ms + 1000,
    )
    inproc.close_clients()
    inproc.stop()
    clock.advance(4500)  # while it is down: the one-shot came due, the recurring one four times
    inproc.start()
    c = inproc.client()
    # on its first turn, each once (both were due at the same millisecond: in either order)
    assert sorted(str(r) for r in fired(c, "s", 2)) == ["once", "tick"]
    fence(c, clock)
    assert sorted(str(r) for r in results(c, "s")) == ["once", "tick"]
    # back on its grid: the next due time is the first after now, a whole period on
    (left,) = c.ok({"op": "timers", "session": "s"})["timers"]
    assert (left["timer"], left["due_ms"]) == (every["timer"], every["due_ms"] + 4000)
    assert once["timer"] != left["timer"]
    clock.advance(500)
    assert sorted(str(r) for r in fired(c, "s", 3)) == ["once", "tick", "tick"]
    (left,) = c.ok({"op": "timers", "session": "s"})["timers"]
    assert left["due_ms"] == every["due_ms"] + 5000
    inproc.close_clients()
    inproc.stop()
    inproc.start()  # a clean restart, the clock where it was: nothing fires twice
    c = inproc.client()
    fence(c, clock)
    assert sorted(str(r) for r in results(c, "s")) == ["once", "tick", "tick"]


def test_every_second_fires_once_a_second_until_cancelled(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    repl = Repl(inproc)
    repl.ok("start", "beat")
    timer = repl.ok("every", "beat", "1s", "alive").strip()
    c = inproc.client()
    started = clock.ms
    for n in range(1, 4):
        clock.advance(1000)
        assert len(fired(c, "beat", n)) == n
    fence(c, clock)
    ticks = firings(c, "beat")
    assert {(f["handler"], f["result"]) for f in ticks} == {("on-tick", "alive")}
    assert [stamp_ms(f) for f in ticks] == [started + 1000, started + 2000, started + 3000]
    repl.ok("cancel", "beat", timer)
    clock.advance(2000)
    fence(c, clock)
    assert len(firings(c, "beat")) == 3
    assert repl.fails(1, "cancel", "beat", timer).startswith(
        f"repl: session 'beat' has no pending timer '{timer}'"
    )


def test_stopping_a_session_cancels_its_timers(inproc: InProcDaemon, clock: MovedClock) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "s"})
    c.ok({"op": "schedule", "session": "s", "text": "never", "in": "500ms"})
    c.ok({"op": "stop", "session": "s"})
    c.ok({"op": "start", "session": "s"})
    clock.advance(1000)
    fence(c, clock, "s")  # in the same session, due after the stopped one would have been
    assert results(c, "s") == ["fence"]
    assert c.ok({"op": "timers"})["timers"] == []


def test_a_keyed_schedule_retried_makes_no_second_timer(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    repl = Repl(inproc)
    repl.ok("start", "k")
    first = repl.ok("send", "k", "hello", "--in", "3s", "--key", "greet").strip()
    assert repl.ok("send", "k", "hello", "--in", "3s", "--key", "greet") == f"{first} duplicate\n"
    clock.advance(3000)
    assert repl.ok("wait", "k", "--timeout", "30") == "on-message: hello\n"  # it fired
    # fired: the retry still finds it, and says which firing it was
    again = json.loads(repl.ok("send", "k", "hello", "--in", "500ms", "--key", "greet", "--json"))
    assert (again["timer"], again["duplicate"], again["seq"], again["due"]) == (
        first,
        True,
        1,
        None,
    )
    assert json.loads(repl.ok("timers", "k", "--json")) == []  # nothing more to fire
    clock.advance(1000)
    fence(inproc.client(), clock)
    assert repl.ok("read", "k", "--after", "0") == "on-message: hello\n"


# -- on a real daemon, by the real clock ------------------------------------------


def test_on_a_real_daemon_a_firing_in_1s_fires_once(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0", "--idle-timeout", "30")
    try:
        repl = Repl(d)
        repl.ok("start", "inbox")
        asked = time.time() * 1000
        timer = repl.ok("send", "inbox", "remind me", "--in", "1s").strip()
        # listed, unless it fired already: a loaded machine can take a second to start the
        # CLI again (no bound on the time is asserted, only the order of things)
        listed = json.loads(repl.ok("timers", "inbox", "--json"))
        for row in listed:
            assert row["timer"] == timer and row["due_ms"] >= asked + 1000
        assert repl.ok("wait", "inbox", "--timeout", "30") == "on-message: remind me\n"
        # fired and gone in one step: nothing is left that could fire it again
        assert json.loads(repl.ok("timers", "--json")) == []
        (firing,) = firings(d.client(), "inbox")
        assert firing["result"] == "remind me" and stamp_ms(firing) >= asked + 1000
    finally:
        d.close_clients()
        d.stop()


def test_on_a_real_daemon_timers_due_while_it_was_killed_fire_once_when_it_is_back(
    tmp_path: Path,
) -> None:
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0", "--idle-timeout", "30")
    try:
        c = d.client()
        c.ok({"op": "start", "session": "s"})
        c.ok({"op": "schedule", "session": "s", "text": "once", "in": "1s"})
        hourly = c.ok({"op": "schedule", "session": "s", "text": "tick", "every": "1h", "in": "1s"})
        c.close()
        d.kill()
        # asleep until both are due, however long that takes: a wait for the time, no bound
        time.sleep(max(0.0, hourly["due_ms"] / 1000 - time.time()) + 0.05)
        d.start(d.port)
        c = d.client()
        assert sorted(str(r) for r in fired(c, "s", 2)) == ["once", "tick"]
        (left,) = c.ok({"op": "timers", "session": "s"})["timers"]
        assert (left["timer"], left["due_ms"]) == (hourly["timer"], hourly["due_ms"] + 3_600_000)
        c.ok({"op": "start", "session": "fence"})
        c.ok({"op": "schedule", "session": "fence", "text": "x", "at": "2020-01-01T00:00:00Z"})
        fired(c, "fence", 1)  # its turn came: the one-shot was not left to fire again
        assert sorted(str(r) for r in results(c, "s")) == ["once", "tick"]
        c.close()
        d.restart()  # a clean restart fires nothing twice
        c = d.client()
        c.ok({"op": "schedule", "session": "fence", "text": "y", "at": "2020-01-01T00:00:00Z"})
        fired(c, "fence", 2)
        assert sorted(str(r) for r in results(c, "s")) == ["once", "tick"]
    finally:
        d.close_clients()
        d.stop()
