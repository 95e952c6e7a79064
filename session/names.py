"""The names a session's things have: a session's id, a cursor's, a group's, a handler's.

Kept apart from ``session.session`` so that what a session holds (its groups,
``session.group``) can check its names without importing the session itself.
"""

from __future__ import annotations

import re

from session.errors import BadCursorName, BadGroupName, BadHandler, BadSessionId
from session.rules import MAX_NAME_LENGTH

_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_session_id(session_id: str) -> str:
    if not _SESSION_ID.fullmatch(session_id):
        raise BadSessionId(
            f"session id {session_id!r} is not 1-64 of A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return session_id


def is_name(name: str) -> bool:
    # Every whitespace character but the ASCII space is already unprintable
    # (a control or separator), so one substring test finishes the rule; a
    # per-character isspace() scan cost ten times as much on every send and ack.
    return 0 < len(name) <= MAX_NAME_LENGTH and name.isprintable() and " " not in name


def check_cursor_name(name: str) -> str:
    if not is_name(name):
        raise BadCursorName(
            f"cursor name {name!r} is not 1-64 printable characters without whitespace"
        )
    return name


def check_group_name(name: str) -> str:
    """A group's name: as a cursor's (a claim token holds it), told as a group's."""
    if not is_name(name):
        raise BadGroupName(
            f"group name {name!r} is not 1-64 printable characters without whitespace"
        )
    return name


def check_handler(handler: str) -> str:
    if not is_name(handler):
        raise BadHandler(
            f"handler name {handler!r} is not 1-64 printable characters without whitespace"
        )
    return handler
