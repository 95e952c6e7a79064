"""The pure core of repl: sessions, their rings of firings, cursors and dedup keys.

Nothing here does I/O, reads a clock, or knows about asyncio: callers pass
timestamps in and get plain values back. Every rule of SPEC.md §3 that does
not need a socket lives here, so it can be tested synchronously and
exhaustively. A method that raises leaves its object exactly as it was.
"""

from session.errors import Code, ReplError
from session.firing import Batch, Firing
from session.ring import DEFAULT_LIMIT, MAX_LIMIT, Ring
from session.session import (
    MAX_CURSORS,
    MAX_KEYS,
    CursorInfo,
    CursorState,
    Recorded,
    Session,
    Snapshot,
    check_cursor_name,
    check_session_id,
)

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_CURSORS",
    "MAX_KEYS",
    "MAX_LIMIT",
    "Batch",
    "Code",
    "CursorInfo",
    "CursorState",
    "Firing",
    "Recorded",
    "ReplError",
    "Ring",
    "Session",
    "Snapshot",
    "check_cursor_name",
    "check_session_id",
]
