"""What an operation answers: a value now, a value once a commit is durable, or a job.

The engine never blocks the connection loop: an operation applied in memory
answers at once (``Outcome.now``); one whose change must be durable first
answers with the value and the commit it waits for (``Outcome.after``: no
task, the commit calls back); one that must wait on something else answers
with a ``Job``, which the caller starts with a callback and cancels when
nobody wants the answer any more (the client went away). A job is either a
coroutine run as a task of its own (``Outcome.later``), a future's answer
(``Outcome.pending``: a shared store's call, answered by its pipeline), or
the engine's wait, which needs no task at all: it is driven
by the callbacks that wake it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, cast

import anyio

from session.errors import StoreFailed

log = logging.getLogger("repl.daemon")

T = TypeVar("T")
U = TypeVar("U")

#: how a job answers: ``done(value, None)``, or ``done(None, error)``
Done = Callable[[T | None, Exception | None], None]


class Ticket:
    """The outcome of one commit, shared by every change in its batch."""

    __slots__ = ("callbacks", "done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: StoreFailed | None = None
        self.callbacks: list[Callable[[StoreFailed | None], None]] = []

    def resolve(self, error: StoreFailed | None = None) -> None:
        self.error = error
        self.done.set()
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            try:
                callback(error)
            except Exception:  # one connection's trouble must not stop the committer
                log.exception("a commit callback failed")

    def add_done_callback(self, callback: Callable[[StoreFailed | None], None]) -> None:
        """Call ``callback(error)`` once the commit is written (or failed); at once if it is."""
        if self.done.is_set():
            callback(self.error)
        else:
            self.callbacks.append(callback)

    async def wait(self) -> None:
        await self.done.wait()
        if self.error is not None:
            raise StoreFailed(self.error.message)


class Job(Generic[T]):
    """Work that answers later through a callback; ``start`` it once."""

    __slots__ = ()

    def start(self, done: Done[T]) -> None:
        """Begin; ``done`` is called once with the answer (perhaps before this returns)."""
        raise NotImplementedError

    def cancel(self) -> None:
        """Nobody wants the answer: stop, changing nothing more; ``done`` is not called."""
        raise NotImplementedError

    async def run(self) -> T:
        """The answer, awaited in the calling task; cancelling that cancels the job."""
        answered = anyio.Event()
        answer: list[tuple[T | None, Exception | None]] = []

        def done(value: T | None, error: Exception | None) -> None:
            answer.append((value, error))
            answered.set()

        self.start(done)
        try:
            await answered.wait()
        finally:
            if not answer:
                self.cancel()
        value, error = answer[0]
        if error is not None:
            raise error
        return cast(T, value)


class _Task(Job[T]):
    """A coroutine function run as a task of its own; cancelling the job cancels the task.

    A bare asyncio task rather than one in a task group: a job is started
    from a connection's callbacks, where no task group can be entered, and
    whoever started it cancels it.
    """

    __slots__ = ("fn", "task")

    def __init__(self, fn: Callable[[], Awaitable[T]]) -> None:
        self.fn = fn
        self.task: asyncio.Task[None] | None = None

    def start(self, done: Done[T]) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run(done))

    async def _run(self, done: Done[T]) -> None:
        try:
            value = await self.fn()
        except Exception as exc:
            done(None, exc)
        else:
            done(value, None)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def run(self) -> T:
        return await self.fn()  # in the caller's task: no task of its own is needed


class _Pending(Job[T]):
    """A future made on ``start`` (a shared store's call): no task, its callback answers."""

    __slots__ = ("future", "make")

    def __init__(self, make: Callable[[], asyncio.Future[T]]) -> None:
        self.make = make
        self.future: asyncio.Future[T] | None = None

    def start(self, done: Done[T]) -> None:
        try:
            future = self.future = self.make()
        except Exception as exc:  # refused before it was sent
            done(None, exc)
            return

        def answered(future: asyncio.Future[T]) -> None:
            if future.cancelled():
                return  # cancelled by ``cancel``: nobody wants the answer
            error = future.exception()
            if error is not None:
                done(None, cast(Exception, error))
            else:
                done(future.result(), None)

        future.add_done_callback(answered)

    def cancel(self) -> None:
        if self.future is not None:
            self.future.cancel()

    async def run(self) -> T:
        return await self.make()


#: what one of several jobs answered: (value, None) or (None, error)
Settled = tuple[T | None, Exception | None]


class _Settled(Job[list[Settled[T]]]):
    """Several outcomes at once, answered together once each has its answer or error."""

    __slots__ = ("outcomes", "started")

    def __init__(self, outcomes: list[Outcome[T]]) -> None:
        self.outcomes = outcomes
        self.started: list[Job[T]] = []

    def start(self, done: Done[list[Settled[T]]]) -> None:
        answers: list[Settled[T] | None] = [None] * len(self.outcomes)
        left = len(self.outcomes)

        def one(index: int) -> Callable[[T | None, Exception | None], None]:
            def answered(value: T | None, error: Exception | None) -> None:
                nonlocal left
                answers[index] = (value, error)
                left -= 1
                if not left:
                    done(cast(list[Settled[T]], answers), None)

            return answered

        for index, outcome in enumerate(self.outcomes):
            job = outcome.settle(one(index))
            if job is not None:
                self.started.append(job)

    def cancel(self) -> None:
        for job in self.started:
            job.cancel()


def _committed(value: T, answered: Done[T]) -> Callable[[StoreFailed | None], None]:
    """A commit's callback that answers ``value``, or the commit's failure."""

    def committed(error: StoreFailed | None) -> None:
        if error is None:
            answered(value, None)
        else:
            answered(None, StoreFailed(error.message))

    return committed


class _Mapped(Job[U], Generic[T, U]):
    """Another job's answer with a function applied to it."""

    __slots__ = ("fn", "inner")

    def __init__(self, inner: Job[T], fn: Callable[[T], U]) -> None:
        self.inner = inner
        self.fn = fn

    def start(self, done: Done[U]) -> None:
        fn = self.fn

        def mapped(value: T | None, error: Exception | None) -> None:
            if error is not None:
                done(None, error)
                return
            try:
                result = fn(cast(T, value))
            except Exception as exc:
                done(None, exc)
            else:
                done(result, None)

        self.inner.start(mapped)

    def cancel(self) -> None:
        self.inner.cancel()

    async def run(self) -> U:
        return self.fn(await self.inner.run())


class Outcome(Generic[T]):
    """One of: ``value`` now; ``value`` once ``ticket`` is durable; or ``job``'s answer."""

    __slots__ = ("job", "ticket", "value")

    def __init__(self, value: T, ticket: Ticket | None = None, job: Job[T] | None = None) -> None:
        self.value = value  # meaningless when there is a job
        self.ticket = ticket
        self.job = job

    @classmethod
    def now(cls, value: T) -> Outcome[T]:
        return cls(value)

    @classmethod
    def after(cls, ticket: Ticket | None, value: T) -> Outcome[T]:
        """``value``, to be told once ``ticket``'s commit is durable (None: it already is)."""
        return cls(value, ticket)

    @classmethod
    def later(cls, fn: Callable[[], Awaitable[T]]) -> Outcome[T]:
        """The value of ``fn()``, awaited in a task of its own."""
        return cls.of(_Task(fn))

    @classmethod
    def pending(cls, make: Callable[[], asyncio.Future[T]]) -> Outcome[T]:
        """The answer of the future ``make()`` returns, told by its callback (no task)."""
        return cls.of(_Pending(make))

    @classmethod
    def of(cls, job: Job[T]) -> Outcome[T]:
        return cls(cast(T, None), job=job)

    @classmethod
    def settle_all(cls, outcomes: list[Outcome[U]]) -> Outcome[list[Settled[U]]]:
        """Every outcome's ``(value, None)`` or ``(None, error)``, in order, once all have one.

        No task: each job is started with a callback (a shared store's calls
        all join the next pipeline); a ticket's commit calls back.
        """
        if all(o.job is None and o.ticket is None for o in outcomes):
            return Outcome.now([(o.value, None) for o in outcomes])
        return Outcome.of(_Settled(outcomes))

    def settle(self, done: Done[T]) -> Job[T] | None:
        """Tell ``done`` the answer: at once when it is known, once the ticket's commit is
        durable (its failure as ``StoreFailed``), or once the job answers; returns the job
        it started, to cancel, or None. The line protocol's connection does the same by
        hand, on its hot path (``repl_daemon.server``: docs/layout.md says why)."""
        job, ticket = self.job, self.ticket
        if job is not None:
            job.start(done)
        elif ticket is not None:
            ticket.add_done_callback(_committed(self.value, done))
        else:
            done(self.value, None)
        return job

    def then(self, fn: Callable[[T], U]) -> Outcome[U]:
        """The same outcome with ``fn`` applied to its value (at once, when it is known)."""
        if self.job is None:
            return Outcome(fn(self.value), self.ticket)
        mapped: _Mapped[T, U] = _Mapped(self.job, fn)
        return Outcome.of(mapped)

    async def result(self) -> T:
        """The value, once durable: for code that runs in a task anyway (tests, a shared store)."""
        if self.job is not None:
            return await self.job.run()
        if self.ticket is not None:
            await self.ticket.wait()
        return self.value
