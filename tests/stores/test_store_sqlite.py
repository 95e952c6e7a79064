"""The SQLite store's own duties: its file, its lock, its failures, its load time.

Real files in the test's directory; a second ``sqlite3`` connection plays
the other program where one is needed (a lock holder, a hand edit).
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

import pytest

from repl_daemon.backends.local.sqlite import SCHEMA_VERSION, SqliteStore
from repl_daemon.backends.local.sqlite import write as sqlite_write
from session.delta import Delta
from session.errors import StoreFailed
from session.firing import CursorInfo, Firing
from session.ring import Image, encode_image
from session.rules import READ
from session.schedule import Timer
from session.scopes import Scope, TokenRecord, digest
from session.session import CursorState, Session, Snapshot
from session.tags import Match
from tests.helpers import TS, Mirror, counted


def filled(path: Path, sessions: int = 3, firings: int = 50) -> SqliteStore:
    store = SqliteStore(path)
    for n in range(sessions):
        m = Mirror(f"s{n}")
        for i in range(firings):
            m.record(f"text {i} " * 8, key=f"k{i}")
        m.session.ack("read", firings // 2)
        store.write([m.delta()])
    return store


def _as_schema_4(conn: sqlite3.Connection) -> None:
    """A schema-5 file made as the repl of schema 4 wrote it: the firings in a table of
    their own, by session, and no log."""
    conn.executescript(
        """
        CREATE TABLE firings (session TEXT NOT NULL, seq INTEGER NOT NULL,
            handler TEXT NOT NULL, result TEXT, event TEXT, ts TEXT NOT NULL, tags TEXT,
            PRIMARY KEY (session, seq)) WITHOUT ROWID;
        INSERT INTO firings SELECT l.session, l.seq, l.handler, l.result, l.event, l.ts,
            l.tags FROM log AS l JOIN sessions AS s ON s.id = l.session
            WHERE l.id > s.since AND l.seq >= s.first;
        DROP TABLE log;
        ALTER TABLE sessions DROP COLUMN first;
        ALTER TABLE sessions DROP COLUMN since;
        PRAGMA user_version = 4;
        """
    )


def test_the_file_has_the_documented_schema(tmp_path: Path) -> None:
    db = tmp_path / "repl.db"
    filled(db).close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        columns = {
            table: [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            for table in ("sessions", "log", "cursors", "keys", "timers", "hooks", "rings")
        }
        count = conn.execute("SELECT count(*) FROM log WHERE session = 's0'").fetchone()
    conn.close()
    assert columns == {
        "sessions": ["id", "limit", "head", "uses", "first", "since"],
        "log": ["id", "session", "seq", "handler", "result", "event", "ts", "tags", "sender"],
        "cursors": ["session", "name", "seq", "last_use"],
        "keys": ["session", "key", "seq", "ord"],
        "timers": ["session", "id", "due_ms", "every_ms", "handler", "text", "key", "tags"],
        "hooks": ["session", "secret", "handler"],
        "rings": ["session", "since", "mark", "head", "image", "crc"],
    }
    assert count == (50,)


@pytest.mark.parametrize(
    ("version", "dropped"),
    [
        (1, ("timers", "hooks", "tokens")),
        (2, ("tokens",)),
        (3, ()),
        (4, ()),
        (5, ()),
        (6, ()),
        (7, ()),
    ],
)
def test_an_older_file_opens_with_its_sessions_and_gains_the_newer_tables(
    tmp_path: Path, version: int, dropped: tuple[str, ...]
) -> None:
    """A home written by the repl before timers (1), before tokens (2), before tags (3) or
    before the firings' log (4) or before the rings' images (5) or before senders (6) or
    before groups (7): it opens, keeps everything (the firings moved to the log), and takes
    timers, tokens and tagged firings."""
    db = tmp_path / "repl.db"
    filled(db, sessions=2, firings=5).close()
    with sqlite3.connect(db) as conn:  # back to what that repl wrote
        conn.execute("DROP TABLE groups")
        if version < 7:
            conn.execute("ALTER TABLE log DROP COLUMN sender")
        if version < 6:
            conn.execute("DROP TABLE rings")
        if version < 5:
            _as_schema_4(conn)
        for table in dropped:
            conn.execute(f"DROP TABLE {table}")
        if version < 4:
            conn.execute("ALTER TABLE firings DROP COLUMN tags")
            if "timers" not in dropped:
                conn.execute("ALTER TABLE timers DROP COLUMN tags")
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    store = SqliteStore(db)
    before = {snap.id: snap for snap in store.load()}
    assert sorted(before) == ["s0", "s1"] and before["s0"].head == 5
    assert all(f.tags == {} for f in before["s0"].firings)
    m = Mirror("s0")
    m.session = Session.restore(before["s0"])
    tags = {"corr": "c-1", "reply-to": "me"}
    m.session.schedule(
        Timer(id="t1", session="s0", due_ms=5, handler="on-tick", text="x", tags={"k": "v"})
    )
    m.session.record("on-message", "tagged", "2026-12-01T00:00:00.000Z", tags=tags, by="agent")
    store.write([m.delta()])
    token = TokenRecord("agent", digest("secret"), Scope(("team-a.*",), frozenset({READ})))
    store.put_token(token)
    store.close()
    store = SqliteStore(db)
    after = {snap.id: snap for snap in store.load()}["s0"]
    (timer,) = after.timers
    assert (timer.id, timer.due_ms, timer.handler, timer.tags) == ("t1", 5, "on-tick", {"k": "v"})
    assert after.firings[-1].tags == tags and after.firings[0].tags == {}
    assert after.firings[-1].by == "agent" and after.firings[0].by is None
    assert store.load_tokens() == [token]
    store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    conn.close()


#: a home's database as the repl before senders (schema 6, commit 1ddc883) wrote it: a
#: daemon sent "plain one", "tagged" (k=v) and "from agent" (a scoped token "agent") to
#: ``inbox`` and stopped cleanly (an image of the three), then recorded an unhandled
#: on-build firing after the image, acknowledged cursor ``w`` to 2 and was killed -9
SCHEMA_6 = Path(__file__).parent / "data" / "schema-6.db"


def test_a_database_written_before_senders_reads_every_firing_with_by_none(
    tmp_path: Path,
) -> None:
    db = tmp_path / "repl.db"
    db.write_bytes(SCHEMA_6.read_bytes())
    store = SqliteStore(db)
    (snap,) = store.load()
    session = Session.restore(snap)
    firings = session.read_after(0).firings
    assert [(f.seq, f.result or f.event, f.tags, f.by) for f in firings] == [
        (1, "plain one", {}, None),
        (2, "tagged", {"k": "v"}, None),
        (3, "from agent", {}, None),  # the token is known, but never guessed
        (4, "after the image", {}, None),
    ]
    assert session.cursor_table() == [CursorInfo("w", 2, 2)]
    assert [t.name for t in store.load_tokens()] == ["agent"]
    m = Mirror("inbox")
    m.session = session
    m.session.record("on-message", "now", TS, by="root")
    store.write([m.delta()])
    store.close()
    store = SqliteStore(db)
    (snap,) = store.load()
    assert [f.by for f in Session.restore(snap).read_after(0).firings] == [None] * 4 + ["root"]
    store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
    conn.close()


#: a home's database as the repl before tagged firings were packed (schema 8, commit
#: bf6bb78) wrote it, with its own ``SqliteStore`` and ``Session`` (the script below):
#: 20 sends to ``inbox`` (ring of 16) of ``TAGGED_SENDS`` in turn, each with its key, an
#: image of the ring (its tagged firings in it as ``Firing`` maps), then two sends after
#: the image (in the log only) and cursor ``w`` acknowledged to 18.
SCHEMA_8_TAGGED = Path(__file__).parent / "data" / "schema-8-tagged.db"
TAGGED_TS = "2026-01-02T03:04:05.678Z"
TAGGED_SENDS: list[tuple[str, str, str, dict[str, str], str | None]] = [
    ("on-message", "plain one", TAGGED_TS, {}, None),
    (
        "on-message",
        "tagged",
        TAGGED_TS,
        {"reply-to": "agent-7", "corr": "c-1", "kind": "review", "prio": "2"},
        "agent",
    ),
    ("on-build", "unhandled tagged", TAGGED_TS, {"k": "v"}, "root"),
    (
        "on-message",
        "ünïcode ✓",
        "2026-01-02T03:04:06.001Z",
        {"kind": "日本語 🎉", "empty": ""},
        None,
    ),
    ("on-message", "many", TAGGED_TS, {f"k{i}": f"v{i}" * i for i in range(16)}, "timer"),
    ("on-message", "odd ts", "a ts of another form", {"corr": "c-2"}, None),
    ("on-message", "nul\x00inside", TAGGED_TS, {"a.b_c-d": "x\x00y", "z": "\n\t"}, None),
]
# The script, run with the code of bf6bb78 (``store``: SqliteStore(path)):
#     s = Session("inbox", 16)
#     for n in range(20):
#         handler, text, ts, tags, by = TAGGED_SENDS[n % 7]
#         s.record(handler, f"{text} {n}", ts, tags=tags, by=by, key=f"k{n}")
#     store.write([s.take_delta()]); store.keep_images([("inbox", s.ring.image())])
#     s.record("on-message", "after the image", TAGGED_TS,
#              tags={"reply-to": "me", "corr": "c-9"}, by="agent")
#     s.record("on-message", "plain after", TAGGED_TS)
#     s.read("w"); s.ack("w", 18); store.write([s.take_delta()]); store.close()


def tagged_fixture_firings() -> list[Firing]:
    """What the repl of the fixture read back from it: the ring's newest 16."""
    firings = []
    for n in range(20):
        handler, text, ts, tags, by = TAGGED_SENDS[n % len(TAGGED_SENDS)]
        handled = handler == "on-message"
        result, event = (f"{text} {n}", None) if handled else (None, f"{text} {n}")
        firings.append(Firing(n + 1, handler, result, event, ts, tags, by))
    after = {"reply-to": "me", "corr": "c-9"}
    firings.append(Firing(21, "on-message", "after the image", None, TAGGED_TS, after, "agent"))
    firings.append(Firing(22, "on-message", "plain after", None, TAGGED_TS))
    return firings[-16:]


def test_a_database_written_before_tagged_firings_were_packed_reads_back_the_same(
    tmp_path: Path,
) -> None:
    """Its image holds tagged firings as ``Firing`` maps, and the ring keeps them so; what
    is recorded now packs its tags, and an image of both kinds, kept and read again, gives
    the same firings, matched the same."""
    db = tmp_path / "repl.db"
    db.write_bytes(SCHEMA_8_TAGGED.read_bytes())
    store = SqliteStore(db)
    with sqlite3.connect(db) as conn:  # raised, so that a repl of schema 8 refuses it now
        assert conn.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,) == (9,)
    conn.close()
    (snap,) = store.load()
    session = Session.restore(snap)
    expected = tagged_fixture_firings()
    assert session.read_after(0).firings == expected
    assert session.cursor_table() == [CursorInfo("w", 18, 4)]
    corr = Match({"corr": "c-1"})
    assert [f.seq for f in session.read_after(0, match=corr).firings] == [9, 16]
    m = Mirror("inbox")
    m.session = session
    now = {"corr": "c-1", "kind": "日本語 🎉"}
    session.record("on-message", "now", TAGGED_TS, tags=now, by="root")
    expected = [*expected[1:], Firing(23, "on-message", "now", None, TAGGED_TS, now, "root")]
    assert isinstance(session.ring._firings[-1], bytes)  # packed, tags and all
    store.write([m.delta()])
    assert store.keep_images([("inbox", session.ring.image())]) == 1
    store.close()
    for _ in range(2):  # from the new image; then from the log alone
        store = SqliteStore(db)
        (snap,) = store.load()
        again = Session.restore(snap)
        assert again.read_after(0).firings == expected
        assert [f.seq for f in again.read_after(0, match=corr).firings] == [9, 16, 23]
        store.close()
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM rings")
        conn.close()


def test_a_second_store_on_the_same_file_is_refused_until_the_first_closes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "repl.db"
    first = SqliteStore(db)
    with pytest.raises(StoreFailed) as refused:
        SqliteStore(db)
    assert str(refused.value) == (
        f"another repl daemon is using {tmp_path} (pid {os.getpid()}): "
        "stop it first, or give this one another --home"
    )
    first.close()
    SqliteStore(db).close()


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "repl.db"
    garbage = b"this is not an SQLite file\n" * 500
    db.write_bytes(garbage)
    with pytest.raises(StoreFailed, match=r"is not a readable repl database.*move it away"):
        SqliteStore(db)
    assert db.read_bytes() == garbage
    assert not (tmp_path / "repl.db-wal").exists()
    # the refusal let go of the lock: once the file is moved away, it starts
    db.rename(tmp_path / "repl.db.bad")
    SqliteStore(db).close()


def test_a_damaged_page_is_found_before_the_store_serves_and_the_file_left_alone(
    tmp_path: Path,
) -> None:
    """A page of the log damaged: the open reads every page beside the load (a thread of
    its own), and the load, or a write before it, fails with the open's message."""
    db = tmp_path / "repl.db"
    filled(db, sessions=10, firings=200).close()
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 8192)
    damaged = db.read_bytes()
    for use in ("load", "write"):
        store = SqliteStore(db)
        try:
            with pytest.raises(StoreFailed, match=r"is not a readable repl database .* malformed"):
                if use == "load":
                    list(store.load())
                else:
                    store.write([Delta("s0", gone=True)])
        finally:
            store.close()
    assert db.read_bytes() == damaged


def test_another_programs_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "repl.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.close()
    with pytest.raises(StoreFailed, match=r"not repl's .*invoices"):
        SqliteStore(db)


def test_a_database_from_a_newer_repl_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "repl.db"
    SqliteStore(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreFailed, match="newer repl"):
        SqliteStore(db)


def refused_load(db: Path, match: str) -> None:
    """A load of ``db`` ends in ``StoreFailed`` saying ``match``."""
    store = SqliteStore(db)
    try:
        with pytest.raises(StoreFailed, match=match):
            list(store.load())
    finally:
        store.close()


@pytest.mark.parametrize(
    "edit",
    [
        "DELETE FROM log WHERE session = 's1' AND seq = 30",  # a hole
        "UPDATE log SET seq = 31 WHERE session = 's1' AND seq = 30",  # a hole and a twin
    ],
)
def test_a_ring_with_a_hole_is_refused_by_the_load(tmp_path: Path, edit: str) -> None:
    """The log is checked as the load reads it (the open checks the sessions' rows and
    reads every page, not a second sort of the log); the daemon loads before it serves."""
    db = tmp_path / "repl.db"
    filled(db).close()
    edited(db, edit)
    refused_load(db, "not consistent: session 's1'")


def test_a_directory_it_cannot_create_the_file_in(tmp_path: Path) -> None:
    (tmp_path / "repl.db").mkdir()  # the database's name is taken by a directory
    with pytest.raises(StoreFailed, match="cannot open"):
        SqliteStore(tmp_path / "repl.db")


def test_a_lock_held_by_another_program_fails_the_write_then_clears(tmp_path: Path) -> None:
    db = tmp_path / "repl.db"
    store = SqliteStore(db, busy_timeout=0.1)
    a = Mirror("a")
    a.record("one")
    store.write([a.delta()])
    other = sqlite3.connect(db, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        a.record("two")
        delta = a.delta()
        with pytest.raises(StoreFailed, match="database is locked: another program holds"):
            store.write([delta])
        assert store.load_sessions(["a"])["a"] is not None  # reading goes on meanwhile
        other.execute("ROLLBACK")
    finally:
        other.close()
    store.write([delta])
    assert store.load_sessions(["a"])["a"] == a.snapshot()
    store.close()


def test_load_reads_what_another_connection_sees(tmp_path: Path) -> None:
    db = tmp_path / "repl.db"
    store = filled(db)
    with sqlite3.connect(db) as conn:
        heads = dict(conn.execute("SELECT id, head FROM sessions ORDER BY id").fetchall())
    conn.close()
    assert {s.id: s.head for s in store.load()} == heads == {"s0": 50, "s1": 50, "s2": 50}
    store.close()


@pytest.mark.slow
def test_a_thousand_full_rings_load_back(tmp_path: Path) -> None:
    """1,000 sessions of 256 firings: written in ten batches, read in one load."""
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    for b in range(10):
        batch = []
        for i in range(b * 100, b * 100 + 100):
            sid = f"s{i:04d}"
            firings = [
                Firing(n, "on-message", f"firing {n} of {sid}", None, "2026-01-01T00:00:00.000Z")
                for n in range(1, 301)
            ][-256:]
            batch.append(
                Delta(
                    sid,
                    reset=True,
                    limit=256,
                    head=300,
                    uses=2,
                    retained=256,
                    firings=firings,
                    cursors=[CursorState("read", 100, 1), CursorState("wait", 290, 2)],
                    keys=[(f"k{n}", n) for n in range(250, 301)],
                )
            )
        store.write(batch)
    store.close()
    started = time.perf_counter()
    store = SqliteStore(db)
    snapshots = list(store.load())
    elapsed = time.perf_counter() - started
    store.close()
    print(f"opened and loaded 1,000 sessions x 256 firings in {elapsed:.2f} s")
    assert len(snapshots) == 1000
    assert all(len(s.firings) == 256 and s.firings[0].seq == 45 for s in snapshots)
    assert snapshots[7].firings[-1].result == "firing 300 of s0007"
    assert snapshots[999].cursors[-1] == CursorState("wait", 290, 2)


def test_a_closed_store_writes_nothing_more(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "repl.db")
    store.close()
    with pytest.raises(StoreFailed, match="is closed"):
        store.write([Mirror("a").delta()])
    store.close()  # twice is harmless
    reopened = SqliteStore(tmp_path / "repl.db")
    assert list(reopened.load()) == []
    reopened.close()


def edited(db: Path, *statements: str) -> None:
    """Another program changes the file behind the store's back."""
    with sqlite3.connect(db) as conn:
        for statement in statements:
            conn.execute(statement)
    conn.close()


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ("UPDATE sessions SET id = '../etc' WHERE id = 's1'", "session id '../etc'"),
        ("UPDATE sessions SET \"limit\" = 70000 WHERE id = 's1'", "70000"),
        (
            "UPDATE sessions SET \"limit\" = 10 WHERE id = 's1'",
            "session 's1' holds 50 firing(s) under limit 10 and head 50",
        ),
    ],
)
def test_a_session_the_core_could_not_host_is_refused_at_open(
    tmp_path: Path, edit: str, why: str
) -> None:
    db = tmp_path / "repl.db"
    filled(db).close()
    edited(db, edit)
    with pytest.raises(StoreFailed) as refused:
        SqliteStore(db)
    assert f"{db} is not consistent: " in refused.value.message
    assert why in refused.value.message
    assert refused.value.message.endswith(
        "restore it from a backup, or move it away to start with no sessions"
    )


def test_a_file_changed_under_the_store_fails_its_reads_and_says_so(tmp_path: Path) -> None:
    db = tmp_path / "repl.db"
    store = filled(db)
    assert len(list(store.load())) == 3
    edited(db, "DROP TABLE keys")
    for read in (lambda: list(store.load()), lambda: store.load_sessions(["s1"])["s1"]):
        with pytest.raises(StoreFailed, match=rf"^cannot read {db}: no such table: keys$"):
            read()
    store.close()


def test_a_home_that_does_not_exist_cannot_hold_the_lock(tmp_path: Path) -> None:
    db = tmp_path / "gone" / "repl.db"
    lock = re.escape(f"{db}.lock")
    with pytest.raises(StoreFailed, match=rf"^cannot create the lock file {lock}: No such file"):
        SqliteStore(db)
    assert not db.parent.exists()


def load_peak(store: SqliteStore, keep: bool) -> int:
    """The most memory (bytes, tracemalloc's) a load of ``store`` held at once: keeping every
    snapshot, or taking each and letting it go as a committer does."""
    import tracemalloc

    tracemalloc.start()
    try:
        kept = list(store.load()) if keep else None
        if not keep:
            for snapshot in store.load():
                del snapshot
        del kept
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_restart_streams_the_sessions_one_at_a_time_exactly_as_they_were(
    tmp_path: Path,
) -> None:
    """Issue 29: ``load`` is a generator that holds one session's rows at a time (a restart
    of many full sessions never holds them all), and every session comes back as the core
    held it: its ring firing by firing, its cursors and its keys, in id order."""
    import inspect

    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    mirrors = [Mirror(f"s{n:03d}") for n in range(200)]
    for m in mirrors:
        for i in range(100):
            m.record(f"{m.session.id} {i} " * 4, key=f"k{i}" if i % 3 == 0 else None)
        m.session.ack("read", 30)
        m.session.ack("monitor", 45)
    store.write([m.delta() for m in mirrors])
    store.close()
    expected = {m.session.id: m.session.snapshot() for m in mirrors}

    reopened = SqliteStore(db)
    loading = reopened.load()
    assert inspect.isgenerator(loading)
    seen = []
    for snapshot in loading:
        assert snapshot == expected[snapshot.id], snapshot.id
        seen.append(snapshot.id)
    assert seen == sorted(expected)  # every session, in id order
    # what a load holds at once: one session's rows, not the 20,000 firings of all of them
    everything, streamed = load_peak(reopened, keep=True), load_peak(reopened, keep=False)
    reopened.close()
    assert streamed * 20 < everything, (streamed, everything)


def test_the_log_stays_within_twice_its_live_rows_and_loads_back_exactly(tmp_path: Path) -> None:
    """Firings go to an append-only log; a trim, a stop or a restart of a session leaves
    its old rows dead, and compaction (in each batch's transaction) takes them away by
    range, appending the live ones again. 20 sessions of limit 8, 300 batches of a send
    to each, a stop and a new start of one session now and then: the log never holds
    more than twice its live rows and the slack, and the file loads back as the core
    holds every session, firing by firing, after a restart of the store."""
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    mirrors = {f"s{n}": Mirror(f"s{n}", limit=8) for n in range(20)}
    store.write([m.delta() for m in mirrors.values()])
    ts = "2026-12-02T04:30:00.000Z"
    most = compacted = 0
    for turn in range(300):
        for name, m in mirrors.items():
            m.session.record("on-message", f"{name} turn {turn}", ts)
        if turn % 37 == 5:  # one session stopped and started again under the same id
            gone = f"s{turn % 20}"
            store.write([Delta(gone, gone=True)])
            mirrors[gone] = Mirror(gone, limit=3 + turn % 5)
        store.write([m.delta() for m in mirrors.values()])
        with sqlite3.connect(db) as conn:
            recounted = counted(conn)
        conn.close()
        rows, live = recounted
        assert store._counts == recounted  # what compaction goes by is what the file holds
        assert live == sum(len(m.session.snapshot().firings) for m in mirrors.values())
        assert rows <= 2 * live + sqlite_write.COMPACT_SLACK + 2 * len(mirrors) + 1
        compacted += rows < most
        most = max(most, rows)
    store.close()
    store = SqliteStore(db)
    assert {snap.id: snap for snap in store.load()} == {
        name: m.session.snapshot() for name, m in mirrors.items()
    }
    assert store.load_sessions(["s3", "nope"]) == {
        "s3": mirrors["s3"].session.snapshot(),
        "nope": None,
    }
    store.close()
    assert compacted  # the log shrank at least once: compaction ran


def test_compaction_keeps_every_live_row_whatever_the_slack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no slack at all the log is compacted in every batch once it holds more than
    twice its live rows: each load still gives exactly the core's sessions."""
    monkeypatch.setattr(sqlite_write, "COMPACT_SLACK", 0)
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    mirrors = [Mirror(f"c{n}", limit=1 + n) for n in range(4)]
    store.write([m.delta() for m in mirrors])
    for turn in range(60):
        for m in mirrors[: 1 + turn % 4]:
            m.session.record("on-message", f"{m.session.id} {turn}", "2026-12-02T04:31:00.000Z")
        if turn == 30:
            mirrors[1].session.set_limit(0)
        if turn == 40:
            mirrors[1].session.set_limit(5)
        store.write([m.delta() for m in mirrors])
        assert {snap.id: snap for snap in store.load()} == {
            m.session.id: m.session.snapshot() for m in mirrors
        }
    store.close()


def test_a_log_emptied_by_compaction_never_gives_an_old_id_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose ring is empty, every other session stopped, the log compacted to
    nothing: the next firing's row must still be live (log ids are never given twice,
    or it would be at or below the session's ``since``)."""
    monkeypatch.setattr(sqlite_write, "COMPACT_SLACK", 0)
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    a, b = Mirror("a"), Mirror("b")
    a.record("one")
    store.write([a.delta()])
    store.write([b.delta()])  # b: empty, its since is a's row
    store.write([Delta("a", gone=True)])  # compaction takes the whole log away
    b.record("b's first")
    store.write([b.delta()])
    assert store._counts == (1, 1)
    assert store.load_sessions(["b"])["b"] == b.snapshot()
    store.close()
    store = SqliteStore(db)
    assert list(store.load()) == [b.snapshot()]
    store.close()


def test_a_batch_that_names_a_session_twice_is_refused_and_writes_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    a = Mirror("a")
    a.record("one")
    first = a.delta()
    with pytest.raises(StoreFailed, match="names a session twice"):
        store.write([first, first])
    store.write([Delta("a", gone=True), first])  # a stop and a new start: that is fine
    assert store.load_sessions(["a"])["a"] == a.snapshot()
    store.close()


# -- the rings' images (schema 6) ------------------------------------------------------


def as_restored(snapshots: Iterable[Snapshot]) -> dict[str, Snapshot]:
    """Each session as the core holds it once restored: every retained firing, no image."""
    return {s.id: Session.restore(s).snapshot() for s in snapshots}


def images_of(mirrors: Iterable[Mirror]) -> list[tuple[str, Image]]:
    return [(m.session.id, m.session.ring.image()) for m in mirrors]


def test_the_rings_images_load_exactly_as_the_log_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Images kept now and then (of every ring, or of some), and after them sends, trims, a
    session stopped and started again, one stopped for good, tags and a ts that does not
    pack, compaction in every batch: after each batch the store loads, and after a restart
    of the store, exactly the sessions the core holds, firing by firing."""
    monkeypatch.setattr(sqlite_write, "COMPACT_SLACK", 0)
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    mirrors = {f"s{n}": Mirror(f"s{n}", limit=limit) for n, limit in enumerate((0, 1, 3, 8, 20))}
    store.write([m.delta() for m in mirrors.values()])
    for turn in range(90):
        for n, m in enumerate(mirrors.values()):
            if (turn + n) % 3:
                tags = {"corr": f"c{turn}"} if turn % 7 == 0 else {}
                ts = "a ts of another form" if turn % 11 == 0 else TS
                m.session.record(f"h{turn % 5}", f"{m.session.id} {turn}", ts, tags=tags)
        if turn == 20:
            mirrors["s4"].session.set_limit(5)
        if turn == 33:  # stopped and started again under the same id
            store.write([Delta("s3", gone=True)])
            mirrors["s3"] = Mirror("s3", limit=6)
        if turn == 50:  # stopped for good
            store.write([Delta("s2", gone=True)])
            del mirrors["s2"]
        store.write([m.delta() for m in mirrors.values()])
        if turn % 10 == 9:  # every ring's image, or the even turns' sessions' only
            kept = [m for n, m in enumerate(mirrors.values()) if turn % 20 == 9 or n % 2]
            assert store.keep_images(images_of(kept)) == len(kept)
        expected = as_restored(m.snapshot() for m in mirrors.values())
        assert as_restored(store.load()) == expected, turn
        assert as_restored(s for s in store.load_sessions(["s1", "s4"]).values() if s) == {
            sid: expected[sid] for sid in ("s1", "s4")
        }
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM rings").fetchone() == (len(mirrors),)
    conn.close()
    store.close()
    store = SqliteStore(db)
    assert as_restored(store.load()) == expected
    store.close()


def test_a_load_after_every_ring_was_imaged_reads_the_images_and_the_log_after_them(
    tmp_path: Path,
) -> None:
    """The images are what is read: with the log's rows up to them taken away by hand, the
    load still gives every session exactly, from its image and the rows after it."""
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    mirrors = [Mirror(f"s{n}", limit=8) for n in range(4)]
    for i in range(20):
        for m in mirrors:
            m.record(f"{m.session.id} {i}")
    store.write([m.delta() for m in mirrors])
    assert store.keep_images(images_of(mirrors)) == 4
    for m in mirrors[1:]:  # after the images: two more firings, and a trim
        m.record("after the image")
        m.record("and one more")
    mirrors[2].session.set_limit(1)
    store.write([m.delta() for m in mirrors])
    store.close()
    with sqlite3.connect(db) as conn:
        (mark,) = conn.execute("SELECT min(mark) FROM rings").fetchone()
        conn.execute("DELETE FROM log WHERE id <= ?", (mark,))
    conn.close()
    store = SqliteStore(db)
    loaded = list(store.load())
    assert [len(s.firings) for s in loaded] == [0, 2, 1, 2]  # the rows after the images
    assert as_restored(loaded) == as_restored(m.snapshot() for m in mirrors)
    store.close()


def test_a_damaged_image_is_passed_over_for_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    mirrors = [Mirror(f"s{n}") for n in range(3)]
    for m in mirrors:
        for i in range(30):
            m.record(f"{m.session.id} {i}")
    store.write([m.delta() for m in mirrors])
    assert store.keep_images(images_of(mirrors)) == 3
    store.close()
    with sqlite3.connect(db) as conn:  # one byte of s1's image changed, and s2's cut short
        (image,) = conn.execute("SELECT image FROM rings WHERE session = 's1'").fetchone()
        damaged = image[:40] + bytes([image[40] ^ 1]) + image[41:]
        conn.execute("UPDATE rings SET image = ? WHERE session = 's1'", (damaged,))
        conn.execute(
            "UPDATE rings SET image = substr(image, 1, 20), crc = ? WHERE session = 's2'",
            (zlib.crc32(image[:20]),),
        )
    conn.close()
    store = SqliteStore(db)
    assert as_restored(store.load()) == as_restored(m.snapshot() for m in mirrors)
    store.close()
    damaged_ones = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert damaged_ones == [
        f"the image of session {sid!r}'s ring is damaged; its firings are read from the log"
        for sid in ("s1", "s2")
    ]


def test_an_image_with_its_crc_that_holds_no_ring_is_passed_over_for_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes whose CRC checks but whose ring could not be (four firings up to head 2): a
    hand-made image, passed over as a damaged one is."""
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    m = Mirror("s0")
    for i in range(3):
        m.record(f"firing {i}")
    store.write([m.delta()])
    assert store.keep_images(images_of([m])) == 1
    store.close()
    made_up = encode_image(Image(2, [("on-message", False)], [b"\0" * 12] * 4))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE rings SET image = ?, crc = ?", (made_up, zlib.crc32(made_up)))
    conn.close()
    store = SqliteStore(db)
    assert as_restored(store.load()) == as_restored([m.snapshot()])
    store.close()
    assert "the image of session 's0''s ring is damaged" in caplog.text


def test_an_image_of_a_ring_the_file_does_not_hold_is_not_kept(tmp_path: Path) -> None:
    """An image ahead of the file (a send not yet written), behind it, or of a session the
    file does not hold, is not kept: only an image of what is durable is."""
    db = tmp_path / "repl.db"
    store = SqliteStore(db)
    ahead, behind, written = Mirror("ahead"), Mirror("behind"), Mirror("written")
    for m in (ahead, behind, written):
        m.record("one")
    store.write([m.delta() for m in (ahead, behind, written)])
    old = behind.session.ring.image()
    behind.record("two")
    store.write([behind.delta()])
    ahead.record("not yet written")
    images = [*images_of([ahead, written]), ("behind", old), ("nowhere", old)]
    assert store.keep_images(images) == 1
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT session FROM rings").fetchall() == [("written",)]
    conn.close()
    store.close()


# -- folded rings: a whole image is read when its ring is first looked into -------------


def restored(mirror: Mirror) -> Session:
    return Session.restore(mirror.snapshot())


def imaged(db: Path, sessions: int = 3, firings: int = 30) -> list[Mirror]:
    """A file whose every ring has its image, as a clean stop leaves it; the store closed."""
    store = SqliteStore(db)
    mirrors = [Mirror(f"s{n}", limit=16) for n in range(sessions)]
    for m in mirrors:
        for i in range(firings):
            m.record(f"{m.session.id} {i}")
    store.write([m.delta() for m in mirrors])
    assert store.keep_images(images_of(mirrors)) == sessions
    store.close()
    return mirrors


def test_a_whole_image_is_read_only_when_its_ring_is_first_looked_into(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After a clean stop the load reads no image (one damaged by hand is not noticed yet):
    each ring comes folded, with its counts, and is read, the damaged one from the log, the
    first time a firing of it is needed."""
    db = tmp_path / "repl.db"
    mirrors = imaged(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE rings SET image = substr(image, 2) WHERE session = 's1'")
    conn.close()
    store = SqliteStore(db)
    loaded = list(store.load())
    assert [(s.fold is not None, s.firings, s.image) for s in loaded] == [(True, [], None)] * 3
    sessions = [Session.restore(s) for s in loaded]
    assert [s.summary() for s in sessions] == [restored(m).summary() for m in mirrors]
    assert all(s.ring.is_folded for s in sessions) and "damaged" not in caplog.text
    assert [s.snapshot() for s in sessions] == [m.session.snapshot() for m in mirrors]
    assert not any(s.ring.is_folded for s in sessions)
    assert "the image of session 's1''s ring is damaged" in caplog.text
    store.close()


def test_a_folded_ring_that_cannot_be_read_is_store_failed_and_stays_folded(
    tmp_path: Path,
) -> None:
    """A ring whose image was damaged and rows taken away by hand, and a store closed under a
    folded ring: bringing it in is ``store_failed``, saying why, and the ring stays folded
    (its counts as they were); the other rings are read as ever."""
    db = tmp_path / "repl.db"
    mirrors = imaged(db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE rings SET image = substr(image, 2) WHERE session = 's1'")
        conn.execute("DELETE FROM log WHERE session = 's1'")
    conn.close()
    store = SqliteStore(db)
    s0, s1, s2 = (Session.restore(s) for s in store.load())
    with pytest.raises(
        StoreFailed, match=r"session 's1' holds 0 firing\(s\) where its ring keeps 16"
    ):
        s1.ring.firings()
    assert s1.ring.is_folded and s1.summary() == restored(mirrors[1]).summary()
    assert s0.snapshot() == mirrors[0].session.snapshot()
    store.close()
    with pytest.raises(StoreFailed, match="is closed"):
        s2.ring.firings()
    assert s2.ring.is_folded


def test_a_ring_left_folded_through_a_stop_keeps_its_image_for_the_next_start(
    tmp_path: Path,
) -> None:
    """A ring nothing looked into keeps the image of an older stop, whose mark is behind the
    log's growth since: a start after sends to the other rings, new images of those only
    (as a stop keeps them: not of a folded ring), and more sends after them, gives every
    ring exactly, the untouched one still from its old image."""
    db = tmp_path / "repl.db"
    mirrors = imaged(db)
    for turn in range(3):
        store = SqliteStore(db)
        assert as_restored(store.load()) == as_restored(m.snapshot() for m in mirrors)
        for m in mirrors[1:]:
            for i in range(20):
                m.record(f"{m.session.id} turn {turn} {i}")
        store.write([m.delta() for m in mirrors[1:]])
        assert store.keep_images(images_of(mirrors[1 + turn % 2 :])) == 2 - turn % 2
        mirrors[2].record("after the images")
        store.write([mirrors[2].delta()])
        store.close()
    with sqlite3.connect(db) as conn:
        marks = conn.execute("SELECT session, mark FROM rings ORDER BY session").fetchall()
    conn.close()
    assert marks[0][1] < marks[1][1]  # s0's image is the first stop's
    store = SqliteStore(db)
    loaded = list(store.load())
    assert [s.fold is not None for s in loaded] == [True, True, False]
    assert as_restored(loaded) == as_restored(m.snapshot() for m in mirrors)
    store.close()


def test_a_whole_image_with_rows_past_its_head_is_refused_by_the_load(tmp_path: Path) -> None:
    """A ring that would fold, but the log's tail, read for another ring's rows after its
    image, holds a row past this ring's head (written by hand): the load reads its image to
    check it, as it does a ring with rows after its image, and refuses the file before the
    daemon serves. (With every ring whole the log is not read at all, and such a row is
    found only if the ring is ever read from the log.)"""
    db = tmp_path / "repl.db"
    s0 = imaged(db)[0]
    store = SqliteStore(db)
    s0.record("after the image")
    store.write([s0.delta()])
    store.close()
    edited(
        db,
        "INSERT INTO log (session, seq, handler, result, event, ts)"
        " VALUES ('s1', 31, 'on-message', NULL, 'past the head', '2026-12-02T09:00:00.000Z')",
    )
    refused_load(db, "not consistent: session 's1' holds 17 firing")


def test_a_whole_image_that_holds_less_than_its_ring_is_passed_over_when_first_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An image of the session's head whose CRC checks but that holds fewer firings than the
    ring keeps (made by hand: a clean stop keeps only the image of the file's ring): when the
    ring is first used it is read from the log instead, exactly, with a warning."""
    db = tmp_path / "repl.db"
    mirrors = imaged(db)
    image = mirrors[2].session.ring.image()
    short = encode_image(Image(image.head, image.slots, image.items[-3:]))
    edited(
        db,
        f"UPDATE rings SET image = x'{short.hex()}', crc = {zlib.crc32(short)}"
        " WHERE session = 's2'",
    )
    store = SqliteStore(db)
    assert as_restored(store.load()) == as_restored(m.snapshot() for m in mirrors)
    store.close()
    assert "the image of session 's2''s ring is not its ring" in caplog.text
