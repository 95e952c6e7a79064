"""The store interface: where the daemon keeps sessions between runs.

A store persists what it is handed and decides no rule: the daemon applies
every operation with the ``session`` core and hands the store one
``Delta`` a changed session (``session.delta``), a batch of them at a time
(group commit, see ``repl_daemon.engine.local``). At start it loads every
session back from the store's snapshots. A store raises ``StoreFailed`` and
nothing else; the message says what failed and, where a user can act, what
to do.

What any store must guarantee (a networked one such as Redis included):

- ``write`` is atomic: after a crash either the whole batch is there or
  none of it, and a batch is never reordered with the one before it. A
  store shared by several daemons (Redis) is atomic per session instead:
  each session's delta is one server-side step, checked against the version
  the daemon's copy came from (``repl_daemon.engine.shared``).
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
  use, dedup keys in the order they came (the newest ``max_keys``), limits
  and the cursor-use clock; ``load_session`` the same for one session;
- one writer at a time: a second daemon on the same SQLite file refuses to
  start (``repl_daemon.stores.sqlite`` holds a file lock on it). A store
  that several daemons share must arbitrate inside the write itself: the
  write checks, in the same atomic step, that nobody changed the session
  since this daemon read it (a version, or a fencing token), and otherwise
  writes nothing; a lock or lease taken beside the write is not enough,
  because its holder can be paused past its expiry and then write.
"""

from __future__ import annotations

from typing import Protocol

from session.delta import Delta
from session.scopes import TokenRecord
from session.session import Snapshot


class Store(Protocol):
    """Where the daemon keeps its sessions between runs."""

    #: a short name for logs and ``stats``: "memory", "sqlite:/path"
    name: str
    #: False for a store that keeps nothing (readers need not wait for it)
    durable: bool
    #: True for a store that other daemons write too (its sessions are not this daemon's alone)
    shared: bool

    def load(self) -> list[Snapshot]:
        """Every stored session; called once at start, before serving."""
        ...

    def load_session(self, session_id: str) -> Snapshot | None:
        """One session as stored, or None; used to roll back after a failed write."""
        ...

    def write(self, batch: list[Delta]) -> None:
        """Make the batch durable atomically, or raise ``StoreFailed``. Runs in a thread."""
        ...

    def load_tokens(self) -> list[TokenRecord]:
        """The scoped tokens (SPEC §11), by name; called at start."""
        ...

    def put_token(self, record: TokenRecord) -> None:
        """Keep a new token (its name is not in use: the committer checked). Runs in a thread."""
        ...

    def drop_token(self, name: str) -> None:
        """Forget a token. Runs in a thread."""
        ...

    def close(self) -> None: ...
