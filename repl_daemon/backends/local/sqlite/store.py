"""The default store: every session in one SQLite file in the daemon's home.

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
page beside the load (``load.PageCheck``).

Only one daemon may use a home at a time: the store holds an exclusive
``flock`` on ``repl.db.lock`` next to the database for as long as it is
open, and the kernel lets go of it when the process dies, however it dies.
A networked store (Redis) cannot lean on a file lock or on one file's
transactions; what it must keep instead is listed in ``repl_daemon.backends.local.store``.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import threading
import zlib
from collections.abc import Collection, Iterator
from functools import partial
from pathlib import Path

import msgspec

from repl_daemon.backends.local.sqlite.failures import (
    DAMAGED,
    Inconsistent,
    NotOurs,
    error_name,
    load_failure,
    open_failure,
    write_failure,
)
from repl_daemon.backends.local.sqlite.load import PageCheck, check_sessions, load_all, unfold
from repl_daemon.backends.local.sqlite.schema import (
    SCHEMA_VERSION,
    check_schema,
)
from repl_daemon.backends.local.sqlite.write import write_batch
from session.delta import Delta
from session.errors import BadSeq, StoreFailed
from session.ring import Fold, Image, Ring, encode_image
from session.scopes import Scope, TokenRecord
from session.session import Snapshot

log = logging.getLogger("repl.daemon")

#: how long a write waits for another program's lock on the file before it fails
BUSY_TIMEOUT = 2.0
#: the WAL file is cut back to this size once checkpointed
WAL_SIZE_LIMIT = 64 << 20

_scope = msgspec.json.Decoder(Scope)


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
        self._pages: PageCheck | None = None
        self._lock_fd = _lock_home(self.path)
        try:
            self._conn = self._connect()
            # check everything before the daemon serves, so that a damaged file stops it
            # with the same clear message as a bad header: every session's row now, and
            # every page of the tables beside the load (``PageCheck``, which ``load``
            # waits for at its end, and a write before it does)
            self._live = check_sessions(self._conn)
        except (sqlite3.Error, NotOurs, Inconsistent) as exc:
            self.close()
            if isinstance(exc, NotOurs):
                raise StoreFailed(str(exc)) from None
            if isinstance(exc, Inconsistent):
                raise StoreFailed(load_failure(self.path, exc)) from None
            raise StoreFailed(open_failure(self.path, exc)) from None
        self._pages = PageCheck(self.path, self._busy_ms)
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
            raise StoreFailed(open_failure(self.path, check.error))
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
            check_schema(conn, self.path)
        except BaseException:
            conn.close()
            raise
        return conn

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
                write_failure(self.path, exc),
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
        except (sqlite3.Error, NotOurs) as exc:
            reason = open_failure(self.path, exc) if isinstance(exc, sqlite3.Error) else exc
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
                yield from load_all(self._connection(), fold=self._fold)
            except (sqlite3.Error, Inconsistent, msgspec.DecodeError) as exc:
                if isinstance(exc, sqlite3.Error) and error_name(exc).startswith(DAMAGED):
                    # a damaged page the load came to first: the page check's words for it
                    raise StoreFailed(open_failure(self.path, exc)) from None
                raise StoreFailed(load_failure(self.path, exc)) from None
            self._checked()  # a daemon serves once every page was read, and not before

    def _fold(self, session_id: str, limit: int, head: int, first: int, since: int) -> Fold:
        return Fold(head - first + 1, partial(self._unfold, session_id, limit, head, first, since))

    def _unfold(self, session_id: str, limit: int, head: int, first: int, since: int) -> Ring:
        """A folded ring's firings: its image, or (damaged, or not the ring's) its rows in the
        log, read in full as a start without images does. ``StoreFailed`` when neither can
        be read, or the log's rows are not the ring: the ring stays folded, and an operation
        that needed it fails and changes nothing."""
        try:
            return unfold(self._reading(), session_id, limit, head, first, since)
        except (sqlite3.Error, Inconsistent, BadSeq) as exc:
            raise StoreFailed(load_failure(self.path, exc)) from None

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
                    for snapshot in load_all(conn, "JOIN temp.wanted AS w ON w.id = s.id"):
                        found[snapshot.id] = snapshot
                finally:
                    conn.execute("DELETE FROM temp.wanted")
                return found
            except (sqlite3.Error, Inconsistent, msgspec.DecodeError) as exc:
                raise StoreFailed(load_failure(self.path, exc)) from None

    def write(self, batch: list[Delta]) -> None:
        """Apply the batch in one transaction; on any failure nothing of it is written."""
        with self._mutex:
            self._checked()
            try:
                conn = self._connection()
                conn.execute("BEGIN IMMEDIATE")
                counts = write_batch(conn, batch, self._counts)
                conn.execute("COMMIT")
                self._counts = counts
            except StoreFailed:
                raise
            except Exception as exc:
                self._abort(exc)
                raise StoreFailed(write_failure(self.path, exc)) from None

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
                raise StoreFailed(write_failure(self.path, exc)) from None

    def load_tokens(self) -> list[TokenRecord]:
        with self._mutex:
            try:
                rows = self._connection().execute(
                    "SELECT name, digest, scope FROM tokens ORDER BY name"
                )
                return [TokenRecord(name, d, _scope.decode(scope)) for name, d, scope in rows]
            except (sqlite3.Error, msgspec.DecodeError) as exc:
                raise StoreFailed(load_failure(self.path, exc)) from None

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
                raise StoreFailed(write_failure(self.path, exc)) from None

    def _abort(self, exc: BaseException) -> None:
        conn = self._conn
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                self._reopen = True  # closing the connection rolls back for sure
        if error_name(exc).startswith("SQLITE_READONLY"):
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
