"""What people who live in ``tail -F``, ``journalctl`` and ``redis-cli`` reach for.

``read --last N`` (the newest N) and ``read --since WHEN`` (a time back or
an ISO time) look without a cursor; ``--ts`` shows each firing's time;
``wait --count N`` and ``follow --count N`` stop after N firings, ``wait --max N``
prints at most N; ``send``
and ``start`` speak ``--json``; session ids complete in the shell. And the
wording that used to surprise: one dropped firing, an ``--after`` past the
head, a server that is not a daemon, a line that is too long.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from repl_cli.cli.recent import since_ts
from tests.helpers import Repl, assert_one_error_line, eventually, repl_argv


def test_read_last_n_is_the_newest_n_and_acknowledges_nothing(repl: Repl, s: str) -> None:
    repl.send(s, *(f"m{n}" for n in range(1, 8)))
    assert repl.ok("read", s, "--last", "2", "--seq") == "#6 on-message: m6\n#7 on-message: m7\n"
    assert repl.ok("read", s, "--last", "50").count("\n") == 7  # all there are
    assert repl.cursor(s, "read") is None
    repl.fails(64, "read", s, "--last", "2", "--cursor", "x")
    repl.fails(64, "read", s, "--last", "2", "--max", "1")


def test_read_last_after_a_loss_says_so(repl: Repl) -> None:
    s = repl.session("tiny")
    repl.ask({"op": "buffer", "session": s, "limit": 2})
    repl.send(s, "a", "b", "c", "d")
    assert repl.ok("read", s, "--last", "3") == (
        "(1 earlier firing dropped)\non-message: c\non-message: d\n"
    )


def test_read_since_a_time_back_or_an_iso_time(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two")
    assert repl.ok("read", s, "--since", "10m") == "on-message: one\non-message: two\n"
    assert repl.ok("read", s, "--since", "1h 30m", "--last", "1") == "on-message: two\n"
    soon = (datetime.now(UTC) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M")
    assert repl.ok("read", s, "--since", soon) == ""
    assert repl.ok("read", s, "--since", "2000-01-01").count("\n") == 2
    assert repl.cursor(s, "read") is None
    assert "is neither a time back" in repl.fails(64, "read", s, "--since", "yesterday")
    repl.fails(64, "read", s, "--since", "1m", "--after", "0")


def test_read_since_with_max_pages_through_them(repl: Repl, s: str) -> None:
    repl.send(s, "a", "b", "c")
    first = repl.ok("read", s, "--since", "1h", "--max", "2", "--full").splitlines()
    assert first[0] == "2 0" and len(first) == 3  # NEXT LOST, then the oldest two
    assert repl.ok("read", s, "--after", "2") == "on-message: c\n"


def test_since_bounds_read_as_firing_times() -> None:
    now = datetime(2026, 12, 1, 9, 30, 15, 250000, tzinfo=UTC)
    assert since_ts("90s", now) == "2026-12-01T09:28:45.250Z"
    assert since_ts("1h30m", now) == "2026-12-01T08:00:15.250Z"
    assert since_ts("2d", now) == "2026-11-29T09:30:15.250Z"
    assert since_ts("2026-12-01T08:00", now) == "2026-12-01T08:00:00.000Z"
    assert since_ts("2026-12-01T10:00+02:00", now) == "2026-12-01T08:00:00.000Z"
    assert since_ts("2026-12-01T08:00:00Z", now) == "2026-12-01T08:00:00.000Z"
    assert since_ts("soon", now) is None
    assert since_ts("10x", now) is None


def test_ts_puts_each_firings_time_before_it(repl: Repl, s: str) -> None:
    repl.send(s, "hello")
    (as_json,) = [
        json.loads(x) for x in repl.ok("read", s, "--after", "0", "--json").split("\n")[1:] if x
    ]
    text = repl.ok("read", s, "--after", "0", "--ts", "--seq")
    assert text == f"#1 {as_json['ts']} on-message: hello\n"


def test_wait_count_waits_for_n_firings_over_several_batches(repl: Repl, s: str) -> None:
    repl.send(s, "one", "two")
    waiter = repl.popen("wait", s, "--count", "3", "--seq")
    assert waiter.stdout is not None
    first = [waiter.stdout.readline() for _ in range(2)]  # taken: so they are acknowledged
    assert first == [b"#1 on-message: one\n", b"#2 on-message: two\n"]
    eventually(lambda: repl.cursor(s, "wait") == 2, what="the first two acknowledged")
    assert waiter.poll() is None  # two of three: still waiting
    repl.send(s, "three", "four")
    out, err = waiter.communicate(timeout=20)
    assert waiter.returncode == 0, err
    assert out.decode() == "#3 on-message: three\n"
    assert repl.cursor(s, "wait") == 3  # the fourth is left for the next reader
    assert repl.ok("wait", s) == "on-message: four\n"
    repl.fails(64, "wait", s, "--count", "2", "--peek")


def test_wait_count_with_a_timeout_exits_0_once_something_was_printed(repl: Repl, s: str) -> None:
    repl.send(s, "only")
    done = repl.run("wait", s, "--count", "5", "--timeout", "0.3")
    assert (done.returncode, done.stdout) == (0, "on-message: only\n")
    done = repl.run("wait", s, "--count", "5", "--timeout", "0.3")
    assert (done.returncode, done.stdout) == (2, "")


def test_wait_max_prints_the_oldest_n_and_acknowledges_only_them(repl: Repl, s: str) -> None:
    repl.send(s, "a", "b", "c")
    assert repl.ok("wait", s, "--max", "1") == "on-message: a\n"
    assert repl.cursor(s, "wait") == 1  # b and c stay for the next wait
    assert repl.ok("wait", s, "--max", "2", "--seq") == "#2 on-message: b\n#3 on-message: c\n"
    assert repl.cursor(s, "wait") == 3
    assert repl.run("wait", s, "--max", "1", "--timeout", "0").returncode == 2
    # a matching reader's --max ends its batch at the last firing it printed, not at the last
    # it looked at, so the matching firings after it are not passed over
    repl.ok("send", s, "--lines", "--tag", "reply-to=me", input="x\ny\nz\n")
    one = repl.ok("wait", s, "--match", "reply-to", "--cursor", "worker", "--max", "1")
    assert one == "on-message: x\n"
    assert repl.cursor(s, "worker") == 4
    rest = repl.ok("wait", s, "--match", "reply-to", "--cursor", "worker", "--max", "5")
    assert rest == "on-message: y\non-message: z\n"
    repl.fails(64, "wait", s, "--max", "1", "--count", "2")
    repl.fails(64, "wait", s, "--max", "0")


def test_wait_max_bounds_the_whole_over_several_sessions(repl: Repl) -> None:
    a, b = repl.session("a", "a1", "a2"), repl.session("b", "b1", "b2")
    out = repl.ok("wait", a, b, "--max", "3", "--json")
    firings = [json.loads(line) for line in out.splitlines() if '"seq"' in line]
    assert [(f["session"], f["result"]) for f in firings] == [
        (a, "a1"),
        (a, "a2"),
        (b, "b1"),
    ] or [(f["session"], f["result"]) for f in firings] == [(b, "b1"), (b, "b2"), (a, "a1")]
    assert sorted([repl.cursor(a, "wait"), repl.cursor(b, "wait")]) == [1, 2]
    rest = repl.ok("wait", a, b, "--max", "3")
    assert len(rest.splitlines()) == 1  # the one left of the four


def test_follow_count_stops_after_n_and_acknowledges_them(repl: Repl, s: str) -> None:
    repl.send(s, "a", "b", "c")
    assert repl.ok("follow", s, "--count", "2") == "on-message: a\non-message: b\n"
    assert repl.cursor(s, "follow") == 2
    assert repl.ok("follow", s, "--count", "1") == "on-message: c\n"
    assert repl.cursor(s, "follow") == 3


def test_send_and_start_speak_json(repl: Repl) -> None:
    started = json.loads(repl.ok("start", "--json"))
    assert sorted(started) == ["created", "session"] and started["created"] is True
    s = started["session"]
    again = json.loads(repl.ok("start", s, "--exist-ok", "--json"))
    assert again == {"session": s, "created": False}
    assert json.loads(repl.ok("send", s, "x", "--key", "k", "--json")) == {
        "seq": 1,
        "duplicate": False,
    }
    assert json.loads(repl.ok("send", s, "x", "--key", "k", "--json")) == {
        "seq": 1,
        "duplicate": True,
    }
    lines = repl.ok("send", s, "--lines", "--json", input="p\nq\n").splitlines()
    assert [json.loads(x) for x in lines] == [
        {"seq": 2, "duplicate": False},
        {"seq": 3, "duplicate": False},
    ]


def _complete(env: dict[str, str], line: str) -> list[str]:
    words = line.split(" ")
    done = subprocess.run(
        repl_argv(),
        capture_output=True,
        text=True,
        timeout=30,
        env={
            **env,
            "_REPL_COMPLETE": "bash_complete",
            "COMP_WORDS": line,
            "COMP_CWORD": str(len(words) - 1),
        },
    )
    assert done.returncode == 0 and done.stderr == "", done
    return [item.split(",", 1)[1] for item in done.stdout.split() if item.startswith("plain,")]


def test_session_ids_complete_in_the_shell_and_nothing_breaks_when_the_daemon_is_away(
    repl: Repl,
) -> None:
    a = repl.session("comp")
    b = repl.session("comp")
    assert {a, b} <= set(_complete(repl.env, "repl read "))
    assert set(_complete(repl.env, f"repl wait {a[:-1]}")) >= {a}
    assert _complete(repl.env, "repl read zzz-none") == []
    away = {**repl.env, "REPL_ADDR": "127.0.0.1:1"}
    assert _complete(away, "repl read ") == []


def test_one_dropped_firing_is_singular(repl: Repl) -> None:
    s = repl.session("one")
    repl.ask({"op": "buffer", "session": s, "limit": 1})
    repl.send(s, "a", "b")
    assert repl.ok("read", s) == "(1 earlier firing dropped)\non-message: b\n"


def test_an_after_past_the_head_names_the_option(repl: Repl, s: str) -> None:
    repl.send(s, "x")
    stderr = repl.fails(1, "read", s, "--after", "5")
    assert stderr == (
        "repl: after 5 is after head 1: "
        "read from the head or before it (`repl sessions` shows it)\n"
    )


@pytest.fixture
def not_a_daemon() -> Iterator[str]:
    """A server that answers like a web server: its address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def test_a_server_that_is_not_a_daemon_is_named_so(repl: Repl, not_a_daemon: str) -> None:
    done = repl.run("--addr", not_a_daemon, "ping")
    assert done.returncode == 1
    assert_one_error_line(done.stderr)
    assert f"what answers at {not_a_daemon} is not a repl daemon" in done.stderr
    assert "an HTTP server answers there" in done.stderr and "same version" not in done.stderr


def test_a_line_too_long_says_what_fits(repl: Repl, s: str) -> None:
    stderr = repl.fails(1, "send", s, input="a" * 1_100_000)
    assert "over the 1,048,576 bytes (1 MiB)" in stderr and "JSON escaping" in stderr
