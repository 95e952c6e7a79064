"""Disk and file failures, each on a real file under a real daemon.

While the disk fails, the change that needed it is answered ``store_failed``
with the reason and does not happen (no seq is taken, nothing comes back
after a restart); reads go on being served; the error is in the log; and
once the cause is gone, writes succeed again without a restart. At start,
a file the daemon cannot use, or a home another daemon holds, ends it with
one clear line on stderr and exit status 1, and the file is left as it was.

The tests run as whoever runs pytest. As root, file modes do not stop
writes, so a full disk is a small tmpfs (skipped where mounting is not
allowed), a read-only file is ``chattr +i`` (skipped where the file system
has no such flag) and a write error is a file-size limit set on the daemon
from outside with ``prlimit``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Client, DaemonProc, LoggedElsewhere, eventually, pipelined, small_disk

BIG = "x" * 300_000  # more than any slack a WAL file has: the write must grow it


def reads_are_served(c: Client, session: str, results: list[str]) -> None:
    """Every read-only op still answers, from what is durable."""
    assert c.ok({"op": "ping"})["version"]
    ring = c.ok({"op": "read", "session": session, "after": 0})
    assert [f["result"] for f in ring["firings"]] == results
    assert c.ok({"op": "read", "session": session})["next"] == len(results)
    assert c.ok({"op": "cursors", "session": session})["cursors"]
    assert c.ok({"op": "stats", "session": session})["sessions"][0]["head"] == len(results)
    assert session in [s["id"] for s in c.ok({"op": "sessions"})["sessions"]]


def refused(answer: dict[str, Any], reason: str) -> None:
    assert not answer["ok"], answer
    assert answer["code"] == "store_failed", answer
    assert reason in answer["message"], answer


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk``; returns the file that holds them."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (1 << 16, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * chunk):
                    pass
    finally:
        os.close(fd)
    with pytest.raises(OSError) as full:
        (disk / "probe").write_bytes(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


def test_a_full_disk_fails_the_change_and_serves_reads_until_space_returns(
    tmp_path: Path,
) -> None:
    with small_disk(tmp_path / "disk", "4m") as home:
        d = LoggedElsewhere(home, tmp_path / "daemon.log")
        try:
            c = d.client()
            c.ok({"op": "start", "session": "a"})
            c.ok({"op": "send", "session": "a", "text": "before"})
            c.ok({"op": "ack", "session": "a", "seq": 1})
            filler = fill(home)

            refused(c.call({"op": "send", "session": "a", "text": BIG}), "database or disk is full")
            reads_are_served(c, "a", ["before"])
            refused(c.call({"op": "send", "session": "a", "text": BIG}), "free some space")
            assert "database or disk is full" in d.log.read_text()

            filler.unlink()
            # the failed sends took no seq: the next one is 2
            assert c.ok({"op": "send", "session": "a", "text": "after"})["seq"] == 2
            c.ok({"op": "start", "session": "b"})
            d.restart()
            c = d.client()
            reads_are_served(c, "a", ["before", "after"])
            assert [s["id"] for s in c.ok({"op": "sessions"})["sessions"]] == ["a", "b"]
        finally:
            d.close_clients()
            d.stop()


def test_a_write_error_fails_the_change_and_clears_when_the_cause_goes(
    durable_daemon: DaemonProc,
) -> None:
    """EFBIG, from a file-size limit put on the daemon: SQLite reports a disk I/O error."""
    if not hasattr(resource, "prlimit"):
        pytest.skip("no prlimit on this system")
    d = durable_daemon
    assert d.proc is not None
    c = d.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "before"})
    c.ok({"op": "ack", "session": "a", "seq": 1})
    largest = max(f.stat().st_size for f in d.home.iterdir())
    soft, hard = resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE)
    resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (largest + (64 << 10), hard))
    try:
        refused(c.call({"op": "send", "session": "a", "text": BIG}), "disk I/O error")
        reads_are_served(c, "a", ["before"])
        refused(c.call({"op": "send", "session": "a", "text": BIG}), "check the disk")
        assert "disk I/O error" in d.log.read_text()
    finally:
        resource.prlimit(d.proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
    assert c.ok({"op": "send", "session": "a", "text": BIG})["seq"] == 2
    d.restart(crash=True)
    c = d.client()
    reads_are_served(c, "a", ["before", BIG])


@contextlib.contextmanager
def read_only(db: Path) -> Iterator[None]:
    """Make the database file read-only for the daemon, then writable again."""
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(db)], capture_output=True, check=False)
        if made.returncode:
            pytest.skip(f"chattr +i does not work here: {made.stderr.decode().strip()}")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(db)], check=True)
    else:
        db.chmod(0o444)
        try:
            yield
        finally:
            # SQLite makes -wal and -shm with the database's mode
            for path in db.parent.glob(db.name + "*"):
                path.chmod(0o600)


def test_a_read_only_database_serves_reads_and_takes_writes_once_writable(
    durable_daemon: DaemonProc,
) -> None:
    d = durable_daemon
    c = d.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "before"})
    c.ok({"op": "ack", "session": "a", "seq": 1})
    d.close_clients()
    d.stop()
    with read_only(d.home / "repl.db"):
        d.start()
        c = d.client()
        reason = "attempt to write a readonly database"
        reads_are_served(c, "a", ["before"])
        refused(c.call({"op": "send", "session": "a", "text": "no"}), reason)
        refused(c.call({"op": "start", "session": "b"}), reason)
        refused(c.call({"op": "ack", "session": "a", "seq": 0, "cursor": "new"}), reason)
        reads_are_served(c, "a", ["before"])
        log = d.log.read_text()
        assert "every change fails until that is fixed" in log  # said at start
        assert log.count(reason) >= 4
    # writable again: the daemon opens the file anew on the next write. The reads above
    # used the cursor, and its write may still be failing on the connection opened while
    # the file was read-only: a send made meanwhile is undone with that batch (built on
    # it) and refused, and changes nothing. So the first send answered ok is seq 2.
    answers: list[dict[str, Any]] = []

    def sent() -> bool:
        answers.append(c.call({"op": "send", "session": "a", "text": "after"}))
        return bool(answers[-1]["ok"])

    eventually(sent, what="a send once the file is writable")
    assert answers[-1]["seq"] == 2
    assert all(a["code"] == "store_failed" for a in answers[:-1]), answers
    d.restart()
    reads_are_served(d.client(), "a", ["before", "after"])


def test_a_write_lock_held_by_another_program(durable_daemon: DaemonProc) -> None:
    d = durable_daemon
    c, reader = d.client(), d.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "before"})
    c.ok({"op": "ack", "session": "a", "seq": 1})
    other = sqlite3.connect(d.home / "repl.db", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        c.send({"op": "send", "session": "a", "text": "blocked"})
        reads_are_served(reader, "a", ["before"])  # while the write waits for the lock
        refused(c.recv(), "database is locked: another program holds a write lock")
        reads_are_served(c, "a", ["before"])
        other.execute("ROLLBACK")
    finally:
        other.close()
    assert "database is locked" in d.log.read_text()
    assert c.ok({"op": "send", "session": "a", "text": "after"})["seq"] == 2
    d.restart(crash=True)
    reads_are_served(d.client(), "a", ["before", "after"])


# -- at start ----------------------------------------------------------------


def start_refused(home: Path) -> str:
    """Run a daemon on ``home`` that must refuse to start; returns its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "repl_daemon", "--addr", "127.0.0.1:0", "--home", str(home)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.stdout == b""  # it never said it was listening
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert stderr.count("\n") == 1 and stderr.startswith("repl daemon: "), stderr
    return stderr


def test_a_corrupt_database_ends_the_start_with_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    db = home / "repl.db"
    garbage = b"not a database at all\n" * 1000
    db.write_bytes(garbage)
    stderr = start_refused(home)
    assert f"{db} is not a readable repl database (file is not a database)" in stderr
    assert "move it away" in stderr
    assert db.read_bytes() == garbage


def test_a_damaged_page_ends_the_start_with_one_clear_line(durable_daemon: DaemonProc) -> None:
    d = durable_daemon
    c = d.client()
    for n in range(8):
        c.ok({"op": "start", "session": f"s{n}"})
        sends = [{"op": "send", "session": f"s{n}", "text": f"firing {i} " * 20} for i in range(40)]
        assert all(answer["ok"] for answer in pipelined(c, sends))
    d.close_clients()
    d.stop()
    db = d.home / "repl.db"
    size = db.stat().st_size
    with open(db, "r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 8192)
    damaged = db.read_bytes()
    assert "database disk image is malformed" in start_refused(d.home)
    assert db.read_bytes() == damaged
    db.rename(d.home / "repl.db.damaged")
    d.start()  # moved away: the daemon starts with no sessions
    assert d.client().ok({"op": "sessions"})["sessions"] == []


def test_a_second_daemon_on_the_same_home_is_refused(durable_daemon: DaemonProc) -> None:
    first = durable_daemon
    assert first.proc is not None
    c = first.client()
    c.ok({"op": "start", "session": "a"})
    stderr = start_refused(first.home)
    assert stderr == (
        f"repl daemon: another repl daemon is using {first.home} (pid {first.proc.pid}): "
        "stop it first, or give this one another --home\n"
    )
    assert c.ok({"op": "send", "session": "a", "text": "still here"})["seq"] == 1
    first.close_clients()
    first.restart()  # once the first is gone, its home is free
    assert first.client().ok({"op": "read", "session": "a", "after": 0})["next"] == 1
