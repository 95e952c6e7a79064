"""The local backend: sessions in this daemon's memory, written to a store of its own by
group commit (``committer``): ``memory`` keeps nothing, ``sqlite`` is the default store.
``store`` states what such a store must guarantee."""

from __future__ import annotations

from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.store import Store
from repl_daemon.engine.clock import Clock
from repl_daemon.engine.committer import Committer, Listener

__all__ = ["LocalBackend"]


class LocalBackend:
    """A store of this daemon's own (memory or SQLite), and the committer over it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def name(self) -> str:
        return self.store.name

    def committer(self, listener: Listener, *, max_sessions: int, clock: Clock) -> Committer:
        return LocalCommitter(self.store, listener, max_sessions=max_sessions, clock=clock)

    def notes(self) -> list[tuple[int, str]]:
        return []

    async def close(self) -> None:
        self.store.close()  # idempotent: a daemon that failed to start closes it too
