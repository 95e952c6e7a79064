"""The SQLite store's file: its tables, the migrations from each older schema, and how a
value is kept in a column (a firing's row, a timer's, tags as JSON, a group as
MessagePack).

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
SHA-256 of the secret, never the secret, and the scope), ``rings`` (each
ring's image as the last clean stop left it, ``session.ring.Image``: its
firings still packed, so that a start reads a ring as one blob and the log
only after it, instead of building and packing every firing again, and a
ring the image holds whole not at all until a firing of it is needed
(``Ring.folded``, read then with a reader connection of the event loop's
own); a copy, checked by a CRC, that a damaged or stale one is passed over
for the log, which always holds every live row) and ``groups`` (a group a row,
SPEC §16). ``PRAGMA user_version`` holds the schema's version (9; a file of
schema 1 to 8 gets the tables and columns it lacks when opened: schema 4 added
the tags of firings and timers, schema 5 moved the firings into the log, schema
6 added the images, schema 7 the sender of each firing, its ``by``, NULL in the
rows written before, schema 8 the groups and their claims, a blob a group,
schema 9 no table but images whose tagged firings are packed, which a repl of
schema 8 would misread, so it refuses the file instead).

Seqs are SQLite integers here, so they stop at 2**63 - 1 (a billion
firings a second would take three hundred years to get there).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import msgspec

from repl_daemon.backends.local.sqlite.failures import NotOurs
from session.firing import NO_TAGS, Firing
from session.group import GroupSnapshot
from session.schedule import Timer

SCHEMA_VERSION = 9

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
# schema 9 changes no table: a ring's image may now hold tagged firings packed, their tag
# keys in the image's ``keys`` (issue 50). An image of schema 8 reads back the same; the
# version is raised so that a repl of schema 8 refuses the file (``NotOurs``: "written by
# a newer repl") rather than read a packed tagged firing's values as part of its text
_SCHEMA_9 = ""
#: what each schema after the first added (timers and hooks, tokens, tags, the log, rings,
#: senders, groups, packed tagged firings)
_UPGRADES = (
    _SCHEMA_2,
    _SCHEMA_3,
    _SCHEMA_4,
    _SCHEMA_5,
    _SCHEMA_6,
    _SCHEMA_7,
    _SCHEMA_8,
    _SCHEMA_9,
)
#: the log's live rows: those of a session after its ``since``, from its ``first`` seq on
LIVE_ROW = "l.id > s.since AND l.seq >= s.first"
LIVE = f"log AS l JOIN sessions AS s ON s.id = l.session WHERE {LIVE_ROW}"
#: a log row as a firing is read from it (``firing_of``)
COLUMNS = "l.session, l.seq, l.handler, l.result, l.event, l.ts, l.tags, l.sender"

group_bytes = msgspec.msgpack.Encoder().encode
group_of = msgspec.msgpack.Decoder(GroupSnapshot).decode
_tags_json = msgspec.json.Encoder()
_tags_decode = msgspec.json.Decoder(dict[str, str]).decode


def tags_column(tags: dict[str, str] | None) -> str | None:
    return _tags_json.encode(tags).decode() if tags else None


def tags_of(column: str | None) -> dict[str, str]:
    return NO_TAGS if column is None else _tags_decode(column)


def firing_of(row: tuple[Any, ...]) -> Firing:
    _, seq, handler, result, event, ts, tags, by = row
    return Firing(seq, handler, result, event, ts, tags_of(tags), by and sys.intern(by))


def timer_of(
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
        tags=tags_of(tags) or None,
    )


def check_schema(conn: sqlite3.Connection, path: Path) -> None:
    """Our schema in ``conn``: what an older repl's file lacks added, an empty file's
    tables made; ``NotOurs`` for a newer repl's file or another program's database."""
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
        raise NotOurs(
            f"{path} was written by a newer repl (schema {version}; this one "
            f"reads {SCHEMA_VERSION}): run the newer repl, or give this one another --home"
        )
    tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master")]
    if tables:
        raise NotOurs(
            f"{path} is an SQLite database but not repl's (it holds "
            f"{', '.join(sorted(tables)[:5])}): move it away, or give the daemon another --home"
        )
    conn.executescript(
        f"BEGIN IMMEDIATE; {_SCHEMA} {' '.join(_UPGRADES)} "
        f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
    )
