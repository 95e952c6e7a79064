"""The shared committer: several daemons serve the same sessions through Redis.

With a shared store the stored session is the truth and this daemon's copy
is a cache, tagged with the stored version it came from. Every operation on
a session runs under that session's lock, as:

1. refresh: ask the store for the session's version; reload the copy when
   another daemon changed it (or it is not loaded yet);
2. run the operation on the copy with the ``session`` core, exactly as a
   single daemon does (so every rule is checked by the same code);
3. if it changed anything, write the copy's ``Delta`` with the version of
   step 1 as a condition (one atomic step in the store); if another daemon
   got there first, reload and run the operation again from step 1.

Operations that queue on one session while a batch of them is on its way
to Redis run as the next batch: one refresh, one commit. A lock exists only
while someone holds or waits for it, so naming ids costs nothing after.

Waits stay free of polling: every commit publishes the session's new head,
a listener thread hands those to this daemon's engine, and a waiter that
wakes refreshes before it reads. When the subscription breaks, the engine
is told (waiters are answered ``store_failed``: changes made meanwhile would
not wake them); once it is back, waiters read again.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import AsyncIterator
from typing import TypeVar, cast

import anyio

from repl_daemon.engine.committer import Listener, Totals
from repl_daemon.engine.local import exists, made_up_id, no_session
from repl_daemon.engine.outcome import Outcome
from repl_daemon.stores.redis import Conflict, RedisStore
from session.errors import NoSuchSession, StoreFailed, TooMany
from session.ops import Ack, Op
from session.session import Session, Summary, check_cursor_name, check_session_id

log = logging.getLogger("repl.daemon")

R = TypeVar("R")
MAX_RETRIES = 100


class _Queued:
    """An operation waiting for its session's next batch."""

    __slots__ = ("done", "error", "op", "result")

    def __init__(self, op: Op[object]) -> None:
        self.op = op
        self.done = False
        self.result: object = None
        self.error: Exception | None = None


class _Lock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = anyio.Lock()
        self.users = 0


class SharedCommitter:
    """Sessions kept in a store that other daemons write too."""

    def __init__(
        self, store: RedisStore, listener: Listener, *, max_sessions: int = 10_000
    ) -> None:
        self.store = store
        self.listener = listener
        self.max_sessions = max_sessions
        self.sessions: dict[str, Session] = {}
        self.versions: dict[str, int] = {}
        self.retired_evaluations = 0
        self._locks: dict[str, _Lock] = {}
        self._queues: dict[str, list[_Queued]] = {}

    # -- life --------------------------------------------------------------

    def load(self) -> int:
        """Nothing up front: a session is loaded on its first use."""
        return len(self.store.ids())

    async def run(self) -> None:
        """The listener thread hands other daemons' changes to this daemon's waiters."""

        def on_change(session_id: str, head: int | None) -> None:
            # most changes are to sessions this daemon does not serve: no need to wake the loop
            if session_id in self.sessions:
                anyio.from_thread.run_sync(self._changed_elsewhere, session_id, head)

        def on_link(up: bool) -> None:
            error = None if up else StoreFailed("lost the link to Redis: waits cannot wake")
            anyio.from_thread.run_sync(self.listener.link, error)

        await anyio.to_thread.run_sync(
            self.store.listen, on_change, on_link, abandon_on_cancel=True
        )

    async def close(self) -> None:
        """Nothing to write: every change was committed by its own operation."""

    def _changed_elsewhere(self, session_id: str, head: int | None) -> None:
        if head is None:
            self._forget(session_id)
        elif session_id in self.sessions:
            self.listener.changed(session_id)

    def _forget(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        self.versions.pop(session_id, None)
        if session is not None:
            self.retired_evaluations += session.evaluations
            self.listener.stopped(session_id)

    # -- one session at a time -------------------------------------------------

    @contextlib.asynccontextmanager
    async def _locked(self, session_id: str) -> AsyncIterator[None]:
        entry = self._locks.get(session_id)
        if entry is None:
            entry = self._locks[session_id] = _Lock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[session_id]

    async def _refresh(self, session_id: str) -> Session:
        """This daemon's copy of a session, reloaded if the stored one moved on."""
        version = await anyio.to_thread.run_sync(self.store.version, session_id)
        if version == 0:
            self._forget(session_id)
            raise no_session(session_id)
        session = self.sessions.get(session_id)
        if session is not None and self.versions.get(session_id) == version:
            return session
        loaded = await anyio.to_thread.run_sync(self.store.load_versioned, session_id)
        if loaded is None:
            return await self._refresh(session_id)
        snapshot, version = loaded
        fresh = Session.restore(snapshot)
        if session is not None:
            fresh.evaluations = session.evaluations
        self.sessions[session_id] = fresh
        self.versions[session_id] = version
        return fresh

    async def _op(self, session_id: str, op: Op[R]) -> R:
        """Run ``op`` on a fresh copy and write it under the stored version, in a batch."""
        queued = _Queued(op)
        queue = self._queues.setdefault(session_id, [])
        queue.append(queued)
        try:
            async with self._locked(session_id):
                if not queued.done:
                    await self._run_batch(session_id, self._queues.pop(session_id, []))
        finally:
            if not queued.done:  # cancelled before its batch ran: it must not run later
                waiting = self._queues.get(session_id)
                if waiting is not None and queued in waiting:
                    waiting.remove(queued)
                    if not waiting:
                        del self._queues[session_id]
        if queued.error is not None:
            raise queued.error
        return cast(R, queued.result)

    async def _run_batch(self, session_id: str, batch: list[_Queued]) -> None:
        try:
            for attempt in range(MAX_RETRIES):
                session = await self._refresh(session_id)
                head = session.head
                outcomes = [_attempt(session, queued.op) for queued in batch]
                if not session.dirty:
                    break
                delta = session.take_delta()
                try:
                    version = await anyio.to_thread.run_sync(
                        self.store.commit, delta, self.versions[session_id]
                    )
                except Conflict:
                    self.versions.pop(session_id, None)
                    await anyio.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
                    continue
                except StoreFailed:
                    self.versions.pop(session_id, None)  # the copy is ahead: reload it
                    raise
                self.versions[session_id] = version
                if session.head > head:
                    self.listener.changed(session_id)
                break
            else:
                raise StoreFailed(
                    f"session {session_id!r} changed elsewhere {MAX_RETRIES} times in a row"
                )
        except Exception as exc:  # the batch as a whole failed: every op in it did
            for queued in batch:
                queued.done, queued.error = True, exc
            return
        for queued, (result, error) in zip(batch, outcomes, strict=True):
            queued.done, queued.result, queued.error = True, result, error

    # -- the Committer interface -------------------------------------------------

    def execute(self, session_id: str, op: Op[R]) -> Outcome[R]:
        check_session_id(session_id)
        return Outcome.later(lambda: self._op(session_id, op))

    def ack_all(self, cursor: str, acks: list[tuple[str, int]]) -> Outcome[list[int]]:
        check_cursor_name(cursor)
        for session_id, _ in acks:
            check_session_id(session_id)

        async def ack() -> list[int]:
            # every ack is checked on a fresh copy before the first is written
            for session_id, seq in acks:
                async with self._locked(session_id):
                    (await self._refresh(session_id)).check_ack(seq)
            # each is then its own atomic step: only a store failure between
            # them can leave some done (an ack repeated later does no harm)
            return [await self._op(session_id, Ack(cursor, seq)) for session_id, seq in acks]

        return Outcome.later(ack)

    def require(self, session_ids: list[str]) -> Outcome[None]:
        for session_id in session_ids:
            check_session_id(session_id)

        async def require() -> None:
            for session_id in session_ids:
                async with self._locked(session_id):
                    await self._refresh(session_id)

        return Outcome.later(require)

    def start(
        self, session_id: str | None, limit: int, exist_ok: bool
    ) -> Outcome[tuple[str, bool]]:
        chosen = made_up_id(self.sessions) if session_id is None else check_session_id(session_id)
        return Outcome.later(lambda: self._start(chosen, limit, exist_ok))

    async def _start(self, session_id: str, limit: int, exist_ok: bool) -> tuple[str, bool]:
        async with self._locked(session_id):
            try:
                await self._refresh(session_id)
            except NoSuchSession:
                pass
            else:
                if not exist_ok:
                    raise exists(session_id)
                return session_id, False
            if len(self.sessions) >= self.max_sessions:
                raise TooMany(f"the daemon hosts {self.max_sessions:,} sessions, its limit")
            session = Session(session_id, limit)
            try:
                version = await anyio.to_thread.run_sync(self.store.commit, session.take_delta(), 0)
            except Conflict:
                if exist_ok:
                    return session_id, False
                raise exists(session_id) from None
            self.sessions[session_id] = session
            self.versions[session_id] = version
            return session_id, True

    def stop(self, session_id: str) -> Outcome[None]:
        check_session_id(session_id)
        return Outcome.later(lambda: self._stop(session_id))

    async def _stop(self, session_id: str) -> None:
        async with self._locked(session_id):
            existed = await anyio.to_thread.run_sync(self.store.stop, session_id)
            self._forget(session_id)
            if not existed:
                raise no_session(session_id)

    def summaries(self, session_id: str | None) -> Outcome[list[Summary]]:
        if session_id is not None:
            check_session_id(session_id)
        return Outcome.later(lambda: self._summaries(session_id))

    async def _summaries(self, session_id: str | None) -> list[Summary]:
        if session_id is not None:
            async with self._locked(session_id):
                return [(await self._refresh(session_id)).summary()]
        rows = []
        for stored in await anyio.to_thread.run_sync(self.store.ids):
            with contextlib.suppress(NoSuchSession):
                async with self._locked(stored):
                    rows.append((await self._refresh(stored)).summary())
        return rows

    def totals(self) -> Totals:
        sessions = self.sessions.values()
        return Totals(
            sessions=len(self.sessions),
            lost=sum(s.ring.dropped for s in sessions),
            evaluations=self.retired_evaluations + sum(s.evaluations for s in sessions),
        )


def _attempt(session: Session, op: Op[object]) -> tuple[object, Exception | None]:
    """Run one queued operation; its error is its own, not the batch's."""
    try:
        return op.run(session, None), None
    except Exception as exc:
        return None, exc
