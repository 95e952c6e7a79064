"""The engine in-process, without sockets: one request at a time, as the connection loop calls it.

A wait cut off from outside (``move_on_after``, as a killed client or a
timeout does) must leave every cursor where it was (SPEC rule 10); a
request that is refused changes nothing, in any session (issue "one engine").
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from types import SimpleNamespace

import anyio
import msgspec
import pytest

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.engine import Engine, Ticket, committer, utc_now
from repl_daemon.engine.clock import REAL, Clock
from session.errors import (
    AckAfterHead,
    BadMax,
    BadRequest,
    BadSeq,
    NoSuchSession,
    SessionStopped,
    StoreFailed,
    UnknownOp,
)
from session.session import Snapshot
from tests.helpers import WatchedClock

pytestmark = pytest.mark.anyio


async def call(engine: Engine, req: p.Request) -> p.Response:
    return await engine.handle(req).result()


async def started(*ids: str, clock: Clock = REAL) -> Engine:
    engine = Engine(LocalBackend(MemoryStore()), settle=0, clock=clock)
    for session_id in ids:
        await call(engine, p.Start(session=session_id))
    return engine


def send(engine: Engine, session: str, text: str) -> int:
    outcome = engine.handle(p.Send(session=session, text=text))
    assert outcome.job is None and outcome.ticket is None  # the memory store needs no commit
    sent = outcome.value
    assert isinstance(sent, p.Sent)
    return sent.seq


def cursors(engine: Engine, session: str) -> list[tuple[str, int]]:
    listed = engine.handle(p.Cursors(session=session)).value
    assert isinstance(listed, p.CursorList)
    return [(c.name, c.seq) for c in listed.cursors]


def state(engine: Engine) -> dict[str, tuple[Snapshot, int]]:
    committer = engine.committer
    assert isinstance(committer, LocalCommitter)
    return {
        sid: (h.session.snapshot(), h.session.evaluations) for sid, h in committer.sessions.items()
    }


async def test_a_cancelled_wait_moves_no_cursor() -> None:
    engine = await started("a")
    send(engine, "a", "one")
    await call(engine, p.Ack(session="a", cursor="wait", seq=1))
    before = cursors(engine, "a")
    with anyio.move_on_after(0.05):
        await call(engine, p.Wait(sessions=["a"]))
    assert cursors(engine, "a") == before
    assert engine.waiting == 0 and not engine.waiters


async def test_a_wait_cancelled_after_its_wake_moves_no_cursor() -> None:
    engine = await started("a")
    engine.settle = 10  # the wake comes, then the settle is cut off
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, engine, p.Wait(sessions=["a"]))
        await anyio.wait_all_tasks_blocked()
        send(engine, "a", "one")
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert cursors(engine, "a") == []


async def test_a_firing_between_subscribe_and_sleep_is_not_missed() -> None:
    engine = await started("a")
    results: list[p.Response] = []

    async def waiter() -> None:
        results.append(await call(engine, p.Wait(sessions=["a"], timeout_ms=5000)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        send(engine, "a", "just in time")
    woken = results[0]
    assert isinstance(woken, p.Woken)
    assert [f.result for f in woken.batches[0].firings] == ["just in time"]


async def test_stopping_wakes_a_multi_session_wait_with_session_stopped() -> None:
    engine = await started("a", "b")
    errors: list[str] = []

    async def waiter() -> None:
        try:
            await call(engine, p.Wait(sessions=["a", "b"]))
        except Exception as exc:
            errors.append(type(exc).__name__)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        await call(engine, p.Stop(session="b"))
    assert errors == ["SessionStopped"]
    assert not engine.waiters  # no entry is left behind for either session


async def test_evaluations_do_not_move_while_a_wait_blocks() -> None:
    """Blocked, a wait is not evaluated while the engine's time passes: 0.2 s of it, as the
    engine's own timeout of a wait on another session measures it."""
    engine = await started("a", "other")
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, engine, p.Wait(sessions=["a"]))
        await anyio.wait_all_tasks_blocked()
        before = state(engine)["a"][1]
        timed = await call(engine, p.Wait(sessions=["other"], timeout_ms=200))
        assert isinstance(timed, p.Woken) and timed.timed_out
        assert state(engine)["a"][1] == before
        assert engine.waiters_of("a") == 1
        tg.cancel_scope.cancel()


async def test_an_ack_wakes_no_waiter() -> None:
    """Only new firings wake a wait: a cursor moving elsewhere costs the waiter nothing."""
    engine = await started("a")
    send(engine, "a", "one")
    await call(engine, p.Ack(session="a", cursor="wait", seq=1))
    async with anyio.create_task_group() as tg:
        tg.start_soon(call, engine, p.Wait(sessions=["a"]))
        await anyio.wait_all_tasks_blocked()
        before = state(engine)["a"][1]
        await call(engine, p.Ack(session="a", cursor="other", seq=1))
        await anyio.wait_all_tasks_blocked()
        assert state(engine)["a"][1] == before + 1  # the ack alone; the waiter did not read
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("wait", "error"),
    [
        (p.Wait(sessions=["a", "b"], ack={"a": 1, "b": -1}), BadSeq),
        (p.Wait(sessions=["a", "b"], ack={"a": 1, "b": 5}), AckAfterHead),
        (p.Wait(sessions=["a", "nope"], ack={"a": 1}), NoSuchSession),
        (p.Wait(sessions=["a"], ack={"a": 1}, max=0), BadMax),
        (p.Wait(sessions=["a"], ack={"a": 1}, timeout_ms=-1), BadRequest),
        (p.Wait(sessions=["a"], ack={"a": 1, "b": 1}), BadRequest),
    ],
)
async def test_a_refused_wait_acks_nothing_on_any_session(
    wait: p.Wait, error: type[Exception]
) -> None:
    """The defect of issue "one engine": a wait with one bad ack moved the other cursor."""
    engine = await started("a", "b")
    send(engine, "a", "one")
    send(engine, "b", "one")
    before = state(engine)
    with pytest.raises(error):
        await call(engine, wait)
    assert state(engine) == before


async def test_a_wait_with_good_acks_acks_every_session() -> None:
    engine = await started("a", "b")
    send(engine, "a", "one")
    send(engine, "b", "one")
    woken = await call(engine, p.Wait(sessions=["a", "b"], ack={"a": 1, "b": 1}, timeout_ms=0))
    assert isinstance(woken, p.Woken) and woken.timed_out
    assert cursors(engine, "a") == cursors(engine, "b") == [("wait", 1)]


async def test_a_request_the_engine_has_no_case_for_is_refused_not_done() -> None:
    """The shared hub once answered every op it did not know with "done"."""

    class Bogus(p.Request, tag="bogus"):
        session: str = "a"

    engine = await started("a")
    with pytest.raises(UnknownOp, match="Bogus"):
        engine.handle(Bogus())  # type: ignore[arg-type]
    assert msgspec.json.decode(p.encode(Bogus()))["op"] == "bogus"


def test_utc_now_is_iso_8601_utc_with_milliseconds() -> None:
    for _ in range(1000):
        before = datetime.now(UTC).replace(tzinfo=None)
        stamp = utc_now()
        after = datetime.now(UTC).replace(tzinfo=None)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp
        parsed = datetime.fromisoformat(stamp[:-1])
        assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= parsed <= after


async def test_a_firing_that_wakes_a_wait_near_its_timeout_is_still_returned() -> None:
    """The timeout bounds the blocking: a wake's settle may run past it and still deliver."""
    engine = await started("a")
    engine.settle = 0.3
    results: list[p.Response] = []

    async def waiter() -> None:
        results.append(await call(engine, p.Wait(sessions=["a"], timeout_ms=100)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        send(engine, "a", "late")
    woken = results[0]
    assert isinstance(woken, p.Woken) and not woken.timed_out
    assert [f.result for f in woken.batches[0].firings] == ["late"]


async def test_a_session_stopped_before_its_wait_first_looks_answers_no_such_session() -> None:
    """A stop that lands between a wait's request and its first look (pipelined behind it):
    a wait on one session finds it with its first look (its ack with it, in one step), so
    it answers as a wait sent after the stop does, and is gone from the waiters."""
    engine = await started("a")
    outcome = engine.handle(p.Wait(sessions=["a"], cursor="c", ack={"a": 0}))
    assert outcome.job is not None  # the wait runs as its own task, later
    await call(engine, p.Stop(session="a"))
    with pytest.raises(NoSuchSession, match="no session 'a'"):
        await outcome.job.run()
    assert engine.waiting == 0 and not engine.waiters


async def test_a_session_stopped_before_a_multi_session_wait_first_looks_answers_stopped() -> None:
    """On several sessions the wait checks they exist before it starts: a stop that lands
    before its first look answers ``session_stopped``."""
    engine = await started("a", "b")
    outcome = engine.handle(p.Wait(sessions=["a", "b"]))
    assert outcome.job is not None
    await call(engine, p.Stop(session="a"))
    with pytest.raises(SessionStopped, match="session 'a' stopped"):
        await outcome.job.run()
    assert engine.waiting == 0 and not engine.waiters


async def test_a_made_up_session_id_is_never_one_already_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = await started()
    draws = iter(["0000beef", "0000beef", "0000beef", "00c0ffee"])
    monkeypatch.setattr(committer, "secrets", SimpleNamespace(token_hex=lambda n: next(draws)))
    first = await call(engine, p.Start())
    second = await call(engine, p.Start())
    assert isinstance(first, p.Started) and isinstance(second, p.Started)
    assert (first.session, second.session) == ("s-0000beef", "s-00c0ffee")


def test_a_commit_callback_that_fails_keeps_the_others_and_the_committer_going(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One connection's trouble with its answer must not stop the others' (or the committer)."""
    told: list[object] = []

    def broken(error: StoreFailed | None) -> None:
        raise RuntimeError("a connection in trouble")

    ticket = Ticket()
    ticket.add_done_callback(broken)
    ticket.add_done_callback(told.append)
    failure = StoreFailed("the disk is full")
    ticket.resolve(failure)  # must not raise
    assert told == [failure]
    assert [r.getMessage() for r in caplog.records] == ["a commit callback failed"]
    ticket.add_done_callback(told.append)  # once resolved, a callback is called at once
    assert told == [failure, failure]


async def test_pending_timers_cost_nothing_until_one_is_due() -> None:
    """A thousand timers an hour away: the timer task sleeps until the first is due, and
    moving the clock 59 minutes on wakes it once (for the move) and evaluates no session.
    A sooner timer wakes it once; it fires at its time, not a millisecond sooner; the task
    sleeps until the hour again."""
    clock = WatchedClock()
    engine = await started(*(f"s{i}" for i in range(4)), clock=clock)
    committer = engine.committer
    assert isinstance(committer, LocalCommitter)
    hour = clock.ms + 3_600_000
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        for i in range(1000):
            await call(engine, p.Schedule(session=f"s{i % 4}", text=str(i), in_="1h"))
        await anyio.wait_all_tasks_blocked()
        turns, before = committer.timer_turns, state(engine)
        assert clock.slept[-1] == hour  # no sooner: nothing of its own wakes it
        clock.advance(59 * 60_000)
        await anyio.wait_all_tasks_blocked()
        assert committer.timer_turns == turns + 1 and state(engine) == before
        assert clock.slept[-1] == hour
        await call(engine, p.Schedule(session="s0", text="soon", in_="200ms"))
        await anyio.wait_all_tasks_blocked()
        assert committer.timer_turns == turns + 2  # woken to sleep until the sooner one
        assert clock.slept[-1] == clock.ms + 200
        scheduled = state(engine)
        clock.advance(199)
        await anyio.wait_all_tasks_blocked()
        assert state(engine) == scheduled  # not yet due: nothing fired
        clock.advance(1)
        woken = await call(engine, p.Wait(sessions=["s0"], cursor="c", timeout_ms=5000))
        assert isinstance(woken, p.Woken)
        assert [f.result for f in woken.batches[0].firings] == ["soon"]
        await anyio.wait_all_tasks_blocked()
        assert clock.slept[-1] == hour  # asleep until the hour's timers again, no sooner
        tg.cancel_scope.cancel()
