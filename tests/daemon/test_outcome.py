"""Outcomes and jobs (``repl_daemon.engine.outcome``) on a real event loop.

How an answer travels from a store to a connection: a value now, one after
a commit (a ``Ticket``), a future's (``Outcome.pending``, a shared store's
call), several at once (``settle_all``), and what cancelling each does.
"""

from __future__ import annotations

import asyncio

import pytest

from repl_daemon.engine.outcome import Done, Job, Outcome, Ticket
from session.errors import NoSuchSession, StoreFailed

pytestmark = pytest.mark.anyio


class Answers:
    """A ``done`` callback that keeps what it was told."""

    def __init__(self) -> None:
        self.told: list[tuple[object, Exception | None]] = []

    def __call__(self, value: object, error: Exception | None) -> None:
        self.told.append((value, error))


async def test_a_pending_outcome_answers_by_its_futures_callback() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    job = Outcome.pending(lambda: future).then(lambda n: n * 2).job
    assert job is not None
    told = Answers()
    job.start(told)
    assert told.told == []
    future.set_result(21)
    await asyncio.sleep(0)
    assert told.told == [(42, None)]


async def test_a_pending_outcome_tells_its_futures_error_and_a_refusal_before_sending() -> None:
    loop = asyncio.get_running_loop()
    failing: asyncio.Future[int] = loop.create_future()
    told = Answers()
    job = Outcome.pending(lambda: failing).job
    assert job is not None
    job.start(told)
    failing.set_exception(NoSuchSession("no session 'x'"))
    await asyncio.sleep(0)
    assert isinstance(told.told[0][1], NoSuchSession)

    def refuse() -> asyncio.Future[int]:
        raise StoreFailed("redis at X is not connected")

    refused = Answers()
    job = Outcome.pending(refuse).job
    assert job is not None
    job.start(refused)  # answered at once: nothing was sent
    assert isinstance(refused.told[0][1], StoreFailed)


async def test_cancelling_a_pending_outcome_cancels_its_future_and_tells_nobody() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    told = Answers()
    job = Outcome.pending(lambda: future).job
    assert job is not None
    job.cancel()  # before it started: nothing to cancel
    job.start(told)
    job.cancel()
    await asyncio.sleep(0)
    assert future.cancelled() and told.told == []
    assert await Outcome.pending(lambda: _done(loop, 7)).result() == 7


def _done(loop: asyncio.AbstractEventLoop, value: int) -> asyncio.Future[int]:
    future: asyncio.Future[int] = loop.create_future()
    future.set_result(value)
    return future


async def test_settle_all_of_values_is_a_value_and_of_jobs_and_tickets_one_answer() -> None:
    now = Outcome.settle_all([Outcome.now(1), Outcome.now(2)])
    assert now.job is None and now.value == [(1, None), (2, None)]

    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    durable, broken = Ticket(), Ticket()
    settled = Outcome.settle_all(
        [
            Outcome.now(1),
            Outcome.pending(lambda: future),
            Outcome.after(durable, 3),
            Outcome.after(broken, 4),
        ]
    )
    assert settled.job is not None
    told = Answers()
    settled.job.start(told)
    durable.resolve()
    broken.resolve(StoreFailed("disk full"))
    assert told.told == []  # the future has not answered yet
    future.set_result(2)
    await asyncio.sleep(0)
    ((answers, error),) = told.told
    assert error is None
    assert isinstance(answers, list)
    assert answers[:3] == [(1, None), (2, None), (3, None)]
    assert answers[3][0] is None and isinstance(answers[3][1], StoreFailed)


async def test_cancelling_settle_all_cancels_every_job_it_started() -> None:
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[int]] = [loop.create_future() for _ in range(3)]
    settled = Outcome.settle_all([Outcome.pending(lambda f=f: f) for f in futures])
    assert settled.job is not None
    told = Answers()
    settled.job.start(told)
    settled.job.cancel()
    await asyncio.sleep(0)
    assert all(f.cancelled() for f in futures) and told.told == []


async def test_a_task_outcome_is_cancelled_with_its_job() -> None:
    started, ended = asyncio.Event(), asyncio.Event()

    async def forever() -> int:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()  # cancelled: the job's task goes on from here in this same step
        return 0

    job = Outcome.later(forever).job
    assert job is not None
    told = Answers()
    job.start(told)
    await started.wait()
    job.cancel()
    await ended.wait()  # and wakes this task in a later one: the job's task is over by then
    assert told.told == []


async def test_a_job_is_an_interface() -> None:
    class Bare(Job[int]):
        __slots__ = ()

    done: Done[int] = Answers()
    with pytest.raises(NotImplementedError):
        Bare().start(done)
    with pytest.raises(NotImplementedError):
        Bare().cancel()
