"""What went wrong with the SQLite store's file, in words a user can act on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

# what a user can do about each kind of failure, by SQLite's error name
_HINTS = {
    "SQLITE_FULL": "free some space on its disk",
    "SQLITE_READONLY": "make it (and its directory) writable by the daemon's user",
    "SQLITE_BUSY": "another program holds a write lock on it",
    "SQLITE_IOERR": "check the disk and the system log",
    "SQLITE_CORRUPT": "the file is damaged: restore it from a backup",
    "SQLITE_CANTOPEN": "check that the daemon's user can read and write it and its directory",
}


class Inconsistent(Exception):
    """A change that does not follow from what the file holds (a bug, or a foreign edit)."""


class NotOurs(Exception):
    """The file is a database, but not one this repl can use."""


def error_name(exc: BaseException) -> str:
    return getattr(exc, "sqlite_errorname", "") or ""


def _hint(exc: BaseException) -> str:
    name = error_name(exc)
    for prefix, hint in _HINTS.items():
        if name.startswith(prefix):
            return f": {hint}"
    return ""


def write_failure(path: Path, exc: BaseException) -> str:
    if isinstance(exc, sqlite3.Error):
        return f"cannot write {path}: {exc}{_hint(exc)}"
    if isinstance(exc, Inconsistent):
        return f"cannot write {path}: {exc} (a bug in repl: the change is undone)"
    return f"cannot write {path}: {type(exc).__name__}: {exc}"


def load_failure(path: Path, exc: BaseException) -> str:
    if isinstance(exc, Inconsistent):
        return (
            f"{path} is not consistent: {exc}: restore it from a backup, "
            "or move it away to start with no sessions"
        )
    return f"cannot read {path}: {exc}{_hint(exc)}"


#: the SQLite errors of a file whose pages are not a database's
DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


def open_failure(path: Path, exc: sqlite3.Error) -> str:
    name = error_name(exc)
    if name.startswith(DAMAGED):
        return (
            f"{path} is not a readable repl database ({exc}): move it away to start "
            "with no sessions, or restore it from a backup"
        )
    return f"cannot open {path}: {exc}{_hint(exc)}"
