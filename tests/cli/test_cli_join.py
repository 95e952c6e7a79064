"""The join through the CLI as a user runs it (SPEC §18): ``repl wait --all``, ``repl
gather``, ``repl request --to ... --key``, ``repl join``.

A blocked command is started first, seen blocked (``Repl.waiters``), and only then is
what completes it sent: every wait is for an event, bounded, never for time to pass.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.helpers import Repl, eventually

pytestmark = pytest.mark.timeout(120)


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out.decode(), err.decode()


# -- wait --all ------------------------------------------------------------------------


def test_wait_all_returns_when_the_last_session_gets_its_firing(repl: Repl) -> None:
    a, b, c = repl.session("a"), repl.session("b"), repl.session("c")
    repl.send(b, "b early")  # an early arrival counts at once
    waiter = repl.popen("wait", a, b, c, "--all", "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(c) == 1, what="the wait to block")
        repl.send(a, "a")
        repl.send(c, "c last")
        status, out, err = finish(waiter)
    finally:
        waiter.kill()
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"{a} on-message: a",
        f"{b} on-message: b early",
        f"{c} on-message: c last",
    ]
    assert [repl.cursor(s, "wait") for s in (a, b, c)] == [1, 1, 1]  # acknowledged together


def test_wait_all_that_times_out_prints_and_acknowledges_nothing(repl: Repl) -> None:
    a, b = repl.session("a", "there"), repl.session("b")
    done = repl.run("wait", a, b, "--all", "--timeout", "0.05")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", "")
    assert repl.cursor(a, "wait") is None
    # --max bounds each session's batch: every session still has one
    repl.send(b, "b1", "b2")
    out = repl.ok("wait", a, b, "--all", "--max", "1", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line.get("result") for line in lines if "seq" in line] == ["there", "b1"]
    assert (repl.cursor(a, "wait"), repl.cursor(b, "wait")) == (1, 1)


def test_wait_all_with_count_is_refused(repl: Repl) -> None:
    s = repl.session("a")
    assert "not both" in repl.fails(64, "wait", s, "--all", "--count", "2")


# -- gather ----------------------------------------------------------------------------


def test_gather_prints_one_reply_a_corr_in_the_order_asked_and_again_the_same(
    repl: Repl,
) -> None:
    mine = repl.session("co")
    repl.ok("send", mine, "w2's", "--tag", "corr=c2")  # before the gather: it counts
    gatherer = repl.popen("gather", mine, "c1", "c2", "c3", "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(mine) == 1, what="the gather to block")
        repl.ok("send", mine, "w3's", "--tag", "corr=c3")
        repl.ok("send", mine, "w2's retry", "--tag", "corr=c2")  # first by seq wins
        repl.ok("send", mine, "w1's", "--tag", "corr=c1")
        status, out, err = finish(gatherer)
    finally:
        gatherer.kill()
    assert (status, err) == (0, "")
    assert out.splitlines() == ["on-message: w1's", "on-message: w2's", "on-message: w3's"]
    again = repl.ok("gather", mine, "c1", "c2", "c3")
    assert again == out  # it acknowledged nothing: the same answer
    full = repl.ok("gather", mine, "c3", "c1", "--full")
    assert [line.split()[0] for line in full.splitlines()] == ["4", "(2", "(4"]  # as wait's
    assert repl.cursor(mine, "wait") is None


def test_gather_at_its_timeout_prints_what_came_and_names_what_did_not(repl: Repl) -> None:
    mine = repl.session("co")
    repl.ok("send", mine, "b's", "--tag", "corr=b")
    done = repl.run("gather", mine, "a", "b", "c", "--timeout", "0.05", "--json")
    assert done.returncode == 2
    firings = [json.loads(line) for line in done.stdout.splitlines()][1:]  # after the header
    assert [f["tags"]["corr"] for f in firings] == ["b"]
    assert done.stderr == "repl: no reply for a, c within 0.1 s\n"


# -- request to several ---------------------------------------------------------------


def test_request_to_several_with_a_key_sends_once_and_gathers_the_same(repl: Repl) -> None:
    mine, w1, w2 = repl.session("co"), repl.session("w"), repl.session("w")
    ask = ("request", "--to", w1, "--to", w2, "--reply-to", mine, "--key", "run-7", "6*7?")
    first = repl.run(*ask, "--timeout", "0.05")
    assert first.returncode == 2 and first.stdout == ""
    assert first.stderr == f"repl: no reply from {w1}, {w2} within 0.1 s\n"
    (request,) = [
        json.loads(line) for line in repl.ok("read", w1, "--after", "0", "--json").splitlines()[1:]
    ]
    assert request["tags"] == {"reply-to": mine, "corr": f"run-7.{w1}"}
    repl.ok("reply", w2, "1", "42 from w2")
    repl.ok("reply", w1, "1", "42 from w1")
    # the coordinator, run again with the same key: nothing sent again, the same replies
    out = repl.ok(*ask, "--timeout", "30")
    assert out.splitlines() == ["on-message: 42 from w1", "on-message: 42 from w2"]
    assert [
        repl.ask({"op": "stats", "session": w})[0]["sessions"][0]["head"] for w in (w1, w2)
    ] == [1, 1]
    assert repl.ok(*ask) == out


def test_request_names_its_sessions_one_way(repl: Repl) -> None:
    mine, w = repl.session("co"), repl.session("w")
    assert "the one argument is TEXT" in repl.fails(
        64, "request", "--to", w, w, "x", "--reply-to", mine
    )
    assert "name the session" in repl.fails(64, "request", "--reply-to", mine)


# -- join ------------------------------------------------------------------------------


def claim(repl: Repl, s: str) -> str:
    head = json.loads(repl.ok("claim", s, "--json", "--timeout", "0").splitlines()[0])
    token: str = head["claim"]
    return token


def test_join_is_woken_by_the_last_done_and_counts_the_dead(repl: Repl) -> None:
    jobs = repl.session("jobs", "job 1", "job 2", "job 3")
    repl.session("jobs")  # a dead-letter session of its own
    dead = f"{jobs}.dead"
    repl.ask({"op": "start", "session": dead})
    repl.ok("group", jobs, "work", "--max-attempts", "1", "--dead-letter", dead)
    tokens = [claim(repl, jobs) for _ in range(3)]
    joiner = repl.popen("join", jobs, "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(jobs) == 1, what="the join to block")
        repl.ok("send", jobs, "job 4: after the join began")
        repl.ok("done", jobs, tokens[0])
        released = repl.run("release", jobs, tokens[1])  # its only attempt: a dead letter
        assert released.returncode == 0 and "last attempt" in released.stderr
        repl.ok("done", jobs, tokens[2])
        status, out, err = finish(joiner)
    finally:
        joiner.kill()
    assert (status, out, err) == (0, "3 of 3 done (1 dead)\n", "")


def test_join_at_its_timeout_says_what_is_left(repl: Repl) -> None:
    jobs = repl.session("jobs", "a", "b", "c", "d")
    claim(repl, jobs)
    repl.ok("release", jobs, claim(repl, jobs), "--delay", "1h")
    repl.ok("done", jobs, claim(repl, jobs))
    done = repl.run("join", jobs, "--timeout", "0.05")
    assert (done.returncode, done.stdout) == (2, "1 of 4 done; left: 1 ready, 1 held, 1 delayed\n")
    as_json = json.loads(repl.run("join", jobs, "--timeout", "0", "--json").stdout)
    assert as_json == {
        "upto": 4,
        "done": 1,
        "dead": 0,
        "ready": 1,
        "held": 1,
        "delayed": 1,
        "timed_out": True,
    }
    assert repl.ok("join", jobs, "--upto", "0") == "0 of 0 done\n"
    assert "upto 9" in repl.fails(64, "join", jobs, "--upto", "9")
    assert "bad name!" in repl.fails(64, "join", jobs, "--group", "bad name!")
