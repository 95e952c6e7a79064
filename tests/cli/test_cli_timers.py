"""``repl send --in/--at``, ``repl every``, ``repl timers`` and ``repl cancel`` (SPEC §9),
and the same through the Python API, sync and async.

What each prints, piped and as JSON; the usage errors the CLI catches itself
(``--in`` with ``--at``, ``--lines`` with a time) and those the daemon
answers (a duration that does not parse: exit 64; no such timer: exit 1).
"""

from __future__ import annotations

import json

import pytest

from repl_cli import aio, api
from tests.helpers import InProcDaemon, MovedClock, Repl


def test_send_in_prints_the_timer_and_timers_lists_it(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    repl = Repl(inproc)  # a daemon of its own, on a clock that stands still: the due time is exact
    s = repl.session("s")
    timer = repl.ok("send", s, "later\tplease\nthanks", "--in", "1h").strip()
    assert timer.startswith("t-") and len(timer) == 14
    header, row = repl.ok("timers", s).splitlines()
    assert header == "timer\tsession\tdue\tevery\thandler\ttext"
    fields = row.split("\t")
    assert fields[:2] == [timer, s] and fields[3:] == ["", "on-message", "later\\tplease\\nthanks"]
    (listed,) = json.loads(repl.ok("timers", s, "--json"))
    assert listed["text"] == "later\tplease\nthanks" and listed["due"] == fields[2]
    assert (listed["due_ms"], listed["due"]) == (
        clock.ms + 3_600_000,
        clock.at(clock.ms + 3_600_000),
    )


def test_send_at_and_json(repl: Repl, s: str) -> None:
    out = json.loads(repl.ok("send", s, "x", "--at", "2099-01-01T09:00:00+02:00", "--json"))
    assert out["due"] == "2099-01-01T07:00:00.000Z" and out["duplicate"] is False
    assert out["every_ms"] is None and out["seq"] is None


def test_every_defaults_to_on_tick_and_takes_a_first_time(repl: Repl, s: str) -> None:
    repl.ok("every", s, "90m")
    repl.ok("every", s, "2h", "checkpoint", "--handler", "on-check", "--in", "10m")
    rows = json.loads(repl.ok("timers", s, "--json"))
    assert [(t["handler"], t["text"], t["every_ms"]) for t in rows] == [
        ("on-check", "checkpoint", 7_200_000),
        ("on-tick", "", 5_400_000),
    ]
    assert "\t1h30m\t" in repl.ok("timers", s) and "\t2h\t" in repl.ok("timers", s)


def test_a_keyed_every_retried_is_the_same_timer(repl: Repl, s: str) -> None:
    first = repl.ok("every", s, "1h", "--key", "beat").strip()
    assert repl.ok("every", s, "1h", "--key", "beat") == f"{first} duplicate\n"
    assert len(json.loads(repl.ok("timers", s, "--json"))) == 1


def test_cancel_removes_and_then_is_exit_1(repl: Repl, s: str) -> None:
    timer = repl.ok("send", s, "x", "--in", "1h").strip()
    assert repl.ok("cancel", s, timer) == ""
    assert json.loads(repl.ok("timers", s, "--json")) == []
    line = repl.fails(1, "cancel", s, timer)
    assert f"no pending timer '{timer}'" in line and "`repl timers`" in line


@pytest.mark.parametrize(
    ("args", "status", "says"),
    [
        (
            ("send", "S", "x", "--in", "1s", "--at", "2099-01-01T00:00:00Z"),
            64,
            "either --in or --at",
        ),
        (("send", "S", "--lines", "--in", "1s"), 64, "cannot go with --lines"),
        (("every", "S", "1h", "--in", "1s", "--at", "2099-01-01T00:00:00Z"), 64, "either --in"),
        (("send", "S", "x", "--in", "soon"), 64, "duration 'soon'"),
        (("send", "S", "x", "--at", "noon"), 64, "is not RFC 3339"),
        (("every", "S", "100ms"), 64, "under 1 s"),
        (("send", "nosuch", "x", "--in", "1s"), 1, "no session 'nosuch'"),
        (("timers", "nosuch"), 1, "no session 'nosuch'"),
        (("cancel", "nosuch", "t-1"), 1, "no session 'nosuch'"),
    ],
)
def test_bad_timer_arguments_are_one_line_and_schedule_nothing(
    repl: Repl, s: str, args: tuple[str, ...], status: int, says: str
) -> None:
    line = repl.fails(status, *(s if a == "S" else a for a in args))
    assert says in line
    assert json.loads(repl.ok("timers", s, "--json")) == []


def test_the_api_schedules_lists_and_cancels(inproc: InProcDaemon, clock: MovedClock) -> None:
    with api.connect(inproc.addr, inproc.home) as repl:
        repl.start("api-t")
        soon = repl.schedule("api-t", "soon", in_="300ms")
        tick = repl.schedule("api-t", every="1h", key="k")
        assert repl.schedule("api-t", every="1h", key="k").duplicate
        assert [t.timer for t in repl.timers("api-t")] == [soon.timer, tick.timer]
        assert repl.cancel("api-t", tick.timer).every_ms == 3_600_000
        clock.advance(300)
        woken = repl.wait("api-t", cursor="c", timeout=10)
        assert [f.result for b in woken.batches for f in b.firings] == ["soon"]
        with pytest.raises(api.NotFound) as refused:
            repl.cancel("api-t", tick.timer)
        assert refused.value.code == "no_such_timer"


@pytest.mark.anyio
async def test_the_async_api_schedules_lists_and_cancels(inproc: InProcDaemon) -> None:
    async with aio.connect(inproc.addr, inproc.home) as repl:
        await repl.start("aio-t")
        made = await repl.schedule("aio-t", "x", at="2099-01-01T00:00:00Z")
        assert [t.timer for t in await repl.timers()] == [made.timer]
        assert (await repl.cancel("aio-t", made.timer)).text == "x"
        assert await repl.timers("aio-t") == []
