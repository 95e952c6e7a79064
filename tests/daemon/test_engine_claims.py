"""Claims in the engine, without sockets (SPEC §16): what a claim takes when its client
goes, what a durable store answers when, and what a store without groups says.

A claim on a durable store is answered once its commit is; a client that goes away
in between took nothing, so the claim gives its firing straight back (the next
claim has it, attempt 2) in the same commit. Two daemons on one Redis (one
server, a cluster, a cluster with replicas) share a group's work as one daemon does.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.backends.redis import keys as redis_keys
from repl_daemon.engine import Engine
from repl_daemon.engine.claim import ClaimWait
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.wait import WaitState
from session.errors import LeaseLost, NoSuchSession, StoreFailed, TooMany
from session.rules import GROUPS_TIMER
from tests.daemon.test_engine_shared import AnyRedis, call, opened, two_daemons
from tests.helpers import MovedClock, RedisProc, store_url

pytestmark = pytest.mark.anyio


async def durable(path: Path) -> tuple[Engine, LocalCommitter]:
    """An engine over SQLite whose committer writes only when the test says
    (``commit_now``): a change's answer waits until then."""
    engine = Engine(LocalBackend(SqliteStore(path)), settle=0)
    await engine.load()
    committer = engine.committer
    assert isinstance(committer, LocalCommitter)
    return engine, committer


async def answered(committer: LocalCommitter, outcome: Outcome[Any]) -> Any:
    await committer.commit_now()
    return await outcome.result()


def held(committer: LocalCommitter, session: str) -> list[tuple[int, int]]:
    groups = committer.sessions[session].session.groups
    return [(lease.seq, lease.attempt) for lease in groups.leases()]


async def test_a_claim_whose_client_goes_before_its_commit_gives_the_firing_back(
    tmp_path: Path,
) -> None:
    engine, committer = await durable(tmp_path / "repl.db")
    try:
        await answered(committer, engine.handle(p.Start(session="jobs")))
        await answered(committer, engine.handle(p.Send(session="jobs", text="job")))
        answers: list[Any] = []
        job = engine.handle(p.Claim(session="jobs")).settle(lambda v, e: answers.append((v, e)))
        assert job is not None
        assert held(committer, "jobs") == [(1, 1)]  # taken, not yet durable, not answered
        job.cancel()  # the client went away
        assert held(committer, "jobs") == []  # given back at once
        await committer.commit_now()
        assert answers == []  # a cancelled claim is answered nothing
        engine.handle(p.Claim(session="jobs", timeout_ms=0)).settle(
            lambda v, e: answers.append((v, e))
        )
        await committer.commit_now()
        ((again, error),) = answers
        assert error is None and isinstance(again, p.Claimed)
        assert (again.seq, again.attempt) == (1, 2)
    finally:
        await committer.close()
        committer.store.close()


async def test_a_give_back_that_cannot_be_made_leaves_the_lease_to_run_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine, committer = await durable(tmp_path / "repl.db")
    try:
        await answered(committer, engine.handle(p.Start(session="jobs")))
        await answered(committer, engine.handle(p.Send(session="jobs", text="job")))
        job = engine.handle(p.Claim(session="jobs")).settle(lambda v, e: None)
        assert job is not None
        stopped = engine.handle(p.Stop(session="jobs"))  # gone here at once, durable later
        with caplog.at_level(logging.INFO, logger="repl.daemon"):
            job.cancel()
        assert "was not given back" in caplog.text
        await answered(committer, stopped)
    finally:
        await committer.close()
        committer.store.close()


async def test_a_durable_claim_is_answered_once_committed(tmp_path: Path) -> None:
    engine, committer = await durable(tmp_path / "repl.db")
    try:
        await answered(committer, engine.handle(p.Start(session="jobs")))
        await answered(committer, engine.handle(p.Send(session="jobs", text="job")))
        answers: list[Any] = []
        engine.handle(p.Claim(session="jobs")).settle(lambda v, e: answers.append((v, e)))
        assert answers == []  # taken in memory, on its way to the disk
        await committer.commit_now()
        ((claimed, error),) = answers
        assert error is None and isinstance(claimed, p.Claimed) and claimed.claim == "work:1:1"
    finally:
        await committer.close()
        committer.store.close()
    store = SqliteStore(tmp_path / "repl.db")
    try:
        (snapshot,) = list(store.load())
        ((name, leases),) = [(g.name, g.leases) for g in snapshot.groups]
        assert name == "work" and [(seq, a) for seq, a, _ in leases] == [(1, 1)]
    finally:
        store.close()


async def claimed(engine: Engine, req: p.Claim) -> p.Claimed:
    answer = await engine.handle(req).result()
    assert isinstance(answer, p.Claimed)
    return answer


async def test_two_daemons_on_one_redis_share_the_work_of_a_group(redis_any: AnyRedis) -> None:
    """Claimers blocked on two daemons: a send on either wakes them, and each firing goes
    to one of them; a release on one wakes a claimer blocked on the other; a lease that
    runs out is offered again by whichever daemon's timer fires its expiry (a durable
    timer, once), and the last attempt lands in the dead-letter session, on another slot
    of a cluster, once."""
    clock = MovedClock()
    async with two_daemons(store_url(redis_any), clock=clock) as (a, _, b, _b, tg):
        await call(a, p.Start(session="jobs"))
        await call(a, p.Group(session="jobs", group="work", max_attempts=2))
        got: list[p.Claimed] = []

        async def claim_on(engine: Engine) -> None:
            got.append(await claimed(engine, p.Claim(session="jobs", lease_ms=5000)))

        for engine in (a, b, a, b):
            tg.start_soon(claim_on, engine)
        await _blocked(a, 2)
        await _blocked(b, 2)
        for n in range(4):
            await call(b if n % 2 else a, p.Send(session="jobs", text=f"job {n}"))
        await _until(lambda: len(got) == 4)
        assert sorted(c.seq for c in got) == [1, 2, 3, 4] and {c.attempt for c in got} == {1}
        # a release on a wakes a claimer blocked on b (the message on the session's channel)
        tg.start_soon(claim_on, b)
        await _blocked(b, 1)
        first = min(got, key=lambda c: c.seq)
        assert first.claim is not None
        released = await call(a, p.Release(session="jobs", claim=first.claim))
        assert released == p.Released(dead=False)
        await _until(lambda: len(got) == 5)
        assert (got[-1].seq, got[-1].attempt) == (1, 2)
        # the second attempt runs out: dead (max 2), recorded in jobs.dead once
        for c in got[:4]:
            if c is first:
                continue
            assert c.claim is not None
            await call(a, p.Finish(session="jobs", claim=c.claim))
        clock.advance(5000)
        await _until_dead(a)
        listed = await call(b, p.Groups(session="jobs"))
        assert isinstance(listed, p.GroupList)
        (row,) = listed.groups
        assert (row.done, row.dead, row.held, row.ready) == (4, 1, 0, 0)
        dead = await call(b, p.Read(session="jobs.dead", after=0))
        assert isinstance(dead, p.Firings)
        assert [(f.result, f.tags["dead.seq"], f.tags["dead.attempts"]) for f in dead.firings] == [
            ("job 0", "1", "2")
        ]


async def _blocked(engine: Engine, count: int) -> None:
    await _until(lambda: engine.waits.count >= count)


async def _until(check: Any) -> None:
    with anyio.fail_after(30):
        while not check():  # noqa: ASYNC110 - a bounded look at other tasks' state
            await anyio.sleep(0.005)


async def _until_dead(engine: Engine) -> None:
    with anyio.fail_after(30):
        while True:
            try:
                read = await call(engine, p.Read(session="jobs.dead", after=0))
            except NoSuchSession:
                read = None
            if isinstance(read, p.Firings) and read.firings:
                return
            await anyio.sleep(0.01)


async def test_a_firing_wakes_one_blocked_claimer_and_a_burst_hands_on_in_a_chain() -> None:
    """Fifty claimers blocked on one group: a send costs the look of the claimer that
    takes it and of the next one (which finds nothing and ends the chain), not fifty; a
    burst of ten is taken by ten claimers, oldest first, each handing the wake on."""
    engine = Engine(LocalBackend(MemoryStore()), settle=0)
    await engine.load()
    committer = engine.committer
    assert isinstance(committer, LocalCommitter)
    await engine.handle(p.Start(session="jobs")).result()
    answers: list[p.Claimed] = []
    for n in range(50):
        engine.handle(p.Claim(id=n, session="jobs")).settle(
            lambda v, e: answers.append(cast(p.Claimed, v))
        )
    assert engine.waits.count == 50
    session = committer.sessions["jobs"].session
    before = session.evaluations
    engine.handle(p.Send(session="jobs", text="one"))
    await _until(lambda: len(answers) == 1)
    await _until(lambda: session.evaluations >= before + 3)
    # every claimer left is blocked, none looking: the chain has ended (a claimer hands the
    # wake on as its look ends, so a fourth look would be under way or counted by now)
    await _until(lambda: all(w.state is WaitState.BLOCKED for w in engine.waits.every()))
    assert session.evaluations == before + 3  # the send, the taker's look, the next one's
    assert answers[0].id == 0 and answers[0].seq == 1  # the oldest claimer took it
    for n in range(10):
        engine.handle(p.Send(session="jobs", text=f"burst {n}"))
    await _until(lambda: len(answers) == 11)
    assert [a.id for a in answers[1:]] == list(range(1, 11))  # oldest first
    assert sorted(a.seq for a in answers[1:]) == list(range(2, 12))
    assert engine.waits.count == 39


async def test_a_claimer_that_goes_while_it_looks_hands_the_wake_on(tmp_path: Path) -> None:
    engine, committer = await durable(tmp_path / "repl.db")
    try:
        await answered(committer, engine.handle(p.Start(session="jobs")))
        await answered(committer, engine.handle(p.Group(session="jobs", group="work")))
        answers: list[Any] = []
        first = engine.handle(p.Claim(session="jobs", id="first")).settle(lambda v, e: None)
        engine.handle(p.Claim(session="jobs", id="second")).settle(lambda v, e: answers.append(v))
        assert first is not None
        sent = engine.handle(p.Send(session="jobs", text="job"))
        await committer.commit_now()  # the send is visible: the first claimer takes it
        await sent.result()
        assert held(committer, "jobs") == [(1, 1)]
        first.cancel()  # gone before its claim was durable: given back, the wake handed on
        await _until(lambda: held(committer, "jobs") == [(1, 2)])
        await committer.commit_now()
        await _until(lambda: len(answers) == 1)
        assert answers[0].id == "second" and answers[0].attempt == 2
    finally:
        await committer.close()
        committer.store.close()


async def test_a_claim_on_redis_whose_client_goes_while_its_script_runs_gives_it_back(
    redis_any: AnyRedis,
) -> None:
    """The claim's script is on its way to Redis when the claimer goes: what it takes
    there is released when its answer comes (the next claim has it, attempt 2)."""
    async with two_daemons(store_url(redis_any)) as (a, first, _b, _bc, _tg):
        await call(a, p.Start(session="jobs"))
        await call(a, p.Send(session="jobs", text="job"))
        calls = first.groups
        claim_script = calls.claim
        jobs: list[ClaimWait] = []

        def claim_then_go(session_id: str, op: Any) -> Any:
            sent = claim_script(session_id, op)  # queued for the next pipeline
            asyncio.get_running_loop().call_soon(jobs[0].cancel)  # gone before its answer
            return sent

        calls.claim = claim_then_go  # type: ignore[method-assign]
        job = a.handle(p.Claim(session="jobs")).settle(lambda v, e: None)
        assert isinstance(job, ClaimWait)
        jobs.append(job)
        await _until(lambda: job.state.value == "over")
        calls.claim = claim_script  # type: ignore[method-assign]
        again = await claimed(a, p.Claim(session="jobs", timeout_ms=10_000))
        assert (again.seq, again.attempt) == (1, 2)


async def test_a_group_deadline_the_index_failed_to_take_is_written_again(
    redis_server: RedisProc,
) -> None:
    """A claim's lease is indexed as a timer; when that write fails (the index's node
    away in a cluster's failover), it is written again until the index has it."""
    async with two_daemons(store_url(redis_server)) as (a, first, _b, _bc, _tg):
        await call(a, p.Start(session="jobs"))
        await call(a, p.Send(session="jobs", text="job"))
        store = first.store
        index = store.index
        failed: list[object] = []

        def fail_once(partition: str, **changes: Any) -> Any:
            if not failed and changes.get("lower"):
                failed.append(changes)
                future = asyncio.get_running_loop().create_future()
                future.set_exception(StoreFailed("redis at the index's node failed"))
                return future
            return index(partition, **changes)

        store.index = fail_once  # type: ignore[method-assign]
        got = await claimed(a, p.Claim(session="jobs", lease_ms=60_000))
        assert failed and got.seq == 1
        key = redis_keys.partition_keys(redis_keys.partition_of("jobs"))[0]
        await _until_indexed(store, key, got.lease_until_ms)
        store.index = index  # type: ignore[method-assign]


async def _until_indexed(store: Any, key: str, due: int) -> None:
    with anyio.fail_after(30):
        while await store.client.zscore(key, f"jobs {GROUPS_TIMER}") != due:  # noqa: ASYNC110 - a bounded look at Redis
            await anyio.sleep(0.02)


async def test_a_seventeenth_group_is_refused_on_redis_as_in_the_core(
    redis_server: RedisProc,
) -> None:
    async with two_daemons(store_url(redis_server)) as (a, _, b, _bc, _tg):
        await call(a, p.Start(session="jobs"))
        for n in range(16):
            await call(a if n % 2 else b, p.Group(session="jobs", group=f"g{n}"))
        for req in (p.Group(session="jobs", group="g16"), p.Claim(session="jobs", group="g16")):
            with pytest.raises(TooMany, match="has 16 groups, its limit"):
                await call(a, req)
        listed = await call(b, p.Groups(session="jobs"))
        assert isinstance(listed, p.GroupList) and len(listed.groups) == 16


async def test_a_join_on_one_daemon_is_woken_by_the_group_moving_on_another(
    redis_any: AnyRedis,
) -> None:
    """A join blocked on a hears b's dones and the dead letter an expiry made (the
    ``grouped`` message on the session's channel), and answers with the counts."""
    clock = MovedClock()
    async with two_daemons(store_url(redis_any), clock=clock) as (a, _, b, _b, tg):
        await call(a, p.Start(session="jobs"))
        await call(a, p.Group(session="jobs", group="work", max_attempts=1))
        for n in range(3):
            await call(b, p.Send(session="jobs", text=f"job {n}"))
        held = [await claimed(b, p.Claim(session="jobs", lease_ms=5000)) for _ in range(3)]
        joined: list[p.Response] = []

        async def join() -> None:
            joined.append(await a.handle(p.Join(session="jobs", group="work")).result())

        tg.start_soon(join)
        await _blocked(a, 1)
        for c in held[:2]:
            assert c.claim is not None
            await call(b, p.Finish(session="jobs", claim=c.claim))
        await _until(lambda: a.waits.count == 1 and not joined)  # two of three: still blocked
        clock.advance(5000)  # the third's lease runs out: its only attempt, a dead letter
        await _until(lambda: bool(joined))
        assert joined == [
            p.Joined(upto=3, done=3, dead=1, ready=0, held=0, delayed=0, timed_out=False)
        ]


# -- done --next (docs/semantics.md G11): the done and the claim, one commit ----------------


async def looked(committer: LocalCommitter, outcome: Outcome[Any]) -> Any:
    """A claim's answer on a store that commits when told: its look started, then the
    commit made."""
    answers: list[Any] = []
    outcome.settle(lambda v, e: answers.append((v, e)))
    await committer.commit_now()
    ((value, error),) = answers
    assert error is None
    return value


async def test_done_next_is_answered_after_one_commit_holding_the_done_and_the_claim(
    tmp_path: Path,
) -> None:
    engine, committer = await durable(tmp_path / "repl.db")
    try:
        await answered(committer, engine.handle(p.Start(session="jobs")))
        for n in (1, 2):
            await answered(committer, engine.handle(p.Send(session="jobs", text=f"job {n}")))
        first = await looked(committer, engine.handle(p.Claim(session="jobs")))
        assert isinstance(first, p.Claimed) and first.claim == "work:1:1"
        commits = engine.counts.commits.count
        answers: list[Any] = []
        req = p.FinishNext(session="jobs", claim="work:1:1")
        engine.handle(req).settle(lambda v, e: answers.append((v, e)))
        assert answers == []  # done and taken in memory, on their way to the disk together
        assert held(committer, "jobs") == [(2, 1)]
        await committer.commit_now()
        ((following, error),) = answers
        assert error is None and isinstance(following, p.Claimed)
        assert (following.claim, following.seq) == ("work:2:1", 2)
        assert engine.counts.commits.count == commits + 1  # one group commit, not two
    finally:
        await committer.close()
        committer.store.close()
    store = SqliteStore(tmp_path / "repl.db")
    try:
        (snapshot,) = list(store.load())
        ((group,),) = [snapshot.groups]
        assert group.done_through == 1 and [(s, a) for s, a, _ in group.leases] == [(2, 1)]
    finally:
        store.close()


async def test_done_next_whose_client_goes_before_its_commit_gives_the_claim_back(
    tmp_path: Path,
) -> None:
    engine, committer = await durable(tmp_path / "repl.db")
    try:
        await answered(committer, engine.handle(p.Start(session="jobs")))
        for n in (1, 2):
            await answered(committer, engine.handle(p.Send(session="jobs", text=f"job {n}")))
        await looked(committer, engine.handle(p.Claim(session="jobs")))
        job = engine.handle(p.FinishNext(session="jobs", claim="work:1:1")).job
        assert job is not None
        job.start(lambda v, e: None)
        assert held(committer, "jobs") == [(2, 1)]
        job.cancel()  # the client went away: the done stands, the claim is given back
        assert held(committer, "jobs") == []
        await committer.commit_now()
        again = await looked(committer, engine.handle(p.Claim(session="jobs", timeout_ms=0)))
        assert isinstance(again, p.Claimed) and (again.seq, again.attempt) == (2, 2)
    finally:
        await committer.close()
        committer.store.close()


@pytest.mark.parametrize("store", ["memory", "durable", "redis"])
async def test_done_next_on_every_store(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same answers on each store, the engine running: the next job, a block until
    one comes (the done made meanwhile), a timeout with the done made, and a refused done
    that takes nothing."""
    if store == "redis":
        url = store_url(request.getfixturevalue("redis_server"))
        engine: Engine = (await opened(url))[0]
    else:
        local = SqliteStore(tmp_path / "repl.db") if store == "durable" else MemoryStore()
        engine = Engine(LocalBackend(local), settle=0)
        await engine.load()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            await _done_next_answers(engine)
            tg.cancel_scope.cancel()
    finally:
        await engine.committer.close()
        if store != "redis":
            local.close()


async def _done_next_answers(engine: Engine) -> None:
    await call(engine, p.Start(session="jobs"))
    for n in (1, 2):
        await call(engine, p.Send(session="jobs", text=f"job {n}"))
    first = await claimed(engine, p.Claim(session="jobs"))
    req = p.FinishNext(session="jobs", claim=first.claim or "")
    following = await call(engine, req)
    assert isinstance(following, p.Claimed) and following.firing is not None
    assert (following.claim, following.firing.result) == ("work:2:1", "job 2")
    # nothing left: it blocks as a claim does, the done made, until a job comes
    blocked = engine.handle(p.FinishNext(session="jobs", claim="work:2:1", timeout_ms=60_000))
    blocked_answer = asyncio.ensure_future(blocked.result())
    await _blocked(engine, 1)
    rows = await call(engine, p.Groups(session="jobs"))
    assert isinstance(rows, p.GroupList) and rows.groups[0].done == 2
    await call(engine, p.Send(session="jobs", text="job 3"))
    third = await blocked_answer
    assert isinstance(third, p.Claimed) and third.claim == "work:3:1"
    # a timeout: the done made, nothing taken
    timed = await call(engine, p.FinishNext(session="jobs", claim="work:3:1", timeout_ms=0))
    assert isinstance(timed, p.Claimed) and timed.timed_out and timed.claim is None
    # a done refused: its error, nothing taken
    await call(engine, p.Send(session="jobs", text="job 4"))
    with pytest.raises(LeaseLost):
        await call(engine, p.FinishNext(session="jobs", claim="work:3:1"))
    rows = await call(engine, p.Groups(session="jobs"))
    assert isinstance(rows, p.GroupList)
    assert (rows.groups[0].done, rows.groups[0].held, rows.groups[0].ready) == (3, 0, 1)
