"""The store interface the daemon writes through, and the in-memory store.

The daemon keeps every session in memory (the ``session`` core) and hands
the store a batch of :class:`SessionDelta` values to make durable in one
atomic step; it answers a client only after the batch holding that
client's change is written (group commit, see ``repl_daemon.hub``). At
start it loads every session back from the store's snapshots.

What any store must guarantee (a networked one such as Redis included):

- ``write`` is atomic: after a crash either the whole batch is there or
  none of it, and a batch is never reordered with the one before it. A
  store shared by several daemons (Redis) is atomic per session instead:
  each session's delta is one server-side step, checked against the version
  the daemon's copy came from (``repl_daemon.shared``).
- once ``write`` returns, the batch survives a crash of the daemon (and,
  for a networked store, of the store's own process as far as its settings
  promise: Redis keeps a batch through a crash of its machine only with
  ``appendonly yes`` and ``appendfsync always``, or after a WAIT for
  replicas; see GUIDE.md);
- ``write`` raises ``StoreFailed`` with a reason when it cannot, and then
  has written nothing; the daemon reloads the sessions of the batch with
  ``load_session`` and answers their callers ``store_failed``;
- a write after a failed one works again once the cause is gone (a
  reconnect, a reopened file): the daemon does not restart for it;
- ``load`` returns exactly what was written: seqs, the newest firings
  (seq above ``head - retained``, with no hole), cursors with their last
  use, dedup keys in the order they came (the newest 1,024), limits and
  the cursor-use clock; ``load_session`` the same for one session;
- one writer at a time: a second daemon on the same SQLite file refuses to
  start (``repl_daemon.sqlite_store`` holds a file lock on it). A store that
  several daemons share must arbitrate inside the write itself: the write
  checks, in the same atomic step, that nobody changed the session since
  this daemon read it (a version, or a fencing token), and otherwise writes
  nothing; a lock or lease taken beside the write is not enough, because
  its holder can be paused past its expiry and then write.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from session.firing import Firing
from session.session import CursorState, Snapshot


class SessionDelta(msgspec.Struct, frozen=True):
    """What changed in one session since the previous batch.

    ``gone``: the session was stopped; delete all of it. ``reset``: delete
    whatever is stored under this id first (a new session, or a rewrite
    after a failure), then write the rest. ``firings`` are the new ones
    (seq above what was written before); the store also drops every stored
    firing with seq <= ``head - retained``, where ``retained`` is how many
    firings the ring holds now (None: as many as ``limit`` allows; it is
    fewer when the limit was lowered and raised again since). The new
    firings must continue the stored ones with no hole; a store may refuse a
    delta that does not. ``cursors`` replaces the whole
    cursor table when not None. ``keys`` are new dedup keys, oldest first;
    the store keeps the newest 1,024.
    """

    id: str
    gone: bool = False
    reset: bool = False
    limit: int = 0
    head: int = 0
    uses: int = 0
    retained: int | None = None
    firings: list[Firing] = []
    cursors: list[CursorState] | None = None
    keys: list[tuple[str, int]] = []


class Store(Protocol):
    """Where the daemon keeps its sessions between runs."""

    #: a short name for logs and ``stats``: "memory", "sqlite:/path"
    name: str
    #: False for a store that keeps nothing (readers need not wait for it)
    durable: bool

    def load(self) -> list[Snapshot]:
        """Every stored session; called once at start, before serving."""
        ...

    def load_session(self, session_id: str) -> Snapshot | None:
        """One session as stored, or None; used to roll back after a failed write."""
        ...

    def write(self, batch: list[SessionDelta]) -> None:
        """Make the batch durable atomically, or raise ``StoreFailed``. Runs in a thread."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """Keeps nothing: ``repl daemon --memory``. Every write succeeds at once."""

    name = "memory"
    durable = False

    def load(self) -> list[Snapshot]:
        return []

    def load_session(self, session_id: str) -> Snapshot | None:
        return None

    def write(self, batch: list[SessionDelta]) -> None:
        pass

    def close(self) -> None:
        pass
