"""The pure core of repl: sessions, their rings of firings, cursors and dedup keys.

Nothing here does I/O, reads a clock, or knows about asyncio: callers pass
timestamps in and get plain values back. Every rule of a session (S1-S17 of
docs/semantics.md; comments everywhere cite its rules by these ids: S3, T2,
H1, K2, ...) that does not need a socket lives here, so it can be tested synchronously and
exhaustively. A method that raises leaves its object exactly as it was.

The names below load on first use (PEP 562), so that a program that needs
only the wire's structs (``repl read`` imports ``session.firing`` and
``session.errors``) does not pay for the ring and the session on every run.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from session.delta import CursorState, Delta
    from session.errors import Code, ReplError
    from session.firing import Batch, CursorInfo, Firing
    from session.names import check_cursor_name, check_session_id
    from session.ring import Ring
    from session.rules import DEFAULT_LIMIT, MAX_CURSORS, MAX_KEYS, MAX_LIMIT
    from session.session import Recorded, Session, Snapshot, Summary

_HOMES = {
    "Code": "session.errors",
    "ReplError": "session.errors",
    "Batch": "session.firing",
    "CursorInfo": "session.firing",
    "Firing": "session.firing",
    "DEFAULT_LIMIT": "session.rules",
    "MAX_LIMIT": "session.rules",
    "Ring": "session.ring",
    "MAX_CURSORS": "session.rules",
    "MAX_KEYS": "session.rules",
    "CursorState": "session.delta",
    "Delta": "session.delta",
    "Recorded": "session.session",
    "Session": "session.session",
    "Snapshot": "session.session",
    "Summary": "session.session",
    "check_cursor_name": "session.names",
    "check_session_id": "session.names",
}

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_CURSORS",
    "MAX_KEYS",
    "MAX_LIMIT",
    "Batch",
    "Code",
    "CursorInfo",
    "CursorState",
    "Delta",
    "Firing",
    "Recorded",
    "ReplError",
    "Ring",
    "Session",
    "Snapshot",
    "Summary",
    "check_cursor_name",
    "check_session_id",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'session' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
