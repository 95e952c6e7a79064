"""The engine: requests in, the core's operations run, answers out (see ``engine.engine``).

It is handed a ``Backend`` (``engine.committer``), whose committer keeps the
sessions, and never asks which kind it has: this package imports no backend
(``repl_daemon.backends``), and so neither ``sqlite3`` nor ``redis``.
"""

from __future__ import annotations

from repl_daemon.engine.clock import REAL, Clock, utc_now
from repl_daemon.engine.committer import Backend, Committer
from repl_daemon.engine.engine import Engine
from repl_daemon.engine.outcome import Outcome, Ticket

__all__ = ["REAL", "Backend", "Clock", "Committer", "Engine", "Outcome", "Ticket", "utc_now"]
