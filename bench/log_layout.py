"""Two layouts of the SQLite firings table under a batch over many sessions (issue 29).

``python -m bench.log_layout``: a file of 10,000 sessions × 32 firings of 100
bytes (WAL, ``synchronous = FULL``, as the daemon opens it), then 30 commits of
1,000 sends each to 1,000 sessions drawn at random, each commit one
``executemany`` of the firings and one of the sessions' heads, as the daemon's
store writes a batch. Two layouts of the firings:

- ``clustered``: today's ``PRIMARY KEY (session, seq) WITHOUT ROWID``, so each
  touched session's new firing lands on a page of its own;
- ``log``: an append-only table (``id INTEGER PRIMARY KEY``, no other index), so
  a commit's firings land on the last few pages whatever sessions they are for.

Prints each layout's median commit, the sends/s it makes, and the same without
the heads' update. The measurement behind schema 5 (the daemon's store keeps its
firings in such a log since), not a row of the benchmark.
"""

from __future__ import annotations

import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

SESSIONS, PER, BATCH, BATCHES = 10_000, 32, 1_000, 30
TEXT, TS = "x" * 100, "2026-12-02T03:40:00.000Z"

LAYOUTS = {
    "clustered": (
        "CREATE TABLE firings (session TEXT NOT NULL, seq INTEGER NOT NULL, handler TEXT NOT "
        "NULL, result TEXT, event TEXT, ts TEXT NOT NULL, tags TEXT, PRIMARY KEY (session, "
        "seq)) WITHOUT ROWID"
    ),
    "log": (
        "CREATE TABLE firings (id INTEGER PRIMARY KEY, session TEXT NOT NULL, seq INTEGER NOT "
        "NULL, handler TEXT NOT NULL, result TEXT, event TEXT, ts TEXT NOT NULL, tags TEXT)"
    ),
}
INSERT = (
    "INSERT INTO firings (session, seq, handler, result, event, ts, tags) "
    "VALUES (?, ?, 'on-message', ?, NULL, ?, NULL)"
)


def commits(path: Path, layout: str, heads_too: bool) -> float:
    """The median seconds of one commit of ``BATCH`` sends to as many sessions."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(
        'CREATE TABLE sessions (id TEXT PRIMARY KEY, "limit" INTEGER NOT NULL, '
        "head INTEGER NOT NULL, uses INTEGER NOT NULL) WITHOUT ROWID"
    )
    conn.execute(LAYOUTS[layout])
    ids = [f"s-{n:05d}" for n in range(SESSIONS)]
    heads = dict.fromkeys(ids, PER)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO sessions VALUES (?, 256, ?, 0)", [(i, PER) for i in ids])
    for session in ids:  # each session's firings together, as the daemon's own would be
        conn.executemany(INSERT, [(session, seq, TEXT, TS) for seq in range(1, PER + 1)])
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rng = random.Random(29)
    times = []
    for _ in range(BATCHES):
        chosen = rng.sample(ids, BATCH)
        rows = []
        for session in chosen:
            heads[session] += 1
            rows.append((session, heads[session], TEXT, TS))
        began = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT, rows)
        if heads_too:
            conn.executemany(
                "UPDATE sessions SET head = ? WHERE id = ?", [(heads[s], s) for s in chosen]
            )
        conn.execute("COMMIT")
        times.append(time.perf_counter() - began)
    conn.close()
    return sorted(times)[len(times) // 2]


def main() -> int:
    print(f"{SESSIONS:,} sessions × {PER}, commits of {BATCH:,} sends to {BATCH:,} sessions")
    for layout in LAYOUTS:
        for heads_too in (True, False):
            with tempfile.TemporaryDirectory(prefix="repl-log-layout-") as tmp:
                median = commits(Path(tmp) / "repl.db", layout, heads_too)
            what = "firings and heads" if heads_too else "firings only"
            print(
                f"{layout:>9}, {what:<17}: {median * 1000:6.1f} ms a commit, "
                f"{BATCH / median:9,.0f} sends/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
