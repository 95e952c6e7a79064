"""Security (issue 7): names never escape into file paths or SQL, and
nothing is served without the token."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import DAEMON_STORES, Client, DaemonProc, InProcDaemon

HOSTILE_CURSORS = [
    "');DROP_TABLE_firings;--",
    "x'OR'1'='1",
    "../../../../etc/passwd",
    "/tmp/evil",
    "%s%n%x",
    "{repl}:meta",
    "名前",
    "a\\b",
    '"quoted"',
]


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_hostile_cursor_names_are_plain_names_and_survive_a_restart(
    durable_daemon: DaemonProc, tmp_path: Path
) -> None:
    c = durable_daemon.client()
    c.ok({"op": "start", "session": "a"})
    for i in range(3):
        c.ok({"op": "send", "session": "a", "text": f"'; DROP TABLE sessions; -- {i}"})
    for i, name in enumerate(HOSTILE_CURSORS):
        assert c.ok({"op": "ack", "session": "a", "cursor": name, "seq": i % 4})["seq"] == i % 4
    outside = files_under(tmp_path.parent) - files_under(durable_daemon.home)
    durable_daemon.close_clients()
    durable_daemon.restart(crash=True)
    c = durable_daemon.client()
    rows = {r["name"]: r["seq"] for r in c.ok({"op": "cursors", "session": "a"})["cursors"]}
    assert rows == {name: i % 4 for i, name in enumerate(HOSTILE_CURSORS)}
    texts = [f["result"] for f in c.ok({"op": "read", "session": "a", "after": 0})["firings"]]
    assert texts == [f"'; DROP TABLE sessions; -- {i}" for i in range(3)]
    assert files_under(tmp_path.parent) - files_under(durable_daemon.home) == outside
    assert not Path("/tmp/evil").exists()


@pytest.mark.parametrize("inproc", DAEMON_STORES, indirect=True)
def test_path_and_sql_shaped_session_ids_are_refused(inproc: InProcDaemon) -> None:
    c = inproc.client()
    for bad in ["../x", "a/b", "/etc", ".hidden", "a;b", "a'b", "a b", "{a}", "", "x" * 65]:
        answer = c.call({"op": "start", "session": bad})
        assert answer["code"] == "bad_session_id", (bad, answer)
    assert c.ok({"op": "sessions"})["sessions"] == []


@pytest.mark.parametrize("inproc", DAEMON_STORES, indirect=True)
def test_no_firing_leaves_the_daemon_without_the_token(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "secret"})
    c.ok({"op": "send", "session": "secret", "text": "the password is swordfish"})
    for first in (
        {"op": "read", "session": "secret", "after": 0},
        {"op": "wait", "sessions": ["secret"]},
        {"op": "poll", "session": "secret"},
        {"op": "auth", "token": ""},
        {"op": "auth", "token": inproc.token[:-1]},
    ):
        stranger = Client(inproc.port)
        raw = b""
        stranger.send(first)
        while chunk := stranger.readline():
            raw += chunk
        stranger.close()
        assert b"swordfish" not in raw and b"unauthorized" in raw
    assert os.stat(inproc.home / "token").st_mode & 0o077 == 0
