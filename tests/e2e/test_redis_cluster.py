"""Several daemons on a real Redis Cluster: sessions on every primary, one set of rules.

Three daemon processes (``python -m repl_daemon --store redis+cluster://...``)
share the 3-primary cluster of ``redis_cluster`` (tests/conftest.py), emptied
before each test. The 24 sessions of these tests have their slots on all three
primaries (``CLUSTER KEYSLOT`` and ``CLUSTER NODES`` say so, and each
primary's ``DBSIZE`` shows it holds some): sends through every daemon at once
give gapless seqs in every session, a send on one daemon wakes a wait on
another whatever shard the session is on, a stop wakes every daemon's
waiters, every daemon lists the same sessions, and waiters blocked on every
daemon cost the cluster no command at all (``INFO commandstats``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from repl_daemon.backends.redis.keys import session_keys, wake_channel
from tests.e2e import correlated
from tests.helpers import (
    Client,
    RedisClusterProcs,
    SharedDaemons,
    answered,
    eventually,
    store_url,
)

#: the sessions of these tests: their slots are on all three primaries
SESSIONS = [f"s{n}" for n in range(24)]


@pytest.fixture(scope="module")
def module_daemons(
    tmp_path_factory: pytest.TempPathFactory, redis_cluster: RedisClusterProcs
) -> Iterator[SharedDaemons]:
    """Three daemons on the 3-primary cluster, for the module: they keep nothing of their own."""
    group = SharedDaemons(tmp_path_factory.mktemp("cluster-daemons"), redis_cluster.url, 3)
    yield group
    group.close()


@pytest.fixture
def daemons(
    module_daemons: SharedDaemons, redis_cluster: RedisClusterProcs
) -> Iterator[SharedDaemons]:
    """The module's daemons on the emptied cluster; the test's clients closed after it."""
    redis_cluster.flush()
    yield module_daemons
    for d in module_daemons.daemons:
        d.close_clients()


def one_per_primary(cluster: RedisClusterProcs) -> list[str]:
    return [sessions[0] for sessions in cluster.by_primary(SESSIONS).values()]


def start_all(group: SharedDaemons, sessions: list[str], buffer: int = 256) -> None:
    """Each session started through a different daemon in turn."""
    for n, session in enumerate(sessions):
        c = group.client(n % len(group.daemons))
        c.ok({"op": "start", "session": session, "buffer": buffer})


def listed(c: Client) -> list[dict[str, Any]]:
    """``sessions`` as one daemon answers it, without the daemon's own waiter count."""
    rows = c.ok({"op": "sessions"})["sessions"]
    return [{k: v for k, v in row.items() if k != "waiters"} for row in rows]


def test_the_sessions_spread_over_every_primary_and_every_daemon_lists_them_alike(
    daemons: SharedDaemons, redis_cluster: RedisClusterProcs
) -> None:
    start_all(daemons, SESSIONS)
    spread = redis_cluster.by_primary(SESSIONS)
    assert sorted(spread) == sorted(redis_cluster.primaries())
    for port in spread:  # the keys are where CLUSTER NODES says their slot is
        with redis_cluster.node(port).admin() as admin:
            assert admin.dbsize() == len(spread[port])  # a started session is its meta key
    for n, session in enumerate(SESSIONS):
        for i in range(n % 4):
            daemons.client(i % 3).ok({"op": "send", "session": session, "text": str(i)})
    lists = [listed(daemons.client(i)) for i in range(3)]
    assert [row["id"] for row in lists[0]] == sorted(SESSIONS)
    assert {row["id"]: row["head"] for row in lists[0]} == {
        s: n % 4 for n, s in enumerate(SESSIONS)
    }
    assert lists[1] == lists[0] and lists[2] == lists[0]


def test_concurrent_sends_through_every_daemon_are_gapless_in_every_session(
    daemons: SharedDaemons,
) -> None:
    start_all(daemons, SESSIONS, buffer=1000)
    answered: list[list[tuple[str, int, str]]] = [[] for _ in range(6)]

    def sender(n: int) -> None:
        d = daemons.daemons[n % 3]
        c = Client(d.port, d.token)
        try:
            for i in range(120):
                session, text = SESSIONS[(n * 7 + i) % len(SESSIONS)], f"{n}:{i}"
                seq = c.ok({"op": "send", "session": session, "text": text})["seq"]
                answered[n].append((session, seq, text))
        finally:
            c.close()

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    sent: dict[str, dict[int, str]] = {}
    for part in answered:
        for session, seq, text in part:
            assert seq not in sent.setdefault(session, {}), (session, seq)
            sent[session][seq] = text
    assert sum(len(seqs) for seqs in sent.values()) == 720
    reader = daemons.client(2)
    for session in SESSIONS:
        assert sorted(sent[session]) == list(range(1, len(sent[session]) + 1)), session
        ring = reader.ok({"op": "read", "session": session, "after": 0})["firings"]
        assert {f["seq"]: f["result"] for f in ring} == sent[session]


def test_a_send_on_one_daemon_wakes_waits_on_the_others_on_every_shard(
    daemons: SharedDaemons, redis_cluster: RedisClusterProcs
) -> None:
    start_all(daemons, SESSIONS)
    shards = one_per_primary(redis_cluster)
    waits = [(s, daemons.client(i)) for s in shards for i in (1, 2)]
    for session, w in waits:
        w.send({"op": "wait", "sessions": [session]})
    everywhere = daemons.client(2)  # one wait on every session
    everywhere.send({"op": "wait", "sessions": SESSIONS})
    assert not answered([*(w for _, w in waits), everywhere])
    sender = daemons.client(0)
    for session in shards:
        assert sender.ok({"op": "send", "session": session, "text": f"to {session}"})["seq"] == 1
    for session, w in waits:
        answer = w.recv()
        assert answer["ok"], answer
        (batch,) = answer["batches"]
        assert batch["session"] == session
        assert [f["result"] for f in batch["firings"]] == [f"to {session}"]
    woken = {b["session"] for b in everywhere.recv()["batches"]}
    assert woken and woken <= set(shards)


def test_a_stop_wakes_the_waiters_of_every_daemon_on_every_shard(
    daemons: SharedDaemons, redis_cluster: RedisClusterProcs
) -> None:
    start_all(daemons, SESSIONS)
    shards = one_per_primary(redis_cluster)
    waits = [daemons.client(i) for _ in shards for i in (0, 1, 2)]
    for n, w in enumerate(waits):
        w.send({"op": "wait", "sessions": [shards[n // 3]]})
    assert not answered(waits)
    stopper = daemons.client(0)
    for session in shards:
        stopper.ok({"op": "stop", "session": session})
    for w in waits:
        assert w.recv()["code"] == "session_stopped"
    for i in range(3):
        c = daemons.client(i)
        for session in shards:
            assert c.call({"op": "read", "session": session})["code"] == "no_such_session"
        assert [row["id"] for row in listed(c)] == sorted(set(SESSIONS) - set(shards))


def command_counts(admins: dict[int, Any]) -> dict[int, dict[str, int]]:
    """``INFO commandstats`` of each node: calls by command."""
    return {
        port: {name: row["calls"] for name, row in admin.info("commandstats").items()}
        for port, admin in admins.items()
    }


IDLE_SECONDS = 3.0
#: idle windows a test may look at before it says the waits cost commands: a stray
#: partition claim spoils at most one of them, a poller every one
IDLE_WINDOWS = 3


def idle_window(admins: dict[int, Any]) -> dict[int, dict[str, int]]:
    """What each node counted over ``IDLE_SECONDS``, our own INFO included (once a look)."""
    before = command_counts(admins)
    # waited out on purpose: what idle waits cost over a stretch of time is what this
    # test measures (no event marks "idle long enough"; a poller would show here)
    time.sleep(IDLE_SECONDS)
    after = command_counts(admins)
    return {
        port: {
            name: after[port].get(name, 0) - calls
            for name, calls in before[port].items()
            if after[port].get(name, 0) != calls
        }
        | {name: calls for name, calls in after[port].items() if name not in before[port]}
        for port in admins
    }


def only_partition_claims(moved: dict[str, int]) -> bool:
    """Whether a node counted only our INFO and whole runs of a timer partition's CLAIM."""
    rest = dict(moved)
    assert rest.pop("cmdstat_info", 0) == 1
    claims = rest.get("cmdstat_evalsha", 0)
    return not rest or rest == dict.fromkeys(
        ("cmdstat_evalsha", "cmdstat_zrangebyscore", "cmdstat_zrange"), claims
    )


def test_waiters_blocked_on_every_daemon_cost_the_cluster_no_command(
    daemons: SharedDaemons, redis_cluster: RedisClusterProcs
) -> None:
    """Over 3 idle seconds, 12 blocked waits (3 daemons x one on all 24 sessions and one on a
    session of each primary: 72 subscriptions on 9 subscriber connections) move no command
    count on any of the 3 nodes; only our own INFO is counted, once a look."""
    start_all(daemons, SESSIONS)
    singles = one_per_primary(redis_cluster)
    waits = []
    for i in range(3):
        everywhere = daemons.client(i)
        everywhere.send({"op": "wait", "sessions": SESSIONS})
        waits.append(everywhere)
        for session in singles:
            w = daemons.client(i)
            w.send({"op": "wait", "sessions": [session]})
            waits.append(w)
    admins = {server.port: server.admin() for server in redis_cluster.servers}
    try:

        def subscribed() -> bool:  # every daemon holds every session's channel
            counts: dict[str, int] = {}
            for admin in admins.values():
                for channel, n in admin.execute_command(
                    "PUBSUB SHARDNUMSUB", *map(wake_channel, SESSIONS)
                ):
                    counts[channel] = counts.get(channel, 0) + n
            return all(n == 3 for n in counts.values()) and len(counts) == len(SESSIONS)

        eventually(subscribed, 10, "the daemons to subscribe")
        # subscribed comes before each wait's first look (on a busy machine some are still
        # on their way): those reads are over once each is counted, an evaluation of its
        # session, and the idle window is counted from then on
        looks = {s: 6 if s in singles else 3 for s in SESSIONS}  # 3 daemons' waits on each
        observer = daemons.client(0)

        def looked() -> bool:
            rows = observer.ok({"op": "stats"})["sessions"]
            return {row["id"]: row["evaluations"] for row in rows} == looks

        eventually(looked, 20, "the waits' first reads")
        assert not answered(waits, 0)
        for window in range(IDLE_WINDOWS):
            moved = idle_window(admins)
            if all(m == {"cmdstat_info": 1} for m in moved.values()):
                break
            # a timer or a lease an earlier test on this cluster left falls due once, and the
            # daemons claim it from its partition (the CLAIM script: one EVALSHA, one
            # ZRANGEBYSCORE, one ZRANGE each time): not the waits' cost, and not again in the
            # next window; anything else, or the same in every window, is a fault
            assert window < IDLE_WINDOWS - 1 and all(
                only_partition_claims(m) for m in moved.values()
            ), moved
    finally:
        for admin in admins.values():
            admin.close()
    assert not answered(waits, 0)  # still waiting, and still awake:
    daemons.client(0).ok({"op": "send", "session": singles[-1], "text": "wake"})
    for w in waits[0::4] + waits[3::4]:  # the waits on every session and on that one
        assert w.recv()["batches"][0]["session"] == singles[-1]


def test_a_session_whose_slot_moves_is_followed_by_its_changes_and_its_waiters(
    tmp_path: Path, redis_cluster_replicated: RedisClusterProcs
) -> None:
    """Resharding under ``?replicas=1`` (3 primaries, a replica each): the session's slot and
    keys move to another primary. The daemon that sends next still has the old table: its
    change is refused with MOVED (nothing ran), and it reads the table again and sends it
    there. The waiter's daemon is told by the old node that the channel left (SUNSUBSCRIBE):
    it subscribes where the slot now is, and the send wakes it."""
    cluster = redis_cluster_replicated
    cluster.flush()
    group = SharedDaemons(tmp_path, store_url(cluster), 2)
    slot = cluster.keyslot(session_keys("m")[0])
    home = cluster.primary_of_slot(slot)
    try:
        sender, reader = group.client(0), group.client(1)
        sender.ok({"op": "start", "session": "m"})
        sender.ok({"op": "send", "session": "m", "text": "before"})
        waiter = group.client(1)
        waiter.send({"op": "wait", "sessions": ["m"], "ack": {"m": 1}})
        assert not answered([waiter])
        cluster.move_slot(slot, next(p for p in cluster.primaries() if p != home))
        assert sender.ok({"op": "send", "session": "m", "text": "after"})["seq"] == 2
        woken = waiter.recv()
        assert [f["result"] for f in woken["batches"][0]["firings"]] == ["after"], woken
        got = reader.ok({"op": "read", "session": "m", "after": 0})
        assert [f["result"] for f in got["firings"]] == ["before", "after"]
    finally:
        group.close()
        if cluster.primary_of_slot(slot) != home:
            cluster.move_slot(slot, home)


def test_a_request_and_its_reply_cross_daemons_and_shards(
    daemons: SharedDaemons, redis_cluster: RedisClusterProcs
) -> None:
    """``repl request`` on A to a session of one primary, the reply to a session of another:
    the worker on B waits with ``--match reply-to`` and answers with ``repl reply``; then an
    early reply, found at once; then a matching wait on B, blocked through firings sent via
    A that do not match, one look each, woken by its match (SPEC §15)."""
    svc, me, other = one_per_primary(redis_cluster)
    start_all(daemons, [svc, me, other])
    a, b = daemons.daemons[0], daemons.daemons[1]
    correlated.request_and_reply(a, b, svc, me)
    correlated.early_reply(a, b, me, other)
    correlated.matching_wait_stays_blocked(a, b, other)
