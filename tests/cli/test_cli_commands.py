"""Each ``repl`` command, run as a user runs it, against a real daemon."""

from __future__ import annotations

import json

import pytest

from tests.helpers import InProcDaemon, Repl


@pytest.fixture
def lone(inproc: InProcDaemon) -> Repl:
    """repl on a daemon of the test's own, for tests that look at every session."""
    return Repl(inproc)


def test_ping_names_the_version_and_uptime(repl: Repl) -> None:
    out = repl.ok("ping")
    assert out.startswith(f"repl daemon 0.1.0 at {repl.daemon.addr}, pid ")
    assert ", store memory, up " in out


def test_version_and_help(repl: Repl) -> None:
    assert repl.ok("--version") == "repl 0.1.0\n"
    assert "Usage: repl read" in repl.ok("read", "--help")
    assert "follow" in repl.ok("-h")


def test_start_prints_the_id_given_or_a_made_up_one(lone: Repl) -> None:
    repl = lone
    assert repl.ok("start", "inbox") == "inbox\n"
    made_up = repl.ok("start").strip()
    assert made_up
    listed = [row["id"] for row in json.loads(repl.ok("sessions", "--json"))]
    assert listed == sorted(["inbox", made_up])


def test_start_twice_fails_unless_exist_ok(repl: Repl) -> None:
    a = repl.session("a")
    assert "--exist-ok" in repl.fails(1, "start", a)
    assert repl.ok("start", a, "--exist-ok") == f"{a}\n"


def test_start_with_buffer_sets_the_limit(repl: Repl) -> None:
    repl.ok("start", "buffered", "--buffer", "3")
    rows = json.loads(repl.ok("sessions", "--json"))
    assert [row["limit"] for row in rows if row["id"] == "buffered"] == [3]


def test_stop_removes_the_session(lone: Repl) -> None:
    repl = lone
    repl.ok("start", "a")
    assert repl.ok("stop", "a") == ""
    assert repl.ok("sessions", "--json") == "[]\n"
    assert "no session 'a'" in repl.fails(1, "stop", "a")


def test_sessions_lists_tab_separated_with_a_header_when_piped(lone: Repl) -> None:
    repl = lone
    repl.ok("start", "a")
    repl.ok("start", "b", "--buffer", "8")
    repl.send("a", "x", "y")
    out = repl.ok("sessions")
    assert out.splitlines() == [
        "id\thead\tretained\tlimit\tcursors\twaiters",
        "a\t2\t2\t256\t0\t0",
        "b\t0\t0\t8\t0\t0",
    ]
    rows = json.loads(repl.ok("sessions", "--json"))
    assert rows[0] == {
        "id": "a",
        "head": 2,
        "retained": 2,
        "limit": 256,
        "cursors": 0,
        "waiters": 0,
    }


def test_send_prints_the_seq_and_records_the_text(repl: Repl) -> None:
    a = repl.session("a")
    assert repl.ok("send", a, "hello world") == "1\n"
    assert repl.ok("send", a, "again") == "2\n"
    assert repl.ok("read", a, "--after", "0") == "on-message: hello world\non-message: again\n"


def test_send_reads_stdin_less_one_trailing_newline(repl: Repl) -> None:
    a = repl.session("a")
    assert repl.ok("send", a, input="from stdin\n") == "1\n"
    assert repl.ok("send", a, "-", input="two lines\n\n") == "2\n"
    assert repl.ok("send", a, "-", input="no newline") == "3\n"
    got = [json.loads(line) for line in repl.ok("read", a, "--json").splitlines()[1:]]
    assert [f["result"] for f in got] == ["from stdin", "two lines\n", "no newline"]


def test_send_with_another_handler_is_unhandled(repl: Repl) -> None:
    a = repl.session("a")
    repl.ok("send", a, "tick", "--handler", "on-build")
    assert repl.ok("read", a) == "on-build (unhandled): tick\n"


def test_send_with_a_key_twice_is_a_duplicate(repl: Repl) -> None:
    a = repl.session("a")
    assert repl.ok("send", a, "once", "--key", "k-1") == "1\n"
    assert repl.ok("send", a, "once", "--key", "k-1") == "1 duplicate\n"
    assert repl.ok("send", a, "other", "--key", "k-2") == "2\n"


def test_send_lines_sends_a_thousand_lines_over_one_connection(lone: Repl) -> None:
    repl = lone
    repl.ok("start", "a", "--buffer", "2000")
    lines = [f"line {n} ✓" for n in range(1, 1001)]
    out = repl.ok("send", "a", "--lines", input="\n".join(lines) + "\n")
    assert out.splitlines() == [str(n) for n in range(1, 1001)]
    read = repl.ok("read", "a", "--after", "0", "--json").splitlines()
    assert json.loads(read[0]) == {"next": 1000, "lost": 0}
    assert [json.loads(line)["result"] for line in read[1:]] == lines
    stats = json.loads(repl.ok("stats", "--json"))["daemon"]
    # the CLI's sends plus this stats call, and the few test clients: not a connection a line
    assert stats["connections"] < 10


def test_send_lines_keeps_a_last_line_without_newline(repl: Repl) -> None:
    a = repl.session("a")
    assert repl.ok("send", a, "--lines", input="one\ntwo") == "1\n2\n"
    assert repl.ok("read", a) == "on-message: one\non-message: two\n"


def test_send_lines_with_text_or_key_is_a_usage_error(repl: Repl) -> None:
    a = repl.session("a")
    repl.fails(64, "send", a, "text", "--lines")
    repl.fails(64, "send", a, "--lines", "--key", "k", input="x\n")


def test_read_prints_and_acknowledges_the_read_cursor(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "one", "two")
    assert repl.ok("read", a) == "on-message: one\non-message: two\n"
    assert repl.cursor(a, "read") == 2
    assert repl.ok("read", a) == ""
    repl.send(a, "three")
    assert repl.ok("read", a, "--seq") == "#3 on-message: three\n"


def test_read_max_pages_through(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "1", "2", "3")
    assert repl.ok("read", a, "--max", "2") == "on-message: 1\non-message: 2\n"
    assert repl.ok("read", a, "--max", "2") == "on-message: 3\n"


def test_read_with_a_named_cursor_leaves_the_default_alone(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "one")
    assert repl.ok("read", a, "--cursor", "mine") == "on-message: one\n"
    assert repl.cursor(a, "mine") == 1
    assert repl.cursor(a, "read") is None


def test_read_peek_and_after_acknowledge_nothing(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "one", "two")
    assert repl.ok("read", a, "--peek") == "on-message: one\non-message: two\n"
    assert repl.ok("read", a, "--after", "1") == "on-message: two\n"
    assert repl.cursor(a, "read") is None
    assert repl.ok("read", a, "--peek", "--max", "1") == "on-message: one\n"


def test_ack_by_hand_after_a_peek(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "one", "two")
    repl.ok("read", a, "--peek", "--max", "1")
    assert repl.ok("ack", a, "1") == ""
    assert repl.ok("read", a) == "on-message: two\n"
    assert repl.ok("ack", a, "1", "--cursor", "other") == ""
    assert repl.cursor(a, "other") == 1
    assert "head is 2" in repl.fails(1, "ack", a, "5")


def test_cursors_lists_name_seq_and_lag(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "one", "two", "three")
    repl.ok("ack", a, "1")
    repl.ok("ack", a, "3", "--cursor", "x")
    header, *rows = repl.ok("cursors", a).splitlines()
    assert header == "name\tseq\tlag"
    assert sorted(rows) == ["read\t1\t2", "x\t3\t0"]
    listed = json.loads(repl.ok("cursors", a, "--json"))
    assert sorted(listed, key=lambda c: c["name"]) == [
        {"name": "read", "seq": 1, "lag": 2},
        {"name": "x", "seq": 3, "lag": 0},
    ]


def test_buffer_sets_the_limit_and_readers_hear_of_the_loss(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "1", "2", "3", "4")
    assert repl.ok("buffer", a, "2") == ""
    rows = json.loads(repl.ok("sessions", "--json"))
    assert [row["limit"] for row in rows if row["id"] == a] == [2]
    assert repl.ok("read", a) == "(2 earlier firings dropped)\non-message: 3\non-message: 4\n"
    repl.fails(64, "buffer", a, "70000")


def test_poll_drains_at_most_once(repl: Repl) -> None:
    a = repl.session("a")
    repl.send(a, "one", "two", "three")
    assert repl.ok("poll", a, "--max", "1") == "on-message: one\n"
    assert repl.ok("poll", a) == "on-message: two\non-message: three\n"
    assert repl.ok("poll", a) == ""
    assert repl.cursor(a, "poll") == 3
    assert repl.cursor(a, "read") is None


def test_stats_counts_per_daemon_and_per_session(lone: Repl) -> None:
    repl = lone
    repl.ok("start", "a")
    repl.send("a", "one")
    got = json.loads(repl.ok("stats", "--json"))
    assert got["daemon"]["firings"] == 1
    assert {"firings", "lost", "evaluations", "waiters", "connections"} <= set(got["daemon"])
    assert got["sessions"][0]["id"] == "a"
    one = json.loads(repl.ok("stats", "a", "--json"))
    assert [s["id"] for s in one["sessions"]] == ["a"]
    text = repl.ok("stats")
    assert text.startswith("counter\tvalue\n")
    assert "\nfirings since start\t1\n" in text
    assert "\nid\thead\tretained\tlimit\tfirings\tlost\tevaluations\twaiters\tcursors\n" in text
    assert repl.ok("stats", "a").splitlines()[1].startswith("a\t1\t1\t256\t1\t0\t")
