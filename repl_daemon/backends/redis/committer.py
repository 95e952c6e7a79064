"""The shared committer: sessions that live in Redis, served by any number of daemons.

Redis is the only copy: this daemon keeps no session of its own, so there
is nothing to refresh, nothing to reload and nothing to retry. Each
operation of the core (``session.ops``) is first checked with its own
``check`` (the rules that need no session state, exactly as the core
orders them), then run as one script inside Redis on the session's keys
(``repl_daemon.backends.redis.store``), and its answer is what Redis answered.

A wait on several sessions acknowledges them after checking every ack
first, each session's ack being its own atomic step (a cluster keeps
sessions on different shards, so no step spans two of them): only a store
failure between two acks can leave some done, and an ack repeated later
does no harm.

Waits stay free of polling: a daemon subscribes to the wake channel of each
session it has waiters on (``watch``), and the script that records a
firing publishes on it, with the firing itself. This daemon's own changes
wake its waiters at once (their wakes from Redis are skipped by origin);
another daemon's arrive as messages. Either way the waiters are handed the
new firing, and one that looked last just before it is answered from it
with no read (``repl_daemon.engine.wait``); such a look's evaluation is
counted with this daemon's next read of the session, or when its
subscription ends (``looked``). A broken subscription is repaired by
``Wakes``, and once it is back every waiter reads again: a lost wake never
leaves a waiter asleep.

Scoped tokens (rules K1-K5) live in Redis too, so every daemon of the store
knows them. A daemon keeps the ones it has seen; a token it has not seen
yet (made on another daemon a moment ago) is looked up once. A revocation
publishes on the tokens' channel, and every daemon ends the token's
connections at once; after a broken link the daemon reads the tokens again
and ends those that went meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import anyio
from msgspec.structs import replace

from repl_daemon.backends.redis.claims import GroupCalls, Stepped
from repl_daemon.backends.redis.keys import AUTH, is_partition, partition_of
from repl_daemon.backends.redis.pipeline import let_go
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.backends.redis.timers import SharedTimers
from repl_daemon.backends.redis.wakes import Wakes, heard
from repl_daemon.engine.clock import REAL, Clock
from repl_daemon.engine.committer import Listener, Totals, made_up_id
from repl_daemon.engine.outcome import Outcome, Settled
from session.errors import NoSuchSession, ReplError, StoreFailed, no_such_session
from session.firing import NO_TAGS, Firing
from session.groups import Taken
from session.names import check_cursor_name, check_session_id
from session.ops import (
    Ack,
    AckRead,
    AddTimer,
    CancelTimer,
    ClaimFiring,
    ClaimStep,
    ClaimTable,
    ConfigureGroup,
    CursorTable,
    Describe,
    ExpireGroups,
    FinishNext,
    FireTimers,
    GetWebhook,
    GroupProgress,
    GroupTable,
    Op,
    Poll,
    ReadAfter,
    ReadCursor,
    ReadRecent,
    ReadSeq,
    Record,
    Release,
    SetLimit,
    SetWebhook,
    TimerList,
    check_seq,
)
from session.ring import check_limit, only, since_of
from session.rules import DEFAULT_LIMIT, GROUPS_TIMER, HANDLERS, POLL_CURSOR
from session.schedule import Timer, timer_order
from session.scopes import TokenRecord, no_such_token
from session.session import Recorded, Summary, session_exists

log = logging.getLogger("repl.daemon")

R = TypeVar("R")
T = TypeVar("T")

#: how long before a group deadline the index failed to take is written again (doubling)
RETRY_INDEX = (0.1, 5.0)
A = TypeVar("A")
B = TypeVar("B")

#: the most looks a daemon answers from published firings at one session before it counts
#: them in Redis (it counts them sooner, with its next read there or when it unsubscribes)
MAX_OWED = 64


#: the steps of groups and claims (SPEC §16): each one script of ``group_scripts``
_GROUP_OPS = (
    ClaimFiring,
    ClaimStep,
    FinishNext,
    GroupProgress,
    ExpireGroups,
    ConfigureGroup,
    GroupTable,
    ClaimTable,
)


class SharedCommitter:
    """Every operation one script in Redis; wakes over sharded pub/sub."""

    def __init__(self, store: RedisStore, listener: Listener, *, clock: Clock = REAL) -> None:
        self.store = store
        self.listener = listener
        self.wakes = Wakes(store, self._woken, self._restored, self._quiet)
        self.shared_timers = SharedTimers(store, self.wakes, listener, clock=clock)
        self.shared_timers.expire_groups = self._expire_groups
        self.clock = clock
        #: the group scripts (SPEC §16)
        self.groups = GroupCalls(store)
        #: the sessions whose outbox of dead letters is being recorded now
        self._draining: set[str] = set()
        store.counts = listener.counts  # its round trips are this daemon's writes
        #: the scoped tokens this daemon has seen, by digest (a miss asks Redis)
        self._tokens: dict[str, TokenRecord] = {}
        #: digests heard revoked: a lookup's answer that crossed its revocation is dropped
        self._revoked: set[str] = set()
        #: each session's looks answered here from a published firing, not yet counted in
        #: Redis: they go with the next read of the session from here (or ``_quiet``)
        self._owed: dict[str, int] = {}
        self._tg: Any = None

    # -- life --------------------------------------------------------------

    async def load(self) -> int:
        """Connect (``StoreFailed`` when Redis does not answer); Redis holds the sessions."""
        await self.store.open()
        for record in await self.store.find_tokens():
            self._tokens[record.digest] = record
        return len(await self.store.ids())

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.wakes.run)
            tg.start_soon(self.shared_timers.run)
            tg.start_soon(self._watch_tokens)

    async def close(self) -> None:
        """Count the looks still owed, then disconnect: every change was made inside Redis
        by its operation."""
        owed, self._owed = self._owed, {}
        counted = []
        for session_id, count in owed.items():  # one pipeline for them all
            try:
                counted.append(self.store.looked(session_id, count))
            except StoreFailed as exc:  # not connected: uncounted
                log.debug("the looks at %r go uncounted: %s", session_id, exc)
        for future in counted:
            try:
                await future
            except ReplError as exc:
                log.debug("looks went uncounted: %s", exc)
        await self.store.close()

    def _woken(self, session_id: str, payload: bytes) -> None:
        if session_id == AUTH:
            what, _, digest = payload.decode().partition(" ")
            if what == "revoked":
                self._forget(digest)
            return
        if is_partition(session_id):  # a timer partition's earliest due time moved sooner
            self.shared_timers.heard(session_id, payload)
            return
        message = heard(payload)
        if message.origin == self.store.origin:
            return  # this daemon told its waiters already
        if message.what == "claimable":  # a release or an expiry elsewhere (SPEC §16)
            self.listener.claimable(session_id)
            return
        if message.what == "grouped":  # a done or a dead letter elsewhere (SPEC §18)
            self.listener.grouped(session_id)
            return
        if message.what == "stop":
            self._owed.pop(session_id, None)
            self.listener.stopped(session_id)
            return
        firing = message.firing
        if firing is not None and message.incarnation.encode() != self.store.heads.incarnation(
            session_id
        ):
            # of a session this daemon has not read, or of one stopped and started again
            # since (a message that waited behind a newer answer): the waiters read
            firing = None
        self.listener.changed(session_id, firing)

    def _quiet(self, session_id: str) -> None:
        """The session's subscription ended: count the looks owed there now."""
        owed = self._owed.pop(session_id, 0)
        if owed:
            future = self.store.looked(session_id, owed)
            future.add_done_callback(_uncounted)

    def looked(self, session_id: str) -> None:
        owed = self._owed[session_id] = self._owed.get(session_id, 0) + 1
        if owed >= MAX_OWED:  # a wait that stays blocked on a busy session: count them now
            self._quiet(session_id)

    async def _summary(self, session_id: str) -> Summary:
        return self._with_owed(await self.store.summary(session_id))

    def _with_owed(self, row: Summary) -> Summary:
        """A session's summary with the looks this daemon owes Redis counted in."""
        owed = self._owed.get(row.id)
        return replace(row, evaluations=row.evaluations + owed) if owed else row

    def _unless_refused(self, session_id: str, owed: int) -> Callable[[asyncio.Future[Any]], None]:
        def counted(future: asyncio.Future[Any]) -> None:
            if future.cancelled():
                return  # perhaps sent, perhaps not: uncounted rather than counted twice
            error = future.exception()
            if isinstance(error, ReplError) and not isinstance(
                error, StoreFailed | NoSuchSession
            ):  # a refusal: the script stopped before it counted
                self._owed[session_id] = self._owed.get(session_id, 0) + owed

        return counted

    def _restored(self) -> None:
        self.shared_timers.restored()
        self.listener.link(None)
        if self._tg is not None:  # a revocation may have gone unheard while the link was down
            self._tg.start_soon(self._reread_tokens)

    # -- scoped tokens ---------------------------------------------------------

    async def _watch_tokens(self) -> None:
        """Subscribe to the tokens' channel, then read them again (one may have gone since
        ``load``); a subscription that fails is tried again."""
        await self.wakes.ready.wait()
        delay = 0.05
        while True:
            try:
                await self.wakes.subscribe(AUTH)
                break
            except StoreFailed as exc:
                log.warning("%s; trying again", exc.message)
                await anyio.sleep(delay)
                delay = min(delay * 2, 2.0)
        await self._reread_tokens()

    async def _reread_tokens(self) -> None:
        try:
            records = await self.store.find_tokens()
        except StoreFailed as exc:  # the link is down again: its repair reads them once more
            log.warning("cannot read the tokens again: %s", exc.message)
            return
        there = {record.digest for record in records}
        for digest in [d for d in self._tokens if d not in there]:
            self._forget(digest)
        for record in records:
            if record.digest not in self._revoked:
                self._tokens[record.digest] = record

    def _forget(self, digest: str) -> None:
        self._revoked.add(digest)
        if self._tokens.pop(digest, None) is not None:
            self.listener.revoked(digest)

    def find_token(self, digest: str) -> Outcome[TokenRecord | None]:
        record = self._tokens.get(digest)
        if record is not None or digest in self._revoked:
            return Outcome.now(record)

        def found(records: list[TokenRecord]) -> TokenRecord | None:
            if not records or digest in self._revoked:
                return None
            self._tokens[digest] = records[0]
            return records[0]

        return Outcome.pending(lambda: self.store.find_tokens(digest)).then(found)

    def tokens(self) -> Outcome[list[TokenRecord]]:
        listed = Outcome.pending(self.store.find_tokens)
        return listed.then(lambda records: sorted(records, key=lambda r: r.name))

    def add_token(self, record: TokenRecord) -> Outcome[None]:
        def added(_: None) -> None:
            self._tokens[record.digest] = record

        return Outcome.pending(lambda: self.store.add_token(record)).then(added)

    def revoke_token(self, name: str) -> Outcome[TokenRecord]:
        def revoked(record: TokenRecord | None) -> TokenRecord:
            if record is None:  # its name was there without its record: gone all the same
                raise no_such_token(name)
            self._forget(record.digest)  # here at once; the others hear it on the channel
            return record

        return Outcome.pending(lambda: self.store.revoke_token(name)).then(revoked)

    # -- the Committer interface -------------------------------------------

    def execute(self, session_id: str, op: Op[R]) -> Outcome[R]:
        check_session_id(session_id)
        op.check()
        if isinstance(op, _GROUP_OPS):
            return cast("Outcome[R]", Outcome.pending(lambda: self._group(session_id, op)))
        timers = self.shared_timers
        match op:  # a timer's change is two steps: the session's, and the index's
            case AddTimer():
                timer = op.timer
                return cast("Outcome[R]", Outcome.later(lambda: timers.schedule(timer)))
            case CancelTimer():
                timer_id = op.timer
                cancel = Outcome.later(lambda: timers.cancel(session_id, timer_id))
                return cast("Outcome[R]", cancel)
        if isinstance(op, Describe):  # not the store's alone: with the looks owed here
            return cast("Outcome[R]", Outcome.later(lambda: self._summary(session_id)))
        return Outcome.pending(lambda: self._call(session_id, op))

    # -- groups and claims (SPEC §16) ----------------------------------------------

    def _group(self, session_id: str, op: Op[Any]) -> asyncio.Future[Any]:
        """One group script; a step's after-effects (``_after_step``) once it is answered.

        A step that will make a lease or a delay first lowers the timer index's entry
        for the session's groups to when it ends, in the same pipeline, so the index is
        never later than the truth (as a timer's schedule does): the expiry comes
        however the daemon that took the lease fares."""
        calls = self.groups
        match op:
            case ClaimFiring():
                self._index_soon(session_id, op.now_ms + op.lease_ms)
                return self._stepped(session_id, calls.claim(session_id, op))
            case FinishNext():
                self._index_soon(session_id, op.now_ms + op.lease_ms)
                return self._stepped(session_id, calls.done_next(session_id, op))
            case ClaimStep():
                due = op.due()  # a release with a delay makes one
                if due is not None:
                    self._index_soon(session_id, due)
                return self._stepped(session_id, calls.step(session_id, op))
            case ExpireGroups():
                return self._stepped(session_id, calls.expire(session_id, op.now_ms))
            case ConfigureGroup():
                return calls.configure(session_id, op)
            case GroupTable():
                return calls.table(session_id, op.now_ms)
            case ClaimTable():
                return calls.leases(session_id, op.group)
            case GroupProgress():
                return calls.progress(session_id, op)
            case _:  # pragma: no cover
                raise AssertionError(f"no group script for {op!r}")

    def _index_soon(self, session_id: str, due_ms: int) -> None:
        entry = (session_id, GROUPS_TIMER, due_ms)
        indexed = self.store.index(partition_of(session_id), lower=[entry])

        def done(future: asyncio.Future[int | None]) -> None:
            if future.cancelled() or future.exception() is None:
                return
            # the index's node failed (a cluster's failover): the lease must still come
            # due, so the entry is written again until it is (a retry, not a poll)
            log.warning("a group deadline was not indexed: %s", future.exception())
            if self._tg is not None:
                self._tg.start_soon(self._index_again, session_id, due_ms)

        indexed.add_done_callback(done)

    async def _index_again(self, session_id: str, due_ms: int) -> None:
        entry = (session_id, GROUPS_TIMER, due_ms)
        pause = RETRY_INDEX[0]
        while True:
            await anyio.sleep(pause)
            try:
                await self.store.index(partition_of(session_id), lower=[entry])
            except StoreFailed:
                pause = min(pause * 2, RETRY_INDEX[1])
                continue
            log.info("the group deadline of %r is indexed again", session_id)
            return

    def _stepped(
        self, session_id: str, step: asyncio.Future[tuple[T, Stepped]]
    ) -> asyncio.Future[T]:
        answered: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def done(future: asyncio.Future[tuple[T, Stepped]]) -> None:
            if future.cancelled():
                answered.cancel()
                return
            error = future.exception()
            if error is not None:
                if not answered.cancelled():
                    answered.set_exception(error)
                return
            value, stepped = future.result()
            self._after_step(session_id, stepped)
            if not answered.cancelled():
                answered.set_result(value)
            elif isinstance(value, Taken):  # its claimer went away before the script answered
                self._give_back(session_id, value)

        step.add_done_callback(done)
        return answered

    def _give_back(self, session_id: str, taken: Taken) -> None:
        """A claim whose claimer went away while its script ran took nothing: release."""
        release = Release(taken.claim.token, self.clock.now_ms())
        try:
            given = self.groups.step(session_id, release)
        except ReplError as exc:  # not connected: its lease runs out
            log.info("a claim whose client went away was not given back: %s", exc.message)
            return

        def released(future: asyncio.Future[tuple[int | bool, Stepped]]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:  # it ran out meanwhile, or the session is gone
                log.info("a claim whose client went away was not given back: %s", error)
                return
            self._after_step(session_id, future.result()[1])

        given.add_done_callback(released)

    def _after_step(self, session_id: str, stepped: Stepped) -> None:
        """Record the dead letters the step left, and tell this daemon's claimers when a
        firing is claimable again, and its joins that a group moved (the other daemons
        hear both on the session's channel)."""
        if stepped.outbox and self._tg is not None:
            self._tg.start_soon(self._drain, session_id)
        if stepped.freed:
            self.listener.claimable(session_id)
        self.listener.grouped(session_id)

    async def _expire_groups(self, session_id: str, now_ms: int) -> int | None:
        """The timer index's entry for the session's groups came due: expire what ran out
        (``EXPIRE_GROUPS``); the next deadline (None: none)."""
        _, stepped = await self.groups.expire(session_id, now_ms)
        self._after_step(session_id, stepped)
        return stepped.deadline

    async def _drain(self, session_id: str) -> None:
        """Record each dead letter of the session's outbox in its dead-letter session
        (started when there is none), with a key that makes a second record of it
        nothing, then take it off the outbox: at least once there, never twice."""
        if session_id in self._draining:
            return
        self._draining.add(session_id)
        try:
            while letters := await self.groups.outbox(session_id):
                ts = self.clock.utc_now()
                for item in letters:
                    letter = item.letter
                    await self.store.start(letter.session, DEFAULT_LIMIT)
                    recorded = await self.store.record(
                        letter.session,
                        letter.handler,
                        letter.text,
                        ts,
                        handled=letter.handled,
                        key=item.key,
                        tags=letter.tags,
                        by=letter.by,
                    )
                    if not recorded.duplicate:
                        self.listener.changed(letter.session)
                    await self.groups.outbox_done(session_id, item.raw)
        except ReplError as exc:  # left in the outbox: the session's next step records it
            log.warning("dead letters of %r wait in its outbox: %s", session_id, exc.message)
        except Exception:  # a bug must not take the daemon down: they wait there too
            log.exception("dead letters of %r wait in its outbox", session_id)
        finally:
            self._draining.discard(session_id)

    def _call(self, session_id: str, op: Op[R]) -> asyncio.Future[R]:
        store = self.store
        future: asyncio.Future[Any]
        owed = 0
        match op:
            case Record():
                future = self._record(session_id, op)
            case ReadAfter():
                owed = self._owed.pop(session_id, 0)
                future = store.read(
                    session_id, "after", op.after, op.max, match=op.match, owed=owed
                )
            case ReadRecent():
                owed = self._owed.pop(session_id, 0)
                if op.since is None:  # the newest N: the script reads after the head less N
                    assert op.last is not None  # a recent read names last, since or both
                    bound = op.last if op.max is None else min(op.last, op.max)
                    future = store.read(
                        session_id, "last", op.last, bound, match=op.match, owed=owed
                    )
                else:  # the whole ring in one script, kept as the core keeps it
                    whole = store.read(session_id, "after", 0, None, owed=owed)
                    future = _then(
                        whole, lambda got: since_of(got, op.since, op.last, op.max, op.match)
                    )
            case ReadSeq():
                owed = self._owed.pop(session_id, 0)
                read = store.read(session_id, "seq", op.seq, 1, owed=owed)
                future = _then(read, lambda got: only(got, op.seq))
            case ReadCursor():
                owed = self._owed.pop(session_id, 0)
                future = store.read(
                    session_id,
                    "cursor",
                    op.cursor,
                    op.max,
                    touch=op.touch,
                    match=op.match,
                    owed=owed,
                )
            case AckRead():
                owed = self._owed.pop(session_id, 0)
                future = store.read(
                    session_id, "cursor", op.cursor, op.max, match=op.match, ack=op.seq, owed=owed
                )
            case Ack():
                future = store.ack(session_id, op.cursor, op.seq)
            case Poll():
                future = store.read(session_id, "poll", POLL_CURSOR, op.max, touch=True)
            case SetLimit():
                future = store.set_limit(session_id, op.limit)
            case CursorTable():
                future = store.cursor_table(session_id)
            case TimerList():
                future = store.timer_list(session_id)
            case SetWebhook():
                future = store.set_webhook(session_id, op.webhook)
            case GetWebhook():
                future = store.webhook(session_id)
            case FireTimers():
                future = store.fire_timers(session_id, op.timers, op.now_ms, op.ts)
            case _:  # pragma: no cover
                raise AssertionError(f"no script for {op!r}")
        if owed:  # the looks it counts are owed again if Redis refused it before counting
            future.add_done_callback(self._unless_refused(session_id, owed))
        return cast("asyncio.Future[R]", future)

    def _record(self, session_id: str, op: Record) -> asyncio.Future[Recorded]:
        """Record a firing; the listener hears of it (with the firing, when the ring keeps
        it, as a read would give it) before whoever awaits the answer."""
        handled = op.handler in HANDLERS if op.handled is None else op.handled
        by = op.by
        future = self.store.record(
            session_id,
            op.handler,
            op.text,
            op.ts,
            handled=handled,
            key=op.key,
            tags=op.tags,
            by=by,
        )

        def recorded(future: asyncio.Future[Recorded]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            done = future.result()
            if done.duplicate:
                return
            firing = None
            if done.retained:  # as the ring holds it, as a read would give it
                text = op.text
                result, event = (text, None) if handled else (None, text)
                tags = op.tags or NO_TAGS
                firing = Firing(done.seq, op.handler, result, event, op.ts, tags, by)
            self.listener.changed(session_id, firing)

        future.add_done_callback(recorded)  # before the caller's: waiters first
        return future

    def ack_all(self, cursor: str, acks: list[tuple[str, int]]) -> Outcome[list[int]]:
        check_cursor_name(cursor)
        for session_id, _ in acks:
            check_session_id(session_id)

        if len(acks) == 1:  # the script checks the ack and makes it in one atomic step
            ((session_id, seq),) = acks
            check_seq(seq)
            return Outcome.pending(lambda: self.store.ack(session_id, cursor, seq)).then(_listed)

        async def ack() -> list[int]:
            for session_id, seq in acks:  # every ack checked, in order, before one is made
                check_seq(seq)
                await self.store.check_ack(session_id, seq)
            return [await self.store.ack(session_id, cursor, seq) for session_id, seq in acks]

        return Outcome.later(ack)

    def require(self, session_ids: list[str]) -> Outcome[None]:
        for session_id in session_ids:
            check_session_id(session_id)

        def make(session_id: str) -> Callable[[], asyncio.Future[bool]]:
            return lambda: self.store.exists(session_id)

        asked = [Outcome.pending(make(session_id)) for session_id in session_ids]

        def required(answers: list[Settled[bool]]) -> None:
            for session_id, (there, error) in zip(session_ids, answers, strict=True):
                if error is not None:
                    raise error
                if not there:
                    raise no_such_session(session_id)

        return Outcome.settle_all(asked).then(required)

    def start(
        self, session_id: str | None, limit: int, exist_ok: bool
    ) -> Outcome[tuple[str, bool]]:

        check_limit(limit)
        if session_id is not None:
            check_session_id(session_id)

        async def start() -> tuple[str, bool]:
            if session_id is None:  # made up: another one if it is taken (1 in 4 billion)
                while True:
                    chosen = made_up_id(())
                    if await self.store.start(chosen, limit):
                        return chosen, True
            if await self.store.start(session_id, limit):
                return session_id, True
            if not exist_ok:
                raise session_exists(session_id)
            return session_id, False

        return Outcome.later(start)

    def stop(self, session_id: str) -> Outcome[None]:
        check_session_id(session_id)

        async def stop() -> None:
            cancelled = await self.store.stop(session_id)
            self._owed.pop(session_id, None)  # a new session of this id starts at 0
            self.listener.stopped(session_id)
            await self.shared_timers.stopped(session_id, cancelled)

        return Outcome.later(stop)

    def summaries(self, session_id: str | None) -> Outcome[list[Summary]]:
        if session_id is not None:
            check_session_id(session_id)
        return Outcome.later(lambda: self._summaries(session_id))

    async def _summaries(self, session_id: str | None) -> list[Summary]:
        ids = [session_id] if session_id is not None else await self.store.ids()
        asked = [self.store.summary(one) for one in ids]  # one pipeline for them all
        rows = []
        with let_go(asked):  # after a failure: the rest are not wanted
            for future in asked:
                try:
                    rows.append(self._with_owed(await future))
                except NoSuchSession:
                    if session_id is not None:
                        raise
                    # stopped between the scan and its look: not there, so not listed
        return rows

    def timers(self, session_id: str | None) -> Outcome[list[Timer]]:
        if session_id is not None:
            check_session_id(session_id)

        async def listed() -> list[Timer]:
            ids = [session_id] if session_id is not None else await self.store.ids()
            asked = [self.store.timer_list(one) for one in ids]  # one pipeline for them all
            timers: list[Timer] = []
            with let_go(asked):  # after a failure: the rest are not wanted
                for future in asked:
                    try:
                        timers += await future
                    except NoSuchSession:
                        if session_id is not None:
                            raise
            timers.sort(key=timer_order)
            return timers

        return Outcome.later(listed)

    def totals(self) -> Outcome[Totals]:
        async def totals() -> Totals:
            return Totals.of(await self._summaries(None))

        return Outcome.later(totals)

    def watch(self, session_id: str) -> Outcome[None]:
        if self.wakes.holds(session_id):  # a waiter here, or one that just left: no round trip
            return Outcome.now(None)
        return Outcome.later(lambda: self.wakes.subscribe(session_id))

    def unwatch(self, session_id: str) -> None:
        self.wakes.unsubscribe(session_id)

    async def health(self) -> str | None:
        """A round trip to Redis (one EXISTS on the pipeline): what failed, or None."""
        try:
            await self.store.exists("~health")
        except StoreFailed as exc:
            return exc.message
        return None

    def vanished(self, session_id: str) -> ReplError:
        return NoSuchSession(
            f"session {session_id!r} is gone: stopped on another daemon, or lost by Redis"
        )


def _listed(moved: int) -> list[int]:
    return [moved]


def _uncounted(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.debug("looks went uncounted: %s", future.exception())


def _then(future: asyncio.Future[A], step: Callable[[A], B]) -> asyncio.Future[B]:
    """A future of ``step`` of ``future``'s answer (its error, or its cancel, as it is)."""
    mapped: asyncio.Future[B] = future.get_loop().create_future()

    def done(answered: asyncio.Future[A]) -> None:
        if answered.cancelled():
            mapped.cancel()
            return
        error = answered.exception()  # taken even when nobody wants it any more
        if mapped.done():
            return
        if error is not None:
            mapped.set_exception(error)
            return
        mapped.set_result(step(answered.result()))

    def given_up(mapped: asyncio.Future[B]) -> None:
        if mapped.cancelled():  # nobody wants the answer: a call not sent yet is not sent
            future.cancel()

    future.add_done_callback(done)
    mapped.add_done_callback(given_up)
    return mapped
