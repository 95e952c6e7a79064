"""A woken wait's settle (rule S8, amended): it lingers until its sessions are quiet.

A woken wait reads once no new firing has come for the quiet gap, and at the
latest the settle time after its wake: a lone firing is answered after the
gap, a burst whose firings come closer than the gap as one batch, a steady
stream at the settle time. Every test runs on a clock it moves by hand
(``MovedClock``: the settle is timed on the engine's clock), on each kind of
store: the memory store and SQLite (the firings recorded on the waiter's own
daemon) and Redis (another daemon's, heard as published messages).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.engine import Engine
from repl_daemon.engine.wait import Wait, WaitState
from tests.daemon.test_engine_shared import two_daemons
from tests.helpers import MovedClock, RedisProc, store_url

pytestmark = pytest.mark.anyio

SETTLE_MS = 50
QUIET_MS = 3
STORES = ("memory", "durable", "redis")


class Pair:
    """Where the test sends (``sender``) and where its wait blocks (``waiter``): one engine
    on a store of its own; two on Redis, the firings heard from the other one."""

    def __init__(self, sender: Engine, waiter: Engine, clock: MovedClock) -> None:
        self.sender, self.waiter, self.clock = sender, waiter, clock
        waiter.settle, waiter.quiet = SETTLE_MS / 1000, QUIET_MS / 1000

    async def send(self, text: str) -> None:
        sent = await self.sender.handle(p.Send(session="s", text=text)).result()
        assert isinstance(sent, p.Sent)

    def the_wait(self) -> Wait:
        (wait,) = self.waiter.waiters["s"]
        return wait

    async def blocked(self) -> None:
        with anyio.fail_after(10):
            while (  # noqa: ASYNC110 - a bounded look at another task's state
                self.waiter.waiters_of("s") != 1 or self.the_wait().state is not WaitState.BLOCKED
            ):
                await anyio.sleep(0.001)

    async def heard(self) -> None:
        """Until the wait has heard the last send: it settles, its quiet gap from now on."""
        gap_from_now = self.clock.monotonic() + QUIET_MS / 1000 - 1e-9
        with anyio.fail_after(10):
            while True:
                wait = self.the_wait()
                if wait.state is WaitState.SETTLING and wait.quiet_end >= gap_from_now:
                    return
                await anyio.sleep(0.001)

    async def still_settling(self) -> None:
        for _ in range(3):  # a call the clock made now would have run
            await anyio.lowlevel.checkpoint()
        assert self.the_wait().state is WaitState.SETTLING


@contextlib.asynccontextmanager
async def paired(store: str, tmp_path: Path, clock: MovedClock) -> AsyncIterator[Pair]:
    backend = LocalBackend(MemoryStore() if store == "memory" else SqliteStore(tmp_path / "r.db"))
    engine = Engine(backend, settle=0, clock=clock)
    await engine.load()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            await engine.handle(p.Start(session="s")).result()
            yield Pair(engine, engine, clock)
            tg.cancel_scope.cancel()
    finally:
        await backend.close()


@contextlib.asynccontextmanager
async def redis_pair(url: str, clock: MovedClock) -> AsyncIterator[Pair]:
    async with two_daemons(url, clock=clock) as (a, _first, b, _second, _tg):
        await a.handle(p.Start(session="s")).result()
        yield Pair(a, b, clock)


@pytest.fixture(params=STORES)
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    clock = MovedClock()
    if request.param == "redis":
        redis: RedisProc = request.getfixturevalue("redis_single")
        redis.flush()
        async with redis_pair(store_url(redis), clock) as both:
            yield both
    else:
        async with paired(request.param, tmp_path, clock) as one:
            yield one


@contextlib.asynccontextmanager
async def waiting(pair: Pair) -> AsyncIterator[list[p.Woken]]:
    """A wait on the session, blocked, in a task of the test's; its answer once it has one."""
    answers: list[p.Woken] = []

    async def wait() -> None:
        woken = await pair.waiter.handle(p.Wait(sessions=["s"], cursor="w")).result()
        assert isinstance(woken, p.Woken)
        answers.append(woken)

    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await pair.blocked()
            yield answers


def texts(woken: p.Woken) -> list[object]:
    (batch,) = woken.batches
    return [f.result for f in batch.firings]


async def test_a_lone_firing_is_answered_after_the_quiet_gap_not_the_settle_time(
    pair: Pair,
) -> None:
    start = pair.clock.ms
    async with waiting(pair) as answers:
        await pair.send("lone")
        await pair.heard()
        pair.clock.advance(QUIET_MS - 1)
        await pair.still_settling()
        pair.clock.advance(1)  # quiet for the gap: read now
    assert [texts(a) for a in answers] == [["lone"]]
    assert pair.clock.ms - start == QUIET_MS < SETTLE_MS


async def test_a_burst_whose_firings_come_closer_than_the_quiet_gap_is_one_batch(
    pair: Pair,
) -> None:
    """Each firing heard while settling starts the gap again."""
    async with waiting(pair) as answers:
        for n in range(5):
            await pair.send(f"b{n}")
            await pair.heard()
            pair.clock.advance(QUIET_MS - 1)
            await pair.still_settling()
        pair.clock.advance(1)
    assert [texts(a) for a in answers] == [["b0", "b1", "b2", "b3", "b4"]]


async def test_a_steady_stream_is_cut_at_the_settle_time(pair: Pair) -> None:
    """A firing every ms never lets the gap pass: the wait reads the settle time after its
    wake, with what came until then."""
    async with waiting(pair) as answers:
        for n in range(SETTLE_MS):
            await pair.send(f"s{n}")
            await pair.heard()
            await pair.still_settling()
            pair.clock.advance(1)
    assert [texts(a) for a in answers] == [[f"s{n}" for n in range(SETTLE_MS)]]


async def test_a_quiet_gap_as_long_as_the_settle_time_settles_the_whole_time(
    tmp_path: Path,
) -> None:
    """``--quiet-ms`` at ``--settle-ms``: a lone firing is held the whole settle time, as
    before the amendment."""
    clock = MovedClock()
    async with paired("memory", tmp_path, clock) as pair:
        pair.waiter.quiet = pair.waiter.settle
        async with waiting(pair) as answers:
            await pair.send("held")
            await pair.heard()
            clock.advance(SETTLE_MS - 1)
            await pair.still_settling()
            clock.advance(1)
        assert [texts(a) for a in answers] == [["held"]]
