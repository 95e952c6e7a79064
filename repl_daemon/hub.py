"""The hub: every hosted session, the commit pipeline, and the waits.

The hub turns requests into calls on the ``session`` core and makes their
effects durable before anyone is told. The order of a change:

1. the core applies it in memory at once (so seqs are assigned in order);
2. the session is marked dirty and the caller awaits the *pending* commit;
3. the committer takes every dirty session, writes one batch (group commit)
   and, once it is durable, raises each session's ``visible`` seq and wakes
   its waiters; every caller of that batch is then answered.

Readers only ever see firings up to ``visible``, so nobody reads a firing
that a crash could still take back. When a write fails, every change that
was not yet durable is rolled back by reloading the touched sessions from
the store, and their callers get ``store_failed``.

A wait subscribes to its sessions before it reads, so a commit between the
read and the sleep still wakes it; a blocked wait does no work at all.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import anyio

from repl_daemon import protocol as p
from repl_daemon.store import SessionDelta, Store
from session.errors import (
    AckAfterHead,
    BadRequest,
    Internal,
    NoSuchSession,
    ReplError,
    SessionExists,
    SessionStopped,
    ShuttingDown,
    StoreFailed,
    TooMany,
)
from session.ring import DEFAULT_LIMIT
from session.session import Session, Snapshot, check_cursor_name, check_session_id

log = logging.getLogger("repl.daemon")


_second: list[tuple[int, str]] = [(-1, "")]


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds, e.g. ``2026-11-30T07:00:00.123Z``.

    Every send stamps one; formatting the date once a second keeps it cheap.
    """
    now = time.time()
    second = int(now)
    cached, prefix = _second[0]
    if cached != second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second[0] = (second, prefix)
    return f"{prefix}.{int((now - second) * 1000):03d}Z"


class Waiter:
    """One blocked wait; ``event`` is replaced before every read (subscribe first)."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()


class Hosted:
    """A session as the daemon hosts it: the core plus its durability and waiters."""

    __slots__ = (
        "dirty",
        "keys",
        "persisted",
        "registry",
        "reset",
        "session",
        "stopped",
        "visible",
        "waiters",
    )

    def __init__(self, session: Session, *, new: bool, registry: dict[str, Hosted]) -> None:
        self.session = session
        # the hub's sessions with changes not yet handed to the store
        self.registry = registry
        # the newest seq that readers may see: durable, or everything in memory
        self.visible = session.head
        # the head as last handed to the store
        self.persisted = session.head
        self.dirty = False
        self.reset = new
        self.keys: list[tuple[str, int]] = []
        self.stopped = False
        self.waiters: set[Waiter] = set()
        if new:
            self.mark()

    def mark(self) -> None:
        """Note a change for the next commit (the committer visits only marked sessions)."""
        self.dirty = True
        self.registry[self.session.id] = self

    def notify(self) -> None:
        for waiter in self.waiters:
            waiter.event.set()


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


class Hub:
    """Hosts sessions over a store; every op of the protocol but auth lives here."""

    def __init__(
        self,
        store: Store,
        *,
        settle: float = 0.1,
        max_sessions: int = 10_000,
    ) -> None:
        self.store = store
        self.settle = settle
        self.max_sessions = max_sessions
        self.sessions: dict[str, Hosted] = {}
        self.started = time.monotonic()
        self.connections = 0
        self.requests = 0
        self.waiting = 0
        self.firings = 0
        self.closing = False
        #: set once the daemon is closing and the last waiter has been answered
        self.no_waiters = anyio.Event()
        self._gone: dict[str, Hosted] = {}
        self._dirty: dict[str, Hosted] = {}
        self._pending = Ticket()
        self._wake = anyio.Event()
        self._commit_lock = anyio.Lock()
        self._durable = store.durable
        self._retired_evaluations = 0

    # -- life --------------------------------------------------------------

    def load(self) -> int:
        """Host every session the store holds; returns how many."""
        for snapshot in self.store.load():
            self._host(Session.restore(snapshot), new=False)
        return len(self.sessions)

    async def run_committer(self) -> None:
        """The single writer: one batch per turn, as long as the daemon runs."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self.commit_now()

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
        try:
            await anyio.to_thread.run_sync(self.store.write, batch)
        except Exception as exc:
            failure = exc if isinstance(exc, StoreFailed) else StoreFailed(f"store failed: {exc}")
            log.error("write of %d session(s) failed: %s", len(batch), failure.message)
            # the stopped sessions of the batch too: their stop did not happen
            self._roll_back({delta.id for delta in batch}, failure)
            ticket.resolve(failure)
            return
        for hosted in written:
            if hosted.visible < hosted.persisted and not hosted.stopped:
                hosted.visible = hosted.persisted
                hosted.notify()
        ticket.resolve()

    def _take_batch(self) -> tuple[list[SessionDelta], list[Hosted]]:
        batch: list[SessionDelta] = []
        written: list[Hosted] = []
        for session_id in self._gone:
            batch.append(SessionDelta(session_id, gone=True))
        self._gone.clear()
        # the dict itself stays: every Hosted holds it to mark itself
        marked = list(self._dirty.items())
        self._dirty.clear()
        for session_id, hosted in marked:
            if not hosted.dirty or self.sessions.get(session_id) is not hosted:
                continue  # written already, or stopped (then it is in _gone)
            batch.append(self._delta(hosted))
            written.append(hosted)
        return batch, written

    def _delta(self, hosted: Hosted) -> SessionDelta:
        session = hosted.session
        ring = session.ring
        if hosted.reset:
            snap = session.snapshot()
            firings, keys = snap.firings, snap.keys
        else:
            firings = ring.events_after(hosted.persisted).firings
            keys = hosted.keys
        delta = SessionDelta(
            session.id,
            reset=hosted.reset,
            limit=ring.limit,
            head=ring.head,
            uses=session.uses,
            retained=ring.retained,
            firings=firings,
            cursors=session.cursor_states(),
            keys=keys,
        )
        hosted.dirty = hosted.reset = False
        self._dirty.pop(session.id, None)
        hosted.keys = []
        hosted.persisted = ring.head
        return delta

    def _roll_back(self, touched: set[str], failure: StoreFailed) -> None:
        """Undo everything not durable: the failed batch and the changes made since."""
        touched.update(i for i, h in self._dirty.items() if h.dirty)
        touched.update(self._gone)
        self._gone.clear()
        pending, self._pending = self._pending, Ticket()
        pending.resolve(failure)
        for session_id in touched:
            try:
                snapshot = self.store.load_session(session_id)
            except Exception as exc:
                log.error("cannot reload %s after a failed write: %s", session_id, exc)
                hosted = self.sessions.get(session_id)
                if hosted is not None:
                    hosted.reset = True
                    hosted.mark()
                continue
            self._replace(session_id, snapshot)

    def _replace(self, session_id: str, snapshot: Snapshot | None) -> None:
        old = self.sessions.pop(session_id, None)
        if snapshot is None:
            if old is not None:
                self._retire(old)
            return
        hosted = self._host(Session.restore(snapshot), new=False)
        if old is not None:
            hosted.session.evaluations = old.session.evaluations
            hosted.waiters = old.waiters
            hosted.notify()

    def _host(self, session: Session, *, new: bool) -> Hosted:
        hosted = self.sessions[session.id] = Hosted(session, new=new, registry=self._dirty)
        return hosted

    def _retire(self, hosted: Hosted) -> None:
        hosted.stopped = True
        hosted.notify()
        self._retired_evaluations += hosted.session.evaluations

    def changed(self, hosted: Hosted | None = None) -> Ticket | None:
        """Note a change to ``hosted``; returns the commit to await, None when nothing is durable.

        Call it in the same step as the change (no await between), so the
        change cannot slip into a batch that was already taken.
        """
        if hosted is not None:
            hosted.mark()
            if not self._durable:
                hosted.visible = hosted.session.head
                hosted.notify()
        if not self._durable:
            return None
        self._wake.set()
        return self._pending

    async def _commit(self, hosted: Hosted | None = None) -> None:
        """Note a change and wait until it is durable."""
        ticket = self.changed(hosted)
        if ticket is not None:
            await ticket.wait()

    async def shutdown(self) -> None:
        """Wake every waiter with an error and write what is still dirty."""
        self._close_waits()
        with anyio.CancelScope(shield=True):
            await self.commit_now()

    def _close_waits(self) -> None:
        """From now on every wait answers ``shutting_down``; wake the blocked ones."""
        self.closing = True
        if not self.waiting:
            self.no_waiters.set()
        for hosted in self.sessions.values():
            hosted.notify()

    # -- lookups -----------------------------------------------------------

    def get(self, session_id: str) -> Hosted:
        hosted = self.sessions.get(session_id)
        if hosted is None:
            check_session_id(session_id)
            raise NoSuchSession(
                f"no session {session_id!r}: start it with `repl start {session_id}`"
            )
        return hosted

    def _visible(self, hosted: Hosted) -> int | None:
        return None if hosted.visible == hosted.session.head else hosted.visible

    # -- ops ---------------------------------------------------------------

    def ping(self, req: p.Ping) -> p.Pong:
        return p.Pong(id=req.id, version=p.VERSION, uptime_s=round(self.uptime(), 3))

    def uptime(self) -> float:
        return time.monotonic() - self.started

    async def start(self, req: p.Start) -> p.Started:
        session_id = self._fresh_id() if req.session is None else check_session_id(req.session)
        existing = self.sessions.get(session_id)
        if existing is not None:
            if not req.exist_ok:
                raise SessionExists(
                    f"session {session_id!r} exists: stop it first, or pass --exist-ok"
                )
            await self._commit()  # it may itself still be on its way to the disk
            return p.Started(id=req.id, session=session_id, created=False)
        if len(self.sessions) >= self.max_sessions:
            raise TooMany(f"the daemon hosts {self.max_sessions:,} sessions, its limit")
        limit = DEFAULT_LIMIT if req.buffer is None else req.buffer
        session = Session(session_id, limit)
        hosted = self._host(session, new=True)
        self._gone.pop(session_id, None)
        await self._commit(hosted)
        return p.Started(id=req.id, session=session_id, created=True)

    def _fresh_id(self) -> str:
        while True:
            session_id = "s-" + secrets.token_hex(4)
            if session_id not in self.sessions:
                return session_id

    async def stop(self, req: p.Stop) -> p.Done:
        hosted = self.get(req.session)
        del self.sessions[req.session]
        self._gone[req.session] = hosted
        self._retire(hosted)
        await self._commit()
        return p.Done(id=req.id)

    def list_sessions(self, req: p.Sessions) -> p.SessionList:
        rows = [
            p.SessionInfo(
                id=h.session.id,
                head=h.visible,
                retained=h.session.ring.retained,
                limit=h.session.ring.limit,
                cursors=len(h.session.cursor_table()),
                waiters=len(h.waiters),
            )
            for h in sorted(self.sessions.values(), key=lambda h: h.session.id)
        ]
        return p.SessionList(id=req.id, sessions=rows)

    def send(self, req: p.Send) -> tuple[Hosted, p.Sent]:
        """Record a firing in memory; answer it only once ``changed(hosted)``'s commit is done."""
        hosted = self.get(req.session)
        recorded = hosted.session.record(req.handler, req.text, utc_now(), req.key)
        if not recorded.duplicate:
            self.firings += 1
            if req.key is not None:
                hosted.keys.append((req.key, recorded.seq))
        return hosted, p.Sent(id=req.id, seq=recorded.seq, duplicate=recorded.duplicate)

    def read(self, req: p.Read) -> p.Firings:
        hosted = self.get(req.session)
        session = hosted.session
        visible = self._visible(hosted)
        if req.after is not None:
            if req.cursor is not None:
                raise BadRequest("give either cursor or after, not both")
            batch = session.read_after(req.after, req.max, visible)
        else:
            cursor = "read" if req.cursor is None else req.cursor
            batch = session.read(cursor, req.max, visible, touch=not req.peek)
            if not req.peek:
                hosted.mark()  # the cursor's last use; written with the next batch
        return p.Firings(id=req.id, next=batch.next, lost=batch.lost, firings=batch.firings)

    def ack(self, req: p.Ack) -> tuple[Hosted, p.Acked]:
        hosted = self.get(req.session)
        seq = hosted.session.ack(req.cursor, req.seq, self._visible(hosted))
        return hosted, p.Acked(id=req.id, cursor=req.cursor, seq=seq)

    def poll(self, req: p.Poll) -> tuple[Hosted, p.Firings]:
        hosted = self.get(req.session)
        batch = hosted.session.poll(req.max, self._visible(hosted))
        return hosted, p.Firings(id=req.id, next=batch.next, lost=batch.lost, firings=batch.firings)

    def cursors(self, req: p.Cursors) -> p.CursorList:
        hosted = self.get(req.session)
        return p.CursorList(id=req.id, cursors=hosted.session.cursor_table(hosted.visible))

    def buffer(self, req: p.Buffer) -> tuple[Hosted, p.Buffered]:
        hosted = self.get(req.session)
        trimmed = hosted.session.set_limit(req.limit)
        return hosted, p.Buffered(id=req.id, limit=req.limit, trimmed=trimmed)

    def stats(self, req: p.Stats) -> p.StatsReply:
        chosen = [self.get(req.session)] if req.session else list(self.sessions.values())
        rows = [
            p.SessionStats(
                id=h.session.id,
                head=h.visible,
                retained=h.session.ring.retained,
                limit=h.session.ring.limit,
                firings=h.session.head,
                lost=h.session.ring.dropped,
                evaluations=h.session.evaluations,
                waiters=len(h.waiters),
                cursors=len(h.session.cursor_table()),
            )
            for h in sorted(chosen, key=lambda h: h.session.id)
        ]
        daemon = p.DaemonStats(
            version=p.VERSION,
            uptime_s=round(self.uptime(), 3),
            store=self.store.name,
            sessions=len(self.sessions),
            firings=self.firings,
            lost=sum(h.session.ring.dropped for h in self.sessions.values()),
            evaluations=self._retired_evaluations
            + sum(h.session.evaluations for h in self.sessions.values()),
            waiters=self.waiting,
            connections=self.connections,
            requests=self.requests,
        )
        return p.StatsReply(id=req.id, daemon=daemon, sessions=rows)

    async def wait(self, req: p.Wait) -> p.Woken:
        """Block until a session has firings after the cursor (SPEC rules 8, 10, 11, 14)."""
        check_cursor_name(req.cursor)
        if not req.sessions:
            raise BadRequest("wait needs at least one session")
        ids = list(dict.fromkeys(req.sessions))
        chosen = await self._sessions_for_wait(ids, first=True)
        await self._ack_for_wait(req, ids)
        waiter = Waiter()
        self.waiting += 1
        try:
            # a wait without a timeout needs no cancel scope (it costs memory per waiter)
            deadline: AbstractContextManager[object] = (
                contextlib.nullcontext()
                if req.timeout_ms is None
                else anyio.move_on_after(req.timeout_ms / 1000)
            )
            with deadline:
                while True:
                    # subscribe before reading: a firing in between still sets this event
                    waiter.event = anyio.Event()
                    chosen = await self._sessions_for_wait(ids, first=False)
                    for hosted in chosen:
                        hosted.waiters.add(waiter)
                    batches = self._ready(chosen, req)
                    if batches:
                        return p.Woken(id=req.id, batches=batches)
                    await waiter.event.wait()
                    self._check_open(chosen)
                    if self.settle:
                        await anyio.sleep(self.settle)
            return p.Woken(id=req.id, batches=[], timed_out=True)
        finally:
            self.waiting -= 1
            for hosted in chosen:
                hosted.waiters.discard(waiter)
            for session_id in ids:
                current = self.sessions.get(session_id)
                if current is not None:
                    current.waiters.discard(waiter)
            if self.closing and not self.waiting:
                self.no_waiters.set()

    async def _sessions_for_wait(self, ids: list[str], *, first: bool) -> list[Hosted]:
        """The sessions a wait is on: unknown ones fail at first, and count as stopped later."""
        if first:
            return [self.get(session_id) for session_id in ids]
        chosen = []
        for session_id in ids:
            hosted = self.sessions.get(session_id)
            if hosted is None:
                raise SessionStopped(f"session {session_id!r} stopped")
            chosen.append(hosted)
        return chosen

    async def _ack_for_wait(self, req: p.Wait, ids: list[str]) -> None:
        """Acknowledge the previous batch (a follow loop's) before waiting; all or nothing."""
        acked = [(self.get(i), seq) for i in ids if (seq := req.ack.get(i)) is not None]
        for hosted, seq in acked:  # validate every ack before applying any
            head = hosted.visible
            if seq > head:
                raise AckAfterHead(f"cannot ack {seq}: head is {head}")
        for hosted, seq in acked:
            hosted.session.ack(req.cursor, seq, self._visible(hosted))
            hosted.mark()
        if acked:
            await self._commit()

    def _check_open(self, chosen: list[Hosted]) -> None:
        if self.closing:
            raise ShuttingDown("the daemon is shutting down: run the command again once it is back")
        for hosted in chosen:
            if hosted.stopped:
                raise SessionStopped(f"session {hosted.session.id!r} stopped")

    def _ready(self, chosen: list[Hosted], req: p.Wait) -> list[p.SessionBatch]:
        self._check_open(chosen)
        batches = []
        for hosted in chosen:
            session = hosted.session
            batch = session.read(req.cursor, req.max, self._visible(hosted), touch=False)
            if batch.firings or batch.lost:
                batches.append(p.SessionBatch(session.id, batch.next, batch.lost, batch.firings))
        return batches


def error_for(exc: BaseException) -> ReplError:
    if isinstance(exc, ReplError):
        return exc
    return Internal(f"internal error: {type(exc).__name__}: {exc}")
