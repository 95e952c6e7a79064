"""Writing a batch of the core's deltas to the SQLite store's file, in the transaction the
store began: one statement a table for the whole batch, the new firings appended to the
log, and the log compacted as it goes (``write_batch``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from repl_daemon.backends.local.sqlite.failures import Inconsistent
from repl_daemon.backends.local.sqlite.schema import LIVE, group_bytes, tags_column
from session.delta import Delta, gap

#: compaction starts once the log holds more than twice its live rows and this many more
COMPACT_SLACK = 4096
#: the most session ids one ``IN (...)`` query of the stored heads names
HEADS_AT_ONCE = 500
#: the tables a gone or reset session is deleted from, with their session column
# (a gone session's firings are left in the log: dead, as nothing names them, until compacted)
_SESSION_TABLES = (
    ("sessions", "id"),
    ("cursors", "session"),
    ("keys", "session"),
    ("timers", "session"),
    ("hooks", "session"),
    ("rings", "session"),
    ("groups", "session"),
)


def write_batch(
    conn: sqlite3.Connection, batch: list[Delta], counts: tuple[int, int]
) -> tuple[int, int]:
    """A batch's changes, inside its transaction: one statement a table for the whole
    batch (``executemany``), not one a session, and the new firings appended to the log,
    so that a batch's cost grows with what it changes and not with how many sessions it
    touches. ``counts`` are the log's rows and live rows before; returns them after."""
    rows, live = counts
    named = [d.id for d in batch if not d.gone]
    if len(set(named)) != len(named):
        raise Inconsistent("a batch names a session twice")
    stored = _stored_heads(conn, list({d.id: None for d in batch}))
    gone = {d.id for d in batch if d.gone}
    for sid in gone | {d.id for d in batch if d.reset}:  # live no more, once an id
        row = stored.get(sid)
        if row is not None:
            live -= row[0] - row[2] + 1
    cleared = [(d.id,) for d in batch if d.gone or d.reset]
    if cleared:  # a stopped session's rows, or what a reset rewrites (its firings: by since)
        for table, column in _SESSION_TABLES:
            conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", cleared)
    kept = [d for d in batch if not d.gone]
    (top,) = conn.execute("SELECT coalesce(max(id), 0) FROM log").fetchone()
    tables = _Tables()
    # what a send across many sessions commits is mostly one new firing in each: this loop
    # runs once a touched session, so it looks at each delta's fields once
    for delta in kept:
        session, held_before = _session_row(delta, stored, gone, top)
        live += session[2] - session[4] + 1 - held_before
        tables.add(delta, session)
    rows += tables.write(conn)
    for delta in kept:
        if delta.keys:
            _add_keys(conn, delta)
    if rows > 2 * live + COMPACT_SLACK:
        rows = _compact(conn, rows, 2 * len(tables.firings) + COMPACT_SLACK // 4 + 1)
    return rows, live


#: a session's row: its id, limit, head, uses, first retained seq and since
_Session = tuple[str, int, int, int, int, int]


def _session_row(
    delta: Delta, stored: dict[str, tuple[int, int, int, int]], gone: set[str], top: int
) -> tuple[_Session, int]:
    """The session's row after ``delta``, and how many live rows it held before (none for
    a reset, whose rows so far are at or before the log's last id, ``top``: dead).
    ``Inconsistent`` when the delta does not continue the stored ring exactly."""
    sid, head, new = delta.id, delta.head, delta.firings
    held_before = 0
    if delta.reset:
        base, first_before, since = 0, 1, top
    else:
        row = stored.get(sid)
        if row is None or sid in gone:  # (gone, then back in the same batch: no reset)
            raise Inconsistent(f"session {sid!r} is not in the file, and the change is no reset")
        base, _, first_before, since = row
        held_before = base - first_before + 1
    oldest = delta.oldest
    # the new firings must continue the stored ring exactly, or the file would
    # hold a ring with a hole in it; refuse, and the engine reloads what is stored
    # (one or two firings that start and end where they must are that, and are most)
    start = max(base + 1, oldest)
    if not (
        head >= base
        and len(new) == head - start + 1
        and (not new or (len(new) <= 2 and new[0].seq == start and new[-1].seq == head))
    ):
        problem = gap(delta, base)
        if problem is not None:
            raise Inconsistent(problem)
    # a trim is ``oldest``, moved: the rows before it are dead; a ring never takes
    # back what it trimmed
    first = oldest if delta.reset else max(oldest, first_before)
    return (sid, delta.limit, head, delta.uses, first, since), held_before


class _Tables:
    """A batch's rows, a list a table: built in one pass over the batch (``add``), each
    written in one statement (``write``)."""

    def __init__(self) -> None:
        self.sessions: list[_Session] = []
        self.firings: list[
            tuple[str, int, str, str | None, str | None, str, str | None, str | None]
        ] = []
        self.cursors_replaced: list[tuple[str]] = []
        self.cursors: list[tuple[str, str, int, int]] = []
        self.hooks_changed: list[tuple[str]] = []
        self.hooks: list[tuple[str, str, str]] = []
        self.timers_gone: list[tuple[str, str]] = []
        self.timers: list[tuple[str, str, int, int | None, str, str, str | None, str | None]] = []
        self.groups_replaced: list[tuple[str]] = []
        self.groups: list[tuple[str, str, bytes]] = []

    def add(self, delta: Delta, session: _Session) -> None:
        """The rows ``delta`` changes, skipping the tables it does not."""
        sid = delta.id
        self.sessions.append(session)
        for f in delta.firings:
            tags = tags_column(f.tags) if f.tags else None  # most have none: no call
            self.firings.append((sid, f.seq, f.handler, f.result, f.event, f.ts, tags, f.by))
        if delta.cursors is not None:
            self.cursors_replaced.append((sid,))
            self.cursors.extend((sid, c.name, c.seq, c.last_use) for c in delta.cursors)
        if delta.webhook_changed:
            self.hooks_changed.append((sid,))
            if delta.webhook is not None:
                self.hooks.append((sid, delta.webhook.secret, delta.webhook.handler))
        if delta.groups is not None:
            self.groups_replaced.append((sid,))
            self.groups.extend((sid, g.name, group_bytes(g)) for g in delta.groups)
        if delta.timers_gone:
            self.timers_gone.extend((sid, timer_id) for timer_id in delta.timers_gone)
        if delta.timers:
            self.timers.extend(
                (sid, t.id, t.due_ms, t.every_ms, t.handler, t.text, t.key, tags_column(t.tags))
                for t in delta.timers
            )

    def write(self, conn: sqlite3.Connection) -> int:
        """Every table's rows, a statement a table; returns how many the log gained."""
        conn.executemany(
            'INSERT INTO sessions (id, "limit", head, uses, first, since)'
            " VALUES (?, ?, ?, ?, ?, ?)"
            ' ON CONFLICT (id) DO UPDATE SET "limit" = excluded."limit",'
            " head = excluded.head, uses = excluded.uses, first = excluded.first,"
            " since = excluded.since",
            self.sessions,
        )
        if self.firings:
            conn.executemany(
                "INSERT INTO log (session, seq, handler, result, event, ts, tags, sender)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                self.firings,
            )
        columns = "session, name, seq, last_use"
        _replace(conn, "cursors", columns, self.cursors_replaced, self.cursors)
        _replace(conn, "hooks", "session, secret, handler", self.hooks_changed, self.hooks)
        if self.timers_gone:
            conn.executemany("DELETE FROM timers WHERE session = ? AND id = ?", self.timers_gone)
        if self.timers:
            conn.executemany(
                "INSERT OR REPLACE INTO timers"
                " (session, id, due_ms, every_ms, handler, text, key, tags)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                self.timers,
            )
        _replace(conn, "groups", "session, name, state", self.groups_replaced, self.groups)
        return len(self.firings)


def _replace(
    conn: sqlite3.Connection,
    table: str,
    columns: str,
    sessions: list[tuple[str]],
    rows: Sequence[tuple[object, ...]],
) -> None:
    """Every row of ``table`` of these ``sessions`` replaced with ``rows`` (``columns``)."""
    if sessions:
        marks = ", ".join("?" * len(columns.split(",")))
        conn.executemany(f"DELETE FROM {table} WHERE session = ?", sessions)
        conn.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows)


def _compact(conn: sqlite3.Connection, rows: int, budget: int) -> int:
    """The log's oldest ``budget`` rows away: the live ones among them appended again, the
    rest deleted, by range (the batch's own transaction). Each batch takes away about
    twice what it adds while the log holds more than twice its live rows, so it stays
    within that, at a few rows a send. Returns the log's rows after."""
    edge = conn.execute("SELECT id FROM log ORDER BY id LIMIT 1 OFFSET ?", (budget - 1,)).fetchone()
    if edge is None:  # fewer rows than the budget: all of them
        edge = conn.execute("SELECT coalesce(max(id), 0) FROM log").fetchone()
    (last,) = edge
    moved = conn.execute(
        "INSERT INTO log (session, seq, handler, result, event, ts, tags, sender)"
        " SELECT l.session, l.seq, l.handler, l.result, l.event, l.ts, l.tags, l.sender"
        f" FROM {LIVE} AND l.id <= ? ORDER BY l.id",
        (last,),
    ).rowcount
    deleted = conn.execute("DELETE FROM log WHERE id <= ?", (last,)).rowcount
    return rows + moved - deleted


def _stored_heads(conn: sqlite3.Connection, ids: list[str]) -> dict[str, tuple[int, int, int, int]]:
    """Each stored session's head, limit, first retained seq and since, of ``ids``."""
    found: dict[str, tuple[int, int, int, int]] = {}
    for first in range(0, len(ids), HEADS_AT_ONCE):
        chunk = ids[first : first + HEADS_AT_ONCE]
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(
            f'SELECT id, head, "limit", first, since FROM sessions WHERE id IN ({marks})',
            chunk,
        )
        found.update((sid, (head, limit, low, since)) for sid, head, limit, low, since in rows)
    return found


def _add_keys(conn: sqlite3.Connection, delta: Delta) -> None:
    """A delta's new dedup keys, the newest ``max_keys`` kept."""
    sid = delta.id
    (top,) = conn.execute(
        "SELECT coalesce(max(ord), 0) FROM keys WHERE session = ?", (sid,)
    ).fetchone()
    # a key the core dropped and took again moves to the newest place
    conn.executemany(
        "INSERT OR REPLACE INTO keys (session, key, seq, ord) VALUES (?, ?, ?, ?)",
        [(sid, key, seq, top + i) for i, (key, seq) in enumerate(delta.keys, 1)],
    )
    if top + len(delta.keys) > delta.max_keys:
        conn.execute(
            "DELETE FROM keys WHERE session = ? AND ord <= (SELECT ord FROM keys"
            " WHERE session = ? ORDER BY ord DESC LIMIT 1 OFFSET ?)",
            (sid, sid, delta.max_keys),
        )
