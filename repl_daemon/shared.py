"""The hub for a shared store: several daemons serve the same sessions.

With a shared store (Redis) the stored session is the truth and this
daemon's copy is a cache, tagged with the stored version it came from.
Every operation on a session runs under a per-session lock, as:

1. refresh: ask the store for the session's version; reload the copy when
   another daemon changed it (or it is not loaded yet);
2. apply the operation to the copy with the ``session`` core, exactly as a
   single daemon does (so every rule is checked by the same code);
3. if it changed anything, write the delta with the version of step 1 as a
   condition (one atomic step in the store); if another daemon got there
   first, reload and run the operation again from step 1.

Waits stay free of polling: every commit publishes the session's new head,
a listener thread hands those to the waiters of this daemon, and a waiter
that wakes refreshes before it reads. When the subscription breaks, every
waiter is answered ``store_failed`` (changes made meanwhile would not wake
it); once it is back, waiters read again.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable
from typing import TypeVar, cast

import anyio

from repl_daemon import protocol as p
from repl_daemon.hub import Hosted, Hub
from repl_daemon.redis_store import Conflict, RedisStore
from session.errors import (
    NoSuchSession,
    SessionExists,
    SessionStopped,
    StoreFailed,
    TooMany,
)
from session.ring import DEFAULT_LIMIT
from session.session import Session, check_session_id

log = logging.getLogger("repl.daemon")

T = TypeVar("T")
MAX_RETRIES = 100


R = TypeVar("R", bound=p.Response)


def _changed(result: tuple[Hosted, R]) -> R:
    """Mark the session of a changing op dirty, so that ``_op`` writes it."""
    hosted, answer = result
    hosted.mark()
    return answer


class _Queued:
    """An operation waiting for its session's next batch."""

    __slots__ = ("apply", "done", "error", "result")

    def __init__(self, apply: Callable[[], object]) -> None:
        self.apply = apply
        self.done = False
        self.result: object = None
        self.error: Exception | None = None


def _attempt(apply: Callable[[], object]) -> tuple[object, Exception | None]:
    """Run one queued operation; its error is its own, not the batch's."""
    try:
        return apply(), None
    except Exception as exc:
        return None, exc


class SharedHub(Hub):
    """A Hub whose sessions live in a store that other daemons write too."""

    def __init__(self, store: RedisStore, *, settle: float = 0.1, max_sessions: int = 10_000):
        super().__init__(store, settle=settle, max_sessions=max_sessions)
        self.shared = store
        self.versions: dict[str, int] = {}
        self.link_error: StoreFailed | None = None
        self._locks: dict[str, anyio.Lock] = {}
        self._queues: dict[str, list[_Queued]] = {}

    # -- life --------------------------------------------------------------

    def load(self) -> int:
        """Nothing up front: a session is loaded on its first use."""
        return len(self.shared.ids())

    async def run_committer(self) -> None:
        """No batches here: the listener thread hands other daemons' changes to waiters."""

        def on_change(session_id: str, head: int | None) -> None:
            # most changes are to sessions this daemon does not serve: no need to wake the loop
            if session_id in self.sessions:
                anyio.from_thread.run_sync(self._changed_elsewhere, session_id, head)

        def on_link(up: bool) -> None:
            anyio.from_thread.run_sync(self._link, up)

        await anyio.to_thread.run_sync(
            self.shared.listen, on_change, on_link, abandon_on_cancel=True
        )

    def _changed_elsewhere(self, session_id: str, head: int | None) -> None:
        hosted = self.sessions.get(session_id)
        if hosted is None:
            return
        if head is None:
            del self.sessions[session_id]
            self.versions.pop(session_id, None)
            self._retire(hosted)
        elif head > hosted.visible or hosted.waiters:
            hosted.notify()

    def _link(self, up: bool) -> None:
        self.link_error = None if up else StoreFailed("lost the link to Redis: waits cannot wake")
        for hosted in self.sessions.values():
            hosted.notify()

    async def shutdown(self) -> None:
        # nothing to write: every change was committed by its own operation, and
        # writing a stale copy unconditionally could undo another daemon's work
        self._close_waits()

    # -- the operation loop ----------------------------------------------------

    def _lock(self, session_id: str) -> anyio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = anyio.Lock()
        return lock

    async def refresh(self, session_id: str) -> Hosted:
        """This daemon's copy of a session, reloaded if the stored one moved on."""
        check_session_id(session_id)
        version = await anyio.to_thread.run_sync(self.shared.version, session_id)
        hosted = self.sessions.get(session_id)
        if version == 0:
            if hosted is not None:
                self._changed_elsewhere(session_id, None)
            raise NoSuchSession(
                f"no session {session_id!r}: start it with `repl start {session_id}`"
            )
        if hosted is not None and self.versions.get(session_id) == version:
            return hosted
        loaded = await anyio.to_thread.run_sync(self.shared.load_versioned, session_id)
        if loaded is None:
            return await self.refresh(session_id)
        snapshot, version = loaded
        self._replace(session_id, snapshot)
        self.versions[session_id] = version
        return self.sessions[session_id]

    async def _op(self, session_id: str, apply: Callable[[], T]) -> T:
        """Run ``apply`` on a fresh copy and write it under the stored version.

        Operations on one session queue up while one batch of them is on its
        way to Redis; the next holder of the session's lock runs every queued
        operation as one batch: one refresh, one commit. On a conflict the
        whole batch runs again on the reloaded copy, after a short random
        back-off so that daemons contending for a session take turns.
        """
        queued = _Queued(apply)
        self._queues.setdefault(session_id, []).append(queued)
        async with self._lock(session_id):
            if not queued.done:
                await self._run_batch(session_id, self._queues.pop(session_id, []))
        if queued.error is not None:
            raise queued.error
        return cast(T, queued.result)

    async def _run_batch(self, session_id: str, batch: list[_Queued]) -> None:
        try:
            for attempt in range(MAX_RETRIES):
                hosted = await self.refresh(session_id)
                outcomes = [_attempt(queued.apply) for queued in batch]
                if not hosted.dirty:
                    break
                delta = self._delta(hosted)
                try:
                    version = await anyio.to_thread.run_sync(
                        self.shared.commit, delta, self.versions[session_id]
                    )
                except Conflict:
                    self.versions.pop(session_id, None)
                    await anyio.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
                    continue
                except StoreFailed:
                    self.versions.pop(session_id, None)  # the copy is ahead: reload it
                    raise
                self.versions[session_id] = version
                hosted.visible = hosted.session.head
                hosted.notify()
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

    async def handle(self, req: p.AnyRequest) -> p.Response:
        """Every op but auth, for the connection loop."""
        match req:
            case p.Send():
                return await self._op(req.session, lambda: _changed(self.send(req)))
            case p.Read():
                return await self._op(req.session, lambda: self.read(req))
            case p.Ack():
                return await self._op(req.session, lambda: _changed(self.ack(req)))
            case p.Poll():
                return await self._op(req.session, lambda: _changed(self.poll(req)))
            case p.Buffer():
                return await self._op(req.session, lambda: _changed(self.buffer(req)))
            case p.Cursors():
                return await self._op(req.session, lambda: self.cursors(req))
            case p.Wait():
                return await self.wait(req)
            case p.Start():
                return await self.start(req)
            case p.Stop():
                return await self.stop(req)
            case p.Sessions():
                for session_id in await anyio.to_thread.run_sync(self.shared.ids):
                    with contextlib.suppress(NoSuchSession):
                        await self.refresh(session_id)
                return self.list_sessions(req)
            case p.Stats():
                if req.session is not None:
                    await self.refresh(req.session)
                return self.stats(req)
            case p.Ping():
                return self.ping(req)
            case _:
                return p.Done(id=req.id)

    # -- ops that differ ---------------------------------------------------

    async def start(self, req: p.Start) -> p.Started:
        session_id = self._fresh_id() if req.session is None else check_session_id(req.session)
        async with self._lock(session_id):
            try:
                await self.refresh(session_id)
            except NoSuchSession:
                pass
            else:
                if not req.exist_ok:
                    raise SessionExists(
                        f"session {session_id!r} exists: stop it first, or pass --exist-ok"
                    )
                return p.Started(id=req.id, session=session_id, created=False)
            if len(self.sessions) >= self.max_sessions:
                raise TooMany(f"the daemon hosts {self.max_sessions:,} sessions, its limit")
            limit = DEFAULT_LIMIT if req.buffer is None else req.buffer
            hosted = self._host(Session(session_id, limit), new=True)
            delta = self._delta(hosted)
            try:
                version = await anyio.to_thread.run_sync(self.shared.commit, delta, 0)
            except Conflict:
                del self.sessions[session_id]
                if req.exist_ok:
                    return p.Started(id=req.id, session=session_id, created=False)
                raise SessionExists(
                    f"session {session_id!r} exists: stop it first, or pass --exist-ok"
                ) from None
            except StoreFailed:
                del self.sessions[session_id]
                raise
            self.versions[session_id] = version
            return p.Started(id=req.id, session=session_id, created=True)

    async def stop(self, req: p.Stop) -> p.Done:
        session_id = check_session_id(req.session)
        async with self._lock(session_id):
            existed = await anyio.to_thread.run_sync(self.shared.stop, session_id)
            hosted = self.sessions.pop(session_id, None)
            self.versions.pop(session_id, None)
            if hosted is not None:
                self._retire(hosted)
            if not existed:
                raise NoSuchSession(f"no session {session_id!r}")
        return p.Done(id=req.id)

    async def _ack_for_wait(self, req: p.Wait, ids: list[str]) -> None:
        for session_id in ids:
            seq = req.ack.get(session_id)
            if seq is not None:
                ack = p.Ack(session=session_id, seq=seq, cursor=req.cursor)
                await self._op(session_id, lambda ack=ack: _changed(self.ack(ack)))  # type: ignore[misc]

    async def _sessions_for_wait(self, ids: list[str], *, first: bool) -> list[Hosted]:
        chosen = []
        for session_id in ids:
            try:
                async with self._lock(session_id):
                    chosen.append(await self.refresh(session_id))
            except NoSuchSession:
                if first:
                    raise
                raise SessionStopped(f"session {session_id!r} stopped") from None
        return chosen

    def _check_open(self, chosen: list[Hosted]) -> None:
        super()._check_open(chosen)
        if self.link_error is not None:
            raise self.link_error
