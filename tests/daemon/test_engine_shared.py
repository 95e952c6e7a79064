"""The shared committer in-process, on a real Redis: what the engine keeps, and refusals.

The daemon keeps no session of a shared store: after any number of
operations, on real, missing and malformed ids, and after waits, nothing is
left in the daemon but the subscriptions its current waiters need (and
those of the timer partitions, which every daemon holds). Each
test runs on one redis-server, on a Redis Cluster of 3 primaries, and on
one with a replica each (through ``?replicas=1``): ``redis_any``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from anyio.abc import TaskGroup

from repl_daemon import protocol as p
from repl_daemon.backends.redis import RedisBackend
from repl_daemon.backends.redis import committer as redis_committer
from repl_daemon.backends.redis import keys as redis_keys
from repl_daemon.backends.redis import pipeline as redis_pipeline
from repl_daemon.backends.redis import wakes as redis_wakes
from repl_daemon.backends.redis.committer import SharedCommitter
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.backends.redis.timers import SharedTimers
from repl_daemon.engine import Engine
from repl_daemon.engine.clock import REAL, Clock
from session import scopes
from session.delta import Webhook
from session.errors import BadSessionId, BadTag, NoSuchSession, ReplError, StoreFailed, Unauthorized
from session.tags import Match
from tests.helpers import RedisClusterProcs, RedisProc, WatchedClock, eventually, store_url

AnyRedis = RedisProc | RedisClusterProcs
#: what a daemon always subscribes to: the channels of the timer partitions (SPEC §9) and
#: the tokens' channel (SPEC §11)
TIMER_CHANNELS = {*redis_keys.PARTITION_IDS, redis_keys.AUTH}

pytestmark = pytest.mark.anyio


async def call(engine: Engine, req: p.Request) -> p.Response:
    return await engine.handle(req).result()


async def opened(
    url: str, *, settle: float = 0, clock: Clock = REAL
) -> tuple[Engine, SharedCommitter]:
    """A daemon's engine on ``url``; a settle time given is held whole (its quiet gap as
    long), so that firings sent one at a time within it are heard while it settles."""
    engine = Engine(RedisBackend(RedisStore(url)), settle=settle, quiet=settle, clock=clock)
    committer = engine.committer
    assert isinstance(committer, SharedCommitter)
    await engine.load()
    return engine, committer


@contextlib.asynccontextmanager
async def two_daemons(
    url: str, *, settle_b: float = 0, clock: Clock = REAL
) -> AsyncIterator[tuple[Engine, SharedCommitter, Engine, SharedCommitter, TaskGroup]]:
    """Daemons A and B on one store and one clock (B with the settle time ``settle_b``),
    running in a task group of their own, their own subscriptions made; on the way out
    both are stopped and closed."""
    a, first = await opened(url, clock=clock)
    b, second = await opened(url, settle=settle_b, clock=clock)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.run)
            tg.start_soon(b.run)
            await first.shared_timers.ready.wait()
            await second.shared_timers.ready.wait()
            yield a, first, b, second, tg
            tg.cancel_scope.cancel()
    finally:
        await first.close()
        await second.close()


async def test_the_daemon_keeps_nothing_of_the_sessions_it_serves(
    redis_any: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_wakes, "LINGER", 0.2)
    engine, committer = await opened(store_url(redis_any))
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        try:
            await call(engine, p.Start(session="real"))
            await call(engine, p.Send(session="real", text="one"))
            for n in range(50):
                named = ((f"missing-{n}", NoSuchSession), (f"bad id {n}", BadSessionId))
                for session_id, error in named:
                    for req in (
                        p.Send(session=session_id, text="x"),
                        p.Read(session=session_id),
                        p.Ack(session=session_id, seq=0),
                        p.Stats(session=session_id),
                    ):
                        with pytest.raises(error):
                            await call(engine, req)
            woken = await call(engine, p.Wait(sessions=["real"], timeout_ms=0))
            assert isinstance(woken, p.Woken) and woken.batches  # timeout 0, firings there
            timed = await call(
                engine, p.Wait(sessions=["real"], cursor="c", ack={"real": 1}, timeout_ms=10)
            )
            assert isinstance(timed, p.Woken) and timed.timed_out
            # the subscription lingers a moment for the next wait, then goes
            assert committer.wakes.wanted == TIMER_CHANNELS and committer.wakes.lingering == {
                "real"
            }
            with anyio.fail_after(10):
                while committer.wakes.lingering:  # noqa: ASYNC110 - a bounded look at another task's state
                    await anyio.sleep(0.01)
            assert committer.wakes.wanted == TIMER_CHANNELS
            held = {c for s in committer.wakes.subscribers.values() for c in s.channels}
            assert held == {redis_keys.wake_channel(t) for t in TIMER_CHANNELS}
            assert engine.waiters == {}
        finally:
            tg.cancel_scope.cancel()
    await committer.close()


async def test_a_user_redis_refuses_scripts_cannot_start_a_daemon_and_nothing_is_written(
    redis_any: AnyRedis,
) -> None:
    """The daemon reads the tokens at start, with a script: refused, it says why at once."""
    for server in redis_any.servers:  # ACLs are each node's own
        with server.admin() as admin:
            admin.execute_command(
                "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-evalsha", "-eval"
            )
    try:
        store = RedisStore(store_url(redis_any).replace("://", "://noscripts:pw@"))
        engine = Engine(RedisBackend(store), settle=0)
        with pytest.raises(StoreFailed, match=r"redis.* at .*noscripts:\*\*\*@.*'evalsha'"):
            await engine.load()
        assert redis_any.dbsize() == 0
        await store.close()
    finally:
        for server in redis_any.servers:
            with server.admin() as admin:
                admin.execute_command("ACL", "DELUSER", "noscripts")


async def test_a_user_that_may_not_run_info_waits_for_no_replica_and_is_told_why(
    redis_any: AnyRedis,
) -> None:
    """Without ``?replicas=N`` the daemon asks each primary whether it has replicas (``INFO
    replication``); a user refused that waits for none, and the line the daemon logs at
    start says why and what to write instead."""
    for server in redis_any.servers:
        with server.admin() as admin:
            admin.execute_command("ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all")
            admin.execute_command("ACL", "SETUSER", "noinfo", "-info")
    try:
        store = RedisStore(redis_any.url.replace("://", "://noinfo:pw@"))
        await store.open()
        level, line = store.replication
        assert store.target.replicas == 0 and store.name.endswith("?replicas=0")
        assert level == logging.WARNING
        assert "cannot tell whether the primar" in line and "'info' command" in line
        assert line.endswith("say ?replicas=1 or ?replicas=0 in the --store URL")
        await store.close()
    finally:
        for server in redis_any.servers:
            with server.admin() as admin:
                admin.execute_command("ACL", "DELUSER", "noinfo")


async def test_every_refusal_is_a_repl_error(redis_any: AnyRedis) -> None:
    engine, committer = await opened(store_url(redis_any))
    await call(engine, p.Start(session="a"))
    await call(engine, p.Start(session="b"))
    await call(engine, p.Send(session="b", text="one"))
    with anyio.fail_after(5):
        for req in (
            p.Wait(sessions=["a"], ack={"a": -1}),
            p.Wait(sessions=["b", "a"], ack={"b": 1, "a": 1}),  # a has no seq 1: b not acked
            p.Wait(sessions=["a", "nope"], timeout_ms=0),
            p.Ack(session="a", seq=9),
        ):
            with pytest.raises(ReplError):
                await call(engine, req)
    for session_id in ("a", "b"):
        listed = await call(engine, p.Cursors(session=session_id))
        assert isinstance(listed, p.CursorList) and listed.cursors == []
    await committer.close()


async def test_callers_that_go_away_never_stall_the_pipeline(redis_any: AnyRedis) -> None:
    """Operations share pipelines; cancelled callers are dropped, and the sender goes on."""
    engine, committer = await opened(store_url(redis_any))
    await call(engine, p.Start(session="a"))
    answered: list[int] = []

    async def send(n: int) -> None:
        with anyio.move_on_after(0 if n % 3 == 0 else 5):
            sent = await call(engine, p.Send(session="a", text=f"m{n}"))
            assert isinstance(sent, p.Sent)
            answered.append(sent.seq)

    for _ in range(5):
        async with anyio.create_task_group() as tg:
            for n in range(300):
                tg.start_soon(send, n)
    assert len(answered) >= 5 * 200 and len(set(answered)) == len(answered)
    with anyio.fail_after(5):  # nothing stalled: the next one goes through at once
        last = await call(engine, p.Send(session="a", text="last"))
    assert isinstance(last, p.Sent) and last.seq > max(answered)
    described = await call(engine, p.Stats(session="a"))
    assert isinstance(described, p.StatsReply)
    # a cancelled caller's send either never left, or was recorded: never half
    assert described.sessions[0].head == last.seq
    await committer.close()


async def test_a_change_its_replicas_do_not_confirm_is_refused_and_a_read_is_not(
    redis_any: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``?replicas=N`` asks for more replicas than there are: no change is answered as stored
    (on one server through a pipeline, on a cluster on the session's primary's connection)."""
    monkeypatch.setattr(redis_pipeline, "REPLICA_TIMEOUT_MS", 50)
    plain, plain_committer = await opened(redis_any.url)
    await call(plain, p.Start(session="a"))
    await plain_committer.close()
    engine, committer = await opened(f"{redis_any.url}?replicas=2")
    with pytest.raises(
        StoreFailed, match=r"only [01] of 2 replicas confirmed the change within 50 ms"
    ):
        await call(engine, p.Send(session="a", text="unconfirmed"))
    read = await call(engine, p.Read(session="a", after=0))
    assert isinstance(read, p.Firings)  # the refused send was made: only a replica is missing
    assert [f.result for f in read.firings] == ["unconfirmed"]
    await committer.close()


async def test_a_redis_that_stops_answering_fails_the_pipeline_and_the_next_one_reconnects(
    redis_single: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Redis: the pipelines' connection has one timeout a round trip, not one a reply.

    A Redis paused past it fails what was on its way (``store_failed``, the
    connection dropped with its unread replies), and the next operation
    goes out on a new connection and is answered.
    """
    redis_single.flush()
    monkeypatch.setattr(redis_pipeline, "PIPELINE_TIMEOUT", 0.3)
    engine, committer = await opened(redis_single.url)
    await call(engine, p.Start(session="a"))
    await call(engine, p.Send(session="a", text="before"))
    with redis_single.admin() as admin:
        admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        try:
            with anyio.fail_after(5), pytest.raises(StoreFailed, match="failed"):
                await call(engine, p.Read(session="a", after=0))
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
    # a reply left unread on the old connection would answer this send: it is not there
    sent = await call(engine, p.Send(session="a", text="after"))
    assert isinstance(sent, p.Sent) and sent.seq == 2
    read = await call(engine, p.Read(session="a", after=0))
    assert isinstance(read, p.Firings)
    assert [f.result for f in read.firings] == ["before", "after"]
    await committer.close()


async def test_a_redis_that_stops_answering_leaves_no_answer_unread_in_the_timer_task(
    redis_single: RedisProc, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis paused past the pipeline's timeout when a timer comes due: the timer task's
    claim fails, and then its read of every partition's earliest due time (one pipeline of
    8 calls, each failed); it used to await them one by one and stop at the first failure,
    and the 7 others were logged as "Future exception was never retrieved" (a failover,
    several). Now every failure is taken, none is logged, and the timer fires once Redis
    answers again."""
    redis_single.flush()
    monkeypatch.setattr(redis_pipeline, "PIPELINE_TIMEOUT", 0.3)
    clock = WatchedClock()
    engine, committer = await opened(redis_single.url, clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        await committer.shared_timers.ready.wait()
        await call(engine, p.Start(session="a"))
        await call(engine, p.Schedule(session="a", text="due", in_="1s"))
        await _asleep_until(clock.ms + 1000, committer)
        with redis_single.admin() as admin:
            admin.execute_command("CLIENT", "PAUSE", 5000, "ALL")
            try:
                clock.advance(1000)
                # the claim failed (trying again in 0.1 s), then the read of the partitions
                with anyio.fail_after(10):
                    while "trying again in 0.2 s" not in caplog.text:  # noqa: ASYNC110 - the log is the event
                        await anyio.sleep(0.01)
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
        woken = await call(engine, p.Wait(sessions=["a"], cursor="c", timeout_ms=10_000))
        assert isinstance(woken, p.Woken) and [f.result for f in woken.batches[0].firings] == [
            "due"
        ]
        tg.cancel_scope.cancel()
    await committer.close()
    gc.collect()  # an unread failure is logged when its future goes
    assert "never retrieved" not in caplog.text, caplog.text


async def test_closing_the_store_answers_every_operation_still_on_its_way(
    redis_any: AnyRedis,
) -> None:
    """Nothing waits forever on a closed store: each is answered, or fails with store_failed."""
    engine, committer = await opened(store_url(redis_any))
    await call(engine, p.Start(session="a"))
    store = committer.store
    futures = [store.record("a", "on-message", f"m{n}", "t", handled=True) for n in range(200)]
    await anyio.lowlevel.checkpoint()  # the first pipeline leaves
    await committer.close()
    answered = failed = 0
    with anyio.fail_after(5):
        for future in futures:
            try:
                await future
                answered += 1
            except StoreFailed:
                failed += 1
    assert answered + failed == 200 and failed > 0
    with pytest.raises(StoreFailed, match="not connected"):
        store.record("a", "on-message", "after", "t", handled=True)


async def test_two_waiters_subscribing_to_one_session_at_once_both_get_its_wakes(
    redis_any: AnyRedis,
) -> None:
    """The second subscribe of a channel on its way waits for the first to be sent.

    It used to start the connection's reader at once, before the first
    SSUBSCRIBE had made the connection: the reader failed ("pubsub
    connection not set"), the link was dropped, and the first waiter got
    store_failed.
    """
    url = store_url(redis_any)
    sender, sender_committer = await opened(url)
    await call(sender, p.Start(session="a"))
    woken: list[str] = []
    came = anyio.Event()

    def wake(session_id: str, _: bytes) -> None:
        woken.append(session_id)
        came.set()

    store = RedisStore(url)
    await store.open()
    wakes = redis_wakes.Wakes(store, wake, lambda: None)
    channel = redis_keys.wake_channel("a")

    def let_go() -> bool:  # its SUNSUBSCRIBE sent, and its echo read
        return all(channel not in s.confirmed and not s.leaving for s in wakes.subscribers.values())

    async with anyio.create_task_group() as tg:
        tg.start_soon(wakes.run)
        await wakes.ready.wait()
        for _ in range(20):
            with anyio.fail_after(5):
                async with anyio.create_task_group() as both:
                    both.start_soon(wakes.subscribe, "a")
                    both.start_soon(wakes.subscribe, "a")
            wakes.unsubscribe("a", linger=0)
            wakes.unsubscribe("a", linger=0)
            with anyio.fail_after(5):
                while not let_go():  # noqa: ASYNC110 - a bounded look at another task's state
                    await anyio.sleep(0.005)
        await wakes.subscribe("a")
        await call(sender, p.Send(session="a", text="wake"))
        with anyio.fail_after(5):
            await came.wait()
        tg.cancel_scope.cancel()
    assert woken == ["a"]
    await store.close()
    await sender_committer.close()


def _commands(redis: AnyRedis, primaries: bool = False) -> dict[str, int]:
    """The calls of every command so far, summed over the nodes (scripts' own inside);
    ``primaries``: over the primaries only (a replica counts what it is handed again)."""
    total: dict[str, int] = {}
    servers = redis.servers
    if primaries and isinstance(redis, RedisClusterProcs):
        servers = [redis.node(port) for port in redis.primaries()]
    for server in servers:
        with server.admin() as admin:
            for name, row in admin.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                total[command] = total.get(command, 0) + int(row["calls"])
    return total


async def test_a_monitors_wait_with_its_ack_is_one_script(redis_any: AnyRedis) -> None:
    """``repl wait ID --ack N`` in a loop: the ack checks the session and the seq, moves
    the cursor and looks in one script; its wakes are still subscribed from the turn
    before (they linger). No EXISTS, no separate check, no SSUBSCRIBE."""
    engine, committer = await opened(store_url(redis_any))
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        await committer.shared_timers.ready.wait()  # its own subscriptions are not the turn's
        await call(engine, p.Start(session="a"))
        await call(engine, p.Send(session="a", text="one"))
        first = await call(engine, p.Wait(sessions=["a"], cursor="mon"))
        assert isinstance(first, p.Woken) and first.batches[0].next == 1
        await call(engine, p.Send(session="a", text="two"))
        before = _commands(redis_any)
        turn = await call(engine, p.Wait(sessions=["a"], cursor="mon", ack={"a": 1}))
        after = _commands(redis_any)
        assert isinstance(turn, p.Woken)
        assert [f.result for f in turn.batches[0].firings] == ["two"]
        spent = _spent(before, after)
        # the ack and the look (with ?replicas=1 on a cluster an EVAL and a WAIT)
        assert spent.get("evalsha", 0) + spent.get("eval", 0) == 1, spent
        assert "exists" not in spent and "ssubscribe" not in spent, spent
        # a refused ack changes nothing, and is the error a separate check would give
        with pytest.raises(ReplError, match="cannot ack 9: head is 2"):
            await call(engine, p.Wait(sessions=["a"], cursor="mon", ack={"a": 9}))
        with pytest.raises(NoSuchSession):
            await call(engine, p.Wait(sessions=["missing"], cursor="mon", ack={"missing": 1}))
        table = await call(engine, p.Cursors(session="a"))
        assert isinstance(table, p.CursorList)
        assert [(c.name, c.seq) for c in table.cursors] == [("mon", 1)]
        tg.cancel_scope.cancel()
    await committer.close()


def _subscribers(redis: AnyRedis, channel: str) -> int:
    """How many connections Redis has subscribed to the shard channel, over the nodes."""
    total = 0
    for server in redis.servers:
        with server.admin() as admin:
            _, count = admin.execute_command("PUBSUB", "SHARDNUMSUB", channel)
            total += int(count)
    return total


async def _answer(into: list[p.Response], engine: Engine, req: p.Request) -> None:
    into.append(await call(engine, req))


#: the goal of a wait cycle's Redis commands (issue 28; XREAD BLOCK is 1), and what a
#: send costs today (EVALSHA, HMGET, XADD, HSET, SPUBLISH; the goal is 4, not met yet)
WAIT_CYCLE_GOAL = 5
SEND_COMMANDS = 5


async def test_a_wait_cycle_across_daemons_costs_redis_at_most_five_commands(
    redis_any: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A monitor on daemon B (``wait`` with the last turn's ack, blocked) and a send
    through daemon A, counted by Redis itself (``INFO commandstats``, commands run inside
    scripts included, every primary summed): the wait's one script (ack, look) and nothing
    for the wake, which carries the firing, so the turn costs at most 5 commands beside
    the send's own (5). The answer is the firing, in order, once. Once the monitor stops,
    B's subscription ends after its linger: Redis holds no subscriber on the channel."""
    monkeypatch.setattr(redis_wakes, "LINGER", 1.0)  # the turns come well within it
    url = store_url(redis_any)
    async with two_daemons(url) as (a, _first, b, _second, tg):
        await call(a, p.Start(session="m"))
        # a send alone, with no waiter anywhere: what the turn's send costs
        ahead = _commands(redis_any, primaries=True)
        await call(a, p.Send(session="m", text="zero"))
        send = _spent(ahead, _commands(redis_any, primaries=True))
        assert sum(n for c, n in send.items() if c != "wait") == SEND_COMMANDS, send
        # the first turn subscribes, and its ack makes the cursor: not counted
        await call(b, p.Wait(sessions=["m"], cursor="mon"))
        await call(b, p.Ack(session="m", cursor="mon", seq=1))
        acked = 1
        for turn in range(2, 5):
            answer: list[p.Response] = []
            req = p.Wait(sessions=["m"], cursor="mon", ack={"m": acked})
            before = _commands(redis_any, primaries=True)
            tg.start_soon(_answer, answer, b, req)
            await _blocked(b, "m")
            sent = await call(a, p.Send(session="m", text=f"turn {turn}"))
            assert isinstance(sent, p.Sent)
            with anyio.fail_after(10):
                while not answer:  # noqa: ASYNC110 - a bounded look at another task's state
                    await anyio.sleep(0.005)
            spent = _spent(before, _commands(redis_any, primaries=True))
            (woken,) = answer
            assert isinstance(woken, p.Woken)
            (batch,) = woken.batches
            assert [(f.seq, f.result) for f in batch.firings] == [(sent.seq, f"turn {turn}")]
            assert (batch.next, batch.lost) == (sent.seq, 0)
            acked = batch.next
            waits = {c: n - send.get(c, 0) for c, n in spent.items()}
            waits.pop("wait", None)  # ?replicas=1: each change's WAIT, the ack's included
            assert all(n >= 0 for n in waits.values()), (waits, send)
            assert sum(waits.values()) <= WAIT_CYCLE_GOAL, (sorted(waits.items()), send)
        channel = redis_keys.wake_channel("m")
        with anyio.fail_after(10):
            while _subscribers(redis_any, channel):  # noqa: ASYNC110 - a bounded look at the store
                await anyio.sleep(0.05)


async def test_a_slot_on_the_move_is_followed_through_ask_and_then_moved(
    redis_cluster: RedisClusterProcs,
) -> None:
    """Each node's part of a pipeline on a 3-primary cluster, while the session's slot is
    resharded. Its keys already on the target: the source answers ASK, the call goes there
    with ASKING, and the target answers TRYAGAIN (a script's keys that do not exist yet
    cannot be served mid-migration), so after a few tries the send is refused with
    store_failed and nothing is recorded. Once the slot is handed over, the source answers
    MOVED, the table is read again and the send goes through: seqs 1 and 2, nothing twice."""
    cluster = redis_cluster
    cluster.flush()
    engine, committer = await opened(store_url(cluster))
    slot = cluster.keyslot(redis_keys.session_keys("m")[0])
    home = cluster.primary_of_slot(slot)
    target = next(port for port in cluster.primaries() if port != home)
    rows = cluster.topology()
    try:
        await call(engine, p.Start(session="m"))
        assert await call(engine, p.Send(session="m", text="before")) == p.Sent(seq=1)
        with cluster.node(target).admin() as to, cluster.node(home).admin() as source:
            to.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", rows[home]["id"])
            source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", rows[target]["id"])
            while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                source.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
        with pytest.raises(StoreFailed, match="rehashing"):
            await call(engine, p.Send(session="m", text="mid-move"))
        for port in cluster.primaries():
            with cluster.node(port).admin() as admin:
                admin.execute_command("CLUSTER SETSLOT", slot, "NODE", rows[target]["id"])
        eventually(lambda: cluster.primary_of_slot(slot) == target, what="the slot to move")
        assert await call(engine, p.Send(session="m", text="moved")) == p.Sent(seq=2)
        read = await call(engine, p.Read(session="m", after=0))
        assert isinstance(read, p.Firings)
        assert [f.result for f in read.firings] == ["before", "moved"]
    finally:
        await committer.close()
        if cluster.primary_of_slot(slot) != home:
            cluster.move_slot(slot, home)


async def test_a_cluster_node_that_stops_answering_fails_only_its_own_calls(
    redis_cluster: RedisClusterProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pipeline over two primaries, one of them paused past the pipeline's timeout: the
    paused node's call fails with store_failed (not a garbled answer), the other node's is
    answered; the paused node's connection is dropped with its unread reply, so the next
    call there is answered by its own reply."""
    cluster = redis_cluster
    cluster.flush()
    monkeypatch.setattr(redis_pipeline, "PIPELINE_TIMEOUT", 0.3)
    spread = cluster.by_primary(["a", "b", "c", "d", "e", "f"])
    (paused, (slow, *_)), (_, (fast, *_)) = list(spread.items())[:2]
    engine, committer = await opened(store_url(cluster))
    try:
        for session in (slow, fast):
            await call(engine, p.Start(session=session))
            await call(engine, p.Send(session=session, text="one"))
        with cluster.node(paused).admin() as admin:
            admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")
            try:
                read = engine.handle(p.Read(session=slow, after=0)).result()
                sent = engine.handle(p.Send(session=fast, text="two")).result()
                async with anyio.create_task_group() as tg:
                    answers: dict[str, object] = {}

                    async def keep(name: str, job: Any) -> None:
                        try:
                            answers[name] = await job
                        except Exception as exc:
                            answers[name] = exc

                    tg.start_soon(keep, "read", read)
                    tg.start_soon(keep, "sent", sent)
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
        assert isinstance(answers["read"], StoreFailed), answers
        assert answers["sent"] == p.Sent(seq=2)
        assert await call(engine, p.Send(session=slow, text="two")) == p.Sent(seq=2)
        again = await call(engine, p.Read(session=slow, after=0))
        assert isinstance(again, p.Firings)
        assert [f.result for f in again.firings] == ["one", "two"]
    finally:
        await committer.close()


async def test_a_replicated_change_on_a_node_that_stops_answering_fails_as_a_pipeline_would(
    redis_cluster_replicated: RedisClusterProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``?replicas=1`` on a cluster a change goes on a connection of its own (its
    script, then WAIT), bounded as a whole by the pipeline's timeout and the replicas'
    wait: a primary that stops answering (paused here; frozen, or in DEBUG SLEEP, in a
    failover) fails it with ``store_failed`` while it is still away, and the next change
    there is answered once it is back."""
    cluster = redis_cluster_replicated
    cluster.flush()
    monkeypatch.setattr(redis_pipeline, "PIPELINE_TIMEOUT", 0.3)
    spread = cluster.by_primary(["a", "b", "c", "d", "e", "f"])
    paused, (session, *_) = next(iter(spread.items()))
    engine, committer = await opened(store_url(cluster))  # ?replicas=1
    try:
        await call(engine, p.Start(session=session))
        with cluster.node(paused).admin() as admin:
            admin.execute_command("CLIENT", "PAUSE", 10_000, "ALL")
            try:
                with pytest.raises(StoreFailed, match="failed: "):
                    await call(engine, p.Send(session=session, text="while paused"))
            finally:
                admin.execute_command("CLIENT", "UNPAUSE")
        sent = await call(engine, p.Send(session=session, text="after"))
        assert isinstance(sent, p.Sent) and sent.seq in (1, 2)  # the first may have run
    finally:
        await committer.close()


async def test_pending_timers_cost_redis_no_command_while_none_is_due(
    redis_any: AnyRedis,
) -> None:
    """Timers an hour away, on two daemons on one clock: each sleeps until the first is due,
    and the clock moved 59 minutes on wakes each once (for the move) to sleep until it again,
    with no command to Redis (no polling); a sooner timer scheduled on one wakes the other
    in time to fire it, and it fires once."""
    clock = WatchedClock()
    hour = clock.ms + 3_600_000
    async with two_daemons(store_url(redis_any), clock=clock) as (one, first, two, second, _):
        await call(one, p.Start(session="a"))
        for i in range(50):
            await call(one, p.Schedule(session="a", text=str(i), in_="1h"))
        await _asleep_until(hour, first, second)  # the other daemon heard of them
        assert clock.slept[-2:] == [hour, hour]
        before, turns = _commands(redis_any), _turns(first, second)
        mark = len(clock.slept)
        clock.advance(59 * 60_000)
        await _asleep_until(hour, first, second, past=turns)
        spent = {c: n - before.get(c, 0) for c, n in _commands(redis_any).items()}
        # our own look (info, hello), and replication's own traffic between the nodes
        ours = ("info", "hello", "replconf", "ping")
        spent = {c: n for c, n in spent.items() if n and c not in ours}
        assert spent == {} and _turns(first, second) == (turns[0] + 1, turns[1] + 1)
        assert clock.slept[mark:] == [hour, hour]
        # the other daemon hears of a sooner one and either may fire it: once
        await call(one, p.Schedule(session="a", text="soon", in_="300ms"))
        await _asleep_until(clock.ms + 300, first, second)
        clock.advance(300)
        woken = await call(two, p.Wait(sessions=["a"], cursor="c", timeout_ms=5000))
        assert isinstance(woken, p.Woken) and [f.result for f in woken.batches[0].firings] == [
            "soon"
        ]
        # fired, it is gone (the script that fires a one-shot deletes it): none fires it again
        listed = await call(two, p.Timers(session="a"))
        assert isinstance(listed, p.TimerList)
        assert sorted(int(t.text) for t in listed.timers) == list(range(50))
        batch = await call(one, p.Read(session="a", after=0))
        assert isinstance(batch, p.Firings) and [f.result for f in batch.firings] == ["soon"]


def _turns(*committers: SharedCommitter) -> tuple[int, ...]:
    """How many turns each daemon's timer task has taken."""
    return tuple(c.shared_timers.turns for c in committers)


async def _asleep_until(
    due: int, *committers: SharedCommitter, past: tuple[int, ...] | None = None
) -> None:
    """Until each daemon's timer task sleeps until ``due`` (ms), nothing waking it; with
    ``past`` (their turns then), each having taken a turn since."""

    def asleep(i: int, timers: SharedTimers) -> bool:
        since = past is None or timers.turns > past[i]
        return since and timers._sleeping_until == due and not timers._wake.is_set()

    with anyio.fail_after(10):
        while not all(asleep(i, c.shared_timers) for i, c in enumerate(committers)):  # noqa: ASYNC110 - a bounded look at another task's state
            await anyio.sleep(0.005)


async def test_the_due_index_keeps_no_entry_of_a_refused_schedule_or_a_stopped_session(
    redis_any: AnyRedis,
) -> None:
    """The index is a hint, but not a leak: what no timer stands behind is taken out."""
    engine, committer = await opened(store_url(redis_any))
    store = committer.store

    async def entries() -> int:
        total = 0
        for partition in redis_keys.PARTITION_IDS:
            index_key = redis_keys.partition_keys(partition)[0]
            total += int(await store.client.zcard(index_key))
        return total

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            await committer.shared_timers.ready.wait()
            with pytest.raises(NoSuchSession):
                await call(engine, p.Schedule(session="missing", text="x", in_="1h"))
            await call(engine, p.Start(session="full"))
            for i in range(3):
                await call(engine, p.Schedule(session="full", text=str(i), in_="1h"))
            assert await entries() == 3
            await call(engine, p.Stop(session="full"))
            assert await entries() == 0
            tg.cancel_scope.cancel()
    finally:
        await committer.close()


async def test_a_timer_claimed_before_it_was_written_still_fires(redis_any: AnyRedis) -> None:
    """The race the index must survive: daemon A indexes a due timer, daemon B claims the entry
    and finds no timer yet (A has not written it), then A writes it. The timer still fires,
    once: A indexes it again once it is written, and B's late clean-up removes only the entry
    it leased."""
    from repl_daemon.engine.clock import now_ms

    async with two_daemons(store_url(redis_any)) as (one, first, two, second, _):
        await call(one, p.Start(session="a"))
        real = first.store.schedule
        partition = redis_keys.partition_of("a")

        async def racing(timer: Any) -> Any:
            await second.shared_timers.fire([partition], now_ms() + 1000)
            return await real(timer)

        first.store.schedule = racing  # type: ignore[method-assign]
        await call(one, p.Schedule(session="a", text="raced", at="2020-01-01T00:00:00Z"))
        first.store.schedule = real  # type: ignore[method-assign]
        woken = await call(one, p.Wait(sessions=["a"], cursor="c", timeout_ms=8000))
        assert isinstance(woken, p.Woken) and not woken.timed_out
        assert [f.result for f in woken.batches[0].firings] == ["raced"]
        # fired, it is gone (the script that fires a one-shot deletes it): none fires it again
        listed = await call(two, p.Timers(session="a"))
        assert isinstance(listed, p.TimerList) and listed.timers == []
        batch = await call(two, p.Read(session="a", after=0))
        assert isinstance(batch, p.Firings) and [f.result for f in batch.firings] == ["raced"]


@pytest.mark.parametrize("redis_any", ["single"], indirect=True)
async def test_tokens_are_the_stores_a_revocation_heard_or_missed_ends_them_everywhere(
    redis_any: AnyRedis,
) -> None:
    """A daemon started after a token was made knows it from ``load``; a revocation through
    another daemon is heard on the tokens' channel; one it missed (the link was down) is
    found when the link comes back and it reads the tokens again (SPEC §11)."""
    url = store_url(redis_any)
    first, first_committer = await opened(url)
    made = []
    for name in ("heard", "missed", "kept"):
        answer = await call(first, p.Token(action="add", name=name, sessions=["*"], can=["read"]))
        assert isinstance(answer, p.TokenMade)
        made.append(answer)
    heard, missed, kept = made
    second, committer = await opened(url)  # after the tokens: its load reads them
    revoked: list[str] = []
    told = [anyio.Event(), anyio.Event()]

    def tell(digest: str) -> None:
        revoked.append(digest)
        told[len(revoked) - 1].set()

    committer.listener.revoked = tell  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(second.run)
        await committer.shared_timers.ready.wait()
        with anyio.fail_after(5):
            while not committer.wakes.holds(redis_keys.AUTH):  # noqa: ASYNC110 - a bounded look at another task's state
                await anyio.sleep(0.01)
        assert len(committer._tokens) == 3
        for answer in made:
            assert await second.authenticate(answer.token, b"root").result() is not None
        await call(first, p.Token(action="revoke", name="heard"))
        with anyio.fail_after(5):
            await told[0].wait()
        # a revocation the second daemon does not hear: made in Redis while its link is down
        for server in redis_any.servers:
            with server.admin() as admin:
                admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        digest = scopes.digest(missed.token)
        with redis_any.servers[0].admin() as admin:
            admin.hdel("repl:{~auth}:names", "missed")
            admin.hdel("repl:{~auth}:tokens", digest)
        with anyio.fail_after(10):
            await told[1].wait()
        assert revoked == [scopes.digest(heard.token), digest]
        for gone in (heard, missed):
            with pytest.raises(Unauthorized):
                await second.authenticate(gone.token, b"root").result()
        assert await second.authenticate(kept.token, b"root").result() is not None
        tg.cancel_scope.cancel()
    await committer.close()
    await first_committer.close()


async def _evaluations(engine: Engine, session_id: str) -> int:
    stats = await call(engine, p.Stats(session=session_id))
    assert isinstance(stats, p.StatsReply)
    return stats.sessions[0].evaluations


async def _blocked(engine: Engine, session_id: str) -> None:
    """Until the session's one waiter on ``engine`` is blocked (its look is over)."""
    with anyio.fail_after(10):
        while not any(w.state.value == "blocked" for w in engine.waiters.get(session_id, ())):  # noqa: ASYNC110 - a bounded look at another task's state
            await anyio.sleep(0.005)


async def _looked_at(engine: Engine, session_id: str, seq: int) -> None:
    """Until the session's one waiter on ``engine`` has looked at ``seq`` and is blocked."""
    with anyio.fail_after(10):
        while not any(  # noqa: ASYNC110 - a bounded look at another task's state
            w.state.value == "blocked" and w.position(session_id) == seq
            for w in engine.waiters.get(session_id, ())
        ):
            await anyio.sleep(0.005)


def _spent(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The commands run between two counts, less our own looks, replication's and the
    clients' reading of the cluster's topology (``cluster|nodes`` and the like)."""
    ours = ("info", "hello", "replconf", "ping")
    return {
        c: n - before.get(c, 0)
        for c, n in after.items()
        if n != before.get(c, 0) and c not in ours and not c.startswith(("cluster|", "command"))
    }


async def test_a_matching_wait_through_redis_stays_blocked_through_other_firings(
    redis_any: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A matching wait on daemon B, no cursor (the whole ring); sends through daemon A. An
    early match is found at once and acknowledges nothing. Blocked, each firing that does
    not match costs one look, answered from the firing its wake carried: B sends Redis no
    command for it (the send's own are the only ones), counts the look's evaluation itself
    (its ``stats`` show it at once) and hands it to Redis when its subscription ends, so
    every daemon then reads the same count. Idle it sends Redis no command at all; the
    match wakes it with its tags, ``next`` its seq."""
    monkeypatch.setattr(redis_wakes, "LINGER", 0.2)
    match = Match({"corr": "c-1"})
    async with two_daemons(store_url(redis_any)) as (a, _first, b, _second, tg):
        await call(a, p.Start(session="r"))
        await call(a, p.Send(session="r", text="early", tags={"corr": "c-0", "n": "1"}))
        early = await call(b, p.Wait(sessions=["r"], cursor=None, match=Match({"corr": "c-0"})))
        assert isinstance(early, p.Woken)
        assert [(f.seq, f.tags) for f in early.batches[0].firings] == [
            (1, {"corr": "c-0", "n": "1"})
        ]
        table = await call(b, p.Cursors(session="r"))
        assert isinstance(table, p.CursorList) and table.cursors == []

        answer: list[p.Response] = []

        async def wait() -> None:
            answer.append(await call(b, p.Wait(sessions=["r"], cursor=None, match=match)))

        tg.start_soon(wait)
        await _blocked(b, "r")
        before = await _evaluations(b, "r")
        others: list[dict[str, str]] = [{}, {"corr": "c-2"}, {"n": "1"}, {"corr": "c-10"}]
        for n, tags in enumerate(others, 1):
            ahead = _commands(redis_any)
            sent = await call(a, p.Send(session="r", text=f"other {n}", tags=tags))
            assert isinstance(sent, p.Sent)
            await _looked_at(b, "r", sent.seq)
            spent = _spent(ahead, _commands(redis_any))
            # the send's one script (an EVAL and a WAIT with ?replicas=1 on a cluster)
            assert spent.get("evalsha", 0) + spent.get("eval", 0) == 1, spent
            assert spent.get("xrange", 0) == spent.get("xlen", 0) == 0, spent
            assert await _evaluations(b, "r") == before + 2 * n  # the send and the look
        # idle, B asks Redis nothing: a later firing that B looks at (so the moment after its
        # last look has passed) costs what each one before did, and no command more (that
        # idle waits cost nothing over a stretch of time: tests/e2e/test_redis_cluster.py)
        idle = _commands(redis_any)
        later = await call(a, p.Send(session="r", text="later", tags={"corr": "c-3"}))
        assert isinstance(later, p.Sent)
        await _looked_at(b, "r", later.seq)
        assert _spent(idle, _commands(redis_any)) == spent
        looks = len(others) + 1
        assert not answer
        assert await _evaluations(b, "r") == before + 2 * looks
        assert await _evaluations(a, "r") == before + looks  # B's looks: not yet
        sent = await call(a, p.Send(session="r", text="reply", tags={"corr": "c-1"}))
        assert isinstance(sent, p.Sent)
        with anyio.fail_after(10):
            while not answer:  # noqa: ASYNC110 - a bounded look at another task's state
                await anyio.sleep(0.005)
        (woken,) = answer
        assert isinstance(woken, p.Woken)
        (batch,) = woken.batches
        assert [(f.result, f.tags) for f in batch.firings] == [("reply", {"corr": "c-1"})]
        assert (batch.next, batch.lost) == (sent.seq, 0)
        counted = before + 2 * looks + 2
        assert await _evaluations(b, "r") == counted
        with anyio.fail_after(10):  # B's subscription ends after its linger: counted
            while await _evaluations(a, "r") != counted:  # noqa: ASYNC110 - a bounded look at the store
                await anyio.sleep(0.02)


async def test_tags_come_back_from_every_redis_path(redis_any: AnyRedis) -> None:
    """A send's, a webhook delivery's and a timer's firing carry their tags through Redis,
    and a timer lists its own; bad tags are refused before Redis sees them."""
    engine, committer = await opened(store_url(redis_any))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            await committer.shared_timers.ready.wait()
            await call(engine, p.Start(session="t"))
            await call(engine, p.Send(session="t", text="sent", tags={"corr": "c-1"}))
            hook = Webhook("secret", "on-webhook")
            delivery = {"event": "push", "delivery": "d-1"}
            await engine.deliver("t", hook, "{}", "d-1", tags=delivery).result()
            await engine.deliver("t", hook, "{}", "d-1", tags=delivery).result()  # a redelivery
            timer = await call(
                engine, p.Schedule(session="t", text="later", in_="200ms", tags={"k": "v"})
            )
            assert isinstance(timer, p.TimerSet)
            listed = await call(engine, p.Timers(session="t"))
            assert isinstance(listed, p.TimerList) and listed.timers[0].tags == {"k": "v"}
            woken = await call(
                engine, p.Wait(sessions=["t"], cursor=None, match=Match({"k": None}))
            )
            assert isinstance(woken, p.Woken)
            assert [f.result for f in woken.batches[0].firings] == ["later"]
            read = await call(engine, p.Read(session="t", after=0))
            assert isinstance(read, p.Firings)
            assert [(f.seq, f.tags) for f in read.firings] == [
                (1, {"corr": "c-1"}),
                (2, delivery),
                (3, {"k": "v"}),
            ]
            hooks = await call(engine, p.Read(session="t", match=Match({"event": "push"})))
            assert isinstance(hooks, p.Firings) and [f.seq for f in hooks.firings] == [2]
            assert (hooks.next, hooks.lost) == (3, 0)
            spent = _commands(redis_any)
            with pytest.raises(BadTag):
                await call(engine, p.Send(session="t", text="x", tags={"Bad": "v"}))
            with pytest.raises(BadTag):
                await call(engine, p.Read(session="t", match=Match()))
            assert _commands(redis_any).get("evalsha") == spent.get("evalsha")
            tg.cancel_scope.cancel()
    finally:
        await committer.close()


def _holder(server: AnyRedis, session_id: str) -> RedisProc:
    """The server that holds the session's keys (on a cluster, its slot's primary)."""
    if isinstance(server, RedisClusterProcs):
        slot = server.keyslot(redis_keys.session_keys(session_id)[0])
        return server.node(server.primary_of_slot(slot))
    return server


async def test_a_head_redis_took_back_is_logged_once_a_session_and_counted(
    redis_any: AnyRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis back with older data (each session's keys put back as they were at seq 3: what a
    restart from an older snapshot, or a failover to a replica that lagged, does): the next
    send takes seq 4 again and a read finds head 3, below the 8 this daemon answered. It is
    logged once a session with the numbers, and counted; a session stopped and started
    again, which starts at seq 1 anew, is not."""
    engine, committer = await opened(store_url(redis_any))
    kept: dict[str, dict[str, bytes]] = {}
    for s in ("a", "b"):
        await call(engine, p.Start(session=s))
        for n in range(1, 4):
            await call(engine, p.Send(session=s, text=f"kept {n}"))
        with _holder(redis_any, s).admin() as admin:
            dumps = {key: admin.dump(key) for key in redis_keys.session_keys(s)}
            kept[s] = {key: dump for key, dump in dumps.items() if dump is not None}
        for n in range(4, 9):
            sent = await call(engine, p.Send(session=s, text=f"lost {n}"))
            assert isinstance(sent, p.Sent) and sent.seq == n
    for s, dumps in kept.items():
        with _holder(redis_any, s).admin() as admin:
            for key, dump in dumps.items():
                admin.restore(key, 0, dump, replace=True)
    assert committer.store.counts.heads_went_back == 0  # nothing seen yet: nobody asked
    again = await call(engine, p.Send(session="a", text="again"))
    assert isinstance(again, p.Sent) and again.seq == 4  # seq 4 handed out a second time
    read = await call(engine, p.Read(session="b", after=0))
    assert isinstance(read, p.Firings) and [f.seq for f in read.firings] == [1, 2, 3]
    for s in ("a", "b"):  # seen once each: the heads learned since are what Redis holds
        await call(engine, p.Send(session=s, text="more"))
        await call(engine, p.Read(session=s, after=0))
    await call(engine, p.Stop(session="b"))
    await call(engine, p.Start(session="b"))
    restarted = await call(engine, p.Send(session="b", text="anew"))
    assert isinstance(restarted, p.Sent) and restarted.seq == 1
    assert engine.counts.heads_went_back == 2
    told = [r.getMessage() for r in caplog.records if "went back" in r.getMessage()]
    assert [line.split(": Redis lost")[0] for line in told] == [
        "session 'a': its head went back from 8 to 3",
        "session 'b': its head went back from 8 to 3",
    ]
    assert all(r.levelname == "WARNING" for r in caplog.records if "went back" in r.getMessage())
    await committer.close()


async def _turn(engine: Engine, req: p.Wait, *, then: Any = None) -> p.SessionBatch:
    """One wait on ``engine`` run until it answers, ``then`` awaited once it is blocked."""
    answer: list[p.Response] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_answer, answer, engine, req)
        if then is not None:
            await _blocked(engine, req.sessions[0])
            await then()
        with anyio.fail_after(10):
            while not answer:  # noqa: ASYNC110 - a bounded look at another task's state
                await anyio.sleep(0.005)
    (woken,) = answer
    assert isinstance(woken, p.Woken)
    (batch,) = woken.batches
    return batch


async def test_a_wake_lost_with_its_subscription_still_wakes_the_waiter_once_in_order(
    redis_any: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiter's subscription on daemon B is dropped between A's sends and their wakes
    (every pubsub connection killed, B's repair held until both are recorded): the
    published firings reach nobody. Once the link is back, the waiter reads and gets both,
    once, in order; the next turn is answered from its wake again."""
    gate = anyio.Event()
    repair = redis_wakes.Wakes._repair

    async def held(self: redis_wakes.Wakes) -> None:
        await gate.wait()
        await repair(self)

    monkeypatch.setattr(redis_wakes.Wakes, "_repair", held)
    url = store_url(redis_any)
    async with two_daemons(url) as (a, _first, b, second, _tg):
        await call(a, p.Start(session="l"))

        async def drop_then_send() -> None:
            for server in redis_any.servers:
                with server.admin() as admin:
                    admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            with anyio.fail_after(10):
                while second.wakes.subscribers:  # noqa: ASYNC110 - a bounded look at another task's state
                    await anyio.sleep(0.005)
            for text in ("one", "two"):
                await call(a, p.Send(session="l", text=text))
            gate.set()

        req = p.Wait(sessions=["l"], cursor="w")
        batch = await _turn(b, req, then=drop_then_send)
        assert [(f.seq, f.result) for f in batch.firings] == [(1, "one"), (2, "two")]

        async def send() -> None:
            await call(a, p.Send(session="l", text="three"))

        req = p.Wait(sessions=["l"], cursor="w", ack={"l": batch.next})
        before = _commands(redis_any, primaries=True)
        batch = await _turn(b, req, then=send)
        spent = _spent(before, _commands(redis_any, primaries=True))
        assert [(f.seq, f.result) for f in batch.firings] == [(3, "three")]
        assert spent.get("xrange", 0) == 0, spent  # the wake's own firing, no read


async def test_wakes_out_of_order_across_two_senders_give_every_firing_once_in_order(
    redis_any: AnyRedis,
) -> None:
    """Daemon B's wakes from Redis are held and handed over late, newest first, while B's
    own sends wake its waiter at once: the waiter hears a firing past a gap (it reads the
    ring), or one it has seen (it reads, finds nothing, blocks on). Over every turn it
    gets each firing once, in order, and a firing answered from its wake is the one a read
    gives, field for field (an event with tags and text a read must keep exactly)."""
    async with two_daemons(store_url(redis_any)) as (a, _first, b, second, _tg):
        held: list[tuple[str, bytes]] = []
        deliver = second.wakes.on_wake
        try:
            await call(a, p.Start(session="o"))
            second.wakes.on_wake = lambda session, payload: held.append((session, payload))
            got: list[int] = []

            def hand_over() -> None:
                for session, payload in reversed(held):
                    deliver(session, payload)
                held.clear()

            async def a_thrice() -> None:  # three wakes held, then handed over newest first
                for n in range(3):
                    await call(a, p.Send(session="o", text=f"a{n}"))
                hand_over()

            async def a_then_b() -> None:  # A's wake held; B's own send wakes at once
                await call(a, p.Send(session="o", text="a3"))
                await call(b, p.Send(session="o", text="b4"))

            async def late() -> None:  # A's wake from the turn before comes now: seen
                hand_over()
                await call(b, p.Send(session="o", text="b5"))

            for then in (a_thrice, a_then_b, late):
                ack = {"o": got[-1]} if got else {}
                batch = await _turn(b, p.Wait(sessions=["o"], cursor="w", ack=ack), then=then)
                got += [f.seq for f in batch.firings]
                assert batch.next == got[-1]
            assert got == [1, 2, 3, 4, 5, 6]

            second.wakes.on_wake = deliver  # in order again: answered from the wake
            tags = {"corr": "c-7", "reply-to": "r é"}

            async def send() -> None:
                text = 'é"\\/\n\x00☃\U0001f600 ' * 3
                await call(a, p.Send(session="o", handler="on-ci", text=text, tags=tags))

            before = _commands(redis_any, primaries=True)
            batch = await _turn(b, p.Wait(sessions=["o"], cursor="w", ack={"o": 6}), then=send)
            spent = _spent(before, _commands(redis_any, primaries=True))
            assert spent.get("xrange", 0) == 0, spent  # the wait's look read no firing
            read = await call(a, p.Read(session="o", after=6))
            assert isinstance(read, p.Firings)
            assert batch.firings == read.firings and batch.firings[0].tags == tags
            assert batch.firings[0].event is not None and batch.firings[0].result is None

            # B's own send: the firing its waiter is handed is made from the request
            for handler in ("on-ci", "on-message"):
                seq = batch.next

                async def own(handler: str = handler) -> None:
                    await call(b, p.Send(session="o", handler=handler, text="é\n", tags=tags))

                before = _commands(redis_any, primaries=True)
                req = p.Wait(sessions=["o"], cursor="w", ack={"o": seq})
                batch = await _turn(b, req, then=own)
                spent = _spent(before, _commands(redis_any, primaries=True))
                assert spent.get("xrange", 0) == 0, spent
                read = await call(a, p.Read(session="o", after=seq))
                assert isinstance(read, p.Firings)
                assert batch.firings == read.firings and len(read.firings) == 1
        finally:
            second.wakes.on_wake = deliver


async def test_a_burst_heard_while_settling_is_read_so_the_rings_limit_holds(
    redis_any: AnyRedis,
) -> None:
    """A waiter on daemon B with a settle time, a session with a limit of 2, five sends
    through A within the settle time: B has heard all five, but the ring keeps two, so the
    wait reads and answers what a read gives (three lost, the last two), never more
    firings than the limit."""
    async with two_daemons(store_url(redis_any), settle_b=0.3) as (a, _first, b, _second, _tg):
        await call(a, p.Start(session="burst", buffer=2))

        async def five() -> None:
            for n in range(1, 6):
                await call(a, p.Send(session="burst", text=f"b{n}"))

        batch = await _turn(b, p.Wait(sessions=["burst"], cursor="w"), then=five)
        assert [(f.seq, f.result) for f in batch.firings] == [(4, "b4"), (5, "b5")]
        assert (batch.next, batch.lost) == (5, 3)


async def test_a_firing_heard_from_before_a_restart_of_its_session_is_not_answered(
    redis_any: AnyRedis,
) -> None:
    """Daemon B's wakes are held while A sends to a session, stops it and starts it again;
    B's waiter then looks at the new session (empty). The old firing's message, handed
    over late, has the seq the waiter would take next, but of the session's earlier
    incarnation: the waiter reads, finds nothing and blocks on; the new session's first
    firing wakes it."""
    async with two_daemons(store_url(redis_any)) as (a, _first, b, second, _tg):
        held: list[tuple[str, bytes]] = []
        deliver = second.wakes.on_wake
        try:
            await call(a, p.Start(session="inc"))
            await call(b, p.Wait(sessions=["inc"], timeout_ms=0))  # B subscribes, lingers
            second.wakes.on_wake = lambda session, payload: held.append((session, payload))
            await call(a, p.Send(session="inc", text="old"))
            await call(a, p.Stop(session="inc"))
            await call(a, p.Start(session="inc"))
            with anyio.fail_after(10):
                while len(held) < 2:  # noqa: ASYNC110 - a bounded look at another task's state
                    await anyio.sleep(0.005)
            (old, _stop) = held  # the stop's message is not handed over: no wait to end
            second.wakes.on_wake = deliver

            async def late_then_new() -> None:
                deliver(*old)  # the waiter reads at once (a round trip) ...
                assert [w.state.value for w in b.waiters["inc"]] == ["looking"]
                await _blocked(b, "inc")  # ... finds nothing, and blocks on
                await call(a, p.Send(session="inc", text="new"))

            batch = await _turn(b, p.Wait(sessions=["inc"], cursor="w"), then=late_then_new)
            assert [(f.seq, f.result) for f in batch.firings] == [(1, "new")]
        finally:
            second.wakes.on_wake = deliver


async def test_the_looks_a_daemon_owes_redis_are_counted_once_whatever_happens_to_them(
    redis_any: AnyRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looks B answers from published firings are owed to Redis's count: B's own figures
    show them at once; a read Redis refuses before counting (an ack past the head) leaves
    them owed; the next read hands them over; 2 of them at one session (``MAX_OWED``,
    made small) are handed over with no read; a stop on B drops them, so the session
    started again under the id counts from 0."""
    monkeypatch.setattr(redis_committer, "MAX_OWED", 3)
    url = store_url(redis_any)
    async with two_daemons(url) as (a, _first, b, second, tg):
        await call(a, p.Start(session="owe"))
        match = Match({"corr": "never"})

        async def others(n: int) -> None:
            for _ in range(n):
                sent = await call(a, p.Send(session="owe", text="other"))
                assert isinstance(sent, p.Sent)
                await _looked_at(b, "owe", sent.seq)

        ended: list[ReplError] = []

        async def wait() -> None:
            try:
                await call(b, p.Wait(sessions=["owe"], match=match, cursor=None))
            except ReplError as exc:
                ended.append(exc)

        tg.start_soon(wait)
        await _blocked(b, "owe")
        await others(2)  # two looks owed
        assert second._owed == {"owe": 2}
        assert await _evaluations(b, "owe") == await _evaluations(a, "owe") + 2
        refused = p.Read(session="owe", after=99)  # refused before it counts
        with pytest.raises(ReplError, match="after head"):
            await call(b, refused)
        assert second._owed == {"owe": 2}
        await call(b, p.Read(session="owe", after=0))  # hands them over
        assert second._owed == {}
        assert await _evaluations(b, "owe") == await _evaluations(a, "owe")
        await others(3)  # the third is counted at once, with no read
        counted = await _evaluations(b, "owe")
        with anyio.fail_after(10):
            while second._owed or await _evaluations(a, "owe") != counted:  # noqa: ASYNC110 - a bounded look at the store
                await anyio.sleep(0.01)
        await others(1)
        assert second._owed == {"owe": 1}
        await call(b, p.Stop(session="owe"))
        assert second._owed == {}
        with anyio.fail_after(10):
            while not ended:  # noqa: ASYNC110 - a bounded look at another task's state
                await anyio.sleep(0.005)
        assert ended[0].code.value == "session_stopped"
        await call(b, p.Start(session="owe"))
        assert await _evaluations(b, "owe") == await _evaluations(a, "owe") == 0
