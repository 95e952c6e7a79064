"""What a client was told survives a restart of the daemon, clean or a crash (SPEC rule 12).

Each test runs a real daemon on the default store, changes some state over
the wire, restarts it on the same home (SIGTERM, or SIGKILL for a crash)
and checks, again over the wire, that every piece of it came back.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import Client, DaemonProc, pipelined

restarts = pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])


def everything(c: Client, ids: list[str]) -> dict[str, Any]:
    """All the state a client can see, session by session."""
    seen: dict[str, Any] = {"sessions": c.ok({"op": "sessions"})["sessions"]}
    for sid in ids:
        seen[sid] = {
            "ring": c.ok({"op": "read", "session": sid, "after": 0}),
            "cursors": c.ok({"op": "cursors", "session": sid})["cursors"],
        }
    return seen


@restarts
def test_every_piece_of_state_comes_back(durable_daemon: DaemonProc, crash: bool) -> None:
    c = durable_daemon.client()
    c.ok({"op": "start", "session": "small", "buffer": 8})
    c.ok({"op": "start", "session": "keyed"})
    c.ok({"op": "start", "session": "none", "buffer": 0})
    c.ok({"op": "start", "session": "stopped"})
    c.ok({"op": "send", "session": "stopped", "text": "gone with it"})
    c.ok({"op": "stop", "session": "stopped"})
    for i in range(20):
        c.ok({"op": "send", "session": "small", "text": f"small {i}"})
    for i in range(5):
        c.ok({"op": "send", "session": "keyed", "text": f"keyed {i}", "key": f"k{i}"})
    c.ok({"op": "send", "session": "keyed", "text": "raw", "handler": "on-build"})
    c.ok({"op": "buffer", "session": "keyed", "limit": 3})
    for i in range(4):
        c.ok({"op": "send", "session": "none", "text": f"unkept {i}"})
    c.ok({"op": "ack", "session": "small", "seq": 15})
    c.ok({"op": "ack", "session": "keyed", "cursor": "x", "seq": 2})
    c.ok({"op": "poll", "session": "keyed"})
    ids = ["small", "keyed", "none"]
    before = everything(c, ids)

    durable_daemon.restart(crash=crash)
    c = durable_daemon.client()

    assert everything(c, ids) == before
    assert [s["id"] for s in before["sessions"]] == ["keyed", "none", "small"]
    assert before["small"]["ring"]["lost"] == 12  # the bound held: 13-20 kept
    # seqs go on from the head: no gap, no seq given twice
    assert c.ok({"op": "send", "session": "small", "text": "after"})["seq"] == 21
    assert c.ok({"op": "send", "session": "none", "text": "after"})["seq"] == 5
    # a dedup key from before the restart still answers with the first seq
    again = c.ok({"op": "send", "session": "keyed", "text": "again", "key": "k3"})
    assert (again["seq"], again["duplicate"]) == (4, True)
    # the stopped session stayed stopped; its id starts afresh
    missing = c.call({"op": "read", "session": "stopped"})
    assert missing["code"] == "no_such_session"
    assert c.ok({"op": "start", "session": "stopped"})["created"]
    assert c.ok({"op": "read", "session": "stopped", "after": 0})["firings"] == []


@restarts
def test_the_least_recently_used_cursor_before_the_restart_goes_first(
    durable_daemon: DaemonProc, crash: bool
) -> None:
    c = durable_daemon.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "m"})
    for i in range(16):
        c.ok({"op": "ack", "session": "a", "cursor": f"c{i}", "seq": 1})
    # a read is a use too: c0 is now the newest, c1 the least recently used;
    # the send after it writes the cursor table with it
    c.ok({"op": "read", "session": "a", "cursor": "c0"})
    c.ok({"op": "send", "session": "a", "text": "m2"})

    durable_daemon.restart(crash=crash)
    c = durable_daemon.client()

    c.ok({"op": "ack", "session": "a", "cursor": "c16", "seq": 2})
    names = [row["name"] for row in c.ok({"op": "cursors", "session": "a"})["cursors"]]
    assert len(names) == 16
    assert "c1" not in names and "c0" in names and names[0] == "c16"
    # the order of uses came back too: most recently used first
    assert names[1:] == ["c0", *[f"c{i}" for i in range(15, 1, -1)]]


def test_a_read_moves_its_cursor_use_through_a_clean_restart(durable_daemon: DaemonProc) -> None:
    """A read answers without waiting for the disk; a clean stop still writes its use."""
    c = durable_daemon.client()
    c.ok({"op": "start", "session": "a"})
    for i in range(16):
        c.ok({"op": "ack", "session": "a", "cursor": f"c{i}", "seq": 0})
    c.ok({"op": "read", "session": "a", "cursor": "c0"})
    durable_daemon.restart()
    c = durable_daemon.client()
    c.ok({"op": "ack", "session": "a", "cursor": "new", "seq": 0})
    names = {row["name"] for row in c.ok({"op": "cursors", "session": "a"})["cursors"]}
    assert "c0" in names and "c1" not in names


@restarts
def test_the_newest_1024_dedup_keys_still_dedup(durable_daemon: DaemonProc, crash: bool) -> None:
    c = durable_daemon.client()
    c.ok({"op": "start", "session": "a", "buffer": 16})
    sends = [
        {"op": "send", "session": "a", "text": f"m{i}", "key": f"k{i}", "id": i}
        for i in range(1100)
    ]
    answers = pipelined(c, sends)
    assert [a["seq"] for a in answers] == list(range(1, 1101))

    durable_daemon.restart(crash=crash)
    c = durable_daemon.client()

    # k0-k75 have left the newest 1,024 keys: sent again they are new firings
    kept = c.ok({"op": "send", "session": "a", "text": "x", "key": "k76"})
    assert (kept["seq"], kept["duplicate"]) == (77, True)
    newest = c.ok({"op": "send", "session": "a", "text": "x", "key": "k1099"})
    assert (newest["seq"], newest["duplicate"]) == (1100, True)
    dropped = c.ok({"op": "send", "session": "a", "text": "x", "key": "k75"})
    assert (dropped["seq"], dropped["duplicate"]) == (1101, False)


def test_state_survives_several_restarts_in_a_row(durable_daemon: DaemonProc) -> None:
    seqs = []
    for round_ in range(3):
        c = durable_daemon.client()
        c.ok({"op": "start", "session": "a", "exist_ok": True, "buffer": 4})
        seqs.append(c.ok({"op": "send", "session": "a", "text": f"r{round_}"})["seq"])
        c.ok({"op": "ack", "session": "a", "seq": seqs[-1]})
        durable_daemon.restart(crash=round_ % 2 == 1)
    c = durable_daemon.client()
    assert seqs == [1, 2, 3]
    ring = c.ok({"op": "read", "session": "a", "after": 0})
    assert [f["result"] for f in ring["firings"]] == ["r0", "r1", "r2"]
    assert c.ok({"op": "cursors", "session": "a"})["cursors"][0]["seq"] == 3
