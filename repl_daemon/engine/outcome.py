"""What an operation answers: a value now, a value once a commit is durable, or work to await.

The engine never blocks the connection loop: an operation applied in memory
answers at once (``Outcome.now``); one whose change must be durable first
answers with the value and the commit it waits for (``Outcome.after``: no
task, the commit calls back); one that must wait on something else (a wait
for firings, a shared store's round trip) answers with a coroutine function
(``Outcome.later``) that the caller runs as a task, so that cancelling it
(the client went away) cancels the wait.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, cast

import anyio

from session.errors import StoreFailed

log = logging.getLogger("repl.daemon")

T = TypeVar("T")
U = TypeVar("U")


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


class Outcome(Generic[T]):
    """One of: ``value`` now; ``value`` once ``ticket`` is durable; or ``job`` to await."""

    __slots__ = ("job", "ticket", "value")

    def __init__(
        self,
        value: T,
        ticket: Ticket | None = None,
        job: Callable[[], Awaitable[T]] | None = None,
    ) -> None:
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
    def later(cls, job: Callable[[], Awaitable[T]]) -> Outcome[T]:
        return cls(cast(T, None), job=job)

    def then(self, fn: Callable[[T], U]) -> Outcome[U]:
        """The same outcome with ``fn`` applied to its value (at once, when it is known)."""
        job = self.job
        if job is None:
            return Outcome(fn(self.value), self.ticket)

        async def mapped() -> U:
            return fn(await job())

        return Outcome.later(mapped)

    async def result(self) -> T:
        """The value, once durable: for code that runs in a task anyway (a wait)."""
        if self.job is not None:
            return await self.job()
        if self.ticket is not None:
            await self.ticket.wait()
        return self.value
