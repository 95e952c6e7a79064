"""Timers on a shared store (SPEC §9): three daemons, each due time fired exactly once.

Daemon processes share one Redis (and, for the first two tests, in turn a
3-primary cluster and one with replicas): 1,000 timers due in the same second give exactly 1,000
firings, none twice, none missed, whichever daemons claimed them; a timer
scheduled on a daemon that is then killed fires on time from the others;
a recurring timer fires once a period however many daemons share it; a
timer scheduled on one daemon is listed and cancelled on another.

The first two tests run once a kind of Redis, and each kind has a store and
three daemons of its own: a test's runs on the three kinds, which mostly
wait for due times, go side by side (``Runs``), and each test waits for its
kind's run.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from tests.helpers import (
    REDIS_KINDS,
    Client,
    RedisClusterProcs,
    RedisProc,
    SharedDaemons,
    SideBySide,
    eventually,
    pipelined,
    store_url,
)

AnyRedis = RedisProc | RedisClusterProcs
SESSIONS = [f"s{i}" for i in range(4)]


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SharedDaemons]]:
    """Three daemons a store URL, started on first use and shared by the module's tests."""
    made: dict[str, SharedDaemons] = {}
    yield made
    for group in made.values():
        group.close()


@contextlib.contextmanager
def group_on(
    groups: dict[str, SharedDaemons], tmp: pytest.TempPathFactory, url: str
) -> Iterator[SharedDaemons]:
    """The module's three daemons on ``url`` (emptied by the caller), each running: one an
    earlier test killed is started again on its port. The test's clients closed after it."""
    if url not in groups:
        groups[url] = SharedDaemons(tmp.mktemp("timers"), url, 3)
    group = groups[url]
    for d in group.daemons:
        if d.proc is not None and d.proc.poll() is not None:
            d.start(d.port)
    try:
        yield group
    finally:
        for d in group.daemons:
            d.close_clients()


#: the session's store of each kind of Redis (tests/conftest.py)
STORES = {
    "single": "redis_single",
    "cluster": "redis_cluster",
    "cluster+replicas": "redis_cluster_replicated",
}
Run = Callable[[SharedDaemons], None]


class Runs:
    """A test's run on each kind of Redis, side by side: all of them start when the first of
    its tests asks (for the kinds selected), each on its kind's emptied store and daemons,
    once any other test's runs are over (they share the daemons). ``result`` waits for one
    kind's run and raises what it raised."""

    def __init__(
        self,
        request: pytest.FixtureRequest,
        groups: dict[str, SharedDaemons],
        tmp: pytest.TempPathFactory,
    ) -> None:
        self.request, self.groups, self.tmp = request, groups, tmp
        self.started: dict[str, SideBySide] = {}

    def result(self, run: Run, kind: str) -> None:
        name = run.__name__
        if name not in self.started:
            self.close()
            kinds = [
                str(item.callspec.params["kind"])
                for item in self.request.session.items
                if isinstance(item, pytest.Function)
                and item.originalname == f"test_{name}"
                and item.module is self.request.module
            ]
            servers = {k: self.request.getfixturevalue(STORES[k]) for k in kinds}
            self.started[name] = SideBySide(
                {k: functools.partial(self._on, run, servers[k]) for k in kinds}
            )
        self.started[name].result(kind)

    def _on(self, run: Run, server: AnyRedis) -> None:
        server.flush()
        with group_on(self.groups, self.tmp, store_url(server)) as group:
            run(group)

    def close(self) -> None:
        for runs in self.started.values():
            runs.close()


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest,
    groups: dict[str, SharedDaemons],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Runs]:
    side_by_side = Runs(request, groups, tmp_path_factory)
    yield side_by_side
    side_by_side.close()


@pytest.fixture
def three_on_one(
    groups: dict[str, SharedDaemons],
    tmp_path_factory: pytest.TempPathFactory,
    redis_single: RedisProc,
    runs: Runs,
) -> Iterator[SharedDaemons]:
    """Three daemons on one redis-server (emptied, once no run is left on it): for what does
    not depend on the kind of Redis (the script that fires is the same on each,
    tests/stores/test_redis_differential.py)."""
    runs.close()
    redis_single.flush()
    with group_on(groups, tmp_path_factory, redis_single.url) as group:
        yield group


def all_firings(c: Client) -> list[tuple[str, str]]:
    """(session, text) of every firing of every session."""
    got = []
    for session in SESSIONS:
        answer = c.ok({"op": "read", "session": session, "after": 0})
        assert answer["lost"] == 0
        got += [(session, f["result"]) for f in answer["firings"]]
    return got


def fired_by(daemons: SharedDaemons) -> list[int]:
    return [daemons.client(i).ok({"op": "stats"})["daemon"]["firings"] for i in range(3)]


def a_thousand_timers_due_in_one_second_fire_exactly_once(three: SharedDaemons) -> None:
    before = fired_by(three)  # the module's daemons may have fired timers of earlier tests
    c = three.client(0)
    for session in SESSIONS:
        c.ok({"op": "start", "session": session, "buffer": 1000})
    # due 3 s on (to the millisecond): after all are scheduled and listed, on a slow machine too
    due = datetime.fromtimestamp(time.time() + 3, UTC).isoformat(timespec="milliseconds")
    due = due.replace("+00:00", "Z")
    requests = [
        {"op": "schedule", "session": SESSIONS[i % 4], "text": f"t{i}", "at": due}
        for i in range(1000)
    ]
    # scheduled through all three daemons at once
    answers = pipelined(c, requests[0::3])
    answers += pipelined(three.client(1), requests[1::3])
    answers += pipelined(three.client(2), requests[2::3])
    assert all(a["ok"] for a in answers), [a for a in answers if not a["ok"]][:3]
    assert len(c.ok({"op": "timers"})["timers"]) == 1000

    def all_fired() -> bool:
        return len(all_firings(c)) >= 1000

    eventually(all_fired, timeout=30)
    time.sleep(1.0)  # a duplicate would come now
    got = all_firings(c)
    assert len(got) == 1000
    assert sorted(text for _, text in got) == sorted(f"t{i}" for i in range(1000))
    assert c.ok({"op": "timers"})["timers"] == []
    counts = [n - was for n, was in zip(fired_by(three), before, strict=True)]
    assert sum(counts) == 1000, counts  # however the daemons shared the work


@pytest.mark.parametrize("kind", REDIS_KINDS)
def test_a_thousand_timers_due_in_one_second_fire_exactly_once(runs: Runs, kind: str) -> None:
    runs.result(a_thousand_timers_due_in_one_second_fire_exactly_once, kind)


def a_timer_fires_on_time_when_the_daemon_that_made_it_is_killed(three: SharedDaemons) -> None:
    a, b = three.client(0), three.client(1)
    a.ok({"op": "start", "session": "s0"})
    a.ok({"op": "schedule", "session": "s0", "text": "orphan", "in": "1500ms"})
    three.daemons[0].close_clients()
    three.daemons[0].kill()
    b.send({"op": "wait", "sessions": ["s0"], "id": "w", "timeout_ms": 8000})
    woken = b.recv()
    assert woken["id"] == "w" and not woken["timed_out"]
    assert [f["result"] for f in woken["batches"][0]["firings"]] == ["orphan"]
    time.sleep(0.5)
    assert [f["result"] for f in b.ok({"op": "read", "session": "s0", "after": 0})["firings"]] == [
        "orphan"
    ]


@pytest.mark.parametrize("kind", REDIS_KINDS)
def test_a_timer_fires_on_time_when_the_daemon_that_made_it_is_killed(
    runs: Runs, kind: str
) -> None:
    runs.result(a_timer_fires_on_time_when_the_daemon_that_made_it_is_killed, kind)


def test_a_recurring_timer_shared_by_three_daemons_fires_once_a_period(
    three_on_one: SharedDaemons,
) -> None:
    three = three_on_one
    c = three.client(2)
    c.ok({"op": "start", "session": "s1"})
    tick = c.ok({"op": "schedule", "session": "s1", "every": "1s", "text": "beat"})
    time.sleep(4.6)
    got = c.ok({"op": "read", "session": "s1", "after": 0})["firings"]
    # one firing a grid point: 4 came due (allow one either way for a slow machine)
    assert 3 <= len(got) <= 5, got
    stamps = [time.mktime(time.strptime(f["ts"][:19], "%Y-%m-%dT%H:%M:%S")) for f in got]
    assert len(set(stamps)) == len(stamps), got  # never two in one period
    # scheduled on one daemon, listed and cancelled on another
    other = three.client(0)
    assert [t["timer"] for t in other.ok({"op": "timers"})["timers"]] == [tick["timer"]]
    other.ok({"op": "cancel", "session": "s1", "timer": tick["timer"]})
    count = len(c.ok({"op": "read", "session": "s1", "after": 0})["firings"])
    time.sleep(1.5)
    assert len(c.ok({"op": "read", "session": "s1", "after": 0})["firings"]) == count
