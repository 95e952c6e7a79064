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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from msgspec import UNSET, UnsetType

from repl_cli.client import Client
from repl_cli.errors import ERROR, UNAVAILABLE, CliError
from repl_cli.reconnect import DEFAULT_RECONNECT, Reconnect, TimedOut
from repl_daemon import protocol as p
from session.firing import CursorInfo, Firing
from session.rules import ACK_CURSOR, DEFAULT_HANDLER, FOLLOW_CURSOR, WAIT_CURSOR, WEBHOOK_HANDLER
from session.tags import CORR, REPLY_TO, Match, correlation_id

__all__ = [
    "CursorInfo",
    "Error",
    "Firing",
    "Match",
    "Repl",
    "Unavailable",
    "connect",
]

#: what a match may be given as: a ``Match``, or the tags that must hold (a value None:
#: the tag is there, whatever its value)
MatchLike = Match | Mapping[str, str | None]


def as_match(match: MatchLike | None) -> Match | None:
    """``match`` as the wire takes it; None for none."""
    if match is None or isinstance(match, Match):
        return match
    return Match(dict(match))


def wait_cursor(
    cursor: str | UnsetType | None, match: MatchLike | None, default: str
) -> str | None:
    """The cursor a wait reads after: the one given (None: none), else ``default``, or none
    for a matching wait (a matching reader given no cursor looks at the whole ring)."""
    if cursor is not UNSET:
        return cursor
    return None if match is not None else default


def reply_tags(firing: Firing, session: str) -> tuple[str, dict[str, str]]:
    """Where a reply to ``firing`` goes, and the tags it carries; an ``Error`` (status 1)
    when the firing was not sent as a request."""
    target = firing.tags.get(REPLY_TO)
    if target is None:
        raise CliError(
            f"firing {firing.seq} of session {session!r} has no reply-to tag: it was not sent "
            "with `repl request` (send the answer with `repl send` instead)"
        )
    corr = firing.tags.get(CORR)
    return target, {} if corr is None else {CORR: corr}


def no_firing(session: str, seq: int, batch: p.Firings) -> CliError:
    if batch.lost:
        return CliError(
            f"firing {seq} of session {session!r} is no longer in its ring: it was dropped"
        )
    return CliError(f"session {session!r} has no firing {seq}", ERROR)


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
    token_file: str | Path | None = None,
) -> Repl:
    """A ``Repl`` for the daemon at ``addr`` (``REPL_ADDR``, else 127.0.0.1:7427) with
    ``token`` (else ``REPL_TOKEN``, else the root token in ``home``: ``REPL_HOME``, else
    the default state directory), over TLS when ``addr`` is ``tls://HOST:PORT`` or
    ``tls_ca`` (else ``REPL_TLS_CA``) names the CA to trust. It connects on the first call;
    use it in a ``with`` block, or ``close`` it."""
    client = Client(addr, home, token=token, tls_ca=tls_ca, token_file=token_file)
    return Repl(client, reconnect=reconnect)


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
        self,
        session: str,
        text: str,
        *,
        handler: str = DEFAULT_HANDLER,
        key: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> p.Sent:
        request = p.Send(
            session=session, text=text, handler=handler, key=key, tags=dict(tags or {})
        )
        return self._call(request, p.Sent)

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
        tags: Mapping[str, str] | None = None,
    ) -> p.TimerSet:
        """Record a firing later: ``in_`` a duration (``"5m"``) or ``at`` an RFC 3339 time,
        and/or ``every`` an interval (``"1m"``; handler ``on-tick`` unless named); each of its
        firings carries ``tags``."""
        request = p.Schedule(
            session=session,
            text=text,
            handler=handler,
            in_=in_,
            at=at,
            every=every,
            key=key,
            tags=dict(tags or {}),
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
        match: MatchLike | None = None,
    ) -> p.Firings:
        """The firings after ``cursor`` (default ``read``) or after seq ``after``.

        Like the wire's ``read`` it acknowledges nothing: ``ack`` the batch's
        ``next`` once it is handled (``repl read`` prints, then acknowledges).
        With ``match`` only the firings that match come back; given neither
        ``cursor`` nor ``after``, a matching read looks at the whole ring.
        """
        request = p.Read(
            session=session, cursor=cursor, after=after, max=max, peek=peek, match=as_match(match)
        )
        return self._call(request, p.Firings)

    def ack(self, session: str, seq: int, *, cursor: str = ACK_CURSOR) -> p.Acked:
        return self._call(p.Ack(session=session, cursor=cursor, seq=seq), p.Acked)

    def poll(self, session: str, *, max: int | None = None) -> p.Firings:
        return self._call(p.Poll(session=session, max=max), p.Firings)

    def wait(
        self,
        sessions: str | list[str],
        *,
        cursor: str | UnsetType | None = UNSET,
        timeout: float | None = None,
        max: int | None = None,
        ack: dict[str, int] | None = None,
        watch: int | None = None,
        match: MatchLike | None = None,
        after: int | None = None,
    ) -> p.Woken:
        """Block until a session has firings after ``cursor`` (default ``wait``);
        ``timeout`` seconds at most (then ``timed_out``). ``ack`` acknowledges the previous
        batch first. With ``match``, only firings that match end the wait, and with no
        ``cursor`` given it looks at the whole ring and acknowledges nothing (``after``
        goes on from a seq instead). A daemon restart meanwhile is ridden out for
        ``reconnect`` seconds, then ``Unavailable``. ``watch``: a pipe we write to; its
        reader leaving ends the wait (``ReaderGone``)."""
        ids = [sessions] if isinstance(sessions, str) else list(sessions)
        deadline = None if timeout is None else time.monotonic() + timeout
        again = self.again(deadline)
        client = self.client
        chosen = None if after is not None else wait_cursor(cursor, match, WAIT_CURSOR)
        wanted = as_match(match)

        def look() -> p.Woken:
            request = p.Wait(
                sessions=ids,
                cursor=chosen,
                timeout_ms=again.remaining_ms(),
                max=max,
                ack=ack or {},
                match=wanted,
                after=after,
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
        self,
        session: str,
        *,
        cursor: str | UnsetType | None = UNSET,
        max: int | None = None,
        match: MatchLike | None = None,
    ) -> Iterator[p.SessionBatch]:
        """Every batch after ``cursor`` (default ``follow``), as it comes, for ever (break
        to stop).

        A batch is acknowledged when the caller asks for the next one, in the
        same request as the wait for it: one that was handed out and not
        finished (the loop broke, the program died) comes again to the next
        follower. A daemon restart is ridden out as in ``wait``. With
        ``match`` and no ``cursor``, it follows the matching firings from the
        whole ring on, acknowledging nothing.
        """
        chosen = wait_cursor(cursor, match, FOLLOW_CURSOR)
        carried: dict[str, int] = {}
        after: int | None = None
        while True:
            if chosen is None:
                woken = self.wait(session, cursor=None, max=max, match=match, after=after)
            else:
                woken = self.wait(session, cursor=chosen, max=max, ack=carried, match=match)
            for batch in woken.batches:
                yield batch
                carried, after = {batch.session: batch.next}, batch.next

    # -- request and reply -------------------------------------------------------

    def request(
        self,
        session: str,
        text: str,
        *,
        reply_to: str,
        timeout: float | None = 30.0,
        handler: str = DEFAULT_HANDLER,
        tags: Mapping[str, str] | None = None,
    ) -> Firing | None:
        """Send ``text`` to ``session`` tagged ``reply-to`` = ``reply_to`` and a fresh
        ``corr``, then wait on ``reply_to`` for the firing tagged with that ``corr`` (one
        that came before the wait is found too); the reply, or None at ``timeout``."""
        corr = correlation_id()
        self.stats(reply_to)  # where the reply goes must exist before the request leaves
        sent_tags = {**(tags or {}), REPLY_TO: reply_to, CORR: corr}
        self.send(session, text, handler=handler, tags=sent_tags)
        woken = self.wait(reply_to, cursor=None, match={CORR: corr}, timeout=timeout, max=1)
        if woken.timed_out or not woken.batches:
            return None
        return woken.batches[0].firings[0]

    def reply(self, session: str, seq: int, text: str, *, handler: str = DEFAULT_HANDLER) -> p.Sent:
        """Send ``text`` to the session named by the ``reply-to`` tag of firing ``seq`` of
        ``session``, tagged with its ``corr``; an ``Error`` when it has no ``reply-to``."""
        firing = self.firing(session, seq)
        target, tags = reply_tags(firing, session)
        return self.send(target, text, handler=handler, tags=tags)

    def firing(self, session: str, seq: int) -> Firing:
        """Firing ``seq`` of ``session``, read without a cursor; an ``Error`` when the ring
        does not hold it."""
        if seq < 1:
            raise CliError(f"seq {seq} names no firing: seqs start at 1", ERROR)
        head = self.stats(session).sessions[0].head
        if seq > head:
            raise CliError(f"session {session!r} has no firing {seq}: its head is {head}")
        batch = self.read(session, after=seq - 1, max=1)
        if not batch.firings or batch.firings[0].seq != seq:
            raise no_firing(session, seq, batch)
        return batch.firings[0]
