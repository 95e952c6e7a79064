"""The engine: one request in, the core's operations run by a committer, one answer out.

``Engine.handle`` is the whole of the daemon's behaviour but framing and
authentication: it checks a request, turns it into operations of the core
(``session.ops``), has the committer run them, and builds the answer. It is
the same for every store; what differs (memory, SQLite, Redis) is the
committer's business (``repl_daemon.engine.committer``).

A request that touches several things is checked whole before anything is
applied: a wait's acks on several sessions go through ``ack_all``, which
applies all of them or none, and every other part of a wait (its cursor,
its ``max``, its timeout, its sessions) is checked before those acks.

Waits are the engine's own (``repl_daemon.engine.wait``): a waiter
subscribes to its sessions before it reads, so a firing recorded between
the read and the sleep still wakes it, and a blocked waiter does no work at
all until the committer says that one of its sessions changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import Any, Never, NoReturn, TypeVar

import anyio
import msgspec

from repl_daemon import protocol as p
from repl_daemon.engine.clock import ms_to_utc, now_ms, utc_now
from repl_daemon.engine.committer import Committer, Totals
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.wait import Wait
from repl_daemon.metrics import Counts
from session.delta import Webhook
from session.errors import (
    BadMax,
    BadRequest,
    BadTime,
    StoreFailed,
    UnknownOp,
)
from session.firing import Batch
from session.ops import (
    Ack,
    AddTimer,
    CancelTimer,
    CursorTable,
    Poll,
    ReadAfter,
    ReadCursor,
    Record,
    SetLimit,
    SetWebhook,
    TimerList,
    check_seq,
)
from session.rules import DEFAULT_HANDLER, DEFAULT_LIMIT, READ_CURSOR, TICK_HANDLER
from session.schedule import MAX_DUE_MS, Timer, parse_duration, parse_every, parse_time
from session.session import (
    Recorded,
    Scheduled,
    Summary,
    check_cursor_name,
    check_key,
    check_session_id,
)

T = TypeVar("T")

log = logging.getLogger("repl.daemon")


class Engine:
    """Every op of the protocol but auth, over one committer."""

    def __init__(
        self,
        make_committer: Callable[[Engine], Committer],
        *,
        settle: float = 0.1,
        store_name: str = "memory",
    ) -> None:
        self.settle = settle
        #: the store as ``ping`` shows it (a Redis URL without its password)
        self.store_name = store_name
        #: requests by op, refusals by code, the store's write latency (``/metrics``)
        self.counts = Counts()
        self.committer = make_committer(self)
        self.started = time.monotonic()
        self.connections = 0
        self.requests = 0
        self.waiting = 0
        self.firings = 0
        self.closing = False
        #: set once the daemon is closing and the last waiter has been answered
        self.no_waiters = anyio.Event()
        #: the waits blocked on each session; an entry lives only while it has waits
        self.waiters: dict[str, set[Wait]] = {}
        self.link_error: StoreFailed | None = None
        #: set by a ``shutdown`` request: the daemon then stops as on SIGTERM
        self.shutdown_requested = anyio.Event()

    # -- life --------------------------------------------------------------

    async def load(self) -> int:
        return await self.committer.load()

    async def run(self) -> None:
        await self.committer.run()

    async def shutdown(self) -> None:
        """Answer every waiter ``shutting_down``, then make what was answered durable."""
        self.closing = True
        if not self.waiting:
            self.no_waiters.set()
        self._wake_all()
        await self.committer.close()

    async def health(self) -> str | None:
        """What is wrong with the daemon's store, or None when it works (``/healthz``)."""
        if self.closing:
            return "the daemon is shutting down"
        return await self.committer.health()

    def uptime(self) -> float:
        return time.monotonic() - self.started

    # -- what the committer tells (the Listener) ---------------------------

    # a woken wait may answer, and leave the table, at once: each loop runs over a copy

    def changed(self, session_id: str) -> None:
        waiters = self.waiters.get(session_id)
        if waiters:
            for waiter in list(waiters):
                waiter.wake()

    def stopped(self, session_id: str) -> None:
        for waiter in list(self.waiters.get(session_id, ())):
            waiter.stopped = session_id
            waiter.wake()

    def link(self, error: StoreFailed | None) -> None:
        self.link_error = error
        self._wake_all()

    def fired(self, count: int) -> None:
        self.firings += count

    def _wake_all(self) -> None:
        for waiter in {w for waiters in self.waiters.values() for w in waiters}:
            waiter.wake()

    # -- requests ----------------------------------------------------------

    def handle(self, req: p.AnyRequest) -> Outcome[p.Response]:
        """The answer to one request; raises a ``ReplError`` when it is refused at once."""
        rid = req.id
        committer = self.committer
        self.counts.requests[str(req.__struct_config__.tag)] += 1
        match req:
            case p.Send():
                op = Record(req.handler, req.text, utc_now(), req.key)
                return committer.execute(req.session, op).then(self._sent(rid))
            case p.Read():
                if req.after is not None:
                    if req.cursor is not None:
                        raise BadRequest("give either cursor or after, not both")
                    read: ReadAfter | ReadCursor = ReadAfter(req.after, req.max)
                else:
                    cursor = READ_CURSOR if req.cursor is None else req.cursor
                    read = ReadCursor(cursor, req.max, touch=not req.peek)
                return committer.execute(req.session, read).then(_firings(rid))
            case p.Wait():
                return self.wait(req)
            case p.Ack():
                acked = committer.execute(req.session, Ack(req.cursor, req.seq))
                return acked.then(lambda seq: p.Acked(id=rid, cursor=req.cursor, seq=seq))
            case p.Poll():
                return committer.execute(req.session, Poll(req.max)).then(_firings(rid))
            case p.Cursors():
                table = committer.execute(req.session, CursorTable())
                return table.then(lambda rows: p.CursorList(id=rid, cursors=rows))
            case p.Buffer():
                trimmed = committer.execute(req.session, SetLimit(req.limit))
                return trimmed.then(lambda n: p.Buffered(id=rid, limit=req.limit, trimmed=n))
            case p.Start():
                limit = DEFAULT_LIMIT if req.buffer is None else req.buffer
                started = committer.start(req.session, limit, req.exist_ok)
                return started.then(lambda s: p.Started(id=rid, session=s[0], created=s[1]))
            case p.Stop():
                return committer.stop(req.session).then(lambda _: p.Done(id=rid))
            case p.Sessions():
                return committer.summaries(None).then(self._listing(rid))
            case p.Stats():
                return self._stats(req)
            case p.Schedule():
                timer = self.timer_for(req)
                scheduled = committer.execute(req.session, AddTimer(timer))
                return scheduled.then(lambda s: _timer_set(rid, timer, s))
            case p.Timers():
                if req.session is not None:
                    listed = committer.execute(req.session, TimerList())
                else:
                    listed = committer.timers(None)
                return listed.then(lambda ts: p.TimerList(id=rid, timers=[_info(t) for t in ts]))
            case p.Cancel():
                cancelled = committer.execute(req.session, CancelTimer(req.timer))
                return cancelled.then(lambda t: p.Cancelled(id=rid, timer=_info(t)))
            case p.SetWebhook():
                hook = None if req.secret is None else Webhook(req.secret, req.handler)
                changed = committer.execute(req.session, SetWebhook(hook))
                return changed.then(lambda _: p.Done(id=rid))
            case p.Ping():
                return Outcome.now(self.ping(req))
            case p.Shutdown():
                log.info("asked to shut down by a client")
                self.shutdown_requested.set()
                return Outcome.now(p.Done(id=rid))
            case p.Auth():  # already authenticated: a second auth changes nothing
                return Outcome.now(p.Done(id=rid))
            case _:
                _unknown(req)

    def deliver(
        self, session_id: str, webhook: Webhook, text: str, key: str | None
    ) -> Outcome[p.Sent]:
        """Record a webhook's delivery (its signature checked by the caller): a handled
        firing of the webhook's handler, deduplicated by the delivery's key."""
        self.counts.requests["webhook"] += 1
        record = Record(webhook.handler, text, utc_now(), key, handled=True)
        return self.committer.execute(session_id, record).then(self._sent(msgspec.UNSET))

    def timer_for(self, req: p.Schedule) -> Timer:
        """The timer a ``schedule`` asks for, its times parsed; ``BadTime`` when they do not.

        Its id is made up, or made from its key, so that a retry with the key
        answers the same id whether or not the first one has fired.
        """
        check_session_id(req.session)
        if req.in_ is not None and req.at is not None:
            raise BadRequest("give either in or at, not both")
        every = None if req.every is None else parse_every(req.every)
        if every is not None and every > MAX_DUE_MS:  # said before the due time it makes
            raise BadTime(f"interval {req.every!r} is longer than the calendar goes")
        now = now_ms()
        if req.in_ is not None:
            due = now + parse_duration(req.in_)
        elif req.at is not None:
            due = parse_time(req.at)
        elif every is not None:
            due = now + every
        else:
            raise BadRequest("schedule needs in, at or every")
        if req.key is not None:
            check_key(req.key)
            digest = hashlib.blake2b(req.key.encode(), digest_size=6).hexdigest()
            timer_id = f"t-{digest}"
        else:
            timer_id = f"t-{secrets.token_hex(6)}"
        handler = req.handler or (TICK_HANDLER if every is not None else DEFAULT_HANDLER)
        return Timer(
            id=timer_id,
            session=req.session,
            due_ms=due,
            every_ms=every,
            handler=handler,
            text=req.text,
            key=req.key,
        )

    def ping(self, req: p.Ping) -> p.Pong:
        return p.Pong(
            id=req.id,
            version=p.VERSION,
            uptime_s=round(self.uptime(), 3),
            pid=os.getpid(),
            store=self.store_name,
        )

    def _sent(self, rid: p.RequestId) -> Callable[[Recorded], p.Sent]:
        def sent(recorded: Recorded) -> p.Sent:
            if not recorded.duplicate:
                self.firings += 1
            return p.Sent(id=rid, seq=recorded.seq, duplicate=recorded.duplicate)

        return sent

    def waiters_of(self, session_id: str) -> int:
        """How many waits (event streams too) are blocked on the session here."""
        return len(self.waiters.get(session_id, ()))

    def _listing(self, rid: p.RequestId) -> Callable[[list[Summary]], p.SessionList]:
        def listing(rows: list[Summary]) -> p.SessionList:
            return p.SessionList(
                id=rid,
                sessions=[
                    p.SessionInfo(
                        id=s.id,
                        head=s.head,
                        retained=s.retained,
                        limit=s.limit,
                        cursors=s.cursors,
                        waiters=self.waiters_of(s.id),
                    )
                    for s in rows
                ],
            )

        return listing

    def _stats(self, req: p.Stats) -> Outcome[p.Response]:
        rows, totals = self.committer.summaries(req.session), self.committer.totals()
        if rows.job is None and totals.job is None:
            return Outcome.now(self._stats_reply(req, rows.value, totals.value))

        async def stats() -> p.Response:
            return self._stats_reply(req, await rows.result(), await totals.result())

        return Outcome.later(stats)

    def _stats_reply(self, req: p.Stats, rows: list[Summary], totals: Totals) -> p.StatsReply:
        daemon = p.DaemonStats(
            version=p.VERSION,
            uptime_s=round(self.uptime(), 3),
            store=self.committer.store.name,
            sessions=totals.sessions,
            firings=self.firings,
            lost=totals.lost,
            evaluations=totals.evaluations,
            waiters=self.waiting,
            connections=self.connections,
            requests=self.requests,
        )
        sessions = [
            p.SessionStats(
                id=s.id,
                head=s.head,
                retained=s.retained,
                limit=s.limit,
                firings=s.recorded,
                lost=s.lost,
                evaluations=s.evaluations,
                waiters=self.waiters_of(s.id),
                cursors=s.cursors,
            )
            for s in rows
        ]
        return p.StatsReply(id=req.id, daemon=daemon, sessions=sessions)

    # -- waits -------------------------------------------------------------

    def wait(self, req: p.Wait) -> Outcome[p.Response]:
        """Block until a session has firings after the cursor (SPEC rules 8, 10, 11, 14).

        Everything about the request is checked here, before anything runs:
        a refused wait changes nothing.
        """
        check_cursor_name(req.cursor)
        if not req.sessions:
            raise BadRequest("wait needs at least one session")
        ids = list(dict.fromkeys(req.sessions))
        for session_id in ids:
            check_session_id(session_id)
        if req.max is not None and req.max < 1:
            raise BadMax(f"max {req.max} is below 1")
        if req.timeout_ms is not None and req.timeout_ms < 0:
            raise BadRequest(f"timeout_ms {req.timeout_ms} is negative")
        if req.after is not None:
            if len(ids) != 1 or req.ack:
                raise BadRequest("a wait with after is on one session, with no ack")
            check_seq(req.after)
        strays = sorted(set(req.ack) - set(ids))
        if strays:
            raise BadRequest(f"ack names {', '.join(strays)}, which the wait is not on")
        acks = [(session_id, req.ack[session_id]) for session_id in ids if session_id in req.ack]
        # every session must exist before any is acked (or read: a read is an evaluation)
        committer = self.committer
        first: list[Outcome[Any]]
        if len(ids) == 1 and acks:  # the ack checks that its one session exists, in one step
            first = [committer.ack_all(req.cursor, acks)]
        else:
            first = [committer.require(ids)]
            if acks:
                first.append(committer.ack_all(req.cursor, acks))
        return Outcome.of(Wait(self, req, ids, first))


def _unknown(req: Never) -> NoReturn:
    """A request the engine has no case for: refused, never answered "done".

    The argument's type makes mypy prove that every request of the protocol
    has its case above; the raise covers a request made outside the decoder.
    """
    raise UnknownOp(f"the daemon has no op {type(req).__name__!r}")


def _info(timer: Timer) -> p.TimerInfo:
    return p.TimerInfo(
        timer=timer.id,
        session=timer.session,
        due=ms_to_utc(timer.due_ms),
        due_ms=timer.due_ms,
        every_ms=timer.every_ms,
        handler=timer.handler,
        text=timer.text,
        key=timer.key,
    )


def _timer_set(rid: p.RequestId, asked: Timer, scheduled: Scheduled) -> p.TimerSet:
    timer = scheduled.timer
    if timer is None:  # its key's timer fired already, as firing ``seq``
        return p.TimerSet(
            id=rid, timer=asked.id, due=None, due_ms=None, duplicate=True, seq=scheduled.seq
        )
    return p.TimerSet(
        id=rid,
        timer=timer.id,
        due=ms_to_utc(timer.due_ms),
        due_ms=timer.due_ms,
        every_ms=timer.every_ms,
        duplicate=scheduled.duplicate,
    )


def _firings(rid: p.RequestId) -> Callable[[Batch], p.Firings]:
    def firings(batch: Batch) -> p.Firings:
        return p.Firings(id=rid, next=batch.next, lost=batch.lost, firings=batch.firings)

    return firings
