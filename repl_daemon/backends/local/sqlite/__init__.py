"""The default store: every session in one SQLite file in the daemon's home
(``SqliteStore``), in five modules a concern:

- ``store``: ``SqliteStore``, the store's face (the ``Store`` protocol of
  ``repl_daemon.backends.local.store``): its connections and transactions, the
  home's lock, tokens, and bringing in a ring a start left folded;
- ``schema``: the file's tables, the migrations from each older schema, and how a
  value is kept in a column;
- ``load``: every session read at start, and the checks of the file at open;
- ``write``: a batch of deltas written in one transaction, and the log's compaction;
- ``failures``: what went wrong, in words a user can act on.
"""

from __future__ import annotations

from repl_daemon.backends.local.sqlite.schema import SCHEMA_VERSION
from repl_daemon.backends.local.sqlite.store import SqliteStore

__all__ = ["SCHEMA_VERSION", "SqliteStore"]
