"""The long polls (``GET /sessions/{id}/wait``, ``POST .../groups/{name}/claim``) and a
request's hold on its token: what ends a blocked HTTP request (its answer, a revocation,
the client gone); a claim's answer that its client left before it was written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
from starlette.responses import Response

from repl_daemon import protocol as p
from repl_daemon.engine.wait import Wait
from repl_daemon.http.streams import line_of
from session.errors import (
    Unauthorized,
)
from session.scopes import TokenRecord

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from repl_daemon.engine import Engine


class Gone(Exception):
    """A long poll's client hung up: nobody is there to answer."""


class Poll:
    """A long poll's wait and its hold on its token while it waits. ``result`` gives the
    wait's answer or a revocation, whichever comes first (each releases the hold, so the
    other cannot follow), unless the client hangs up, after which nobody wants either; the
    request's end, however it comes (its task cancelled too), ends the wait if it is still
    on. An event, not a future, is awaited: a cancellation of the request's task cancels
    the event's own waiter, and this never finds its answer taken away from under it."""

    def __init__(self, engine: Engine, token: TokenRecord | None, job: Wait) -> None:
        self.engine = engine
        self.token = token
        self.job = job
        self.over = asyncio.Event()
        self.value: p.Response | None = None
        self.error: Exception | None = None
        if token is not None:
            engine.hold(token, self)

    def answered(self, value: p.Response | None, error: Exception | None) -> None:
        """The wait's callback (never called once the wait is cancelled)."""
        self._unhold()
        self.value, self.error = value, error
        self.over.set()

    def revoke(self, error: Unauthorized) -> None:
        """The token was revoked while the wait held it (so before its answer)."""
        self.job.cancel()
        self.answered(None, error)

    def hung_up(self) -> None:
        """The client went away: nobody wants the answer it would have. One that is in
        already stays, for the route to see that it has somebody's (a claim's firing,
        which the route gives back when it cannot hand it over: ``Handed``)."""
        self.job.cancel()  # nothing, once it has answered
        if not self.over.is_set():
            self.answered(None, Gone())

    async def result(self) -> p.Response:
        try:
            await self.over.wait()
        finally:  # the answer is in, or this request ended first: the wait ends with it
            self.job.cancel()
            self._unhold()
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value

    def _unhold(self) -> None:
        if self.token is not None:
            self.engine.unhold(self.token, self)


class Held:
    """An HTTP request's hold on its scoped token while it waits: a revocation cancels it."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.error: Unauthorized | None = None

    def revoke(self, error: Unauthorized) -> None:
        self.error = error
        if self.scope is not None:
            self.scope.cancel()


class Handed(Response):
    """A claim's answer, JSON; ``give_back`` called when the connection was lost
    before the answer was written in full (the request's ``Line``), so that a client
    gone holds nothing (SPEC §16: a claimer that cannot have what it took gives it
    back at once). One lost after it was written is as one that read it."""

    media_type = "application/json"

    def __init__(self, body: bytes, give_back: Callable[[], None]) -> None:
        super().__init__(body, 200)
        self.give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        if line_of(scope).gone:
            self.give_back()
