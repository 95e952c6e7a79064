"""The local store interface: where a daemon keeps its own sessions between runs.

A store persists what it is handed and decides no rule: the local committer
applies every operation with the ``session`` core and hands the store one
``Delta`` a changed session (``session.delta``), a batch of them at a time
(group commit, see ``repl_daemon.backends.local.committer``). At start it loads every
session back from the store's snapshots. A store raises ``StoreFailed`` and
nothing else; the message says what failed and, where a user can act, what
to do. (Redis is no such store: the daemons that share it keep no copy, and
every operation is one script there; see ``repl_daemon.backends.redis``.)

What a store must guarantee:

- ``write`` is atomic: after a crash either the whole batch is there or
  none of it, and a batch is never reordered with the one before it;
- once ``write`` returns, the batch survives a crash of the daemon (SQLite:
  the transaction is committed with ``synchronous=FULL``);
- ``write`` raises ``StoreFailed`` with a reason when it cannot, and then
  has written nothing; the committer reloads the sessions of the batch with
  ``load_sessions`` and answers their callers ``store_failed``;
- a write after a failed one works again once the cause is gone (a
  reopened file, a disk with room again): the daemon does not restart for it;
- ``load`` returns exactly what was written: seqs, the newest firings
  (seq above ``head - retained``, with no hole), cursors with their last
  use, dedup keys in the order they came (the newest ``max_keys``), limits
  and the cursor-use clock; ``load_sessions`` the same for the sessions named;
- one writer at a time: a second daemon on the same SQLite file refuses to
  start (``repl_daemon.backends.local.sqlite`` holds a file lock on it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

from session.delta import Delta
from session.ring import Image
from session.scopes import TokenRecord
from session.session import Snapshot


class Store(Protocol):
    """Where the daemon keeps its sessions between runs."""

    #: a short name for logs and ``stats``: "memory", "sqlite:/path"
    name: str
    #: False for a store that keeps nothing (readers need not wait for it)
    durable: bool
    #: True for a store that other daemons write too (its sessions are not this daemon's alone)

    def load(self) -> Iterable[Snapshot]:
        """Every stored session; called once at start, before serving. An iterator of them
        (SQLite's) holds one session's rows at a time, so a restart never holds them all."""
        ...

    def load_sessions(self, session_ids: Collection[str]) -> dict[str, Snapshot | None]:
        """Each of these sessions as stored (None for one that is not); used to roll back
        after a failed write, in one read."""
        ...

    def write(self, batch: list[Delta]) -> None:
        """Make the batch durable atomically, or raise ``StoreFailed``. Runs in a thread."""
        ...

    def keep_images(self, images: list[tuple[str, Image]]) -> int:
        """Keep these rings' images (``Ring.image``) beside what ``write`` made durable, so
        that the next ``load`` reads a ring as one piece: a clean stop's, once the last batch
        is written. A copy only: ``load`` must give the same with them or without them, and
        an image whose ring the store no longer holds (a head or first retained seq that
        differs) is not kept. Returns how many were kept. Runs in a thread."""
        ...

    def load_tokens(self) -> list[TokenRecord]:
        """The scoped tokens (rules K1-K5), by name; called at start."""
        ...

    def put_token(self, record: TokenRecord) -> None:
        """Keep a new token (its name is not in use: the committer checked). Runs in a thread."""
        ...

    def drop_token(self, name: str) -> None:
        """Forget a token. Runs in a thread."""
        ...

    def close(self) -> None: ...
