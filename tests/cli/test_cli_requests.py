"""Tags, matching readers, request and reply, with the real CLI (docs/semantics.md R1-R4).

A tagged send comes back with its tags in ``--json`` and unchanged in text
and ``--full``; bad tags are refused with nothing recorded; a matching
reader without a cursor looks at the whole ring and moves no cursor, the
verbs' default ones included, and with one it owns it; a blocked matching
wait stays blocked through firings that do not match (the evaluation count
says so, not a sleep) and wakes on its own; ``repl request`` finds a reply
that came before it waited, and two shells, a worker and a requester, talk.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from repl_cli import aio, api
from tests.helpers import Repl, assert_one_error_line, eventually, repl_argv, repl_shell


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def evaluations(repl: Repl, session: str) -> int:
    (stats,) = repl.ask({"op": "stats", "session": session})
    count: int = stats["sessions"][0]["evaluations"]
    return count


def test_tags_come_back_in_json_and_leave_text_and_full_alone(repl: Repl, s: str) -> None:
    assert repl.ok("send", s, "hello", "--tag", "kind=greet", "--tag", "to=") == "1\n"
    repl.send(s, "plain")
    got = json_lines(repl.ok("read", s, "--after", "0", "--json"))
    assert [f["tags"] for f in got[1:]] == [{"kind": "greet", "to": ""}, {}]
    assert repl.ok("read", s, "--after", "0") == "on-message: hello\non-message: plain\n"
    full = repl.ok("read", s, "--after", "0", "--full")
    assert full == '2 0\n(1 "on-message" "hello")\n(2 "on-message" "plain")\n'


def test_bad_tags_are_refused_in_one_line_recording_nothing(repl: Repl, s: str) -> None:
    for tag in ("Kind=x", "novalue", "k=" + "v" * 1025):
        stderr = repl.fails(64, "send", s, "x", "--tag", tag)
        assert "tag" in stderr
    many = [arg for n in range(17) for arg in ("--tag", f"k{n}=v")]
    assert "17 tags" in repl.fails(64, "send", s, "x", *many)
    assert "given twice" in repl.fails(64, "send", s, "x", "--tag", "a=1", "--tag", "a=2")
    assert "tag key" in repl.fails(64, "read", s, "--match", "Bad")
    assert repl.ask({"op": "stats", "session": s})[0]["sessions"][0]["head"] == 0


def test_timers_carry_their_tags_to_their_firings(repl: Repl, s: str) -> None:
    timer = json.loads(repl.ok("send", s, "much later", "--in", "1h", "--tag", "job=6", "--json"))
    listed = json.loads(repl.ok("timers", s, "--json"))
    assert [(t["timer"], t["tags"]) for t in listed] == [(timer["timer"], {"job": "6"})]
    repl.ok("send", s, "later", "--in", "250ms", "--tag", "job=7")
    got = json_lines(repl.ok("wait", s, "--match", "job=7", "--timeout", "20", "--json"))
    assert got[1]["result"] == "later" and got[1]["tags"] == {"job": "7"}


def test_a_matching_read_without_a_cursor_looks_at_the_whole_ring_and_acks_nothing(
    repl: Repl, s: str
) -> None:
    repl.send(s, "a")
    repl.ok("send", s, "b", "--tag", "corr=1")
    repl.send(s, "c")
    for _ in range(2):  # twice the same: nothing was acknowledged
        got = json_lines(repl.ok("read", s, "--match", "corr=1", "--json"))
        assert got[0] == {"next": 3, "lost": 0} and [f["seq"] for f in got[1:]] == [2]
    assert repl.ok("wait", s, "--match", "corr") == "on-message: b\n"
    assert repl.ask({"op": "cursors", "session": s})[0]["cursors"] == []
    # the verbs' default cursors still see everything
    assert repl.ok("read", s) == "on-message: a\non-message: b\non-message: c\n"
    assert repl.ok("read", s, "--handler", "on-tick") == ""  # a handler filter alone


def test_a_matching_reader_with_a_cursor_owns_it(repl: Repl, s: str) -> None:
    repl.send(s, "a")
    repl.ok("send", s, "b", "--tag", "urgent=yes")
    repl.send(s, "c")
    assert repl.ok("read", s, "--match", "urgent", "--cursor", "alarms") == "on-message: b\n"
    assert repl.cursor(s, "alarms") == 3  # next: the last seq looked at
    repl.send(s, "d")
    assert repl.ok("read", s, "--match", "urgent", "--cursor", "alarms") == ""
    assert repl.cursor(s, "alarms") == 4  # looked at, though none matched
    assert repl.cursor(s, "read") is None  # no other cursor moved or appeared


def test_a_blocked_matching_wait_stays_blocked_through_others_and_wakes_on_its_own(
    repl: Repl, s: str
) -> None:
    waiter = repl.popen("wait", s, "--match", "corr=mine", "--json", "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(s) == 1, what="the matching wait to block")
        before = evaluations(repl, s)
        for n in range(20):
            repl.ok("send", s, f"other {n}", "--tag", f"corr=other-{n}")
        # each firing that does not match: its send, and at most one look
        eventually(lambda: evaluations(repl, s) >= before + 20, what="the sends")
        assert repl.waiters(s) == 1 and waiter.poll() is None
        assert evaluations(repl, s) <= before + 2 * 20
        repl.ok("send", s, "mine", "--tag", "corr=mine")
        out, err = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 0, err
    got = json_lines(out.decode())
    assert got[0]["next"] == 21 and [f["result"] for f in got[1:]] == ["mine"]


def test_a_matching_wait_times_out_as_any_wait(repl: Repl, s: str) -> None:
    repl.send(s, "nothing to see")
    done = repl.run("wait", s, "--match", "corr=never", "--timeout", "0.2")
    assert done.returncode == 2 and done.stdout == ""


def test_an_early_reply_is_found_at_once(repl: Repl) -> None:
    inbox, mine = repl.session("inbox"), repl.session("mine")
    # the request goes out; the reply is there before anyone waits for it
    with api.connect(repl.daemon.addr, repl.daemon.home) as r:
        r.send(inbox, "ping", tags={"reply-to": mine, "corr": "c-early"})
        r.reply(inbox, 1, "pong")
        assert r.read(mine, match={"corr": "c-early"}).firings[0].result == "pong"
    got = json_lines(repl.ok("wait", mine, "--match", "corr=c-early", "--json"))
    assert got[1]["result"] == "pong" and got[1]["tags"] == {"corr": "c-early"}


def test_request_and_reply_between_two_shells(repl: Repl) -> None:
    inbox, mine = repl.session("inbox"), repl.session("mine")
    worker = f"""
        set -e
        line=$($REPL wait {inbox} --match reply-to --cursor worker --json | tail -n 1)
        seq=$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["seq"])'
        )
        $REPL reply {inbox} "$seq" "answer to $seq"
    """
    with subprocess.Popen(
        ["bash", "-c", worker],
        env={**repl.env, "REPL": repl_shell()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as w:
        eventually(lambda: repl.waiters(inbox) == 1, what="the worker to wait")
        asked = repl.run("request", inbox, "question", "--reply-to", mine, "--timeout", "30")
        out, err = w.communicate(timeout=30)
    assert w.returncode == 0, err
    assert out.decode() == "1\n"  # the reply's seq in the requester's session
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout == "on-message: answer to 1\n"
    # nothing of the requester's session was acknowledged, the worker's cursor was
    assert repl.ask({"op": "cursors", "session": mine})[0]["cursors"] == []
    assert repl.cursor(inbox, "worker") == 1


def test_a_request_times_out_with_2_and_leaves_nothing_a_later_one_could_take(
    repl: Repl,
) -> None:
    inbox, mine = repl.session("inbox"), repl.session("mine")
    late = repl.run("request", inbox, "first", "--reply-to", mine, "--timeout", "0.2")
    assert late.returncode == 2 and late.stdout == ""
    # the first request's answer comes late; the second request must not take it
    first = repl.ask({"op": "read", "session": inbox, "after": 0})[0]["firings"][0]
    with api.connect(repl.daemon.addr, repl.daemon.home) as r:
        r.reply(inbox, first["seq"], "late answer")
        second_corr: list[str] = []

        def answer_second() -> bool:
            batch = r.read(inbox, after=1, match={"reply-to": None})
            if batch.firings:
                second_corr.append(batch.firings[0].tags["corr"])
                r.reply(inbox, batch.firings[0].seq, "right answer")
            return bool(batch.firings)

        with subprocess.Popen(
            repl_argv("request", inbox, "second", "--reply-to", mine, "--timeout", "30"),
            env=repl.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as asker:
            eventually(answer_second, what="the second request")
            out, err = asker.communicate(timeout=30)
    assert asker.returncode == 0, err
    assert out.decode() == "on-message: right answer\n"
    assert second_corr and second_corr[0] != first["tags"]["corr"]  # fresh correlation ids


def test_a_request_may_not_carry_its_own_reply_to_or_corr(repl: Repl, s: str) -> None:
    repl.ok("start", "me-own", "--exist-ok")
    for tag in ("reply-to=elsewhere", "corr=mine"):
        said = repl.fails(64, "request", s, "x", "--reply-to", "me-own", "--tag", tag)
        assert "is the request's own: leave it out" in said
    assert repl.ok("read", s, "--after", "0") == ""  # nothing was sent


def test_reply_refuses_a_firing_that_is_no_request(repl: Repl, s: str) -> None:
    repl.send(s, "not a request")
    stderr = repl.fails(1, "reply", s, "1", "x")
    assert "has no reply-to tag" in stderr
    assert "has no firing 9: its head is 1" in repl.fails(1, "reply", s, "9", "x")
    assert_one_error_line(repl.run("request", s, "x", "--reply-to", "nosuch").stderr)
    assert repl.ask({"op": "stats", "session": s})[0]["sessions"][0]["head"] == 1


def test_the_async_api_requests_and_replies(repl: Repl) -> None:
    import anyio

    inbox, mine = repl.session("inbox"), repl.session("mine")

    async def both() -> None:
        async with (
            aio.connect(repl.daemon.addr, repl.daemon.home) as asker,
            aio.connect(repl.daemon.addr, repl.daemon.home) as worker,
        ):

            async def work() -> None:
                woken = await worker.wait(inbox, match={"reply-to": None})
                request = woken.batches[0].firings[0]
                await worker.reply(inbox, request.seq, f"re: {request.result}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(work)
                answer = await asker.request(inbox, "hi", reply_to=mine, timeout=30)
            assert answer is not None and answer.result == "re: hi"
            assert await asker.request(inbox, "again", reply_to=mine, timeout=0.1) is None

    anyio.run(both)
