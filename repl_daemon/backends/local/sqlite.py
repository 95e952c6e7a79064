"""The default store: every session in one SQLite file in the daemon's home.

Why one module of some 1,000 lines: one file format, and every statement that
reads or writes it, is kept in one place, so that a change of a table is a
change of one module (its schema, its batch writer, its loader, its checks at
open and its compaction all read the same columns).

One connection does all the writing, from the committer's worker thread and
never from two threads at once; each batch is one ``BEGIN IMMEDIATE`` ...
``COMMIT`` transaction in WAL mode with ``synchronous = FULL``, so once
``write`` returns the batch is on the disk, and a crash keeps either all of
it or none. When a write fails the transaction is rolled back and
``StoreFailed`` says why in words a user can act on; the same connection
is used again (a read-only one is reopened, so that a database made
writable again is written again without a restart).
Two more connections only read: the event loop's, which brings in the rings a
start left folded, and, at open, one in a thread of its own that reads every
page beside the load (``_PageCheck``).

The file holds these tables: ``sessions`` (limit, head and the cursor-use
clock of each session, with where its firings start in the log), ``log``
(every session's firings, appended in the order they were committed, so a
commit writes the log's last pages whatever sessions it touches: a trim, a
stop or a restart of a session only moves its ``first`` or ``since``, and
compaction takes the dead rows away by range, in the same transactions,
keeping the log within twice its live rows), ``cursors`` (with their last
use, which orders the LRU eviction), ``keys`` (the newest 1,024 dedup
keys of each session, in the order they came), ``timers`` (the pending
timers, rules T1-T6: a firing and its timer's move or deletion are in one
batch, so one transaction) and ``hooks`` (a session's webhook secret and
handler, rules H1-H7), ``tokens`` (the scoped tokens, rules K1-K5: a name, the
SHA-256 of the secret, never the secret, and the scope) and ``rings`` (each
ring's image as the last clean stop left it, ``session.ring.Image``: its
firings still packed, so that a start reads a ring as one blob and the log
only after it, instead of building and packing every firing again, and a
ring the image holds whole not at all until a firing of it is needed
(``Ring.folded``, read then with a reader connection of the event loop's
own); a copy, checked by a CRC, that a damaged or stale one is passed over
for the log, which always holds every live row). ``PRAGMA user_version``
holds the schema's version (8; a file of schema 1 to 7 gets the tables and columns it
lacks when opened: schema 4 added the tags of firings and timers, schema 5
moved the firings into the log, schema 6 added the images, schema 7 the
sender of each firing, its ``by``, NULL in the rows written before, schema 8
the groups and their claims, SPEC §16, a blob a group).

Only one daemon may use a home at a time: the store holds an exclusive
``flock`` on ``repl.db.lock`` next to the database for as long as it is
open, and the kernel lets go of it when the process dies, however it dies.
A networked store (Redis) cannot lean on a file lock or on one file's
transactions; what it must keep instead is listed in ``repl_daemon.backends.local.store``.

Seqs are SQLite integers here, so they stop at 2**63 - 1 (a billion
firings a second would take three hundred years to get there).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import sys
import threading
import zlib
from collections.abc import Callable, Collection, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from session.delta import CursorState, Delta, Webhook, gap
from session.errors import BadSeq, ReplError, StoreFailed
from session.firing import NO_TAGS, Firing
from session.group import GroupSnapshot
from session.names import check_session_id
from session.ring import Fold, Image, Ring, check_limit, decode_image, encode_image
from session.schedule import Timer
from session.scopes import Scope, TokenRecord
from session.session import Snapshot

log = logging.getLogger("repl.daemon")

SCHEMA_VERSION = 8
#: how long a write waits for another program's lock on the file before it fails
BUSY_TIMEOUT = 2.0
#: the WAL file is cut back to this size once checkpointed
WAL_SIZE_LIMIT = 64 << 20

_scope = msgspec.json.Decoder(Scope)

_SCHEMA = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    "limit" INTEGER NOT NULL,
    head INTEGER NOT NULL,
    uses INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE firings (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    handler TEXT NOT NULL,
    result TEXT,
    event TEXT,
    ts TEXT NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE cursors (
    session TEXT NOT NULL,
    name TEXT NOT NULL,
    seq INTEGER NOT NULL,
    last_use INTEGER NOT NULL,
    PRIMARY KEY (session, name)
) WITHOUT ROWID;
CREATE TABLE keys (
    session TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    ord INTEGER NOT NULL,
    PRIMARY KEY (session, ord),
    UNIQUE (session, key)
) WITHOUT ROWID;
"""

# schema 2 adds the pending timers (rules T1-T6) and the webhooks (rules H1-H7); a schema-1
# file gets the tables at open
_SCHEMA_2 = """
CREATE TABLE timers (
    session TEXT NOT NULL,
    id TEXT NOT NULL,
    due_ms INTEGER NOT NULL,
    every_ms INTEGER,
    handler TEXT NOT NULL,
    text TEXT NOT NULL,
    key TEXT,
    PRIMARY KEY (session, id)
) WITHOUT ROWID;
CREATE TABLE hooks (
    session TEXT PRIMARY KEY,
    secret TEXT NOT NULL,
    handler TEXT NOT NULL
) WITHOUT ROWID;
"""

# schema 3 adds the scoped tokens (rules K1-K5); the scope is JSON (patterns and rights)
_SCHEMA_3 = """
CREATE TABLE tokens (
    name TEXT PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    scope TEXT NOT NULL
) WITHOUT ROWID;
"""

# schema 4 adds a firing's tags and a timer's (the tags its firings carry): JSON objects,
# NULL when none (so a firing without tags costs nothing more than before)
_SCHEMA_4 = """
ALTER TABLE firings ADD COLUMN tags TEXT;
ALTER TABLE timers ADD COLUMN tags TEXT;
"""

# schema 5 keeps the firings in an append-only log, so that a commit's new firings land
# on the log's last pages whatever sessions they are for (a table clustered by session
# wrote a page a touched session). A session's rows in it are those after its ``since``
# (the log's last id before its newest start) from its ``first`` retained seq on; older
# ones are dead, and compaction (``_compact``) takes them away by range.
_SCHEMA_5 = """
ALTER TABLE sessions ADD COLUMN first INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sessions ADD COLUMN since INTEGER NOT NULL DEFAULT 0;
CREATE TABLE log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    handler TEXT NOT NULL,
    result TEXT,
    event TEXT,
    ts TEXT NOT NULL,
    tags TEXT
);
INSERT INTO log (session, seq, handler, result, event, ts, tags)
    SELECT session, seq, handler, result, event, ts, tags FROM firings ORDER BY session, seq;
UPDATE sessions SET first = coalesce(
    (SELECT min(seq) FROM firings WHERE firings.session = sessions.id), head + 1);
DROP TABLE firings;
"""
# schema 6 keeps each ring's image as a clean stop left it (``session.ring.Image``: the
# ring's items still packed, so a restart does not build and pack every firing again). An
# image is a copy, never the truth: the log still holds every live row. It holds the
# session's live rows up to the log's id ``mark`` (the last one when it was taken), its
# newest seq ``head``; the session's rows after ``mark`` and ``head`` are what came since,
# and a reset (``since`` moves) or a stop leaves it no longer the session's.
_SCHEMA_6 = """
CREATE TABLE rings (
    session TEXT PRIMARY KEY,
    since INTEGER NOT NULL,
    mark INTEGER NOT NULL,
    head INTEGER NOT NULL,
    image BLOB NOT NULL,
    crc INTEGER NOT NULL
);
"""
# schema 7 adds who sent each firing (its ``by``; ``sender``, since BY is SQL's word):
# NULL in the rows written before, and read back as None, never a guessed name
_SCHEMA_7 = """
ALTER TABLE log ADD COLUMN sender TEXT;
"""
# schema 8 adds the groups and their claims (SPEC §16): a group a row, its whole state
# (``session.group.GroupSnapshot``) one MessagePack blob, rewritten when it changes
_SCHEMA_8 = """
CREATE TABLE groups (
    session TEXT NOT NULL,
    name TEXT NOT NULL,
    state BLOB NOT NULL,
    PRIMARY KEY (session, name)
) WITHOUT ROWID;
"""
#: what each schema after the first added (timers and hooks, tokens, tags, the log, rings,
#: senders, groups)
_UPGRADES = (_SCHEMA_2, _SCHEMA_3, _SCHEMA_4, _SCHEMA_5, _SCHEMA_6, _SCHEMA_7, _SCHEMA_8)
#: the log's live rows: those of a session after its ``since``, from its ``first`` seq on
_LIVE_ROW = "l.id > s.since AND l.seq >= s.first"
_LIVE = f"log AS l JOIN sessions AS s ON s.id = l.session WHERE {_LIVE_ROW}"
#: compaction starts once the log holds more than twice its live rows and this many more
COMPACT_SLACK = 4096

_group_bytes = msgspec.msgpack.Encoder().encode
_group_of = msgspec.msgpack.Decoder(GroupSnapshot).decode
_tags_json = msgspec.json.Encoder()
_tags_of = msgspec.json.Decoder(dict[str, str]).decode


def _tags_column(tags: dict[str, str] | None) -> str | None:
    return _tags_json.encode(tags).decode() if tags else None


def _tags(column: str | None) -> dict[str, str]:
    return NO_TAGS if column is None else _tags_of(column)


# what a user can do about each kind of failure, by SQLite's error name
_HINTS = {
    "SQLITE_FULL": "free some space on its disk",
    "SQLITE_READONLY": "make it (and its directory) writable by the daemon's user",
    "SQLITE_BUSY": "another program holds a write lock on it",
    "SQLITE_IOERR": "check the disk and the system log",
    "SQLITE_CORRUPT": "the file is damaged: restore it from a backup",
    "SQLITE_CANTOPEN": "check that the daemon's user can read and write it and its directory",
}


class _Inconsistent(Exception):
    """A change that does not follow from what the file holds (a bug, or a foreign edit)."""


class _NotOurs(Exception):
    """The file is a database, but not one this repl can use."""


class SqliteStore:
    """Sessions in an SQLite file; see the module's docstring for the guarantees."""

    durable = True

    def __init__(self, path: Path | str, *, busy_timeout: float = BUSY_TIMEOUT) -> None:
        """Lock the home, open (or create) the database; ``StoreFailed`` when it cannot."""
        self.path = Path(path)
        self.name = f"sqlite:{self.path}"
        self._busy_ms = int(busy_timeout * 1000)
        # never two users of the connection at once: the committer's thread
        # writes, the event loop reads back after a failed write
        self._mutex = threading.Lock()
        self._reopen = False
        self._conn: sqlite3.Connection | None = None
        # the event loop's own, for folded rings (``load``): never the writer's, which a
        # commit may hold for milliseconds, and never written with
        self._reader: sqlite3.Connection | None = None
        # the read of every page, beside the load (``_checked``)
        self._pages: _PageCheck | None = None
        self._lock_fd = _lock_home(self.path)
        try:
            self._conn = self._connect()
            # check everything before the daemon serves, so that a damaged file stops it
            # with the same clear message as a bad header: every session's row now, and
            # every page of the tables beside the load (``_PageCheck``, which ``load``
            # waits for at its end, and a write before it does)
            self._live = _check_sessions(self._conn)
        except (sqlite3.Error, _NotOurs, _Inconsistent) as exc:
            self.close()
            if isinstance(exc, _NotOurs):
                raise StoreFailed(str(exc)) from None
            if isinstance(exc, _Inconsistent):
                raise StoreFailed(_load_failure(self.path, exc)) from None
            raise StoreFailed(_open_failure(self.path, exc)) from None
        self._pages = _PageCheck(self.path, self._busy_ms)
        #: the log's rows and the live ones among them (compaction keeps the first within
        #: twice the second), once the page check has counted them
        self._counts = (0, self._live)

    def _checked(self) -> None:
        """Wait for the page check begun at open; ``StoreFailed`` when it found damage."""
        check = self._pages
        if check is None:
            return
        check.join()
        if check.error is not None:
            raise StoreFailed(_open_failure(self.path, check.error))
        self._pages = None
        self._counts = (check.rows, self._live)
        self._probe_writable()  # a file found damaged is never written

    # -- opening -----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        """A configured connection to a database with our schema (created when empty)."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            # reads the header first: a file that is not a database fails here, unwritten
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode != "wal":  # a file system without shared memory (NFS): still atomic
                log.warning("%s cannot use WAL mode (it is in %s mode)", self.path, mode)
            conn.execute("PRAGMA synchronous = FULL")
            # a burst of big firings grows the WAL; give the space back after it
            conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
            self._check_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version == SCHEMA_VERSION:
            return
        if 1 <= version < SCHEMA_VERSION:  # written by an older repl: what it lacks
            missing = " ".join(_UPGRADES[version - 1 :])
            conn.executescript(
                f"BEGIN IMMEDIATE; {missing} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            )
            return
        if version > SCHEMA_VERSION:
            raise _NotOurs(
                f"{self.path} was written by a newer repl (schema {version}; this one "
                f"reads {SCHEMA_VERSION}): run the newer repl, or give this one another --home"
            )
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
        if tables:
            raise _NotOurs(
                f"{self.path} is an SQLite database but not repl's (it holds "
                f"{', '.join(sorted(tables)[:5])}): move it away, or give the daemon another --home"
            )
        conn.executescript(
            f"BEGIN IMMEDIATE; {_SCHEMA} {' '.join(_UPGRADES)} "
            f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        )

    def _probe_writable(self) -> None:
        """Say at start when the file cannot be written; reads are served all the same."""
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._abort(exc)
            log.warning(
                "%s; reads are served, and every change fails until that is fixed",
                _write_failure(self.path, exc),
            )

    def _connection(self) -> sqlite3.Connection:
        """The open connection, or a new one (to drop a read-only one, or a broken one)."""
        if self._conn is not None and not self._reopen:
            return self._conn
        if self._lock_fd < 0:  # closed: without the lock it must not write again
            raise StoreFailed(f"the store {self.path} is closed")
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        try:
            self._conn = self._connect()
        except (sqlite3.Error, _NotOurs) as exc:
            reason = _open_failure(self.path, exc) if isinstance(exc, sqlite3.Error) else exc
            raise StoreFailed(str(reason)) from None
        self._reopen = False
        return self._conn

    # -- the Store protocol -------------------------------------------------

    def load(self) -> Iterator[Snapshot]:
        """Every session, one at a time, in id order: one ordered scan a table (not a query a
        session), merged, so that no more than one session's rows are held at once (a
        restart's peak and steady memory are those of the sessions it hosts). A ring whose
        image is whole (a clean stop's, with nothing after it) comes folded: its image is
        read when the ring is first looked into (``Ring.folded``, ``_unfold``), so a start
        reads no image and a ring costs memory once it is used."""
        with self._mutex:
            try:
                yield from _load_all(self._connection(), fold=self._fold)
            except (sqlite3.Error, _Inconsistent, msgspec.DecodeError) as exc:
                if isinstance(exc, sqlite3.Error) and _error_name(exc).startswith(_DAMAGED):
                    # a damaged page the load came to first: the page check's words for it
                    raise StoreFailed(_open_failure(self.path, exc)) from None
                raise StoreFailed(_load_failure(self.path, exc)) from None
            self._checked()  # a daemon serves once every page was read, and not before

    def _fold(self, session_id: str, limit: int, head: int, first: int, since: int) -> Fold:
        return Fold(head - first + 1, partial(self._unfold, session_id, limit, head, first, since))

    def _unfold(self, session_id: str, limit: int, head: int, first: int, since: int) -> Ring:
        """A folded ring's firings: its image, or (damaged, or not the ring's) its rows in the
        log, read in full as a start without images does. ``StoreFailed`` when neither can
        be read, or the log's rows are not the ring: the ring stays folded, and an operation
        that needed it fails and changes nothing."""
        try:
            conn = self._reading()
            row = conn.execute(
                "SELECT image, crc FROM rings WHERE session = ? AND since = ? AND head = ?",
                (session_id, since, head),
            ).fetchone()
            image = None if row is None else _image(session_id, row[0], row[1], first)
            if image is not None and len(image.items) == head - first + 1:
                return Ring.from_image(limit, head, image)
            if image is not None:
                log.warning(
                    "the image of session %r's ring is not its ring; its firings "
                    "are read from the log",
                    session_id,
                )
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM log AS l WHERE l.session = ? AND l.id > ?"
                " AND l.seq >= ? ORDER BY l.seq",
                (session_id, since, first),
            )
            firings = [_firing(row) for row in rows]
            if len(firings) != head - first + 1:
                raise _Inconsistent(
                    f"session {session_id!r} holds {len(firings)} firing(s) where its "
                    f"ring keeps {head - first + 1}"
                )
            return Ring(limit, head, firings)
        except (sqlite3.Error, _Inconsistent, BadSeq) as exc:
            raise StoreFailed(_load_failure(self.path, exc)) from None

    def _reading(self) -> sqlite3.Connection:
        if self._reader is None:
            if self._lock_fd < 0:
                raise StoreFailed(f"the store {self.path} is closed")
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA query_only = 1")
            self._reader = conn
        return self._reader

    def load_sessions(self, session_ids: Collection[str]) -> dict[str, Snapshot | None]:
        """These sessions as the file holds them (None for one it does not): one read of
        the log for them all, which has no index by session."""
        with self._mutex:
            try:
                conn = self._conn if self._conn is not None else self._connection()
                found: dict[str, Snapshot | None] = dict.fromkeys(session_ids)
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS wanted (id TEXT PRIMARY KEY)")
                conn.execute("DELETE FROM temp.wanted")
                conn.executemany(
                    "INSERT OR IGNORE INTO temp.wanted VALUES (?)", [(i,) for i in found]
                )
                try:
                    for snapshot in _load_all(conn, "JOIN temp.wanted AS w ON w.id = s.id"):
                        found[snapshot.id] = snapshot
                finally:
                    conn.execute("DELETE FROM temp.wanted")
                return found
            except (sqlite3.Error, _Inconsistent, msgspec.DecodeError) as exc:
                raise StoreFailed(_load_failure(self.path, exc)) from None

    def write(self, batch: list[Delta]) -> None:
        """Apply the batch in one transaction; on any failure nothing of it is written."""
        with self._mutex:
            self._checked()
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                counts = _write_batch(conn, batch, self._counts)
                conn.execute("COMMIT")
                self._counts = counts
            except StoreFailed:
                raise
            except Exception as exc:
                self._abort(exc)
                raise StoreFailed(_write_failure(self.path, exc)) from None

    def keep_images(self, images: list[tuple[str, Image]]) -> int:
        """Keep these rings' images (a clean stop's, ``Ring.image``) in one transaction, each
        only where the file's ring is that ring (the same head and first retained seq); an
        image kept before of a session not among them stays, as right as it was. Returns how
        many were kept."""
        with self._mutex:
            self._checked()
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                (mark,) = conn.execute("SELECT coalesce(max(id), 0) FROM log").fetchone()
                rows = []
                for session_id, image in images:
                    try:
                        data = encode_image(image)
                    except UnicodeEncodeError:  # text UTF-8 cannot carry: the log has it
                        continue
                    crc, head, first = zlib.crc32(data), image.head, image.first
                    rows.append((session_id, mark, head, data, crc, session_id, head, first))
                kept = conn.executemany(
                    "INSERT OR REPLACE INTO rings (session, since, mark, head, image, crc)"
                    " SELECT ?, s.since, ?, ?, ?, ? FROM sessions AS s"
                    " WHERE s.id = ? AND s.head = ? AND s.first = ?",
                    rows,
                ).rowcount
                conn.execute("COMMIT")
                return kept
            except Exception as exc:
                self._abort(exc)
                raise StoreFailed(_write_failure(self.path, exc)) from None

    def load_tokens(self) -> list[TokenRecord]:
        with self._mutex:
            try:
                rows = self._connection().execute(
                    "SELECT name, digest, scope FROM tokens ORDER BY name"
                )
                return [TokenRecord(name, d, _scope.decode(scope)) for name, d, scope in rows]
            except (sqlite3.Error, msgspec.DecodeError) as exc:
                raise StoreFailed(_load_failure(self.path, exc)) from None

    def put_token(self, record: TokenRecord) -> None:
        self._token_change(
            "INSERT INTO tokens (name, digest, scope) VALUES (?, ?, ?)",
            (record.name, record.digest, msgspec.json.encode(record.scope).decode()),
        )

    def drop_token(self, name: str) -> None:
        self._token_change("DELETE FROM tokens WHERE name = ?", (name,))

    def _token_change(self, sql: str, args: tuple[str, ...]) -> None:
        with self._mutex:
            self._checked()
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(sql, args)
                conn.execute("COMMIT")
            except StoreFailed:
                raise
            except Exception as exc:
                self._abort(exc)
                raise StoreFailed(_write_failure(self.path, exc)) from None

    def _abort(self, exc: BaseException) -> None:
        conn = self._conn
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                self._reopen = True  # closing the connection rolls back for sure
        if _error_name(exc).startswith("SQLITE_READONLY"):
            # SQLite opened the file read-only; only a new connection sees it writable
            self._reopen = True

    def close(self) -> None:
        with self._mutex:
            if self._pages is not None:  # its connection is its own: let it finish
                self._pages.join()
                self._pages = None
            if self._reader is not None:
                self._reader.close()
                self._reader = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1


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


def _write_batch(
    conn: sqlite3.Connection, batch: list[Delta], counts: tuple[int, int]
) -> tuple[int, int]:
    """A batch's changes, inside its transaction: one statement a table for the whole
    batch (``executemany``), not one a session, and the new firings appended to the log,
    so that a batch's cost grows with what it changes and not with how many sessions it
    touches. ``counts`` are the log's rows and live rows before; returns them after."""
    # Long (some 120 lines) on purpose: each table's rows of the whole batch are built in
    # one pass and written in one statement, and a helper per table would walk the batch
    # once a table (the send's hot path, docs/benchmarks.md)
    rows, live = counts
    named = [d.id for d in batch if not d.gone]
    if len(set(named)) != len(named):
        raise _Inconsistent("a batch names a session twice")
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
    sessions: list[tuple[str, int, int, int, int, int]] = []
    firings: list[tuple[str, int, str, str | None, str | None, str, str | None, str | None]] = []
    cursors_replaced: list[tuple[str]] = []
    cursors: list[tuple[str, str, int, int]] = []
    hooks_changed: list[tuple[str]] = []
    hooks: list[tuple[str, str, str]] = []
    timers_gone: list[tuple[str, str]] = []
    timers: list[tuple[str, str, int, int | None, str, str, str | None, str | None]] = []
    groups_replaced: list[tuple[str]] = []
    groups: list[tuple[str, str, bytes]] = []
    # what a send across many sessions commits is mostly one new firing in each: this loop
    # runs once a touched session, so it looks at each delta's fields once, and skips the
    # tables a delta does not change
    for delta in kept:
        sid, head, new = delta.id, delta.head, delta.firings
        if delta.reset:  # its rows so far are at or before the log's last id: dead
            base, first_before, since = 0, 1, top
        else:
            row = stored.get(sid)
            if row is None or sid in gone:  # (gone, then back in the same batch: no reset)
                raise _Inconsistent(
                    f"session {sid!r} is not in the file, and the change is no reset"
                )
            base, _, first_before, since = row
            live -= base - first_before + 1
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
                raise _Inconsistent(problem)
        # a trim is ``oldest``, moved: the rows before it are dead; a ring never takes
        # back what it trimmed
        first = oldest if delta.reset else max(oldest, first_before)
        live += head - first + 1
        sessions.append((sid, delta.limit, head, delta.uses, first, since))
        for f in new:
            tags = _tags_column(f.tags) if f.tags else None  # most have none: no call
            firings.append((sid, f.seq, f.handler, f.result, f.event, f.ts, tags, f.by))
        if delta.cursors is not None:
            cursors_replaced.append((sid,))
            cursors.extend((sid, c.name, c.seq, c.last_use) for c in delta.cursors)
        if delta.webhook_changed:
            hooks_changed.append((sid,))
            if delta.webhook is not None:
                hooks.append((sid, delta.webhook.secret, delta.webhook.handler))
        if delta.groups is not None:
            groups_replaced.append((sid,))
            groups.extend((sid, g.name, _group_bytes(g)) for g in delta.groups)
        if delta.timers_gone:
            timers_gone.extend((sid, timer_id) for timer_id in delta.timers_gone)
        if delta.timers:
            timers.extend(
                (sid, t.id, t.due_ms, t.every_ms, t.handler, t.text, t.key, _tags_column(t.tags))
                for t in delta.timers
            )
    conn.executemany(
        'INSERT INTO sessions (id, "limit", head, uses, first, since) VALUES (?, ?, ?, ?, ?, ?)'
        ' ON CONFLICT (id) DO UPDATE SET "limit" = excluded."limit",'
        " head = excluded.head, uses = excluded.uses, first = excluded.first,"
        " since = excluded.since",
        sessions,
    )
    if firings:
        conn.executemany(
            "INSERT INTO log (session, seq, handler, result, event, ts, tags, sender)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            firings,
        )
        rows += len(firings)
    if cursors_replaced:
        conn.executemany("DELETE FROM cursors WHERE session = ?", cursors_replaced)
        conn.executemany(
            "INSERT INTO cursors (session, name, seq, last_use) VALUES (?, ?, ?, ?)", cursors
        )
    if hooks_changed:
        conn.executemany("DELETE FROM hooks WHERE session = ?", hooks_changed)
        conn.executemany("INSERT INTO hooks (session, secret, handler) VALUES (?, ?, ?)", hooks)
    if timers_gone:
        conn.executemany("DELETE FROM timers WHERE session = ? AND id = ?", timers_gone)
    if timers:
        conn.executemany(
            "INSERT OR REPLACE INTO timers"
            " (session, id, due_ms, every_ms, handler, text, key, tags)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            timers,
        )
    if groups_replaced:
        conn.executemany("DELETE FROM groups WHERE session = ?", groups_replaced)
        conn.executemany("INSERT INTO groups (session, name, state) VALUES (?, ?, ?)", groups)
    for delta in kept:
        if delta.keys:
            _add_keys(conn, delta)
    if rows > 2 * live + COMPACT_SLACK:
        rows = _compact(conn, rows, 2 * len(firings) + COMPACT_SLACK // 4 + 1)
    return rows, live


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
        f" FROM {_LIVE} AND l.id <= ? ORDER BY l.id",
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


def _timer(
    session_id: str,
    timer_id: str,
    due_ms: int,
    every_ms: int | None,
    handler: str,
    text: str,
    key: str | None,
    tags: str | None,
) -> Timer:
    return Timer(
        id=timer_id,
        session=session_id,
        due_ms=due_ms,
        every_ms=every_ms,
        handler=handler,
        text=text,
        key=key,
        tags=_tags(tags) or None,
    )


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


#: a log row as a firing is read from it (``_firing``)
_COLUMNS = "l.session, l.seq, l.handler, l.result, l.event, l.ts, l.tags, l.sender"


def _firing(row: tuple[Any, ...]) -> Firing:
    _, seq, handler, result, event, ts, tags, by = row
    return Firing(seq, handler, result, event, ts, _tags(tags), by and sys.intern(by))


def _load_all(
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
    # Long (some 100 lines): one pass over one ordered query, which a split would have to
    # hand its cursor and its half-built session from one helper to the next
    imaged = (
        f"FROM sessions AS s {only} LEFT JOIN rings AS r ON r.session = s.id AND r.since = s.since"
    )
    # an image of the session's head has no rows after it, whatever its mark
    without, oldest = conn.execute(
        f"SELECT count(*) - count(r.session), min(CASE WHEN r.head < s.head THEN r.mark END)"
        f" {imaged}"
    ).fetchone()
    if without == 0 and oldest is None:  # every ring is its image: no row of the log is read
        rows: Iterator[tuple[Any, ...]] = iter(())
    elif without == 0:  # every ring has its image: the log's tail
        query = (
            f"SELECT {_COLUMNS} FROM log AS l JOIN sessions AS s ON s.id = l.session {only}"
            " JOIN rings AS r ON r.session = s.id AND r.since = s.since"
            f" WHERE l.id > ? AND {_LIVE_ROW} AND l.id > r.mark AND l.seq > r.head"
            " ORDER BY l.session, l.seq"
        )
        rows = conn.execute(query, (oldest,))
    else:
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM log AS l JOIN sessions AS s ON s.id = l.session {only}"
            " LEFT JOIN rings AS r ON r.session = s.id AND r.since = s.since"
            f" WHERE {_LIVE_ROW} AND (r.session IS NULL OR (l.id > r.mark AND l.seq > r.head))"
            " ORDER BY l.session, l.seq"
        )
    firings = _Rows(rows)

    def of(table: str, columns: str, order: str) -> _Rows:
        narrowed = f"JOIN sessions AS s ON s.id = t.session {only}" if only else ""
        return _Rows(
            conn.execute(
                f"SELECT t.session, {columns} FROM {table} AS t {narrowed}"
                f" ORDER BY t.session, {order}"
            )
        )

    cursors = of("cursors", "t.name, t.seq, t.last_use", "t.last_use")
    keys = of("keys", "t.key, t.seq", "t.ord")
    timers = of(
        "timers",
        "t.id, t.due_ms, t.every_ms, t.handler, t.text, t.key, t.tags",
        "t.due_ms, t.id",
    )
    hooks = of("hooks", "t.secret, t.handler", "t.session")
    groups = of("groups", "t.state", "t.name")
    # a folded ring's image is not read: not even its crc, which comes after it in the row
    # (SQLite would walk the image's overflow pages to reach it)
    whole = "r.head = s.head" if fold is not None else "0"
    sessions = conn.execute(
        f'SELECT s.id, s."limit", s.head, s.uses, s.first, s.since, r.head,'
        f" CASE WHEN {whole} THEN NULL ELSE r.image END,"
        f" CASE WHEN {whole} THEN NULL ELSE r.crc END {imaged} ORDER BY s.id"
    )
    for session_id, limit, head, uses, first, since, image_head, data, crc in sessions:
        hook = hooks.of(session_id)
        tail = firings.of(session_id)
        folded = None
        if fold is not None and image_head == head:
            if not tail:
                folded = fold(session_id, limit, head, first, since)
            else:  # rows past the session's head: the check below refuses them
                data, crc = conn.execute(
                    "SELECT image, crc FROM rings WHERE session = ?", (session_id,)
                ).fetchone()
        image = None if data is None else _image(session_id, data, crc, first)
        if data is not None and image is None:  # damaged: the log has every live row
            tail = list(
                conn.execute(
                    f"SELECT {_COLUMNS} FROM log AS l WHERE l.session = ? AND l.id > ?"
                    " AND l.seq >= ? ORDER BY l.seq",
                    (session_id, since, first),
                )
            )
        snapshot = Snapshot(
            id=session_id,
            limit=limit,
            head=head,
            firings=[_firing(row) for row in tail],
            cursors=[CursorState(name, seq, use) for _, name, seq, use in cursors.of(session_id)],
            uses=uses,
            keys=[(key, seq) for _, key, seq in keys.of(session_id)],
            timers=[_timer(*row) for row in timers.of(session_id)],
            webhook=Webhook(hook[0][1], hook[0][2]) if hook else None,
            groups=[_group_of(state) for _, state in groups.of(session_id)],
            image=image,
            fold=folded,
        )
        count = head - first + 1 if folded is not None else _check_snapshot(snapshot)
        if count != head - first + 1:
            raise _Inconsistent(
                f"session {session_id!r} holds {count} firing(s) where its "
                f"ring keeps {head - first + 1}"
            )
        yield snapshot


def _image(session_id: str, data: bytes, crc: int, first: int) -> Image | None:
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


def _check_sessions(conn: sqlite3.Connection) -> int:
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
            raise _Inconsistent(exc.message) from None
        count = head - first + 1
        if head < 0 or first < 1 or count < 0 or count > limit:
            raise _Inconsistent(
                f"session {session_id!r} holds {count} firing(s) under limit {limit} "
                f"and head {head} (its first is {first})"
            )
        live += count
    return live


def _read_pages(conn: sqlite3.Connection) -> int:
    """One scan of the log and of each table a load reads whole, which reads every page (a
    damaged one fails it) and builds no row in Python. Returns the log's rows."""
    (rows,) = conn.execute("SELECT count(*) FROM log").fetchone()
    for table in ("cursors", "keys", "timers", "hooks"):  # every page read
        conn.execute(f"SELECT count(*), max(length(session)) FROM {table}").fetchone()
    return int(rows)


class _PageCheck(threading.Thread):
    """``_read_pages`` on a connection of its own, beside the load: SQLite lets go of the
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
                self.rows = _read_pages(conn)
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
        raise _Inconsistent(exc.message) from None
    firings, image = snapshot.firings, snapshot.image
    count = len(firings) + (0 if image is None else len(image.items))
    if snapshot.limit < 0 or snapshot.head < 0 or count > snapshot.limit:
        raise _Inconsistent(
            f"session {snapshot.id!r} holds {count} firing(s) under limit "
            f"{snapshot.limit} and head {snapshot.head}"
        )
    start = snapshot.head - len(firings) + 1  # the seq the first of ``firings`` must have
    if image is not None and image.head != start - 1:
        raise _Inconsistent(
            f"session {snapshot.id!r}'s ring image ends at {image.head}, and the firings "
            f"after it start at {start}"
        )
    if any(firing.seq != seq for seq, firing in enumerate(firings, start)):
        raise _Inconsistent(
            f"session {snapshot.id!r} holds firings {firings[0].seq} to {firings[-1].seq}, "
            f"which are not the newest {len(firings)} up to its head {snapshot.head}"
        )
    return count


def _lock_home(db: Path) -> int:
    """Hold ``<db>.lock`` exclusively, or say which daemon holds it."""
    path = db.with_name(db.name + ".lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StoreFailed(f"cannot create the lock file {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StoreFailed(f"cannot lock {path}: {exc.strerror}") from None
        raise StoreFailed(
            f"another repl daemon is using {db.parent} (pid {holder}): stop it first, "
            "or give this one another --home"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _error_name(exc: BaseException) -> str:
    return getattr(exc, "sqlite_errorname", "") or ""


def _hint(exc: BaseException) -> str:
    name = _error_name(exc)
    for prefix, hint in _HINTS.items():
        if name.startswith(prefix):
            return f": {hint}"
    return ""


def _write_failure(path: Path, exc: BaseException) -> str:
    if isinstance(exc, sqlite3.Error):
        return f"cannot write {path}: {exc}{_hint(exc)}"
    if isinstance(exc, _Inconsistent):
        return f"cannot write {path}: {exc} (a bug in repl: the change is undone)"
    return f"cannot write {path}: {type(exc).__name__}: {exc}"


def _load_failure(path: Path, exc: BaseException) -> str:
    if isinstance(exc, _Inconsistent):
        return (
            f"{path} is not consistent: {exc}: restore it from a backup, "
            "or move it away to start with no sessions"
        )
    return f"cannot read {path}: {exc}{_hint(exc)}"


#: the SQLite errors of a file whose pages are not a database's
_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


def _open_failure(path: Path, exc: sqlite3.Error) -> str:
    name = _error_name(exc)
    if name.startswith(_DAMAGED):
        return (
            f"{path} is not a readable repl database ({exc}): move it away to start "
            "with no sessions, or restore it from a backup"
        )
    return f"cannot open {path}: {exc}{_hint(exc)}"
