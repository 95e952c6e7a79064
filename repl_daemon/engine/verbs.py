"""The engine's step for each verb of the table but those of groups (``repl_daemon.engine.
claim``'s): the request turned into the core's operations, run by the committer the token
sees, and the answer built from what they return. Each is registered with ``step``
(``repl_daemon.engine.steps``), found by the request's class; the engine is passed in
(``Any``: this module may not import it), and its own parts a step needs (a wait, the
daemon's figures, the token table) are its methods.

What must not live here: the token check (``Engine._scoped``, before any step) and a
step's refusal that is the core's to make.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from repl_daemon import protocol as p
from repl_daemon.engine.clock import ms_to_utc
from repl_daemon.engine.committer import Sessions
from repl_daemon.engine.gather import GatherWait, gather_corrs
from repl_daemon.engine.join import JoinWait
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.scoped import Scoped
from repl_daemon.engine.steps import step
from session.delta import Webhook
from session.errors import BadRequest
from session.firing import Batch, ms_to_ts
from session.names import check_group_name, check_session_id
from session.ops import (
    Ack,
    AddTimer,
    CancelTimer,
    CursorTable,
    Poll,
    ReadAfter,
    ReadCursor,
    ReadRecent,
    ReadSeq,
    Record,
    SetLimit,
    SetWebhook,
    TimerList,
    check_seq,
)
from session.rules import DEFAULT_LIMIT, READ_CURSOR
from session.schedule import Timer, parse_time
from session.scopes import TokenRecord
from session.session import Scheduled, no_session
from session.tags import ROOT

log = logging.getLogger("repl.daemon")


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
        tags=timer.tags or {},
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


def read_op(req: p.Read) -> ReadAfter | ReadCursor | ReadRecent | ReadSeq:
    """The core's operation for a ``read``: by cursor, after a seq, the newest N or those
    since a time, one seq; a read that names more than one way is refused."""
    ways = [
        name
        for name, given in (
            ("cursor", req.cursor is not None),
            ("after", req.after is not None),
            ("last", req.last is not None or req.since is not None),
            ("seq", req.seq is not None),
        )
        if given
    ]
    if len(ways) > 1:
        if ways == ["cursor", "after"]:
            raise BadRequest("give either cursor or after, not both")
        named = " and ".join("last/since" if way == "last" else way for way in ways)
        raise BadRequest(f"a read is by one of cursor, after, last/since and seq, not {named}")
    if req.seq is not None:
        if req.max is not None or req.match is not None:
            raise BadRequest("a read of one seq takes no max and no match")
        return ReadSeq(req.seq)
    if req.last is not None or req.since is not None:
        # any RFC 3339 time, as the ts a firing is written with, so the two compare as text
        since = None if req.since is None else ms_to_ts(parse_time(req.since))
        return ReadRecent(req.last, since, req.max, req.match)
    if req.after is not None:
        return ReadAfter(req.after, req.max, req.match)
    if req.cursor is None and req.match is not None:
        return ReadAfter(None, req.max, req.match)  # the whole ring (rule R2)
    cursor = READ_CURSOR if req.cursor is None else req.cursor
    return ReadCursor(cursor, req.max, touch=not req.peek, match=req.match)


def _firings(rid: p.RequestId) -> Callable[[Batch], p.Firings]:
    def firings(batch: Batch) -> p.Firings:
        return p.Firings(id=rid, next=batch.next, lost=batch.lost, firings=batch.firings)

    return firings


# -- the steps ----------------------------------------------------------------------


@step(p.Send)
def _send(engine: Any, req: p.Send, committer: Sessions, token: TokenRecord | None) -> Any:
    by = ROOT if token is None else token.name
    op = Record(req.handler, req.text, engine.clock.utc_now(), req.key, tags=req.tags, by=by)
    return committer.execute(req.session, op).then(engine._sent(req.id))


@step(p.Read)
def _read(engine: Any, req: p.Read, committer: Sessions, token: TokenRecord | None) -> Any:
    return committer.execute(req.session, read_op(req)).then(_firings(req.id))


@step(p.Wait)
def _wait(engine: Any, req: p.Wait, committer: Sessions, token: TokenRecord | None) -> Any:
    return engine.wait(req, committer)


@step(p.Ack)
def _ack(engine: Any, req: p.Ack, committer: Sessions, token: TokenRecord | None) -> Any:
    acked = committer.execute(req.session, Ack(req.cursor, req.seq))
    return acked.then(lambda seq: p.Acked(id=req.id, cursor=req.cursor, seq=seq))


@step(p.Poll)
def _poll(engine: Any, req: p.Poll, committer: Sessions, token: TokenRecord | None) -> Any:
    return committer.execute(req.session, Poll(req.max)).then(_firings(req.id))


@step(p.Cursors)
def _cursors(engine: Any, req: p.Cursors, committer: Sessions, token: TokenRecord | None) -> Any:
    table = committer.execute(req.session, CursorTable())
    return table.then(lambda rows: p.CursorList(id=req.id, cursors=rows))


@step(p.Buffer)
def _buffer(engine: Any, req: p.Buffer, committer: Sessions, token: TokenRecord | None) -> Any:
    trimmed = committer.execute(req.session, SetLimit(req.limit))
    return trimmed.then(lambda n: p.Buffered(id=req.id, limit=req.limit, trimmed=n))


@step(p.Start)
def _start(engine: Any, req: p.Start, committer: Sessions, token: TokenRecord | None) -> Any:
    limit = DEFAULT_LIMIT if req.buffer is None else req.buffer
    started = committer.start(req.session, limit, req.exist_ok)
    return started.then(lambda s: p.Started(id=req.id, session=s[0], created=s[1]))


@step(p.Stop)
def _stop(engine: Any, req: p.Stop, committer: Sessions, token: TokenRecord | None) -> Any:
    return committer.stop(req.session).then(lambda _: p.Done(id=req.id))


@step(p.Sessions)
def _sessions(engine: Any, req: p.Sessions, committer: Sessions, token: TokenRecord | None) -> Any:
    return committer.summaries(None).then(engine._listing(req.id))


@step(p.Stats)
def _stats(engine: Any, req: p.Stats, committer: Sessions, token: TokenRecord | None) -> Any:
    return engine._stats(req, committer, token)


@step(p.Schedule)
def _schedule(engine: Any, req: p.Schedule, committer: Sessions, token: TokenRecord | None) -> Any:
    timer = engine.timer_for(req)
    scheduled = committer.execute(req.session, AddTimer(timer))
    return scheduled.then(lambda s: _timer_set(req.id, timer, s))


@step(p.Timers)
def _timers(engine: Any, req: p.Timers, committer: Sessions, token: TokenRecord | None) -> Any:
    if req.session is not None:
        listed = committer.execute(req.session, TimerList())
    else:
        listed = committer.timers(None)
    return listed.then(lambda ts: p.TimerList(id=req.id, timers=[_info(t) for t in ts]))


@step(p.Cancel)
def _cancel(engine: Any, req: p.Cancel, committer: Sessions, token: TokenRecord | None) -> Any:
    cancelled = committer.execute(req.session, CancelTimer(req.timer))
    return cancelled.then(lambda t: p.Cancelled(id=req.id, timer=_info(t)))


@step(p.SetWebhook)
def _webhook(engine: Any, req: p.SetWebhook, committer: Sessions, token: TokenRecord | None) -> Any:
    hook = None if req.secret is None else Webhook(req.secret, req.handler)
    changed = committer.execute(req.session, SetWebhook(hook))
    return changed.then(lambda _: p.Done(id=req.id))


@step(p.Ping)
def _ping(engine: Any, req: p.Ping, committer: Sessions, token: TokenRecord | None) -> Any:
    return Outcome.now(engine.ping(req))


@step(p.Shutdown)
def _shutdown(engine: Any, req: p.Shutdown, committer: Sessions, token: TokenRecord | None) -> Any:
    log.info("asked to shut down by a client")
    engine.shutdown_requested.set()
    return Outcome.now(p.Done(id=req.id))


@step(p.Token)
def _token(engine: Any, req: p.Token, committer: Sessions, token: TokenRecord | None) -> Any:
    return engine._token(req)


@step(p.Claim)
def _claim(engine: Any, req: p.Claim, committer: Sessions, token: TokenRecord | None) -> Any:
    return engine.claim(req, committer, token)


@step(p.FinishNext)
def _done_next(
    engine: Any, req: p.FinishNext, committer: Sessions, token: TokenRecord | None
) -> Any:
    return engine.done_next(req, committer, token)


@step(p.Auth)
def _auth(engine: Any, req: p.Auth, committer: Sessions, token: TokenRecord | None) -> Any:
    # a connection authenticates once: a second auth would answer ok for a token nobody
    # checked, or switch a connection's identity mid-stream
    raise BadRequest(
        "this connection is authenticated already and keeps its token: "
        "open a new connection to use another"
    )


@step(p.Join)
def _join(engine: Any, req: p.Join, committer: Sessions, token: TokenRecord | None) -> Any:
    """A join (SPEC §18): checked whole before it subscribes to anything."""
    check_session_id(req.session)
    check_group_name(req.group)
    if req.upto is not None:
        check_seq(req.upto)
    if req.timeout_ms is not None and req.timeout_ms < 0:
        raise BadRequest(f"timeout_ms {req.timeout_ms} is negative")
    if isinstance(committer, Scoped) and committer.hides(req.session):
        raise no_session(req.session)
    return Outcome.of(JoinWait(engine.waits, req, engine.clock.now_ms))


@step(p.Gather)
def _gather(engine: Any, req: p.Gather, committer: Sessions, token: TokenRecord | None) -> Any:
    """A gather (SPEC §18): checked whole before it subscribes to anything (a session the
    token cannot see is missing, as for a wait)."""
    check_session_id(req.session)
    corrs = gather_corrs(req.corrs)
    if req.timeout_ms is not None and req.timeout_ms < 0:
        raise BadRequest(f"timeout_ms {req.timeout_ms} is negative")
    if isinstance(committer, Scoped) and committer.hides(req.session):
        raise no_session(req.session)
    return Outcome.of(GatherWait(engine.waits, req, corrs))
