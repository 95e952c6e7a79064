"""Request and reply across two daemons sharing a store (SPEC §15), as scenarios.

Each takes daemon A and daemon B of a shared store (one Redis, or a Redis
Cluster, whichever the calling test has) and sessions started already: the
CLI runs as a user runs it, a subprocess pointed at one daemon or the other.
``test_redis_daemons`` and ``test_redis_cluster`` call them, each on its own
module's daemons.

A blocked matching wait is watched through its session's evaluation count
(the ``stats`` op): it moves by one for each operation on the session's
state, so a send and the wait's one look at it make two, and a wait that
looked twice, or polled, would make more. Nothing here is timed: each step
waits, with a generous bound, for what it looks for.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.helpers import Client, DaemonProc, Repl, eventually

#: how long a step may take on a loaded machine before the scenario fails
BOUND = 30


def _stats(client: Client, session: str) -> dict[str, Any]:
    row: dict[str, Any] = client.ok({"op": "stats", "session": session})["sessions"][0]
    return row


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=BOUND)
    return proc.returncode, out.decode(), err.decode()


def request_and_reply(a: DaemonProc, b: DaemonProc, svc: str, me: str) -> None:
    """A worker on B waits for requests (``repl wait SVC --match reply-to``) and answers
    each with ``repl reply``; ``repl request`` on A is answered with the worker's reply."""
    ra, rb = Repl(a), Repl(b)
    watch = b.client()
    worker = rb.popen("wait", svc, "--match", "reply-to", "--json", "--timeout", str(BOUND))
    try:
        eventually(lambda: _stats(watch, svc)["waiters"] == 1, BOUND, "the worker's wait")
        requester = ra.popen("request", svc, "ping", "--reply-to", me, "--timeout", str(BOUND))
        try:
            status, out, err = _finish(worker)
            assert status == 0, (status, err)
            header, request = (json.loads(line) for line in out.splitlines())
            assert header["lost"] == 0 and request["result"] == "ping"
            assert request["tags"]["reply-to"] == me
            corr = request["tags"]["corr"]
            assert rb.ok("reply", svc, str(request["seq"]), "pong").strip() == "1"
            status, out, err = _finish(requester)
            assert (status, out, err) == (0, "on-message: pong\n", "")
        finally:
            requester.kill()
            requester.wait()
    finally:
        worker.kill()
        worker.wait()
    (reply,) = a.client().ok({"op": "read", "session": me, "after": 0})["firings"]
    assert reply["tags"] == {"corr": corr}
    # the worker's and the requester's waits took nothing from any cursor
    for session in (svc, me):
        assert b.client().ok({"op": "cursors", "session": session})["cursors"] == []


def early_reply(a: DaemonProc, b: DaemonProc, svc: str, me: str) -> None:
    """A reply that is there before its requester waits: the requester's matching wait on
    A, with no cursor, looks at the whole ring and finds it at once."""
    ra, rb = Repl(a), Repl(b)
    ra.ok("send", svc, "early", "--tag", f"reply-to={me}", "--tag", "corr=c-early")
    ra.ok("send", me, "not it", "--tag", "corr=c-other")
    out = rb.ok("read", svc, "--match", "corr=c-early", "--json")  # the whole ring, no ack
    _, request = (json.loads(line) for line in out.splitlines())
    rb.ok("reply", svc, str(request["seq"]), "already")
    ra.ok("send", me, "after it", "--tag", "corr=c-later")
    out = ra.ok("wait", me, "--match", "corr=c-early", "--timeout", "0", "--json")
    header, found = (json.loads(line) for line in out.splitlines())
    assert (found["seq"], found["result"], found["tags"]) == (2, "already", {"corr": "c-early"})
    assert header == {"next": 3, "lost": 0}  # the last seq it looked at: the head
    assert a.client().ok({"op": "cursors", "session": me})["cursors"] == []


def matching_wait_stays_blocked(a: DaemonProc, b: DaemonProc, me: str) -> None:
    """``repl wait ME --match corr=c-3`` on B, blocked; firings that do not match sent
    through A each cost it one look (the session's evaluations move by two a send: the
    send and the look) and leave it blocked; the match wakes it, and that look is the last."""
    sender, watch = a.client(), b.client()
    others = [{}, {"corr": "c-2"}, {"reply-to": me}, {"corr": "c-30"}, {"corr": ""}]
    sender.ok({"op": "send", "session": me, "text": "before", "tags": {"corr": "c-0"}})
    start = _stats(watch, me)["evaluations"]
    waiter = Repl(b).popen("wait", me, "--match", "corr=c-3", "--json", "--timeout", str(BOUND))
    try:

        def evaluations_reach(n: int) -> bool:
            return _stats(watch, me)["evaluations"] >= n

        eventually(lambda: _stats(watch, me)["waiters"] == 1, BOUND, "the wait")
        eventually(lambda: evaluations_reach(start + 1), BOUND, "the wait's first look")
        for n, tags in enumerate(others, 1):
            sender.ok({"op": "send", "session": me, "text": f"other {n}", "tags": tags})
            eventually(lambda n=n: evaluations_reach(start + 1 + 2 * n), BOUND, "its look")
            assert waiter.poll() is None, "a firing that does not match woke the wait"
            assert _stats(watch, me)["evaluations"] == start + 1 + 2 * n
        sent = sender.ok({"op": "send", "session": me, "text": "it", "tags": {"corr": "c-3"}})
        status, out, err = _finish(waiter)
    finally:
        waiter.kill()
        waiter.wait()
    assert status == 0, (status, err)
    header, found = (json.loads(line) for line in out.splitlines())
    assert (found["seq"], found["result"], found["tags"]) == (sent["seq"], "it", {"corr": "c-3"})
    assert header == {"next": sent["seq"], "lost": 0}
    # one look at each firing, and none more: the sends, the first look, one look each
    assert _stats(watch, me)["evaluations"] == start + 1 + 2 * (len(others) + 1)
