"""The local committer: this daemon's memory is the truth, made durable by group commit.

The order of a change:

1. the core applies the operation in memory at once (so seqs are assigned
   in order);
2. the session is noted for the next commit, and the answer waits for the
   *pending* commit (``Outcome.after``);
3. the committer takes every noted session's ``Delta``, writes one batch
   (group commit) and, once it is durable, raises each session's
   ``visible`` seq, tells the listener, and resolves the commit, which
   answers every caller of that batch.

Readers only ever see firings up to ``visible``, so nobody reads a firing
that a crash could still take back. When a write fails, every change that
was not yet durable is rolled back by reloading the touched sessions from
the store, and their callers get ``store_failed``. A batch is one atomic
write, so an operation on several sessions (``ack_all``) is durable as a
whole or not at all.

With a store that keeps nothing (``--memory``) there is no commit: every
answer is given at once and every firing is visible when it is recorded.

Timers (rules T1-T6) are the sessions' own; one ``Schedule`` indexes the due
times of all of them (and each session's groups' next lease deadline or delay end,
SPEC §16, under ``GROUPS_TIMER``: its expiry is fired as a timer is), and one
task sleeps until the earliest (or until a sooner one is scheduled), so pending
timers cost nothing while none is due. Firing is an operation like any
other (``FireTimers``): the firing and its timer's move or deletion go to
the store in one batch, so after a crash either both happened or neither
did, and a timer that came due while the daemon was down fires on its first
turn after ``load``.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import anyio
import anyio.lowlevel

from repl_daemon.backends.local.store import Store
from repl_daemon.engine.clock import REAL, Clock
from repl_daemon.engine.committer import Listener, Totals, made_up_id
from repl_daemon.engine.outcome import Outcome, Ticket
from session.delta import Delta
from session.errors import (
    ReplError,
    SessionStopped,
    StoreFailed,
    TooMany,
)
from session.groups import DeadLetter
from session.names import check_session_id
from session.ops import GROUP_STEPS, ExpireGroups, FireTimers, Op, ReadAfter, ReadCursor, ack_all
from session.rules import DEFAULT_LIMIT, GROUPS_TIMER
from session.schedule import Schedule, Timer, timer_order
from session.scopes import MAX_TOKENS, TokenRecord, no_such_token, token_exists, too_many_tokens
from session.session import Session, Snapshot, Summary, no_session, session_exists

log = logging.getLogger("repl.daemon")

R = TypeVar("R")
T = TypeVar("T")

#: how long the timer task waits before it fires again after a failed commit (doubling)
FIRE_RETRY = (0.1, 5.0)
#: how many due timers the timer task fires before it lets the connections run
FIRE_SLICE = 512
#: how many rings' images a clean stop builds and writes in one transaction
IMAGES_AT_ONCE = 1024
#: the looks that change nothing but the session's count of evaluations (a cursor's,
#: without ``touch``): while waiters are told of a change, the same look is made once
SHARED_LOOKS = (ReadCursor, ReadAfter)


def _shared(op: object) -> bool:
    """Whether ``op`` is a look another waiter's may share: one of ``SHARED_LOOKS``, that
    matches every firing (a ``Match`` is no key), and touches no cursor."""
    if not isinstance(op, SHARED_LOOKS) or op.match is not None:
        return False
    return not isinstance(op, ReadCursor) or not op.touch


class _Looks:
    """While the waiters of a change are told (``on``): the last look made, and its answer."""

    __slots__ = ("key", "on", "outcome")

    def __init__(self) -> None:
        self.on = False
        self.key: tuple[Any, ...] | None = None
        self.outcome: Outcome[Any] | None = None


class Hosted:
    """A session as this daemon hosts it: the core, and how much of it readers may see."""

    __slots__ = ("announced", "session", "visible")

    def __init__(self, session: Session) -> None:
        self.session = session
        # the newest seq that readers may see: durable, or everything in memory
        self.visible = session.head
        # the newest seq the listener was told of (waiters wake only for new firings)
        self.announced = session.head

    def cap(self) -> int | None:
        """``visible`` as the core's read operations take it: None when it is the head."""
        return None if self.visible == self.session.head else self.visible


class LocalCommitter:
    """Hosts every session in memory over a store of this daemon's own."""

    def __init__(
        self,
        store: Store,
        listener: Listener,
        *,
        max_sessions: int = 10_000,
        clock: Clock = REAL,
    ) -> None:
        self.store = store
        self.listener = listener
        #: what the timer task sleeps by and fires at
        self.clock = clock
        self.max_sessions = max_sessions
        self.sessions: dict[str, Hosted] = {}
        self.retired_evaluations = 0
        self._durable = store.durable
        self._dirty: dict[str, Hosted] = {}
        self._gone: set[str] = set()
        self._pending = Ticket()
        self._wake = anyio.Event()
        self._commit_lock = anyio.Lock()
        self.schedule = Schedule(self._pending_timer)
        self._compact_at = 1024
        # what the timer task sleeps until (ms; None: no timer), and what wakes it sooner
        self._sleeping_until: int | None = None
        self._timer_wake = anyio.Event()
        #: how often the timer task woke (a test sees it stand still while none is due)
        self.timer_turns = 0
        #: why the last commit failed, until one succeeds (``/healthz``)
        self.failing: str | None = None
        #: the scoped tokens by name, and the usable ones (written to the store) by digest
        self._tokens: dict[str, TokenRecord] = {}
        self._by_digest: dict[str, TokenRecord] = {}
        #: while the listener is told of a change: the last look made, to share (``_look``)
        self._looks = _Looks()

    # -- life --------------------------------------------------------------

    async def load(self) -> int:
        # Every object the load makes lives as long as its session, so the cyclic
        # collector's passes over them as they pile up find nothing: it waits until they
        # are all in (a load of 10,000 full rings in the daemon, 0.63 s against 0.71).
        collecting = gc.isenabled()
        gc.disable()
        try:
            for snapshot in self.store.load():
                self._host(Session.restore(snapshot))
        finally:
            if collecting:
                gc.enable()
        for record in self.store.load_tokens():
            self._tokens[record.name] = self._by_digest[record.digest] = record
        return len(self.sessions)

    async def run(self) -> None:
        """The single writer, and the timer task, as long as the daemon runs."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._fire_due)
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                await self.commit_now()

    async def _fire_due(self) -> None:
        """Sleep until the earliest timer is due, fire what is due, and again: no polling."""
        retry = FIRE_RETRY[0]
        while True:
            self.timer_turns += 1
            due = self._sleeping_until = self.schedule.next_due()
            self._timer_wake = anyio.Event()
            now = self.clock.now_ms()
            if due is None or due > now:
                await self.clock.sleep_until(due, self._timer_wake)
                continue
            if await self.fire(now):
                retry = FIRE_RETRY[0]
            else:  # the store failed: the timers were rolled back, still due; not at once
                await anyio.sleep(retry)
                retry = min(retry * 2, FIRE_RETRY[1])

    async def fire(self, now: int) -> bool:
        """Fire every timer due at ``now``, one batch; False when the store failed it."""
        ts = self.clock.utc_now()
        fired = since = 0
        failed = False
        outcomes: list[Outcome[None]] = []
        for session_id, timer_ids in self.schedule.take_due(now).items():
            hosted = self.sessions.get(session_id)
            if hosted is None:  # stopped while this loop let others run
                continue
            if GROUPS_TIMER in timer_ids:
                timer_ids.remove(GROUPS_TIMER)
                try:
                    expired = self.execute(session_id, ExpireGroups(now))
                    outcomes.append(expired.then(lambda _: None))
                except StoreFailed:  # its ring could not be brought in: expired later
                    hosted.session.groups.moved = True
                    self._index(hosted.session)
                    failed = True
                if not timer_ids:
                    continue
            try:
                outcome = self.execute(session_id, FireTimers(timer_ids, now, ts))
            except StoreFailed:  # its ring could not be brought in: still due, fired later
                for timer_id in timer_ids:
                    timer = hosted.session.timers.get(timer_id)
                    if timer is not None:
                        self.schedule.add(timer)
                failed = True
                continue
            fired += sum(f.seq is not None for f in outcome.value)
            outcomes.append(outcome.then(lambda _: None))
            since += len(timer_ids)
            if since >= FIRE_SLICE:  # a burst of due timers must not stall the connections
                since = 0
                await anyio.lowlevel.checkpoint()
        try:
            for written in outcomes:
                await written.result()
        except StoreFailed:
            return False
        self.listener.fired(fired)
        return not failed

    def _pending_timer(self, session_id: str, timer_id: str, due_ms: int) -> bool:
        hosted = self.sessions.get(session_id)
        if hosted is None:
            return False
        if timer_id == GROUPS_TIMER:
            return hosted.session.groups.deadline() == due_ms
        timer = hosted.session.timers.get(timer_id)
        return timer is not None and timer.due_ms == due_ms

    def _index(self, session: Session) -> None:
        """Index the timers ``session`` added or moved, and its groups' next deadline when
        it may have moved; wake the timer task for a sooner one."""
        groups = session.groups
        if groups.moved:
            groups.moved = False
            deadline = groups.deadline()
            if deadline is not None:
                self.schedule.add_at(deadline, session.id, GROUPS_TIMER)
                self._sooner(deadline)
        moved = session.take_moved_timers()
        if not moved:
            return
        schedule = self.schedule
        for timer in moved:
            schedule.add(timer)
        self._sooner(min(timer.due_ms for timer in moved))
        if len(schedule) > self._compact_at:  # cancelled and stopped timers left entries behind
            schedule.rebuild(self.all_timers(), self._group_deadlines())
            self._compact_at = 2 * len(schedule) + 1024

    def _sooner(self, due_ms: int) -> None:
        if self._sleeping_until is None or due_ms < self._sleeping_until:
            self._timer_wake.set()

    def _group_deadlines(self) -> list[tuple[int, str, str]]:
        return [
            (deadline, session_id, GROUPS_TIMER)
            for session_id, hosted in self.sessions.items()
            if (deadline := hosted.session.groups.deadline()) is not None
        ]

    def all_timers(self) -> list[Timer]:
        """Every pending timer of every session, soonest first."""
        timers = [t for h in self.sessions.values() for t in h.session.timers.values()]
        timers.sort(key=timer_order)
        return timers

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.commit_now()
            if self._durable and self.failing is None:
                await self._keep_images()

    async def _keep_images(self) -> None:
        """A clean stop's last write: every ring that is as durable as it is in memory, as
        it keeps itself (``Ring.image``), so that the next start reads each in one piece.
        ``IMAGES_AT_ONCE`` rings a transaction: the images are built a chunk at a time."""
        # a folded ring was never brought in: the image it came from is still right
        hosted = [
            (sid, h.session)
            for sid, h in self.sessions.items()
            if not h.session.dirty and h.visible == h.session.head and not h.session.ring.is_folded
        ]
        kept = 0
        began = time.perf_counter()
        for start in range(0, len(hosted), IMAGES_AT_ONCE):
            chunk = [(sid, s.ring.image()) for sid, s in hosted[start : start + IMAGES_AT_ONCE]]
            try:
                kept += await anyio.to_thread.run_sync(self.store.keep_images, chunk)
            except StoreFailed as exc:  # the log has it all: the next start reads that
                log.warning("the rings' images were not kept: %s", exc.message)
                return
        log.info(
            "kept the images of %d of %d ring(s) in %.2f s",
            kept,
            len(self.sessions),
            time.perf_counter() - began,
        )

    async def commit_now(self) -> None:
        # one commit at a time: the shutdown's final commit must not take a
        # batch while the committer's write is still on its way, or a failure
        # of that write would roll back beneath a batch built on top of it
        async with self._commit_lock:
            await self._commit_batch()

    async def _commit_batch(self) -> None:
        ticket, self._pending = self._pending, Ticket()
        batch, written = self._take_batch()
        if not batch:
            ticket.resolve()
            return
        counts = self.listener.counts
        began = time.perf_counter()
        try:
            await anyio.to_thread.run_sync(self.store.write, batch)
        except Exception as exc:
            counts.store_failures += 1
            failure = exc if isinstance(exc, StoreFailed) else StoreFailed(f"store failed: {exc}")
            log.error("write of %d session(s) failed: %s", len(batch), failure.message)
            self.failing = failure.message
            # the stopped sessions of the batch too: their stop did not happen
            self._roll_back({delta.id for delta in batch}, failure)
            ticket.resolve(failure)
            return
        counts.commits.observe(time.perf_counter() - began)
        self.failing = None
        for hosted, head in written:
            if hosted.visible < head and self.sessions.get(hosted.session.id) is hosted:
                hosted.visible = head
                self._announce(hosted)
        ticket.resolve()

    def _take_batch(self) -> tuple[list[Delta], list[tuple[Hosted, int]]]:
        batch = [Delta(session_id, gone=True) for session_id in self._gone]
        self._gone.clear()
        written: list[tuple[Hosted, int]] = []
        marked = list(self._dirty.items())
        self._dirty.clear()
        for session_id, hosted in marked:
            if not hosted.session.dirty or self.sessions.get(session_id) is not hosted:
                continue  # written already, or stopped (then it is in _gone)
            delta = hosted.session.take_delta()
            batch.append(delta)
            written.append((hosted, delta.head))
        return batch, written

    def _roll_back(self, touched: set[str], failure: StoreFailed) -> None:
        """Undo everything not durable: the failed batch and the changes made since."""
        touched.update(i for i, h in self._dirty.items() if h.session.dirty)
        touched.update(self._gone)
        self._gone.clear()
        pending, self._pending = self._pending, Ticket()
        pending.resolve(failure)
        try:
            snapshots = self.store.load_sessions(touched)  # one read for them all
        except Exception as exc:
            log.error("cannot reload %s after a failed write: %s", ", ".join(sorted(touched)), exc)
            for session_id in touched:
                hosted = self.sessions.get(session_id)
                if hosted is not None:
                    hosted.session.mark_reset()
                    self._dirty[session_id] = hosted
            return
        for session_id in touched:
            self._replace(session_id, snapshots[session_id])

    def _replace(self, session_id: str, snapshot: Snapshot | None) -> None:
        old = self.sessions.pop(session_id, None)
        if snapshot is None:
            if old is not None:
                self._retire(old)
            return
        hosted = self._host(Session.restore(snapshot))
        if old is not None:
            hosted.session.evaluations = old.session.evaluations
        self.listener.changed(session_id)  # what its waiters read may have gone back

    def _host(self, session: Session) -> Hosted:
        hosted = self.sessions[session.id] = Hosted(session)
        self._index(session)
        return hosted

    def _retire(self, hosted: Hosted) -> None:
        self.retired_evaluations += hosted.session.evaluations
        self.listener.stopped(hosted.session.id)

    def _announce(self, hosted: Hosted) -> None:
        if hosted.visible > hosted.announced:
            hosted.announced = hosted.visible
            # the waiters' looks share their reads for as long as they are told (a fan-out)
            looks = self._looks
            telling, looks.on = looks.on, True
            try:
                self.listener.changed(hosted.session.id)
            finally:
                looks.on = telling
                looks.key = looks.outcome = None

    def _changed(self, hosted: Hosted) -> Ticket | None:
        """Note a change to ``hosted``; the commit to wait for, None when nothing is durable.

        Called in the same step as the change (no await between), so the
        change cannot slip into a batch that was already taken.
        """
        if not self._durable:  # nothing to write: it is visible as it is
            hosted.visible = hosted.session.head
            self._announce(hosted)
            return None
        self._dirty[hosted.session.id] = hosted
        self._wake.set()
        return self._pending

    def _get(self, session_id: str) -> Hosted:
        hosted = self.sessions.get(session_id)
        if hosted is None:
            raise no_session(session_id)
        return hosted

    # -- operations -----------------------------------------------------------

    def execute(self, session_id: str, op: Op[R]) -> Outcome[R]:
        looks = self._looks
        if looks.on and _shared(op):
            return self._look(looks, session_id, op)
        return self._execute(session_id, op)

    def _look(self, looks: _Looks, session_id: str, op: Op[R]) -> Outcome[R]:
        """A waiter's look while the waiters of a change are told: the answer of the look
        just made, when it was the same look at the same session, unchanged since;
        counted all the same.

        A fan-out's waiters, at the same position, read one batch (its firings unpacked
        once), which the connections then encode once (``repl_daemon.server``), not one
        each. Only a look that changes nothing but the count is shared (``_shared``),
        keyed by the session's count of changes and what readers may see, so that
        nothing it could depend on has moved.
        """
        hosted = self.sessions.get(session_id)
        if hosted is None:
            return self._execute(session_id, op)
        session = hosted.session
        key = (session, session.changes, hosted.visible, op)
        if key == looks.key:
            session.evaluations += 1  # rule S17: each look is an evaluation
            return cast(Outcome[R], looks.outcome)
        outcome = self._execute(session_id, op)
        looks.key, looks.outcome = key, outcome
        return outcome

    def _execute(self, session_id: str, op: Op[R]) -> Outcome[R]:
        hosted = self.sessions.get(session_id)
        if hosted is None:  # the id, then the op's own values, as a shared store checks them
            check_session_id(session_id)
            op.check()
            raise no_session(session_id)
        session = hosted.session
        # a folded ring is brought in before the op, so that one that cannot be is the op's
        # store_failed, with nothing changed
        session.ring.unfold()
        before = session.changes
        groups = session.groups
        freed = groups.freed
        result = op.run(session, hosted.cap())
        if session.changes == before:
            return Outcome.now(result)
        self._index(session)
        if groups.outbox:  # in this same step, so in this same write
            self._post_dead_letters(groups.take_dead_letters())
        ticket = self._changed(hosted)
        if groups.freed != freed:  # a firing is claimable again: its claimers look
            self.listener.claimable(session_id)
        if isinstance(op, GROUP_STEPS):  # a group moved: its joins look (SPEC §18)
            self.listener.grouped(session_id)
        # a change that promises nothing (a read's touch) is written with the next batch
        return Outcome.after(ticket if op.durable else None, result)

    def _post_dead_letters(self, letters: list[DeadLetter]) -> None:
        """Record each dead letter in its dead-letter session, started (with the default
        limit, past ``max_sessions``: a group's last attempt is never dropped) when there
        is none."""
        ts = self.clock.utc_now()
        for letter in letters:
            hosted = self.sessions.get(letter.session)
            if hosted is None:
                hosted = self._host(Session(letter.session, DEFAULT_LIMIT))
                self._gone.discard(letter.session)
            session = hosted.session
            session.ring.unfold()
            session.record(
                letter.handler,
                letter.text,
                ts,
                handled=letter.handled,
                tags=letter.tags,
                by=letter.by,
            )
            self._index(session)
            self._changed(hosted)

    def ack_all(self, cursor: str, acks: list[tuple[str, int]]) -> Outcome[list[int]]:
        chosen = [(self._get(session_id), seq) for session_id, seq in acks]
        for hosted, _ in chosen:
            hosted.session.ring.unfold()
        seqs = ack_all([(h.session, seq, h.cap()) for h, seq in chosen], cursor)
        ticket = None
        for hosted, _ in chosen:
            ticket = self._changed(hosted)
        return Outcome.after(ticket, seqs)

    def require(self, session_ids: list[str]) -> Outcome[None]:
        for session_id in session_ids:
            self._get(session_id)
        return Outcome.now(None)

    def start(
        self, session_id: str | None, limit: int, exist_ok: bool
    ) -> Outcome[tuple[str, bool]]:
        if session_id is None:
            session_id = made_up_id(self.sessions)
        check_session_id(session_id)
        existing = self.sessions.get(session_id)
        if existing is not None:
            if not exist_ok:
                raise session_exists(session_id)
            # it may itself still be on its way to the disk
            return Outcome.after(self._pending_commit(), (session_id, False))
        if len(self.sessions) >= self.max_sessions:
            raise TooMany(f"the daemon hosts {self.max_sessions:,} sessions, its limit")
        hosted = self._host(Session(session_id, limit))
        self._gone.discard(session_id)  # its first delta is a reset: it replaces the old one
        return Outcome.after(self._changed(hosted), (session_id, True))

    def stop(self, session_id: str) -> Outcome[None]:
        hosted = self._get(session_id)
        del self.sessions[session_id]
        self._dirty.pop(session_id, None)
        if self._durable:
            self._gone.add(session_id)
        self._retire(hosted)
        return Outcome.after(self._pending_commit(), None)

    def _pending_commit(self) -> Ticket | None:
        if not self._durable:
            return None
        self._wake.set()
        return self._pending

    def summaries(self, session_id: str | None) -> Outcome[list[Summary]]:
        if session_id is not None:
            hosted = self._get(session_id)
            return Outcome.now([hosted.session.summary(hosted.visible)])
        rows = [h.session.summary(h.visible) for h in self.sessions.values()]
        rows.sort(key=lambda row: row.id)
        return Outcome.now(rows)

    def timers(self, session_id: str | None) -> Outcome[list[Timer]]:
        if session_id is not None:
            return Outcome.now(self._get(session_id).session.timer_list())
        return Outcome.now(self.all_timers())

    def totals(self) -> Outcome[Totals]:
        hosted = self.sessions.values()
        return Outcome.now(
            Totals(
                sessions=len(self.sessions),
                lost=sum(h.session.ring.dropped for h in hosted),
                evaluations=self.retired_evaluations + sum(h.session.evaluations for h in hosted),
            )
        )

    def watch(self, session_id: str) -> Outcome[None]:
        return _WATCHED  # every change here is seen here: nothing to subscribe to

    def unwatch(self, session_id: str) -> None:
        pass

    def looked(self, session_id: str) -> None:
        raise AssertionError("a local change hands no firing to answer from: its reads are here")

    async def health(self) -> str | None:
        return self.failing

    def vanished(self, session_id: str) -> ReplError:
        return SessionStopped(f"session {session_id!r} stopped")  # only a stop removes one

    # -- scoped tokens (rules K1-K5) -----------------------------------------------

    def find_token(self, digest: str) -> Outcome[TokenRecord | None]:
        return Outcome.now(self._by_digest.get(digest))

    def tokens(self) -> Outcome[list[TokenRecord]]:
        return Outcome.now([self._tokens[name] for name in sorted(self._tokens)])

    def add_token(self, record: TokenRecord) -> Outcome[None]:
        if record.name in self._tokens:
            raise token_exists(record.name)
        if len(self._tokens) >= MAX_TOKENS:
            raise too_many_tokens()
        self._tokens[record.name] = record  # the name is taken from now; usable once written

        async def add() -> None:
            try:
                await self._token_write(self.store.put_token, record)
            except BaseException:
                del self._tokens[record.name]
                raise
            self._by_digest[record.digest] = record

        return Outcome.later(add)

    def revoke_token(self, name: str) -> Outcome[TokenRecord]:
        record = self._tokens.get(name)
        if record is None or record.digest not in self._by_digest:
            raise no_such_token(name)

        async def revoke() -> TokenRecord:
            await self._token_write(self.store.drop_token, name)
            if self._tokens.get(name) is record:
                del self._tokens[name]
                del self._by_digest[record.digest]
                self.listener.revoked(record.digest)
            return record

        return Outcome.later(revoke)

    async def _token_write(self, change: Callable[[T], None], arg: T) -> None:
        """One change of the tokens, in the store's thread between two group commits."""
        if not self._durable:
            return
        async with self._commit_lock:
            try:
                await anyio.to_thread.run_sync(change, arg)
            except StoreFailed:
                raise
            except Exception as exc:
                raise StoreFailed(f"store failed: {exc}") from None


_WATCHED: Outcome[None] = Outcome.now(None)
