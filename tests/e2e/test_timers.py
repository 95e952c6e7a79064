"""Scheduled firings end to end (SPEC §9): the real daemon, the real CLI, real clocks.

A firing ``--in 1s`` is absent before and there once after, and wakes a
blocked ``repl wait``; a timer that came due while the daemon was killed
fires once when it is back (a recurring one once for all its missed
periods, then on its grid); ``every 1s`` fires about once a second until it
is cancelled; stopping a session cancels its timers. Bounds on counts are
generous: the machine may be slow, but a duplicate or a loss is never
within them.

Each scenario mostly waits on real clocks, with a daemon of its own, so the
scenarios of the selected tests run side by side (``SideBySide``, started
at once) and each test waits for its own: it fails as it would have failed
running the scenario itself. The firing in 1 s runs alone (no scenario
beside it), as it must read and list before its second is over.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.helpers import Client, DaemonProc, Repl, SideBySide


def firings(c: Client, session: str) -> list[dict[str, object]]:
    got: list[dict[str, object]] = c.ok({"op": "read", "session": session, "after": 0})["firings"]
    return got


@contextlib.contextmanager
def durable(tmp: Path) -> Iterator[DaemonProc]:
    """A daemon process on the default (SQLite) store, settle 0: the durable_daemon fixture's."""
    d = DaemonProc(tmp / "home", "--settle-ms", "0", "--idle-timeout", "5")
    try:
        yield d
    finally:
        d.close_clients()
        d.stop()


@contextlib.contextmanager
def memory(tmp: Path) -> Iterator[DaemonProc]:
    """A memory daemon process with settle 0: the daemon fixture's."""
    d = DaemonProc(tmp / "home", "--memory", "--settle-ms", "0", "--idle-timeout", "5")
    try:
        yield d
    finally:
        d.close_clients()
        d.stop()


def firing_in_1s(tmp: Path) -> None:
    with durable(tmp) as durable_daemon:
        repl = Repl(durable_daemon)
        repl.ok("start", "inbox")
        timer = repl.ok("send", "inbox", "remind me", "--in", "1s").strip()
        assert timer.startswith("t-")
        assert repl.ok("read", "inbox", "--after", "0") == ""
        listed = json.loads(repl.ok("timers", "inbox", "--json"))
        assert [(t["timer"], t["text"], t["every_ms"]) for t in listed] == [
            (timer, "remind me", None)
        ]
        # a monitor blocked on the session is woken by the timer's firing
        assert repl.ok("wait", "inbox", "--timeout", "10") == "on-message: remind me\n"
        time.sleep(0.3)
        c = durable_daemon.client()
        (fired,) = firings(c, "inbox")
        assert fired["result"] == "remind me"
        # not before it was due: the firing's own stamp is at or after the due time
        stamp = datetime.fromisoformat(str(fired["ts"]).replace("Z", "+00:00")).timestamp() * 1000
        assert stamp >= listed[0]["due_ms"]
        assert repl.ok("timers", "inbox") == "timer\tsession\tdue\tevery\thandler\ttext\n"
        assert json.loads(repl.ok("timers", "--json")) == []


def killed_across_due_times(tmp: Path) -> None:
    with durable(tmp) as durable_daemon:
        c = durable_daemon.client()
        c.ok({"op": "start", "session": "s"})
        c.ok({"op": "schedule", "session": "s", "text": "once", "in": "1s"})
        every = c.ok({"op": "schedule", "session": "s", "text": "tick", "every": "1s"})
        assert (every["every_ms"], every["duplicate"]) == (1000, False)
        c.close()
        durable_daemon.kill()
        time.sleep(4.5)  # the one-shot came due, and the recurring one four times
        back = time.time() * 1000
        durable_daemon.start(durable_daemon.port)
        c = durable_daemon.client()
        time.sleep(0.5)  # it fires on its first turn; give a slow machine a moment
        got = [f["result"] for f in firings(c, "s")]
        read = time.time() * 1000
        assert got.count("once") == 1
        # the four missed periods fire once; then the grid goes on, so a period that came due
        # since the restart may have fired too (and none more)
        since = sum(1 for k in range(20) if back < every["due_ms"] + k * 1000 <= read)
        assert 1 <= got.count("tick") <= 1 + since, (got, since)
        (left,) = c.ok({"op": "timers", "session": "s"})["timers"]
        # back on its grid: the next due time is a whole number of seconds after the first
        assert (left["due_ms"] - every["due_ms"]) % 1000 == 0
        assert left["due_ms"] > time.time() * 1000 - 1000
        c.close()
        durable_daemon.restart()  # a clean restart fires nothing twice
        c = durable_daemon.client()
        again = [f["result"] for f in firings(c, "s")]
        assert again[: len(got)] == got and "once" not in again[len(got) :]


def every_second(tmp: Path) -> None:
    with memory(tmp) as daemon:
        repl = Repl(daemon)
        repl.ok("start", "beat")
        timer = repl.ok("every", "beat", "1s", "alive").strip()
        time.sleep(3.6)
        c = daemon.client()
        ticks = firings(c, "beat")
        assert 2 <= len(ticks) <= 5, ticks
        assert {(f["handler"], f["result"]) for f in ticks} == {("on-tick", "alive")}
        repl.ok("cancel", "beat", timer)
        count = len(firings(c, "beat"))
        time.sleep(1.6)
        assert len(firings(c, "beat")) == count
        assert repl.fails(1, "cancel", "beat", timer).startswith(
            f"repl: session 'beat' has no pending timer '{timer}'"
        )


def stop_cancels(tmp: Path) -> None:
    with memory(tmp) as daemon:
        c = daemon.client()
        c.ok({"op": "start", "session": "s"})
        c.ok({"op": "schedule", "session": "s", "text": "never", "in": "500ms"})
        c.ok({"op": "stop", "session": "s"})
        c.ok({"op": "start", "session": "s"})
        time.sleep(1.0)
        assert firings(c, "s") == []
        assert c.ok({"op": "timers"})["timers"] == []


def keyed_retry(tmp: Path) -> None:
    with memory(tmp) as daemon:
        repl = Repl(daemon)
        repl.ok("start", "k")
        # the retry comes well within the 3 s, however loaded the machine
        first = repl.ok("send", "k", "hello", "--in", "3s", "--key", "greet").strip()
        assert (
            repl.ok("send", "k", "hello", "--in", "3s", "--key", "greet") == f"{first} duplicate\n"
        )
        assert repl.ok("wait", "k", "--timeout", "30") == "on-message: hello\n"  # it fired
        # fired: the retry still finds it, and says which firing it was
        again = json.loads(
            repl.ok("send", "k", "hello", "--in", "500ms", "--key", "greet", "--json")
        )
        assert (again["timer"], again["duplicate"], again["seq"], again["due"]) == (
            first,
            True,
            1,
            None,
        )
        assert json.loads(repl.ok("timers", "k", "--json")) == []  # nothing more to fire
        assert repl.ok("read", "k", "--after", "0") == "on-message: hello\n"


#: each test's scenario, run side by side (the firing in 1 s runs alone)
SCENARIOS: dict[str, Callable[[Path], None]] = {
    "test_timers_due_while_the_daemon_was_killed_fire_once_when_it_is_back": (
        killed_across_due_times
    ),
    "test_every_second_fires_about_once_a_second_until_cancelled": every_second,
    "test_stopping_a_session_cancels_its_timers": stop_cancels,
    "test_a_keyed_schedule_retried_makes_no_second_timer": keyed_retry,
}


class Scenarios:
    """The scenarios of the module's selected tests, started side by side when the first of
    those tests asks; ``close`` waits for every one started."""

    def __init__(self, selected: set[str], tmp: pytest.TempPathFactory) -> None:
        self.selected, self.tmp = selected, tmp
        self.runs: SideBySide | None = None

    def result(self, name: str) -> None:
        if self.runs is None:
            self.runs = SideBySide(
                {
                    test: functools.partial(run, self.tmp.mktemp(run.__name__))
                    for test, run in SCENARIOS.items()
                    if test in self.selected
                }
            )
        self.runs.result(name)

    def close(self) -> None:
        if self.runs is not None:
            self.runs.close()


@pytest.fixture(scope="module")
def scenarios(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenarios]:
    selected = {
        item.name
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    }
    runs = Scenarios(selected, tmp_path_factory)
    yield runs
    runs.close()


@pytest.fixture
def scenario(request: pytest.FixtureRequest, scenarios: Scenarios) -> Callable[[], None]:
    """Wait for this test's scenario: what it raised is raised here."""
    return functools.partial(scenarios.result, request.node.name)


def test_a_firing_in_1s_is_absent_before_and_there_once_after(
    scenarios: Scenarios, tmp_path: Path
) -> None:
    scenarios.close()  # alone: nothing runs beside its second
    firing_in_1s(tmp_path)


def test_timers_due_while_the_daemon_was_killed_fire_once_when_it_is_back(
    scenario: Callable[[], None],
) -> None:
    scenario()


def test_every_second_fires_about_once_a_second_until_cancelled(
    scenario: Callable[[], None],
) -> None:
    scenario()


def test_stopping_a_session_cancels_its_timers(scenario: Callable[[], None]) -> None:
    scenario()


def test_a_keyed_schedule_retried_makes_no_second_timer(scenario: Callable[[], None]) -> None:
    scenario()
