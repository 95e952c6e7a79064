"""The timer ops over the wire (SPEC §9): each refusal is one clear line and creates nothing.

Durations, times and intervals that do not parse, an interval under a
second, ``in`` with ``at``, no time at all, a bad handler or key, a missing
session: each answers its code, and ``timers`` shows nothing made. A time
in the past is not refused: it fires at once. A session holds at most
1,024 timers; ``cancel`` of a timer that is not pending is
``no_such_timer``. On the memory store and on SQLite alike, on a clock
that stands still (``MovedClock``): due times are exact, and nothing the
test made comes due while it looks.
"""

from __future__ import annotations

import pytest

from session.rules import MAX_TIMERS
from tests.helpers import Client, InProcDaemon, MovedClock, eventually, pipelined

both_stores = pytest.mark.parametrize("inproc", ["memory", "durable"], indirect=True)


@pytest.fixture
def c(inproc: InProcDaemon, clock: MovedClock) -> Client:
    client = inproc.client()
    client.ok({"op": "start", "session": "s"})
    return client


@both_stores
@pytest.mark.parametrize(
    ("fields", "code", "says"),
    [
        ({"in": "5 m"}, "bad_time", "duration '5 m' is not a number and a unit"),
        ({"in": "0s"}, "bad_time", "is not above zero"),
        ({"in": "1.5s"}, "bad_time", "for example 250ms, 90s, 5m or 1h30m"),
        ({"at": "tomorrow at nine"}, "bad_time", "is not RFC 3339"),
        ({"at": "2026-13-01T00:00:00Z"}, "bad_time", "is not RFC 3339"),
        ({"at": "99999-01-01T00:00:00Z"}, "bad_time", "is not RFC 3339"),
        ({"in": "99999999d"}, "bad_time", "not between 1970 and the end of 9999"),
        ({"every": "500ms"}, "bad_time", "interval '500ms' is under 1 s"),
        ({"every": "99999999999d"}, "bad_time", "longer than the calendar goes"),
        ({"in": "1" + "0" * 4400 + "s"}, "bad_time", "is not a number and a unit"),
        ({"every": "often"}, "bad_time", "duration 'often'"),
        ({"in": "1s", "at": "2099-01-01T00:00:00Z"}, "bad_request", "either in or at"),
        ({}, "bad_request", "needs in, at or every"),
        ({"in": "1m", "handler": "two words"}, "bad_handler", "handler name"),
        ({"in": "1m", "key": ""}, "bad_key", "dedup key"),
        ({"in": "1m", "session": "nope"}, "no_such_session", "no session 'nope'"),
        ({"in": "1m", "session": "bad id"}, "bad_session_id", "session id 'bad id'"),
    ],
)
def test_a_bad_schedule_is_refused_with_one_line_and_makes_nothing(
    c: Client, fields: dict[str, str], code: str, says: str
) -> None:
    answer = c.call({"op": "schedule", "session": "s", "text": "x", **fields})
    assert (answer["ok"], answer["code"]) == (False, code), answer
    assert says in answer["message"] and "\n" not in answer["message"]
    assert c.ok({"op": "timers"})["timers"] == []
    assert c.ok({"op": "read", "session": "s", "after": 0})["firings"] == []


@both_stores
def test_a_time_in_the_past_fires_at_once(c: Client) -> None:
    answer = c.ok({"op": "schedule", "session": "s", "text": "late", "at": "2020-01-01T00:00:00Z"})
    assert answer["due"] == "2020-01-01T00:00:00.000Z"
    eventually(lambda: c.ok({"op": "read", "session": "s", "after": 0})["firings"] != [])
    (firing,) = c.ok({"op": "read", "session": "s", "after": 0})["firings"]
    assert (firing["handler"], firing["result"]) == ("on-message", "late")
    assert c.ok({"op": "timers"})["timers"] == []


@both_stores
def test_a_session_holds_at_most_its_limit_of_timers(c: Client) -> None:
    requests = [
        {"op": "schedule", "session": "s", "text": str(i), "in": "1h"} for i in range(MAX_TIMERS)
    ]
    assert all(a["ok"] for a in pipelined(c, requests))
    refused = c.call({"op": "schedule", "session": "s", "text": "one more", "in": "1h"})
    assert refused["code"] == "too_many" and "1,024 pending timers" in refused["message"]
    listed = c.ok({"op": "timers", "session": "s"})["timers"]
    assert len(listed) == MAX_TIMERS
    c.ok({"op": "cancel", "session": "s", "timer": listed[0]["timer"]})
    assert c.ok({"op": "schedule", "session": "s", "text": "now it fits", "in": "1h"})["ok"]


@both_stores
def test_timers_list_soonest_first_across_sessions_and_cancel_answers_what_it_removed(
    c: Client, clock: MovedClock
) -> None:
    c.ok({"op": "start", "session": "r"})
    late = c.ok({"op": "schedule", "session": "s", "text": "late", "in": "2h"})
    soon = c.ok({"op": "schedule", "session": "r", "text": "soon", "in": "1h", "handler": "h"})
    tick = c.ok({"op": "schedule", "session": "s", "every": "90m", "text": "t"})
    listed = c.ok({"op": "timers"})["timers"]
    assert [t["timer"] for t in listed] == [soon["timer"], tick["timer"], late["timer"]]
    assert listed[0]["handler"] == "h" and listed[1]["handler"] == "on-tick"
    assert listed[1]["every_ms"] == 90 * 60_000
    assert [t["due_ms"] for t in listed] == [clock.ms + m * 60_000 for m in (60, 90, 120)]
    assert [t["timer"] for t in c.ok({"op": "timers", "session": "r"})["timers"]] == [soon["timer"]]
    # a timer is its session's: cancelling it through another session finds nothing
    wrong = c.call({"op": "cancel", "session": "s", "timer": soon["timer"]})
    assert wrong["code"] == "no_such_timer"
    gone = c.ok({"op": "cancel", "session": "r", "timer": soon["timer"]})["timer"]
    assert (gone["timer"], gone["text"]) == (soon["timer"], "soon")
    assert c.call({"op": "cancel", "session": "r", "timer": soon["timer"]})["code"] == (
        "no_such_timer"
    )
    assert c.call({"op": "timers", "session": "nope"})["code"] == "no_such_session"
