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

A request made with a scoped token (rules K1-K5) is checked here, in one
place, before anything else: the rights its op needs on the token's
sessions (``forbidden`` when it lacks one; managing tokens and shutting the
daemon down are the root's), then it runs on ``Scoped``, the committer as
that token sees it, where every session outside its patterns is missing.

Waits are the engine's own (``repl_daemon.engine.wait``): a waiter
subscribes to its sessions before it reads, so a firing recorded between
the read and the sleep still wakes it, and a blocked waiter does no work at
all until the committer says that one of its sessions changed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import anyio
import msgspec

from repl_daemon import protocol as p
from repl_daemon.engine import verbs  # noqa: F401  (its steps register as it is imported)
from repl_daemon.engine.claim import ClaimWait, sees_dead_letter  # registers its steps
from repl_daemon.engine.clock import REAL, Clock
from repl_daemon.engine.committer import Backend, Sessions, Totals
from repl_daemon.engine.join import JoinWait
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.scoped import Scoped
from repl_daemon.engine.steps import STEPS
from repl_daemon.engine.wait import Wait, Waiters, wait_ids
from repl_daemon.metrics import Counts
from session.delta import Webhook
from session.errors import (
    BadMax,
    BadRequest,
    BadTime,
    Forbidden,
    StoreFailed,
    Unauthorized,
    UnknownOp,
)
from session.firing import Firing
from session.names import check_cursor_name, check_session_id
from session.ops import (
    ClaimFiring,
    FinishNext,
    GetWebhook,
    Record,
    check_match,
    check_seq,
)
from session.rules import DEFAULT_HANDLER, TICK_HANDLER
from session.schedule import MAX_DUE_MS, Timer, parse_duration, parse_every, parse_time
from session.scopes import (
    TokenRecord,
    check_new_token_name,
    check_token_name,
    digest,
    forbidden,
    make_scope,
    schedule_right,
)
from session.session import Recorded, Summary, check_key, no_session
from session.tags import WEBHOOK, check_tags

T = TypeVar("T")

log = logging.getLogger("repl.daemon")

WRONG_TOKEN = (
    "wrong token: give the daemon's root token (the `token` file in its state directory) "
    "or one made by `repl token add`"
)
REVOKED = "this token was revoked: ask whoever manages the daemon for a new one (`repl token add`)"


class Holder(Protocol):
    """What holds a scoped token now (a connection, an HTTP request): ended when it is revoked."""

    def revoke(self, error: Unauthorized) -> None: ...


class Engine:
    """Every op of the protocol but auth, over one committer."""

    def __init__(
        self,
        backend: Backend,
        *,
        settle: float = 0.1,
        quiet: float = 0.0,
        max_sessions: int = 10_000,
        clock: Clock = REAL,
    ) -> None:
        """An engine over ``backend``'s committer. ``clock`` is what the engine, the
        committer and its timers read the time from (the real one unless a test hands its
        own)."""
        self.backend = backend
        #: what stamps a firing and what a schedule's due time is counted from
        self.clock = clock
        #: requests by op, refusals by code, the store's write latency (``/metrics``)
        self.counts = Counts()
        self.committer = backend.committer(self, max_sessions=max_sessions, clock=clock)
        #: the waits blocked now, by session (a wait knows these, not the engine)
        self.waits = Waiters(self.committer, settle, quiet, clock)
        self.started = time.monotonic()
        self.connections = 0
        self.requests = 0
        self.firings = 0
        #: set by a ``shutdown`` request: the daemon then stops as on SIGTERM
        self.shutdown_requested = anyio.Event()
        #: what holds each scoped token now, by its digest (revocation ends them)
        self.holders: dict[str, set[Holder]] = {}
        #: the requests of each scoped token in use (its ``stats``)
        self.token_requests: Counter[str] = Counter()
        #: the digests of the tokens revoked while this daemon runs: a request made with
        #: one (a connection or an event stream authenticated before) is refused
        self.gone: set[str] = set()

    # -- life --------------------------------------------------------------

    async def load(self) -> int:
        return await self.committer.load()

    async def run(self) -> None:
        await self.committer.run()

    # -- the waits' figures, as the daemon and its tests read them ----------

    @property
    def settle(self) -> float:
        return self.waits.settle

    @settle.setter
    def settle(self, seconds: float) -> None:
        self.waits.settle = seconds

    @property
    def quiet(self) -> float:
        return self.waits.quiet

    @quiet.setter
    def quiet(self, seconds: float) -> None:
        self.waits.quiet = seconds

    @property
    def waiting(self) -> int:
        """The waits blocked now (``stats``, ``/metrics``)."""
        return self.waits.count

    @property
    def waiters(self) -> dict[str, dict[Wait, None]]:
        return self.waits.by_session

    @property
    def closing(self) -> bool:
        return self.waits.closing

    @property
    def no_waiters(self) -> anyio.Event:
        """Set once the daemon is closing and the last waiter has been answered."""
        return self.waits.none_left

    async def shutdown(self) -> None:
        """Answer every waiter ``shutting_down``, then make what was answered durable."""
        self.waits.close()
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

    def changed(self, session_id: str, heard: Firing | None = None) -> None:
        woken: set[str] = set()  # the groups whose first blocked claimer was woken
        for waiter in self.waits.on(session_id):
            if isinstance(waiter, ClaimWait):
                self._wake_claim(waiter, woken)
            else:
                waiter.wake(heard)

    def claimable(self, session_id: str) -> None:
        woken: set[str] = set()
        for waiter in self.waits.on(session_id):
            if isinstance(waiter, ClaimWait):
                self._wake_claim(waiter, woken)
            elif isinstance(waiter, JoinWait):  # a firing given back moves a join too
                waiter.wake()

    def grouped(self, session_id: str) -> None:
        for waiter in self.waits.on(session_id):
            if isinstance(waiter, JoinWait):
                waiter.wake()

    @staticmethod
    def _wake_claim(waiter: ClaimWait, woken: set[str]) -> None:
        """Wake a claimer if it is the first blocked one of its group (the others wait for
        the wake it hands on, ``ClaimWait.pass_on``), has a match, or is looking (it looks
        once more)."""
        group = waiter.claim.group
        if waiter.claim.match is not None or not waiter.blocked:
            waiter.wake()
        elif group not in woken:
            woken.add(group)
            waiter.wake()

    def _pass_on(self, session_id: str, group: str) -> None:
        """A claimer of ``group`` took a firing, or went away while it looked: the next
        blocked one looks, in a later turn of the loop (a burst hands on in a chain, not
        in a recursion)."""
        asyncio.get_running_loop().call_soon(self._wake_next, session_id, group)

    def _wake_next(self, session_id: str, group: str) -> None:
        for waiter in self.waits.on(session_id):
            if (
                isinstance(waiter, ClaimWait)
                and waiter.claim.group == group
                and waiter.claim.match is None
                and waiter.blocked
            ):
                waiter.wake()
                return

    def stopped(self, session_id: str) -> None:
        for waiter in self.waits.on(session_id):
            waiter.stopped = session_id
            waiter.wake()

    def link(self, error: StoreFailed | None) -> None:
        self.waits.link_error = error
        self._wake_all()

    def fired(self, count: int) -> None:
        self.firings += count

    def revoked(self, digest: str) -> None:
        self.gone.add(digest)
        self.token_requests.pop(digest, None)
        error = Unauthorized(REVOKED)
        for holder in list(self.holders.pop(digest, ())):
            holder.revoke(error)

    # -- tokens --------------------------------------------------------------

    def authenticate(self, secret: str, root: bytes) -> Outcome[TokenRecord | None]:
        """Who ``secret`` is: the root (None), a scoped token, or nobody (``Unauthorized``).

        The root token is compared in constant time; a scoped one is found by
        the SHA-256 of the secret, whose own comparison is constant-time too.
        """
        if hmac.compare_digest(secret.encode(), root):
            root_token: Outcome[TokenRecord | None] = Outcome.now(None)
            return root_token
        wanted = digest(secret)

        def known(record: TokenRecord | None) -> TokenRecord | None:
            if record is None or not hmac.compare_digest(record.digest, wanted):
                raise Unauthorized(WRONG_TOKEN)
            return record

        return self.committer.find_token(wanted).then(known)

    def hold(self, token: TokenRecord, holder: Holder) -> None:
        self.holders.setdefault(token.digest, set()).add(holder)

    def unhold(self, token: TokenRecord, holder: Holder) -> None:
        holders = self.holders.get(token.digest)
        if holders is not None:
            holders.discard(holder)
            if not holders:
                del self.holders[token.digest]

    def view(self, token: TokenRecord | None) -> Sessions:
        """The sessions as ``token`` sees them (None: the root sees all of them)."""
        if token is None:
            return self.committer
        if token.digest in self.gone:
            raise Unauthorized(REVOKED)
        return Scoped(self.committer, token.scope)

    def _scoped(self, req: p.Request, tag: str, token: TokenRecord) -> Sessions:
        """The rights ``req`` needs, checked against the token; the sessions as it sees them."""
        view = self.view(token)
        self.token_requests[token.digest] += 1
        scope = token.scope
        right = p.VERB[tag].right
        if right is None:
            raise forbidden("root")
        if isinstance(req, p.Schedule):
            right = schedule_right(req.every is not None)
        if right:
            self.check_right(token, right, getattr(req, "session", None))
        if isinstance(req, p.Start) and (req.session is None or not scope.covers(req.session)):
            raise Forbidden(
                "a scoped token starts only sessions its patterns cover: give an id "
                f"that matches {', '.join(scope.patterns)}"
            )
        named = req.dead_letter if isinstance(req, p.Group) else None
        if named is not None and not scope.covers(named):
            # a group's dead letters are written there: a session the token cannot see
            # would be started or written through it (SPEC §11, §16)
            raise Forbidden(
                "a scoped token names as a group's dead-letter session only a session "
                f"its patterns cover: give one that matches {', '.join(scope.patterns)}"
            )
        return view

    def check_right(self, token: TokenRecord | None, right: str, session_id: Any = None) -> None:
        """``forbidden`` unless ``token`` (None: the root) has ``right``; for the requests
        of HTTP that are several ops (an event stream reads, though it opens with ``stats``)."""
        if token is not None and right not in token.scope.rights:
            raise forbidden(right, session_id)

    def _token(self, req: p.Token) -> Outcome[p.Response]:
        rid, committer = req.id, self.committer
        if req.action == "list":
            listed = committer.tokens()
            return listed.then(lambda ts: p.TokenList(id=rid, tokens=[_token_info(t) for t in ts]))
        if not req.name:
            raise BadRequest(f"token {req.action} needs a name")
        if req.action == "revoke":
            name = check_token_name(req.name)
            return committer.revoke_token(name).then(lambda _: p.Done(id=rid))
        name = check_new_token_name(req.name)
        scope = make_scope(req.sessions, req.can)
        secret = "repl_" + secrets.token_urlsafe(32)
        record = TokenRecord(name, digest(secret), scope)
        info = _token_info(record)
        return committer.add_token(record).then(
            lambda _: p.TokenMade(
                id=rid, token=secret, name=name, sessions=info.sessions, can=info.can
            )
        )

    def _wake_all(self) -> None:
        for waiter in self.waits.every():
            waiter.wake()

    # -- requests ----------------------------------------------------------

    def handle(self, req: p.Request, token: TokenRecord | None = None) -> Outcome[p.Response]:
        """The answer to one request made with ``token`` (None: the root); raises a
        ``ReplError`` when it is refused at once."""
        tag = str(req.__struct_config__.tag)
        self.requests += 1  # every request any front end hands over is counted here, once
        self.counts.requests[tag] += 1
        committer: Sessions = self.committer
        if token is not None:
            committer = self._scoped(req, tag, token)
        run = STEPS.get(type(req))
        if run is None:  # a request made outside the decoder, or a row without its step
            raise UnknownOp(f"the daemon has no op {type(req).__name__!r}")
        return run(self, req, committer, token)

    # -- what HTTP's own routes ask (each counted as the request it is) -------

    def summaries(self, token: TokenRecord | None) -> Outcome[list[Summary]]:
        """Every session ``token`` sees, with its figures (HTTP's listing shows their lag,
        which the ``sessions`` op's rows leave out): counted as a ``sessions`` request."""
        self.requests += 1
        self.counts.requests["sessions"] += 1
        if token is not None:
            self.token_requests[token.digest] += 1
        return self.view(token).summaries(None)

    def webhook_of(self, session_id: str) -> Outcome[Webhook | None]:
        """The session's webhook (None: it has none); ``NoSuchSession`` when there is none."""
        return self.committer.execute(session_id, GetWebhook())

    def totals(self) -> Outcome[Totals]:
        """The daemon-wide figures (``/metrics``)."""
        return self.committer.totals()

    def deliver(
        self,
        session_id: str,
        webhook: Webhook,
        text: str,
        key: str | None,
        tags: dict[str, str] | None = None,
    ) -> Outcome[p.Sent]:
        """Record a webhook's delivery (its signature checked by the caller): a handled
        firing of the webhook's handler, deduplicated by the delivery's key, carrying
        ``tags`` (the delivery's ``event`` and ``delivery``, as HTTP read them)."""
        self.counts.requests["webhook"] += 1
        record = Record(
            webhook.handler,
            text,
            self.clock.utc_now(),
            key,
            handled=True,
            tags=tags or {},
            by=WEBHOOK,
        )
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
        now = self.clock.now_ms()
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
            tags=dict(check_tags(req.tags)) if req.tags else None,
        )

    def ping(self, req: p.Ping) -> p.Pong:
        return p.Pong(
            id=req.id,
            version=p.VERSION,
            uptime_s=round(self.uptime(), 3),
            pid=os.getpid(),
            store=self.backend.name,
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

    def _stats(
        self, req: p.Stats, committer: Sessions, token: TokenRecord | None
    ) -> Outcome[p.Response]:
        rows = committer.summaries(req.session)
        if token is not None:  # the daemon's figures would tell of the others' sessions
            everything = committer.summaries(None)

            async def scoped() -> p.Response:
                mine = await everything.result()
                return self._stats_reply(req, await rows.result(), self._token_figures(token, mine))

            return Outcome.later(scoped)
        totals = committer.totals()
        if rows.job is None and totals.job is None:
            return Outcome.now(self._stats_reply(req, rows.value, self._figures(totals.value)))

        async def stats() -> p.Response:
            figures = self._figures(await totals.result())
            return self._stats_reply(req, await rows.result(), figures)

        return Outcome.later(stats)

    def _figures(self, totals: Totals) -> p.DaemonStats:
        return p.DaemonStats(
            version=p.VERSION,
            uptime_s=round(self.uptime(), 3),
            store=self.backend.name,
            sessions=totals.sessions,
            firings=self.firings,
            lost=totals.lost,
            evaluations=totals.evaluations,
            waiters=self.waiting,
            connections=self.connections,
            requests=self.requests,
        )

    def _token_figures(self, token: TokenRecord, rows: list[Summary]) -> p.DaemonStats:
        """The daemon block of a scoped token's ``stats``: its own sessions, connections and
        requests only."""
        totals = Totals.of(rows)
        return p.DaemonStats(
            version=p.VERSION,
            uptime_s=round(self.uptime(), 3),
            store=self.backend.name,
            sessions=totals.sessions,
            firings=sum(row.recorded for row in rows),
            lost=totals.lost,
            evaluations=totals.evaluations,
            waiters=sum(self.waiters_of(row.id) for row in rows),
            connections=len(self.holders.get(token.digest, ())),
            requests=self.token_requests[token.digest],
        )

    def _stats_reply(
        self, req: p.Stats, rows: list[Summary], daemon: p.DaemonStats
    ) -> p.StatsReply:
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

    def wait(self, req: p.Wait, committer: Sessions | None = None) -> Outcome[p.Response]:
        """Block until a session has firings after the cursor (rules S8, S10, S11, S14).

        Everything about the request is checked here, before anything runs:
        a refused wait changes nothing.
        """
        if req.cursor is not None:
            check_cursor_name(req.cursor)
        check_match(req.match)
        ids = wait_ids(req.sessions)
        if req.max is not None and req.max < 1:
            raise BadMax(f"max {req.max} is below 1")
        if req.timeout_ms is not None and req.timeout_ms < 0:
            raise BadRequest(f"timeout_ms {req.timeout_ms} is negative")
        if req.after is not None:
            if len(ids) != 1 or req.ack:
                raise BadRequest("a wait with after is on one session, with no ack")
            check_seq(req.after)
        if req.cursor is None and req.ack:
            raise BadRequest("a wait with no cursor acknowledges nothing: give no ack")
        strays = sorted(set(req.ack) - set(ids))
        if strays:
            raise BadRequest(f"ack names {', '.join(strays)}, which the wait is not on")
        acks = [(session_id, req.ack[session_id]) for session_id in ids if session_id in req.ack]
        for _, seq in acks:  # the acks' own values before any session is looked up, as for
            check_seq(seq)  # every op (so a session a scoped token cannot see is missing)
        committer = committer or self.committer
        if len(ids) == 1:
            # one session: its first look checks that it exists, and makes the ack first
            # (``AckRead``), in one step; a token that cannot see it is refused here
            if isinstance(committer, Scoped) and committer.hides(ids[0]):
                raise no_session(ids[0])
            ack = acks[0][1] if acks else None
            return Outcome.of(Wait(self.waits, req, ids, [], ack=ack))
        # every session must exist before any is acked (or read: a read is an evaluation)
        first: list[Outcome[Any]] = [committer.require(ids)]
        if acks:
            first.append(committer.ack_all(req.cursor or "", acks))  # refused without one
        return Outcome.of(Wait(self.waits, req, ids, first))

    # -- groups and claims (SPEC §16) --------------------------------------------

    def claim(
        self, req: p.Claim, committer: Sessions, token: TokenRecord | None = None
    ) -> Outcome[p.Response]:
        """Block until the group has a firing to take, and take it (``ClaimWait``). Every
        value is checked first: a refused claim takes nothing and makes no group, nor does
        one by a ``token`` that does not see the group's default dead-letter session
        (``sees_dead_letter``)."""
        check_session_id(req.session)
        ClaimFiring(req.group, 0, req.lease_ms, req.match, req.from_now).check()
        if req.timeout_ms is not None and req.timeout_ms < 0:
            raise BadRequest(f"timeout_ms {req.timeout_ms} is negative")
        if isinstance(committer, Scoped) and committer.hides(req.session):
            raise no_session(req.session)
        sees = sees_dead_letter(token, req.session)
        return Outcome.of(ClaimWait(self.waits, req, self.clock.now_ms, self._pass_on, sees))

    def done_next(
        self, req: p.FinishNext, committer: Sessions, token: TokenRecord | None = None
    ) -> Outcome[p.Response]:
        """``done``, then ``claim`` of the token's group (``ClaimWait``, whose first look is
        both in one step): every value checked first, as a claim's are."""
        check_session_id(req.session)
        op = FinishNext(req.claim, 0, req.lease_ms)
        op.check()
        if req.timeout_ms is not None and req.timeout_ms < 0:
            raise BadRequest(f"timeout_ms {req.timeout_ms} is negative")
        if isinstance(committer, Scoped) and committer.hides(req.session):
            raise no_session(req.session)
        claim = p.Claim(
            id=req.id,
            session=req.session,
            group=op.next.group,
            lease_ms=req.lease_ms,
            timeout_ms=req.timeout_ms,
        )
        sees = sees_dead_letter(token, req.session)
        wait = ClaimWait(self.waits, claim, self.clock.now_ms, self._pass_on, sees, req.claim)
        return Outcome.of(wait)


def _token_info(record: TokenRecord) -> p.TokenInfo:
    scope = record.scope
    return p.TokenInfo(name=record.name, sessions=list(scope.patterns), can=sorted(scope.rights))
