"""Claims in the engine, without sockets (SPEC §16): what a claim takes when its client
goes, what a durable store answers when, and what a store without groups says.

A claim on a durable store is answered once its commit is; a client that goes away
in between took nothing, so the claim gives its firing straight back (the next
claim has it, attempt 2) in the same commit. The Redis store keeps no groups yet:
it refuses each of their ops with a message that says so, and changes nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import pytest

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.backends.redis import RedisBackend
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.engine import Engine
from repl_daemon.engine.outcome import Outcome
from session.errors import BadRequest
from tests.helpers import RedisProc, store_url

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


@pytest.mark.parametrize(
    "req",
    [
        p.Claim(session="jobs", timeout_ms=0),
        p.Finish(session="jobs", claim="work:1:1"),
        p.Release(session="jobs", claim="work:1:1"),
        p.Extend(session="jobs", claim="work:1:1"),
        p.Group(session="jobs", group="work"),
        p.Groups(session="jobs"),
        p.Claims(session="jobs"),
    ],
)
async def test_the_redis_store_refuses_groups_and_says_so(
    redis_server: RedisProc, req: p.AnyRequest
) -> None:
    engine = Engine(RedisBackend(RedisStore(store_url(redis_server))), settle=0)
    await engine.load()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            await engine.handle(p.Start(session="jobs")).result()
            with pytest.raises(BadRequest, match="not kept by the Redis store yet"):
                await engine.handle(req).result()
            tg.cancel_scope.cancel()
    finally:
        await engine.committer.close()
        await engine.backend.close()
