"""repl from Python: the daemon's operations as methods, with typed answers.

    from repl_cli import api

    with api.connect() as repl:                 # REPL_ADDR / REPL_HOME, or addr=, home=
        repl.start("inbox", exist_ok=True)
        repl.send("inbox", "hello").seq          # 1
        for batch in repl.follow("inbox"):       # blocks; rides out a daemon restart
            for firing in batch.firings:
                print(firing.seq, firing.result)
            # asking for the next batch acknowledges this one

Every answer is the protocol's own msgspec Struct (``repl_daemon.protocol``:
``Sent``, ``Firings``, ``Woken``, ``SessionBatch``, ``Pong``...; a firing is
``session.firing.Firing``). Every failure is an ``Error`` whose ``status`` is
the exit status ``repl`` would end with: ``Unavailable`` (75: no daemon, it
went away or is shutting down, its store failed; try again), ``TimedOut``
is not an error (``wait`` answers ``timed_out``), and the rest (1, 64) are
errors that trying again will not mend; ``code`` is the daemon's wire code
when it came from the daemon. ``wait`` and ``follow`` reconnect as ``repl
wait`` and ``repl follow`` do (``reconnect`` seconds, 300 by default), and
log the outage on the ``repl`` logger instead of stderr.

The asynchronous twin is ``repl_cli.aio``. This module is what the ``repl``
command itself is made of.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from repl_cli.client import Client
from repl_cli.errors import UNAVAILABLE, CliError
from repl_cli.reconnect import DEFAULT_RECONNECT, Reconnect, TimedOut
from repl_daemon import protocol as p
from session.firing import CursorInfo, Firing
from session.rules import ACK_CURSOR, DEFAULT_HANDLER, FOLLOW_CURSOR, WAIT_CURSOR, WEBHOOK_HANDLER

__all__ = [
    "CursorInfo",
    "Error",
    "Firing",
    "Repl",
    "Unavailable",
    "connect",
]


R = TypeVar("R", bound=p.Response)

#: every failure: ``status`` is ``repl``'s exit status for it, ``code`` the wire code
Error = CliError


class Unavailable(CliError):
    """Exit status 75: the daemon or its store is away, or shutting down; try again later."""

    def __init__(self, message: str) -> None:
        super().__init__(message, UNAVAILABLE)


def _typed(exc: CliError) -> CliError:
    """The same error, as ``Unavailable`` when its status says so (``except`` can tell)."""
    if exc.status == UNAVAILABLE and not isinstance(exc, Unavailable):
        typed = Unavailable(exc.message)
        typed.code = exc.code
        return typed
    return exc


def _log_note(message: str) -> None:
    import logging  # here: the CLI, which tells on stderr, need not load it on every run

    logging.getLogger("repl").warning("%s", message)


def connect(
    addr: str | None = None,
    home: str | Path | None = None,
    *,
    reconnect: float = DEFAULT_RECONNECT,
    token: str | None = None,
    tls_ca: str | Path | None = None,
) -> Repl:
    """A ``Repl`` for the daemon at ``addr`` (``REPL_ADDR``, else 127.0.0.1:7427) with
    ``token`` (else ``REPL_TOKEN``, else the root token in ``home``: ``REPL_HOME``, else
    the default state directory), over TLS when ``addr`` is ``tls://HOST:PORT`` or
    ``tls_ca`` (else ``REPL_TLS_CA``) names the CA to trust. It connects on the first call;
    use it in a ``with`` block, or ``close`` it."""
    return Repl(Client(addr, home, token=token, tls_ca=tls_ca), reconnect=reconnect)


class Repl:
    """One connection to a daemon, and its operations."""

    def __init__(
        self,
        client: Client,
        *,
        reconnect: float = DEFAULT_RECONNECT,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        #: how long ``wait`` and ``follow`` ride out an outage, in seconds (0: not at all)
        self.reconnect = reconnect
        self.note = note or _log_note  # where an outage is told: the log, or stderr

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    @property
    def addr(self) -> str:
        return self.client.addr

    def _call(self, request: p.Request, expect: type[R]) -> R:
        try:
            return self.client.call(request, expect)
        except CliError as exc:
            raise _typed(exc) from None

    def again(self, deadline: float | None = None) -> Reconnect:
        """A ``Reconnect`` that runs a step again across an outage, as ``wait`` does."""
        return Reconnect(self.client, self.reconnect, deadline, note=self.note)

    # -- the daemon ----------------------------------------------------------

    def ping(self) -> p.Pong:
        return self._call(p.Ping(), p.Pong)

    def shutdown(self) -> None:
        """Ask the daemon to stop as SIGTERM does (it answers first, then exits)."""
        self._call(p.Shutdown(), p.Done)
        self.close()

    def stats(self, session: str | None = None) -> p.StatsReply:
        return self._call(p.Stats(session=session), p.StatsReply)

    # -- sessions ------------------------------------------------------------

    def start(
        self, session: str | None = None, *, buffer: int | None = None, exist_ok: bool = False
    ) -> p.Started:
        return self._call(p.Start(session=session, buffer=buffer, exist_ok=exist_ok), p.Started)

    def stop(self, session: str) -> None:
        self._call(p.Stop(session=session), p.Done)

    def sessions(self) -> list[p.SessionInfo]:
        return self._call(p.Sessions(), p.SessionList).sessions

    def buffer(self, session: str, limit: int) -> p.Buffered:
        return self._call(p.Buffer(session=session, limit=limit), p.Buffered)

    def cursors(self, session: str) -> list[CursorInfo]:
        return self._call(p.Cursors(session=session), p.CursorList).cursors

    # -- firings -------------------------------------------------------------

    def send(
        self, session: str, text: str, *, handler: str = DEFAULT_HANDLER, key: str | None = None
    ) -> p.Sent:
        return self._call(p.Send(session=session, text=text, handler=handler, key=key), p.Sent)

    def schedule(
        self,
        session: str,
        text: str = "",
        *,
        in_: str | None = None,
        at: str | None = None,
        every: str | None = None,
        handler: str | None = None,
        key: str | None = None,
    ) -> p.TimerSet:
        """Record a firing later: ``in_`` a duration (``"5m"``) or ``at`` an RFC 3339 time,
        and/or ``every`` an interval (``"1m"``; handler ``on-tick`` unless named)."""
        request = p.Schedule(
            session=session, text=text, handler=handler, in_=in_, at=at, every=every, key=key
        )
        return self._call(request, p.TimerSet)

    def webhook(self, session: str, secret: str | None, *, handler: str = WEBHOOK_HANDLER) -> None:
        """Give the session a webhook secret (``POST /hooks/{id}``), or with None take it away."""
        self._call(p.SetWebhook(session=session, secret=secret, handler=handler), p.Done)

    def token_add(self, name: str, sessions: list[str], can: list[str]) -> p.TokenMade:
        """Make a scoped token (the root token's only): its secret is in the answer, once."""
        request = p.Token(action="add", name=name, sessions=sessions, can=can)
        return self._call(request, p.TokenMade)

    def token_list(self) -> list[p.TokenInfo]:
        return self._call(p.Token(action="list"), p.TokenList).tokens

    def token_revoke(self, name: str) -> None:
        self._call(p.Token(action="revoke", name=name), p.Done)

    def timers(self, session: str | None = None) -> list[p.TimerInfo]:
        """The pending timers of ``session``, or of every session: soonest first."""
        return self._call(p.Timers(session=session), p.TimerList).timers

    def cancel(self, session: str, timer: str) -> p.TimerInfo:
        """Cancel a pending timer; an ``Error`` with code ``no_such_timer`` when there is none."""
        return self._call(p.Cancel(session=session, timer=timer), p.Cancelled).timer

    def read(
        self,
        session: str,
        *,
        cursor: str | None = None,
        after: int | None = None,
        max: int | None = None,
        peek: bool = False,
    ) -> p.Firings:
        """The firings after ``cursor`` (default ``read``) or after seq ``after``.

        Like the wire's ``read`` it acknowledges nothing: ``ack`` the batch's
        ``next`` once it is handled (``repl read`` prints, then acknowledges).
        """
        request = p.Read(session=session, cursor=cursor, after=after, max=max, peek=peek)
        return self._call(request, p.Firings)

    def ack(self, session: str, seq: int, *, cursor: str = ACK_CURSOR) -> p.Acked:
        return self._call(p.Ack(session=session, cursor=cursor, seq=seq), p.Acked)

    def poll(self, session: str, *, max: int | None = None) -> p.Firings:
        return self._call(p.Poll(session=session, max=max), p.Firings)

    def wait(
        self,
        sessions: str | list[str],
        *,
        cursor: str = WAIT_CURSOR,
        timeout: float | None = None,
        max: int | None = None,
        ack: dict[str, int] | None = None,
        watch: int | None = None,
    ) -> p.Woken:
        """Block until a session has firings after ``cursor``; ``timeout`` seconds at most
        (then ``timed_out``). ``ack`` acknowledges the previous batch first. A daemon
        restart meanwhile is ridden out for ``reconnect`` seconds, then ``Unavailable``.
        ``watch``: a pipe we write to; its reader leaving ends the wait (``ReaderGone``)."""
        ids = [sessions] if isinstance(sessions, str) else list(sessions)
        deadline = None if timeout is None else time.monotonic() + timeout
        again = self.again(deadline)
        client = self.client

        def look() -> p.Woken:
            request = p.Wait(
                sessions=ids, cursor=cursor, timeout_ms=again.remaining_ms(), max=max, ack=ack or {}
            )
            client.send(request)
            return client.receive(p.Woken, timeout=None, watch=watch)

        try:
            return again.run(look)
        except TimedOut:
            return p.Woken(batches=[], timed_out=True)
        except CliError as exc:
            raise _typed(exc) from None

    def follow(
        self, session: str, *, cursor: str = FOLLOW_CURSOR, max: int | None = None
    ) -> Iterator[p.SessionBatch]:
        """Every batch after ``cursor``, as it comes, for ever (break to stop).

        A batch is acknowledged when the caller asks for the next one, in the
        same request as the wait for it: one that was handed out and not
        finished (the loop broke, the program died) comes again to the next
        follower. A daemon restart is ridden out as in ``wait``.
        """
        carried: dict[str, int] = {}
        while True:
            woken = self.wait(session, cursor=cursor, max=max, ack=carried)
            for batch in woken.batches:
                yield batch
                carried = {batch.session: batch.next}
