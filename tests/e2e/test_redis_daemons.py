"""Several daemons sharing sessions through one real redis-server (issue 8).

Every SPEC §3 rule holds across daemons; a send on one wakes a wait on
another; a killed daemon or a restarted Redis (appendonly, fsync always)
loses nothing acknowledged; Redis going away gives clear errors and the
daemons recover on their own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import correlated
from tests.helpers import Client, RedisProc, SharedDaemons, eventually, require_redis


class Cluster(SharedDaemons):
    """Three daemons on one redis-server (``redis``: the server, to kill and restart)."""

    def __init__(self, tmp: Path, redis: RedisProc, count: int) -> None:
        super().__init__(tmp, redis.url, count)
        self.redis = redis


@pytest.fixture
def cluster(tmp_path: Path, redis_server: RedisProc) -> Iterator[Cluster]:
    """Three fresh daemons on a redis-server of the test's own: to kill one, or the server."""
    c = Cluster(tmp_path, redis_server, 3)
    yield c
    c.close()


@pytest.fixture(scope="module")
def module_cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_single: RedisProc
) -> Iterator[Cluster]:
    """Three daemons on the session's redis-server, for the tests that kill nothing: the
    daemons keep nothing of the sessions they serve, so each test works in a session of its
    own (``x``) and none sees another's."""
    redis_single.flush()
    c = Cluster(tmp_path_factory.mktemp("redis-daemons"), redis_single, 3)
    yield c
    c.close()


@pytest.fixture
def shared(module_cluster: Cluster) -> Iterator[Cluster]:
    """The module's daemons; the test's clients closed after it."""
    yield module_cluster
    for d in module_cluster.daemons:
        d.close_clients()


_ids = count(1)


@pytest.fixture
def x() -> str:
    """A session id of the test's own, for the daemons the module's tests share."""
    return f"x{next(_ids)}"


def test_a_send_on_one_daemon_wakes_a_wait_on_another(shared: Cluster, x: str) -> None:
    a, b = shared.client(0), shared.client(1)
    a.ok({"op": "start", "session": x})
    b.send({"op": "wait", "sessions": [x], "id": "w"})
    assert not b.pending(0.3)
    assert a.ok({"op": "send", "session": x, "text": "across"})["seq"] == 1
    answer = b.recv()
    assert answer["id"] == "w"
    assert answer["batches"][0]["firings"][0]["result"] == "across"


def test_a_read_on_any_daemon_sees_a_send_on_any_other(shared: Cluster, x: str) -> None:
    clients = [shared.client(i) for i in range(3)]
    clients[0].ok({"op": "start", "session": x})
    for i, c in enumerate(clients):
        assert c.ok({"op": "send", "session": x, "text": f"from {i}"})["seq"] == i + 1
        for other in clients:
            got = other.ok({"op": "read", "session": x, "after": 0})
            assert [f["result"] for f in got["firings"]] == [f"from {j}" for j in range(i + 1)]


def test_concurrent_sends_through_three_daemons_give_gapless_unique_seqs(
    shared: Cluster,
    x: str,
) -> None:
    shared.client(0).ok({"op": "start", "session": x, "buffer": 1000})
    seqs: list[list[int]] = [[] for _ in range(6)]

    def sender(n: int) -> None:
        c = Client(shared.daemons[n % 3].port, shared.daemons[n % 3].token)
        try:
            for i in range(60):
                seqs[n].append(c.ok({"op": "send", "session": x, "text": f"{n}:{i}"})["seq"])
        finally:
            c.close()

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = sorted(s for part in seqs for s in part)
    assert every == list(range(1, 361))
    ring = shared.client(2).ok({"op": "read", "session": x, "after": 0})
    by_seq = {f["seq"]: f["result"] for f in ring["firings"]}
    for n, part in enumerate(seqs):
        for i, seq in enumerate(part):
            assert by_seq[seq] == f"{n}:{i}"
    for d in shared.daemons:  # answers that crossed each other are no head going back
        assert "went back" not in d.log.read_text()


def test_a_session_started_again_is_no_head_going_back_on_any_daemon(
    shared: Cluster, x: str
) -> None:
    """Stopped and started again (on another daemon, or on this one), a session starts at
    seq 1 anew: each start is a new incarnation of it, so no daemon that knew it at seq 5
    takes that for a head Redis took back (which it logs, and counts)."""
    a, b = shared.client(0), shared.client(1)
    a.ok({"op": "start", "session": x})
    for n in range(5):
        a.ok({"op": "send", "session": x, "text": f"first {n}"})
    assert a.ok({"op": "read", "session": x, "after": 0})["next"] == 5
    b.ok({"op": "stop", "session": x})
    b.ok({"op": "start", "session": x})
    assert a.ok({"op": "send", "session": x, "text": "anew"})["seq"] == 1
    assert a.ok({"op": "read", "session": x, "after": 0})["next"] == 1
    a.ok({"op": "stop", "session": x})
    a.ok({"op": "start", "session": x})
    assert a.ok({"op": "send", "session": x, "text": "anew again"})["seq"] == 1
    assert b.ok({"op": "read", "session": x, "after": 0})["next"] == 1
    for d in shared.daemons:
        assert "went back" not in d.log.read_text()


def test_acks_and_cursors_agree_everywhere_and_never_move_back(shared: Cluster, x: str) -> None:
    a, b, c = (shared.client(i) for i in range(3))
    a.ok({"op": "start", "session": x})
    for i in range(5):
        a.ok({"op": "send", "session": x, "text": str(i)})
    assert a.ok({"op": "ack", "session": x, "cursor": "r", "seq": 4})["seq"] == 4
    assert b.ok({"op": "ack", "session": x, "cursor": "r", "seq": 2})["seq"] == 4
    for client in (a, b, c):
        rows = client.ok({"op": "cursors", "session": x})["cursors"]
        assert {r["name"]: r["seq"] for r in rows} == {"r": 4}
    got = c.ok({"op": "read", "session": x, "cursor": "r"})
    assert [f["seq"] for f in got["firings"]] == [5]


def test_the_cursor_lru_is_shared(shared: Cluster, x: str) -> None:
    a, b = shared.client(0), shared.client(1)
    a.ok({"op": "start", "session": x})
    for i in range(16):
        (a if i % 2 else b).ok({"op": "ack", "session": x, "cursor": f"c{i}", "seq": 0})
    b.ok({"op": "read", "session": x, "cursor": "c0"})  # c0 used last, c1 is now oldest
    a.ok({"op": "ack", "session": x, "cursor": "c16", "seq": 0})
    names = {r["name"] for r in b.ok({"op": "cursors", "session": x})["cursors"]}
    assert "c1" not in names and "c0" in names and "c16" in names and len(names) == 16


def test_dedup_keys_and_the_ring_bound_are_shared(shared: Cluster, x: str) -> None:
    a, b = shared.client(0), shared.client(1)
    a.ok({"op": "start", "session": x, "buffer": 3})
    first = a.ok({"op": "send", "session": x, "text": "once", "key": "k1"})
    again = b.ok({"op": "send", "session": x, "text": "once", "key": "k1"})
    assert again == {"ok": True, "seq": first["seq"], "duplicate": True}
    for i in range(5):
        b.ok({"op": "send", "session": x, "text": str(i)})
    got = a.ok({"op": "read", "session": x, "after": 0})
    assert got["lost"] == 3 and [f["seq"] for f in got["firings"]] == [4, 5, 6]
    a.ok({"op": "buffer", "session": x, "limit": 1})
    assert [f["seq"] for f in b.ok({"op": "read", "session": x, "after": 0})["firings"]] == [6]


def test_poll_hands_each_firing_to_one_daemon_only(shared: Cluster, x: str) -> None:
    clients = [shared.client(i) for i in range(3)]
    clients[0].ok({"op": "start", "session": x})
    for i in range(30):
        clients[i % 3].ok({"op": "send", "session": x, "text": str(i)})
    polled: list[int] = []
    for round_ in range(12):
        got = clients[round_ % 3].ok({"op": "poll", "session": x, "max": 3})
        polled += [f["seq"] for f in got["firings"]]
    assert polled == list(range(1, 31))


def test_stopping_on_one_daemon_wakes_waiters_on_every_daemon(shared: Cluster, x: str) -> None:
    waiters = [shared.client(1), shared.client(2)]
    stopper = shared.client(0)
    stopper.ok({"op": "start", "session": x})
    for w in waiters:
        w.send({"op": "wait", "sessions": [x]})
    assert not waiters[0].pending(0.3)
    stopper.ok({"op": "stop", "session": x})
    for w in waiters:
        assert w.recv()["code"] == "session_stopped"
    assert waiters[0].call({"op": "read", "session": x})["code"] == "no_such_session"


def test_a_killed_daemon_loses_nothing(cluster: Cluster) -> None:
    a, b = cluster.client(0), cluster.client(1)
    a.ok({"op": "start", "session": "x"})
    told = [a.ok({"op": "send", "session": "x", "text": str(i)})["seq"] for i in range(50)]
    a.ok({"op": "ack", "session": "x", "cursor": "r", "seq": 20})
    cluster.daemons[0].kill()
    got = b.ok({"op": "read", "session": "x", "after": 0})
    assert [f["seq"] for f in got["firings"]] == told
    assert b.ok({"op": "cursors", "session": "x"})["cursors"][0]["seq"] == 20


def test_redis_restarted_with_appendonly_loses_nothing_acknowledged(tmp_path: Path) -> None:
    require_redis()
    redis = RedisProc(tmp_path / "redis", appendonly=True)
    cluster = Cluster(tmp_path, redis, 2)
    try:
        a = cluster.client(0)
        a.ok({"op": "start", "session": "x"})
        told = [a.ok({"op": "send", "session": "x", "text": str(i)})["seq"] for i in range(100)]
        a.ok({"op": "ack", "session": "x", "cursor": "r", "seq": 77})
        redis.kill()  # SIGKILL: only what was fsynced survives
        redis.start()
        b = cluster.client(1)
        got: dict[str, Any] = {}

        def read() -> bool:  # store_failed until the daemon is back on the restarted Redis
            got.update(b.call({"op": "read", "session": "x", "after": 0}))
            return bool(got["ok"])

        eventually(read, 10, "a read from the restarted Redis")
        assert [f["seq"] for f in got["firings"]] == told
        assert b.ok({"op": "cursors", "session": "x"})["cursors"][0]["seq"] == 77
    finally:
        cluster.close()
        redis.stop()


def test_redis_down_gives_store_failed_and_the_daemons_recover(cluster: Cluster) -> None:
    """A blocked wait rides the outage out; requests meanwhile get store_failed; Redis comes
    back empty (no persistence): the session is gone everywhere, and the wait says so."""
    a, waiter = cluster.client(0), cluster.client(1)
    a.ok({"op": "start", "session": "x"})
    a.ok({"op": "send", "session": "x", "text": "before"})
    waiter.ok({"op": "ack", "session": "x", "cursor": "wait", "seq": 1})
    waiter.send({"op": "wait", "sessions": ["x"]})
    assert not waiter.pending(0.3)
    cluster.redis.kill()
    assert not waiter.pending(1.0)  # a lost link is no error for a waiter: it waits on
    failed = a.call({"op": "send", "session": "x", "text": "lost?"})
    assert failed["code"] == "store_failed" and "redis" in failed["message"]
    cluster.redis.start()  # same port, empty (no persistence): the daemons reconnect
    # once its subscription is back the waiter reads again: its session is gone
    answer = waiter.recv()
    assert answer["code"] == "no_such_session", answer
    eventually(
        lambda: a.call({"op": "start", "session": "y"})["ok"],  # store_failed until it is back
        15,
        "a start on the daemon, back on the restarted Redis",
    )
    for client in (a, waiter):  # no daemon lists what Redis no longer holds
        assert [s["id"] for s in client.ok({"op": "sessions"})["sessions"]] == ["y"]
    waiter.send({"op": "wait", "sessions": ["y"]})
    assert not waiter.pending(0.2)
    assert a.ok({"op": "send", "session": "y", "text": "after"})["seq"] == 1
    assert waiter.recv()["batches"][0]["firings"][0]["result"] == "after"


def test_a_request_on_one_daemon_is_answered_by_a_worker_on_another(
    shared: Cluster, x: str
) -> None:
    """``repl request`` on A, a worker's ``repl wait --match reply-to`` and ``repl reply`` on
    B: the reply wakes the requester across daemons (SPEC §15)."""
    a, b = shared.daemons[0], shared.daemons[1]
    svc, me = f"{x}-svc", f"{x}-me"
    for session in (svc, me):
        shared.client(0).ok({"op": "start", "session": session})
    correlated.request_and_reply(a, b, svc, me)


def test_an_early_reply_is_found_at_once_on_another_daemon(shared: Cluster, x: str) -> None:
    svc, me = f"{x}-svc", f"{x}-me"
    for session in (svc, me):
        shared.client(1).ok({"op": "start", "session": session})
    correlated.early_reply(shared.daemons[0], shared.daemons[1], svc, me)


def test_a_matching_wait_stays_blocked_through_firings_sent_via_another_daemon(
    shared: Cluster, x: str
) -> None:
    shared.client(0).ok({"op": "start", "session": x})
    correlated.matching_wait_stays_blocked(shared.daemons[0], shared.daemons[1], x)
