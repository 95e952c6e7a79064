"""Timers on a shared store (SPEC §9): several daemons, each due time fired exactly once.

Three in-process daemons share one Redis (for the first test, in turn a
3-primary cluster and one with replicas) and one ``MovedClock``, as daemons
sharing a store share the wall clock: nothing comes due until the test
moves it. 1,000 timers due at the same millisecond give exactly 1,000
firings, none twice, none missed, whichever daemons claimed them; a
recurring timer fires once a period however many daemons share it, each
firing stamped with its own due time; a timer scheduled on one daemon is
listed and cancelled on another.

That nothing more fired is seen once the daemons are stopped (nothing can
fire after that), or through a fence: a timer due at the same time in the
same session, fired in the same claim of its partition.

One case runs on real daemon processes by the real clock: a timer
scheduled on a daemon that is then killed (SIGKILL) fires from the other,
once. It waits for the firing itself, with a generous bound, and asserts
no window of time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from repl_daemon.config import Limits
from tests.helpers import (
    Client,
    InProcDaemon,
    MovedClock,
    RedisClusterProcs,
    RedisProc,
    SharedDaemons,
    daemon_config,
    eventually,
    store_url,
)

AnyRedis = RedisProc | RedisClusterProcs
SESSIONS = [f"s{i}" for i in range(4)]


@contextlib.contextmanager
def sharing(tmp: Path, url: str, clock: MovedClock, count: int = 3) -> Iterator[list[InProcDaemon]]:
    """``count`` in-process daemons on the store at ``url``, all on ``clock``; stopped after."""
    daemons: list[InProcDaemon] = []
    try:
        for i in range(count):
            config = daemon_config(tmp / f"d{i}", store_url=url, limits=Limits(idle_timeout=30))
            daemons.append(InProcDaemon(config, clock))
        yield daemons
    finally:
        stop_all(daemons)


def stop_all(daemons: list[InProcDaemon]) -> None:
    """Stop every daemon still running: from then on nothing fires."""
    for d in daemons:
        d.close_clients()
        if d.started:
            d.stop()


def all_firings(c: Client, sessions: list[str] = SESSIONS) -> list[tuple[str, str]]:
    """(session, text) of every firing of every session."""
    got = []
    for session in sessions:
        answer = c.ok({"op": "read", "session": session, "after": 0})
        assert answer["lost"] == 0
        got += [(session, f["result"]) for f in answer["firings"]]
    return got


def fired_by(daemons: list[InProcDaemon]) -> list[int]:
    return [d.client().ok({"op": "stats"})["daemon"]["firings"] for d in daemons]


def firings_at_least(c: Client, session: str, count: int) -> None:
    eventually(lambda: len(all_firings(c, [session])) >= count, 30, f"{count} firings")


def test_a_thousand_timers_due_in_one_millisecond_fire_exactly_once(
    redis_any: AnyRedis, clock: MovedClock, tmp_path: Path
) -> None:
    with sharing(tmp_path, store_url(redis_any), clock) as three:
        c = three[0].client()
        for session in SESSIONS:
            c.ok({"op": "start", "session": session, "buffer": 1000})
        due = clock.at(clock.ms + 3000)
        requests = [
            {"op": "schedule", "session": SESSIONS[i % 4], "text": f"t{i}", "at": due}
            for i in range(1000)
        ]
        # scheduled through all three daemons at once (each pipeline's answers read after)
        clients = [d.client() for d in three]
        for i, client in enumerate(clients):
            client.send_raw(b"".join(_line(r) for r in requests[i::3]))
        answers = [client.recv() for i, client in enumerate(clients) for _ in requests[i::3]]
        assert all(a["ok"] for a in answers), [a for a in answers if not a["ok"]][:3]
        assert len(c.ok({"op": "timers"})["timers"]) == 1000  # the clock stands: none is due
        assert all_firings(c) == []
        clock.advance(3000)
        eventually(lambda: len(all_firings(c)) >= 1000, 30, "1,000 firings")
        eventually(lambda: sum(fired_by(three)) >= 1000, 10, "every daemon's count")
        counts = fired_by(three)
        stop_all(three)  # nothing fires from here: whatever fired twice is there to be counted
        three[0].start()
        c = three[0].client()
        got = all_firings(c)
        assert len(got) == 1000
        assert sorted(text for _, text in got) == sorted(f"t{i}" for i in range(1000))
        assert c.ok({"op": "timers"})["timers"] == []
        assert sum(counts) == 1000, counts  # however the daemons shared the work


def _line(request: dict[str, object]) -> bytes:
    return json.dumps(request).encode() + b"\n"


def test_a_recurring_timer_shared_by_three_daemons_fires_once_a_period(
    redis_single: RedisProc, clock: MovedClock, tmp_path: Path
) -> None:
    redis_single.flush()
    with sharing(tmp_path, redis_single.url, clock) as three:
        c = three[2].client()
        c.ok({"op": "start", "session": "s1"})
        started = clock.ms
        beat = {"kind": "beat", "reply-to": "s1"}  # its firings carry them (SPEC §15)
        tick = c.ok(
            {"op": "schedule", "session": "s1", "every": "1s", "text": "beat", "tags": beat}
        )
        for n in range(1, 5):
            clock.advance(1000)
            firings_at_least(c, "s1", n)
        # scheduled on one daemon, listed and cancelled on another
        other = three[0].client()
        (listed,) = other.ok({"op": "timers"})["timers"]
        assert (listed["timer"], listed["due_ms"]) == (tick["timer"], started + 5000)
        assert listed["tags"] == beat
        other.ok({"op": "cancel", "session": "s1", "timer": tick["timer"]})
        clock.advance(2000)
        c.ok({"op": "schedule", "session": "s1", "text": "fence", "at": clock.at(clock.ms)})
        firings_at_least(c, "s1", 5)  # the fence
        stop_all(three)
        three[1].start()
        again = three[1].client()
        got = again.ok({"op": "read", "session": "s1", "after": 0})["firings"]
        beats = again.ok({"op": "read", "session": "s1", "match": {"tags": {"kind": "beat"}}})
    # one firing a period, each stamped with its own due time and carrying the timer's
    # tags, none after the cancel
    assert [(f["result"], f["ts"], f["tags"]) for f in got] == [
        *(("beat", clock.at(started + k * 1000), beat) for k in range(1, 5)),
        ("fence", clock.at(clock.ms), {}),
    ]
    assert [f["seq"] for f in beats["firings"]] == [1, 2, 3, 4] and beats["next"] == 5


def test_on_real_daemons_a_timer_fires_when_the_daemon_that_made_it_is_killed(
    redis_any: AnyRedis, tmp_path: Path
) -> None:
    two = SharedDaemons(tmp_path, store_url(redis_any), 2)
    try:
        a, b = two.client(0), two.client(1)
        a.ok({"op": "start", "session": "s0"})
        a.ok({"op": "schedule", "session": "s0", "text": "orphan", "in": "1500ms"})
        two.daemons[0].close_clients()
        two.daemons[0].kill()
        b.send({"op": "wait", "sessions": ["s0"], "id": "w", "timeout_ms": 30_000})
        woken = b.recv()
        assert woken["id"] == "w" and not woken["timed_out"]
        assert [f["result"] for f in woken["batches"][0]["firings"]] == ["orphan"]
        # fired and gone in one step: nothing is left that could fire it again
        assert b.ok({"op": "timers"})["timers"] == []
        firings = b.ok({"op": "read", "session": "s0", "after": 0})["firings"]
        assert [f["result"] for f in firings] == ["orphan"]
    finally:
        two.close()
