"""Waits over real sockets: SPEC rules 8-11 and 14, against a daemon child process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.helpers import Client, DaemonProc


def pending(client: Client, seconds: float) -> bool:
    return client.pending(seconds)


def cursor_of(client: Client, session: str, name: str) -> int | None:
    rows = client.ok({"op": "cursors", "session": session})["cursors"]
    return next((row["seq"] for row in rows if row["name"] == name), None)


def evaluations(client: Client, session: str) -> int:
    stats = client.ok({"op": "stats", "session": session})
    value: int = stats["sessions"][0]["evaluations"]
    return value


def waiters(client: Client, session: str) -> int:
    value: int = client.ok({"op": "stats", "session": session})["sessions"][0]["waiters"]
    return value


def texts(answer: dict[str, object]) -> list[str]:
    batches = answer["batches"]
    assert isinstance(batches, list)
    return [f["result"] for b in batches for f in b["firings"]]


def test_wait_returns_at_once_when_firings_are_after_the_cursor(daemon: DaemonProc) -> None:
    c = daemon.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "one"})
    answer = c.ok({"op": "wait", "sessions": ["a"]})
    assert texts(answer) == ["one"]
    assert answer["batches"][0]["next"] == 1


def test_wait_blocks_until_a_send_then_returns_it(daemon: DaemonProc) -> None:
    waiter, sender = daemon.client(), daemon.client()
    sender.ok({"op": "start", "session": "a"})
    waiter.send({"op": "wait", "sessions": ["a"], "id": "w"})
    assert not pending(waiter, 0.5), "a wait with nothing after its cursor must block"
    sender.ok({"op": "send", "session": "a", "text": "wake"})
    answer = waiter.recv()
    assert answer["id"] == "w" and texts(answer) == ["wake"]


def test_wait_timeout_returns_empty_and_moves_no_cursor(daemon: DaemonProc) -> None:
    c = daemon.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "x"})
    c.ok({"op": "ack", "session": "a", "cursor": "wait", "seq": 1})
    before = c.ok({"op": "cursors", "session": "a"})["cursors"]
    answer = c.ok({"op": "wait", "sessions": ["a"], "timeout_ms": 200})
    assert answer["timed_out"] is True and answer["batches"] == []
    assert c.ok({"op": "cursors", "session": "a"})["cursors"] == before


def test_a_timed_out_wait_on_a_new_cursor_creates_no_cursor(daemon: DaemonProc) -> None:
    c = daemon.client()
    c.ok({"op": "start", "session": "a"})
    for i in range(16):
        c.ok({"op": "ack", "session": "a", "cursor": f"c{i}", "seq": 0})
    c.ok({"op": "wait", "sessions": ["a"], "cursor": "newcomer", "timeout_ms": 100})
    names = {row["name"] for row in c.ok({"op": "cursors", "session": "a"})["cursors"]}
    assert names == {f"c{i}" for i in range(16)}, "the wait must not evict anyone"


def test_a_follow_reader_does_not_take_a_firing_from_a_waiter(daemon: DaemonProc) -> None:
    follower, monitor, sender = daemon.client(), daemon.client(), daemon.client()
    sender.ok({"op": "start", "session": "a"})
    follower.send({"op": "wait", "sessions": ["a"], "cursor": "follow"})
    sender.ok({"op": "send", "session": "a", "text": "for everyone"})
    got = follower.recv()
    follower.ok({"op": "ack", "session": "a", "cursor": "follow", "seq": got["batches"][0]["next"]})
    assert texts(monitor.ok({"op": "wait", "sessions": ["a"], "cursor": "wait"})) == [
        "for everyone"
    ]


def test_two_concurrent_waits_both_get_the_message(daemon: DaemonProc) -> None:
    one, two, sender = daemon.client(), daemon.client(), daemon.client()
    sender.ok({"op": "start", "session": "a"})
    one.send({"op": "wait", "sessions": ["a"]})
    two.send({"op": "wait", "sessions": ["a"]})
    assert not pending(one, 0.2) and not pending(two, 0.0)
    sender.ok({"op": "send", "session": "a", "text": "both"})
    assert texts(one.recv()) == ["both"]
    assert texts(two.recv()) == ["both"]


KILLED_CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    port, token = int(sys.argv[1]), sys.argv[2]
    s = socket.create_connection(("127.0.0.1", port))
    f = s.makefile("rb")
    s.sendall(json.dumps({"op": "auth", "token": token}).encode() + b"\\n")
    f.readline()
    s.sendall(json.dumps({"op": "wait", "sessions": ["a"]}).encode() + b"\\n")
    print(f.readline().decode(), end="", flush=True)
    time.sleep(60)  # killed here: printed, never acknowledged
    """
)


def test_a_client_killed_before_acking_gets_the_same_firings_again(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    c = daemon.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "m1"})
    c.ok({"op": "send", "session": "a", "text": "m2"})
    script = tmp_path / "client.py"
    script.write_text(KILLED_CLIENT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(daemon.port), daemon.token], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert b'"m1"' in first and b'"m2"' in first
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert texts(c.ok({"op": "wait", "sessions": ["a"]})) == ["m1", "m2"]


def test_stopping_a_session_answers_its_blocked_wait_with_session_stopped(
    daemon: DaemonProc,
) -> None:
    waiter, other = daemon.client(), daemon.client()
    other.ok({"op": "start", "session": "a"})
    waiter.send({"op": "wait", "sessions": ["a"], "id": 7})
    assert not pending(waiter, 0.2)
    other.ok({"op": "stop", "session": "a"})
    answer = waiter.recv()
    assert answer == {
        "id": 7,
        "ok": False,
        "code": "session_stopped",
        "message": "session 'a' stopped",
    }


def test_an_idle_wait_costs_no_evaluation(daemon: DaemonProc) -> None:
    waiter, observer = daemon.client(), daemon.client()
    observer.ok({"op": "start", "session": "a"})
    waiter.send({"op": "wait", "sessions": ["a"]})
    deadline = time.monotonic() + 5
    while waiters(observer, "a") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    before = evaluations(observer, "a")
    time.sleep(3)
    assert evaluations(observer, "a") == before
    assert waiters(observer, "a") == 1


def test_a_disconnected_waiter_is_released_within_one_second(daemon: DaemonProc) -> None:
    observer = daemon.client()
    observer.ok({"op": "start", "session": "a"})
    waiter = Client(daemon.port, daemon.token)
    waiter.send({"op": "wait", "sessions": ["a"]})
    deadline = time.monotonic() + 5
    while waiters(observer, "a") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiters(observer, "a") == 1
    waiter.close()
    released = time.monotonic() + 1.0
    while waiters(observer, "a") and time.monotonic() < released:
        time.sleep(0.02)
    assert waiters(observer, "a") == 0


def test_a_wait_on_two_sessions_returns_the_one_that_fired(daemon: DaemonProc) -> None:
    waiter, sender = daemon.client(), daemon.client()
    for s in ("a", "b"):
        sender.ok({"op": "start", "session": s})
    sender.ok({"op": "send", "session": "b", "text": "old b"})
    sender.ok({"op": "ack", "session": "b", "cursor": "wait", "seq": 1})
    waiter.send({"op": "wait", "sessions": ["a", "b"]})
    assert not pending(waiter, 0.2)
    sender.ok({"op": "send", "session": "a", "text": "for a"})
    answer = waiter.recv()
    assert [b["session"] for b in answer["batches"]] == ["a"]
    assert texts(answer) == ["for a"]
    assert cursor_of(sender, "b", "wait") == 1
    assert cursor_of(sender, "a", "wait") is None, "the daemon acknowledges nothing itself"


def test_a_wait_carries_the_previous_batchs_ack(daemon: DaemonProc) -> None:
    c = daemon.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "1"})
    first = c.ok({"op": "wait", "sessions": ["a"], "cursor": "follow"})
    c.ok({"op": "send", "session": "a", "text": "2"})
    ack = {"a": first["batches"][0]["next"]}
    second = c.ok({"op": "wait", "sessions": ["a"], "cursor": "follow", "ack": ack})
    assert texts(second) == ["2"]
    assert cursor_of(c, "a", "follow") == 1


def test_a_burst_after_a_wake_comes_back_as_one_batch(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--memory", "--settle-ms", "300")
    try:
        waiter, sender = d.client(), d.client()
        sender.ok({"op": "start", "session": "a"})
        waiter.send({"op": "wait", "sessions": ["a"]})
        assert not pending(waiter, 0.2)
        for i in range(3):
            sender.send({"op": "send", "session": "a", "text": str(i)})
        for _ in range(3):
            assert sender.recv()["ok"]
        assert texts(waiter.recv()) == ["0", "1", "2"]
    finally:
        d.close_clients()
        d.stop()


def test_sigterm_answers_waiters_and_exits_zero(daemon: DaemonProc) -> None:
    waiter = daemon.client()
    waiter.ok({"op": "start", "session": "a"})
    waiter.send({"op": "wait", "sessions": ["a"]})
    assert not pending(waiter, 0.2)
    assert daemon.stop() == 0
    answer = waiter.recv()
    assert answer["ok"] is False and answer["code"] == "shutting_down"
    assert waiter.closed()
