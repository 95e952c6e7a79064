"""Reading the SQLite store's file: every session at start (``load_all``, one ordered scan
a table, merged), and the checks at open (every session's row, ``check_sessions``; every
page, ``PageCheck``, in a thread of its own beside the load)."""

from __future__ import annotations

import logging
import sqlite3
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from repl_daemon.backends.local.sqlite.failures import Inconsistent
from repl_daemon.backends.local.sqlite.schema import (
    COLUMNS,
    LIVE_ROW,
    firing_of,
    group_of,
    timer_of,
)
from session.delta import CursorState, Webhook
from session.errors import ReplError
from session.names import check_session_id
from session.ring import Fold, Image, Ring, check_limit, decode_image
from session.session import Snapshot

log = logging.getLogger("repl.daemon")


class _Rows:
    """One table's rows in session order, taken a session at a time (a merge join)."""

    def __init__(self, rows: Iterator[tuple[Any, ...]]) -> None:
        self.rows = rows
        self.next: tuple[Any, ...] | None = next(rows, None)

    def of(self, session_id: str) -> list[tuple[Any, ...]]:
        """The rows of ``session_id``: those before it belong to no session, and are left."""
        taken = []
        row = self.next
        while row is not None and row[0] <= session_id:
            if row[0] == session_id:
                taken.append(row)
            row = next(self.rows, None)
        self.next = row
        return taken


def load_all(
    conn: sqlite3.Connection,
    only: str = "",
    fold: Callable[[str, int, int, int, int], Fold] | None = None,
) -> Iterator[Snapshot]:
    """Every session in id order (``only``: a join that narrows the sessions), each with its
    rows, one session's at a time. The log is read once, in session order (SQLite's sorter,
    which spills to disk: not Python's memory); where every session has its ring's image,
    only the log's rows after the oldest image that has rows after it (a range of ids), so
    that a restart after a clean stop reads each ring as one blob. With ``fold`` a ring whose
    image is whole (its head the session's) is not read at all: ``fold`` makes what brings
    it in later (``Ring.folded``)."""
    imaged = (
        f"FROM sessions AS s {only} LEFT JOIN rings AS r ON r.session = s.id AND r.since = s.since"
    )
    firings = _Rows(_log_rows(conn, only, imaged))
    tables = _Tables(conn, only)
    # a folded ring's image is not read: not even its crc, which comes after it in the row
    # (SQLite would walk the image's overflow pages to reach it)
    whole = "r.head = s.head" if fold is not None else "0"
    sessions = conn.execute(
        f'SELECT s.id, s."limit", s.head, s.uses, s.first, s.since, r.head,'
        f" CASE WHEN {whole} THEN NULL ELSE r.image END,"
        f" CASE WHEN {whole} THEN NULL ELSE r.crc END {imaged} ORDER BY s.id"
    )
    for session_id, limit, head, uses, first, since, image_head, data, crc in sessions:
        tail = firings.of(session_id)
        folded = None
        if fold is not None and image_head == head:
            if not tail:
                folded = fold(session_id, limit, head, first, since)
            else:  # rows past the session's head: the check below refuses them
                data, crc = conn.execute(
                    "SELECT image, crc FROM rings WHERE session = ?", (session_id,)
                ).fetchone()
        image = None if data is None else image_of(session_id, data, crc, first)
        if data is not None and image is None:  # damaged: the log has every live row
            tail = ring_rows(conn, session_id, since, first)
        snapshot = tables.snapshot(session_id, limit, head, uses, tail, image, folded)
        count = head - first + 1 if folded is not None else _check_snapshot(snapshot)
        if count != head - first + 1:
            raise Inconsistent(
                f"session {session_id!r} holds {count} firing(s) where its "
                f"ring keeps {head - first + 1}"
            )
        yield snapshot


def _log_rows(conn: sqlite3.Connection, only: str, imaged: str) -> Iterator[tuple[Any, ...]]:
    """The log's rows a load reads, in session order: none where every ring is its image,
    the log's tail after the oldest image where every ring has one, else every live row
    that no image holds."""
    # an image of the session's head has no rows after it, whatever its mark
    without, oldest = conn.execute(
        f"SELECT count(*) - count(r.session), min(CASE WHEN r.head < s.head THEN r.mark END)"
        f" {imaged}"
    ).fetchone()
    if without == 0 and oldest is None:  # every ring is its image: no row of the log is read
        return iter(())
    if without == 0:  # every ring has its image: the log's tail
        query = (
            f"SELECT {COLUMNS} FROM log AS l JOIN sessions AS s ON s.id = l.session {only}"
            " JOIN rings AS r ON r.session = s.id AND r.since = s.since"
            f" WHERE l.id > ? AND {LIVE_ROW} AND l.id > r.mark AND l.seq > r.head"
            " ORDER BY l.session, l.seq"
        )
        return conn.execute(query, (oldest,))
    return conn.execute(
        f"SELECT {COLUMNS} FROM log AS l JOIN sessions AS s ON s.id = l.session {only}"
        " LEFT JOIN rings AS r ON r.session = s.id AND r.since = s.since"
        f" WHERE {LIVE_ROW} AND (r.session IS NULL OR (l.id > r.mark AND l.seq > r.head))"
        " ORDER BY l.session, l.seq"
    )


def unfold(
    conn: sqlite3.Connection, session_id: str, limit: int, head: int, first: int, since: int
) -> Ring:
    """A folded ring's firings: its image, or (damaged, or not the ring's) its rows in the
    log, read in full as a start without images does; ``Inconsistent`` when the log's rows
    are not the ring."""
    row = conn.execute(
        "SELECT image, crc FROM rings WHERE session = ? AND since = ? AND head = ?",
        (session_id, since, head),
    ).fetchone()
    image = None if row is None else image_of(session_id, row[0], row[1], first)
    if image is not None and len(image.items) == head - first + 1:
        return Ring.from_image(limit, head, image)
    if image is not None:
        log.warning(
            "the image of session %r's ring is not its ring; its firings are read from the log",
            session_id,
        )
    firings = [firing_of(row) for row in ring_rows(conn, session_id, since, first)]
    if len(firings) != head - first + 1:
        raise Inconsistent(
            f"session {session_id!r} holds {len(firings)} firing(s) where its "
            f"ring keeps {head - first + 1}"
        )
    return Ring(limit, head, firings)


def ring_rows(
    conn: sqlite3.Connection, session_id: str, since: int, first: int
) -> list[tuple[Any, ...]]:
    """A session's live rows of the log, oldest first: its whole ring, without an image."""
    return list(
        conn.execute(
            f"SELECT {COLUMNS} FROM log AS l WHERE l.session = ? AND l.id > ?"
            " AND l.seq >= ? ORDER BY l.seq",
            (session_id, since, first),
        )
    )


class _Tables:
    """What a session's snapshot holds beside its ring (cursors, dedup keys, timers, its
    webhook, groups): one ordered scan a table, taken a session at a time."""

    def __init__(self, conn: sqlite3.Connection, only: str) -> None:
        def of(table: str, columns: str, order: str) -> _Rows:
            narrowed = f"JOIN sessions AS s ON s.id = t.session {only}" if only else ""
            return _Rows(
                conn.execute(
                    f"SELECT t.session, {columns} FROM {table} AS t {narrowed}"
                    f" ORDER BY t.session, {order}"
                )
            )

        self.cursors = of("cursors", "t.name, t.seq, t.last_use", "t.last_use")
        self.keys = of("keys", "t.key, t.seq", "t.ord")
        self.timers = of(
            "timers",
            "t.id, t.due_ms, t.every_ms, t.handler, t.text, t.key, t.tags",
            "t.due_ms, t.id",
        )
        self.hooks = of("hooks", "t.secret, t.handler", "t.session")
        self.groups = of("groups", "t.state", "t.name")

    def snapshot(
        self,
        session_id: str,
        limit: int,
        head: int,
        uses: int,
        tail: list[tuple[Any, ...]],
        image: Image | None,
        folded: Fold | None,
    ) -> Snapshot:
        """Session ``session_id`` with its ring (its image, the log's rows after it, or
        ``folded``) and its rows of every other table."""
        hook = self.hooks.of(session_id)
        cursors = self.cursors.of(session_id)
        return Snapshot(
            id=session_id,
            limit=limit,
            head=head,
            firings=[firing_of(row) for row in tail],
            cursors=[CursorState(name, seq, use) for _, name, seq, use in cursors],
            uses=uses,
            keys=[(key, seq) for _, key, seq in self.keys.of(session_id)],
            timers=[timer_of(*row) for row in self.timers.of(session_id)],
            webhook=Webhook(hook[0][1], hook[0][2]) if hook else None,
            groups=[group_of(state) for _, state in self.groups.of(session_id)],
            image=image,
            fold=folded,
        )


def image_of(session_id: str, data: bytes, crc: int, first: int) -> Image | None:
    """The ring's image ``data`` holds, from seq ``first`` on; None (and a warning) when its
    bytes are not those that were written, or hold no ring (seqs below 1)."""
    if zlib.crc32(data) == crc:
        try:
            image = decode_image(data)
        except msgspec.DecodeError:
            pass
        else:
            if image.first >= 1:
                return image.since(first)
    log.warning(
        "the image of session %r's ring is damaged; its firings are read from the log",
        session_id,
    )
    return None


def check_sessions(conn: sqlite3.Connection) -> int:
    """What can be checked of the file before its sessions are loaded: every session's row
    (one the core can host, with a ring that fits its limit). Returns the log's live rows:
    the sum of the rings the sessions say they keep. ``load`` checks each session's
    firings against its row as it reads them (a session whose live rows disagree ends the
    load, so the daemon stops before it serves); an aggregate of the log here would be a
    second sort of it, which cost a restart of 256,000 firings a sixth of its time."""
    live = 0
    for session_id, limit, head, first in conn.execute(
        'SELECT id, "limit", head, first FROM sessions'
    ):
        try:
            check_session_id(session_id)
            check_limit(limit)
        except ReplError as exc:
            raise Inconsistent(exc.message) from None
        count = head - first + 1
        if head < 0 or first < 1 or count < 0 or count > limit:
            raise Inconsistent(
                f"session {session_id!r} holds {count} firing(s) under limit {limit} "
                f"and head {head} (its first is {first})"
            )
        live += count
    return live


def read_pages(conn: sqlite3.Connection) -> int:
    """One scan of the log and of each table a load reads whole, which reads every page (a
    damaged one fails it) and builds no row in Python. Returns the log's rows."""
    (rows,) = conn.execute("SELECT count(*) FROM log").fetchone()
    for table in ("cursors", "keys", "timers", "hooks"):  # every page read
        conn.execute(f"SELECT count(*), max(length(session)) FROM {table}").fetchone()
    return int(rows)


class PageCheck(threading.Thread):
    """``read_pages`` on a connection of its own, beside the load: SQLite lets go of the
    GIL while it reads, so the check of 10,000 full rings' log (0.15 s) costs a start on two
    cores next to nothing. ``SqliteStore._checked`` waits for it."""

    def __init__(self, path: Path, busy_ms: int) -> None:
        super().__init__(name="repl-page-check", daemon=True)
        self.path, self.busy_ms = path, busy_ms
        self.rows = 0
        self.error: sqlite3.Error | None = None
        self.start()

    def run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None)
            try:
                conn.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
                self.rows = read_pages(conn)
            finally:
                conn.close()
        except sqlite3.Error as exc:
            self.error = exc


def _check_snapshot(snapshot: Snapshot) -> int:
    """A stored session must be one the core can host: the newest firings up to the head,
    its image's (when it has one) and then those after it. Returns how many it holds."""
    try:
        check_session_id(snapshot.id)
        check_limit(snapshot.limit)
    except ReplError as exc:
        raise Inconsistent(exc.message) from None
    firings, image = snapshot.firings, snapshot.image
    count = len(firings) + (0 if image is None else len(image.items))
    if snapshot.limit < 0 or snapshot.head < 0 or count > snapshot.limit:
        raise Inconsistent(
            f"session {snapshot.id!r} holds {count} firing(s) under limit "
            f"{snapshot.limit} and head {snapshot.head}"
        )
    start = snapshot.head - len(firings) + 1  # the seq the first of ``firings`` must have
    if image is not None and image.head != start - 1:
        raise Inconsistent(
            f"session {snapshot.id!r}'s ring image ends at {image.head}, and the firings "
            f"after it start at {start}"
        )
    if any(firing.seq != seq for seq, firing in enumerate(firings, start)):
        raise Inconsistent(
            f"session {snapshot.id!r} holds firings {firings[0].seq} to {firings[-1].seq}, "
            f"which are not the newest {len(firings)} up to its head {snapshot.head}"
        )
    return count
