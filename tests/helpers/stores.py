"""For the stores' tests: a firing time, what SQLite counts at open, and the core's own deltas."""

from __future__ import annotations

from typing import Any

from repl_daemon.backends.local.sqlite import load as sqlite_load
from session.delta import Delta
from session.session import Session, Snapshot

# -- stores --------------------------------------------------------------------

TS = "2026-01-02T03:04:05.678Z"


def counted(conn: Any) -> tuple[int, int]:
    """What the SQLite store's checks at open count: the log's rows and its live ones (what
    its compaction goes by), recounted on ``conn``."""
    return sqlite_load.read_pages(conn), sqlite_load.check_sessions(conn)


class Mirror:
    """A core session and the deltas it hands over, as the engine hands them."""

    def __init__(self, session_id: str, limit: int = 256) -> None:
        self.session = Session(session_id, limit)

    def record(self, text: str, key: str | None = None, handler: str = "on-message") -> int:
        return self.session.record(handler, text, TS, key=key).seq

    def delta(self) -> Delta:
        return self.session.take_delta()

    def snapshot(self) -> Snapshot:
        return self.session.snapshot()
