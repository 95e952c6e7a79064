"""Bad input and authentication (SPEC §4): a clear error, no state change, no crash."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any, NoReturn

import pytest

from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.config import Limits
from session.delta import Delta
from tests.helpers import (
    Client,
    DaemonProc,
    InProcDaemon,
    daemon_config,
    eventually,
    inproc_daemon,
)


def state(c: Client) -> dict[str, Any]:
    """Everything a bad request must leave alone."""
    sessions = c.ok({"op": "sessions"})["sessions"]
    reads = {
        s["id"]: c.ok({"op": "read", "session": s["id"], "after": 0})["firings"] for s in sessions
    }
    cursors = {s["id"]: c.ok({"op": "cursors", "session": s["id"]})["cursors"] for s in sessions}
    return {"sessions": sessions, "reads": reads, "cursors": cursors}


DEEP = b"[" * 1000 + b"]" * 1000

BAD_LINES: list[tuple[bytes, str, str]] = [
    (b"{not json", "bad_request", "malformed JSON"),
    (b"[1, 2]", "bad_request", "Expected `object`"),
    (b'"just a string"', "bad_request", "Expected `object`"),
    (b'{"id": 1}', "bad_request", "missing required field `op`"),
    (b'{"op": "launch", "id": 2}', "unknown_op", "launch"),
    (b'{"op": "send", "session": "a", "text": 5}', "bad_request", "at `$.text`"),
    (b'{"op": "send", "session": "a"}', "bad_request", "`text`"),
    (b'{"op": "read", "session": "a", "max": "ten"}', "bad_request", "at `$.max`"),
    (b'{"op": "wait", "sessions": "a"}', "bad_request", "at `$.sessions`"),
    (b'{"op": "send", "session": "no/such id", "text": "x"}', "bad_session_id", "no/such id"),
    (b'{"op": "start", "session": "-leading-dash"}', "bad_session_id", "-leading-dash"),
    (b'{"op": "read", "session": "a", "cursor": "has space"}', "bad_cursor_name", "has space"),
    (b'{"op": "read", "session": "a", "cursor": ""}', "bad_cursor_name", "cursor name"),
    (b'{"op": "ack", "session": "a", "seq": 99}', "ack_after_head", "head is 2"),
    (b'{"op": "ack", "session": "a", "seq": -1}', "bad_seq", "negative"),
    (
        b'{"op": "read", "session": "a", "after": 3}',
        "cursor_after_head",
        "after 3 is after head 2",
    ),
    (b'{"op": "read", "session": "a", "after": 1, "cursor": "x"}', "bad_request", "not both"),
    (b'{"op": "read", "session": "a", "max": 0}', "bad_max", "below 1"),
    (b'{"op": "buffer", "session": "a", "limit": 70000}', "bad_limit", "70000"),
    (b'{"op": "send", "session": "nobody", "text": "x"}', "no_such_session", "repl start nobody"),
    (b'{"op": "start", "session": "a"}', "session_exists", "--exist-ok"),
    (b'{"op": "send", "session": "a", "text": "x", "handler": "on tick"}', "bad_handler", ""),
    (b'{"op": "send", "session": "a", "text": "x", "key": ""}', "bad_key", ""),
    (b'{"op": "wait", "sessions": []}', "bad_request", "at least one session"),
    (b'{"op": "send", "session": "a", "text": "\\ud800"}', "bad_request", ""),
    (b'\xff\xfe{"op": "ping"}', "bad_request", "malformed JSON"),
    (
        b'{"op": "send", "session": "a", "text": "x", "key": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        "bad_request",
        "",
    ),
    (b'{"op": "ping", "extra": ' + DEEP + b"}", "bad_request", "JSON nested too deeply"),
    (b'{"op": "ack", "session": "a", "seq": 1e400}', "bad_request", ""),
    (b'{"op": "ack", "session": "a", "seq": 99999999999999999999999}', "ack_after_head", ""),
]


@pytest.mark.parametrize(("line", "code", "text"), BAD_LINES)
def test_a_bad_request_gets_its_error_changes_nothing_and_keeps_the_connection(
    inproc: InProcDaemon, line: bytes, code: str, text: str
) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "one"})
    c.ok({"op": "send", "session": "a", "text": "two"})
    c.ok({"op": "ack", "session": "a", "cursor": "read", "seq": 1})
    before = state(c)
    c.send_raw(line + b"\n")
    answer = c.recv()
    assert answer["ok"] is False
    assert answer["code"] == code, answer
    assert text in answer["message"]
    assert state(c) == before
    assert c.ok({"op": "ping"})["version"], "the connection stays usable"


def test_the_error_echoes_the_request_id_when_it_can(inproc: InProcDaemon) -> None:
    c = inproc.client()
    answer = c.call({"op": "send", "id": "abc", "session": "nobody", "text": "x"})
    assert answer["id"] == "abc" and answer["code"] == "no_such_session"
    answer = c.call({"op": "nope", "id": 42})
    assert answer["id"] == 42 and answer["code"] == "unknown_op"


def test_an_oversized_line_gets_an_error_and_the_connection_closes(inproc: InProcDaemon) -> None:
    c, bystander = inproc.client(), inproc.client()
    c.ok({"op": "start", "session": "a"})
    text = "x" * (1 << 20)
    c.send_raw(json.dumps({"op": "send", "session": "a", "text": text}).encode() + b"\n")
    answer = c.recv()
    assert answer["code"] == "line_too_long"
    assert c.closed()
    assert bystander.ok({"op": "read", "session": "a", "after": 0})["firings"] == []


def test_a_stalled_half_line_is_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    config = daemon_config(tmp_path / "home", limits=Limits(idle_timeout=0.5))
    with inproc_daemon(config) as d:
        staller, bystander = d.client(), d.client()
        staller.send_raw(b'{"op": "pi')
        for _ in range(5):  # the bystander is served while the staller stalls
            assert bystander.ok({"op": "ping"})
        answer = staller.recv()
        assert answer["code"] == "idle_timeout"
        assert staller.closed()


def test_a_line_trickled_a_byte_at_a_time_is_closed_after_the_idle_timeout(
    tmp_path: Path,
) -> None:
    """Bytes that end no line do not reset the idle clock: a request line must arrive whole
    within the idle timeout, however its bytes are spread."""
    config = daemon_config(tmp_path / "home", limits=Limits(idle_timeout=0.5))
    with inproc_daemon(config) as d:
        trickler = d.client()
        line = json.dumps({"op": "ping", "pad": "x" * 200}).encode()
        sent = 0
        while not trickler.pending(0.05):  # a byte every 50 ms: ten each idle timeout
            assert sent < len(line), "the whole line went: it was never timed out"
            trickler.send_raw(line[sent : sent + 1])
            sent += 1
        answer = trickler.recv()
        assert answer["code"] == "idle_timeout"
        assert "no whole request line received for 0.5 s" in answer["message"]
        assert trickler.closed()
        assert sent < len(line)
        assert d.client().ok({"op": "ping"})


def test_half_lines_are_bounded_in_total_the_largest_holder_is_closed(tmp_path: Path) -> None:
    limits = Limits(idle_timeout=30, max_buffered_bytes=100_000)
    with inproc_daemon(daemon_config(tmp_path / "home", limits=limits)) as d:
        small, middle, large = d.client(), d.client(), d.client()
        half = b'{"op": "send", "session": "a", "text": "'
        for c, size in ((small, 20_000), (middle, 30_000), (large, 40_000)):
            c.send_raw(half + b"x" * size)
        assert not any(c.pending(0.2) for c in (small, middle, large))  # 90 KB: within it
        small.send_raw(b"y" * 25_000)  # 115 KB now: the 45 KB of small is the most
        answer = small.recv()
        assert answer["code"] == "too_many" and "unfinished request lines" in answer["message"]
        assert small.closed()
        # the others were not touched, and finish their lines as ever
        middle.send_raw(b'"}\n')
        assert middle.recv()["code"] == "no_such_session"
        large.send_raw(b'"}\n')
        assert large.recv()["code"] == "no_such_session"
        assert d.client().ok({"op": "ping"})


def test_a_blocked_wait_is_exempt_from_the_idle_timeout(tmp_path: Path) -> None:
    config = daemon_config(tmp_path / "home", limits=Limits(idle_timeout=0.3))
    with inproc_daemon(config) as d:
        waiter = d.client()
        waiter.ok({"op": "start", "session": "a"})
        answer = waiter.call({"op": "wait", "sessions": ["a"], "timeout_ms": 1000})
        assert answer["ok"] and answer["timed_out"]


def test_many_bad_lines_on_one_connection_while_another_is_served(inproc: InProcDaemon) -> None:
    bad, good = inproc.client(), inproc.client()
    good.ok({"op": "start", "session": "a"})
    good.ok({"op": "send", "session": "a", "text": "one"})
    good.ok({"op": "send", "session": "a", "text": "two"})
    good.ok({"op": "start", "session": "other"})
    for i, (line, code, _) in enumerate(BAD_LINES * 3):
        bad.send_raw(line + b"\n")
        assert bad.recv()["code"] == code
        assert good.ok({"op": "send", "session": "other", "text": str(i)})["seq"] == i + 1


# -- authentication -------------------------------------------------------


def test_a_connection_without_the_token_is_refused(inproc: InProcDaemon) -> None:
    c = inproc.client(auth=False)
    answer = c.call({"op": "read", "session": "a", "after": 0})
    assert answer["ok"] is False and answer["code"] == "unauthorized"
    assert c.closed()


def test_a_wrong_token_is_refused(inproc: InProcDaemon) -> None:
    c = inproc.client(auth=False)
    answer = c.call({"op": "auth", "token": "guess"})
    assert answer["code"] == "unauthorized" and "wrong token" in answer["message"]
    assert c.closed()


def test_a_token_after_another_op_is_refused(inproc: InProcDaemon) -> None:
    c = inproc.client(auth=False)
    assert c.call({"op": "ping"})["code"] == "unauthorized"
    assert c.closed()


def test_garbage_before_auth_is_refused_and_closed(inproc: InProcDaemon) -> None:
    c = inproc.client(auth=False)
    c.send_raw(b"GET / HTTP/1.1\r\n")
    assert c.recv()["code"] == "bad_request"
    assert c.closed()


def test_the_token_file_is_created_private(inproc: InProcDaemon) -> None:
    mode = stat.S_IMODE((inproc.home / "token").stat().st_mode)
    assert mode == 0o600


def test_a_world_readable_token_file_is_refused_at_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "token").write_text("secret\n")
    os.chmod(home / "token", 0o644)
    proc = subprocess.run(
        [sys.executable, "-m", "repl_daemon", "--addr", "127.0.0.1:0", "--home", str(home)],
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert b"chmod 600" in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_start_generates_an_id_when_none_is_given(inproc: InProcDaemon) -> None:
    c = inproc.client()
    one = c.ok({"op": "start"})["session"]
    two = c.ok({"op": "start"})["session"]
    assert one != two
    ids = [s["id"] for s in c.ok({"op": "sessions"})["sessions"]]
    assert sorted(ids) == sorted([one, two])


def test_start_exist_ok_keeps_the_session(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "kept"})
    assert c.ok({"op": "start", "session": "a", "exist_ok": True})["created"] is False
    assert c.ok({"op": "read", "session": "a", "after": 0})["firings"][0]["result"] == "kept"


def test_stats_counts_firings_lost_connections_and_waiters(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a", "buffer": 2})
    for i in range(5):
        c.ok({"op": "send", "session": "a", "text": str(i)})
    stats = c.ok({"op": "stats"})
    assert stats["daemon"]["firings"] == 5
    assert stats["daemon"]["lost"] == 3
    assert stats["daemon"]["connections"] == 1
    assert stats["daemon"]["store"] == "memory"
    row = stats["sessions"][0]
    assert (row["head"], row["retained"], row["limit"], row["lost"]) == (5, 2, 2, 3)
    assert row["evaluations"] == 5


def test_pipelined_requests_are_answered_in_order(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    payload = b"".join(
        json.dumps({"op": "send", "session": "a", "text": str(i), "id": i}).encode() + b"\n"
        for i in range(500)
    )
    c.send_raw(payload)
    answers = [c.recv() for _ in range(500)]
    assert [a["id"] for a in answers] == list(range(500))
    assert [a["seq"] for a in answers] == list(range(1, 501))


def test_the_daemon_survives_a_client_that_vanishes_mid_request(inproc: InProcDaemon) -> None:
    for _ in range(20):
        c = Client(inproc.port, inproc.token)
        c.send_raw(b'{"op": "start", "session": "x", "exist_ok": tr')
        c.close()
    # the daemon has let go of every one of them (stats count its own connection only),
    # and serves on
    c = inproc.client()
    eventually(
        lambda: c.ok({"op": "stats"})["daemon"]["connections"] == 1, 5, "the vanished clients"
    )
    assert c.ok({"op": "ping"})


def test_an_address_in_use_ends_the_start_with_one_clear_line(inproc: InProcDaemon) -> None:
    second = str(inproc.home / "second")
    proc = subprocess.run(
        [sys.executable, "-m", "repl_daemon", "--addr", inproc.addr, "--memory", "--home", second],
        capture_output=True,
        timeout=30,
    )
    assert proc.returncode == 1
    last = proc.stderr.decode().strip().splitlines()[-1]
    assert last == (
        f"repl daemon: cannot listen on {inproc.addr}: Address already in use: "
        "is another daemon running there?"
    )
    assert b"Traceback" not in proc.stderr


def test_the_event_loop_can_be_chosen(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--memory", "--loop", "asyncio")
    try:
        assert d.client().ok({"op": "ping"})
    finally:
        d.close_clients()
        d.stop()
    assert "event loop: asyncio" in d.log.read_text()
    if find_spec("uvloop") is None:
        home = str(tmp_path / "h2")
        args = ["--addr", "127.0.0.1:0", "--memory", "--home", home, "--loop", "uvloop"]
        proc = subprocess.run(
            [sys.executable, "-m", "repl_daemon", *args],
            capture_output=True,
            timeout=30,
        )
        assert proc.returncode == 1
        assert b"pip install 'repl-inbox[uvloop]'" in proc.stderr
    else:
        d = DaemonProc(tmp_path / "h3", "--memory", "--loop", "uvloop")
        try:
            assert d.client().ok({"op": "ping"})
        finally:
            d.close_clients()
            d.stop()
        assert "event loop: uvloop" in d.log.read_text()


def test_a_home_that_cannot_be_made_ends_the_start_with_one_clear_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    args = ["--addr", "127.0.0.1:0", "--memory", "--home", str(blocker / "home")]
    proc = subprocess.run(
        [sys.executable, "-m", "repl_daemon", *args], capture_output=True, timeout=30
    )
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith("repl daemon: cannot start: Not a directory")
    assert b"Traceback" not in proc.stderr


def test_a_second_auth_is_refused_and_the_connection_keeps_its_token(
    inproc: InProcDaemon,
) -> None:
    """A connection authenticates once. A second auth, whatever its token (the same, a
    scoped one, a wrong one), is refused with bad_request and changes nothing: the
    connection stays usable as what it was."""
    root = inproc.client()
    root.ok({"op": "start", "session": "a"})
    made = root.ok(
        {"op": "token", "action": "add", "name": "t", "sessions": ["a"], "can": ["read"]}
    )
    for token in (inproc.token, made["token"], "garbage"):
        answer = root.call({"op": "auth", "token": token, "id": 7})
        assert answer["ok"] is False and answer["code"] == "bad_request", answer
        assert answer["id"] == 7 and "authenticated already" in answer["message"]
        # still the root: a root-only op works, and so does a send
        assert root.ok({"op": "token", "action": "list"})["tokens"]
    assert root.ok({"op": "send", "session": "a", "text": "still served"})["seq"] == 1
    scoped = Client(inproc.port, made["token"])
    assert scoped.call({"op": "auth", "token": inproc.token})["code"] == "bad_request"
    assert scoped.call({"op": "token", "action": "list"})["code"] == "forbidden"  # still scoped
    scoped.close()


def test_a_bug_in_the_engine_is_answered_internal_logged_and_the_connection_goes_on(
    inproc: InProcDaemon, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: LocalCommitter, session_id: str | None) -> NoReturn:
        raise RuntimeError("a bug")

    monkeypatch.setattr(LocalCommitter, "summaries", broken)
    c = inproc.client()
    answer = c.call({"op": "sessions", "id": 1})
    assert answer == {
        "ok": False,
        "id": 1,
        "code": "internal",
        "message": "internal error: RuntimeError: a bug",
    }
    assert c.ok({"op": "ping"})["version"]
    (logged,) = [r for r in caplog.records if r.getMessage() == "internal error"]
    assert logged.levelname == "ERROR" and logged.exc_info is not None


@pytest.mark.parametrize("inproc", ["durable"], indirect=True)
def test_a_send_whose_client_left_before_its_commit_is_still_recorded(
    inproc: InProcDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    observer = inproc.client()
    observer.ok({"op": "start", "session": "a"})
    gate = threading.Event()
    write = SqliteStore.write

    def held(self: SqliteStore, batch: list[Delta]) -> None:
        assert gate.wait(15), "the test did not open the gate"
        write(self, batch)

    monkeypatch.setattr(SqliteStore, "write", held)
    try:
        sender = Client(inproc.port, inproc.token)
        sender.send({"op": "send", "session": "a", "text": "left behind"})
        sender.close()  # gone before its send is durable: the answer has nowhere to go

        def connections() -> int:
            count: int = observer.ok({"op": "stats"})["daemon"]["connections"]
            return count

        eventually(lambda: connections() == 1, what="the daemon to see the sender go")
    finally:
        gate.set()
    eventually(
        lambda: observer.ok({"op": "sessions"})["sessions"][0]["head"] == 1,
        what="the send to be committed",
    )
    firings = observer.ok({"op": "read", "session": "a", "after": 0})["firings"]
    assert [f["result"] for f in firings] == ["left behind"]
