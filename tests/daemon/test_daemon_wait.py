"""Waits over real sockets: SPEC rules 8-11 and 14.

Against the daemon in the test process, except where a real process must
be signalled (SIGTERM).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from repl_daemon.config import Limits
from tests.helpers import (
    Client,
    DaemonProc,
    InProcDaemon,
    MovedClock,
    daemon_config,
    eventually,
    inproc_daemon,
    pipelined,
    running_daemon,
)


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


def test_wait_returns_at_once_when_firings_are_after_the_cursor(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "one"})
    answer = c.ok({"op": "wait", "sessions": ["a"]})
    assert texts(answer) == ["one"]
    assert answer["batches"][0]["next"] == 1


def test_wait_blocks_until_a_send_then_returns_it(inproc: InProcDaemon) -> None:
    waiter, sender = inproc.client(), inproc.client()
    sender.ok({"op": "start", "session": "a"})
    waiter.send({"op": "wait", "sessions": ["a"], "id": "w"})
    assert not pending(waiter, 0.5), "a wait with nothing after its cursor must block"
    sender.ok({"op": "send", "session": "a", "text": "wake"})
    answer = waiter.recv()
    assert answer["id"] == "w" and texts(answer) == ["wake"]


def test_wait_timeout_returns_empty_and_moves_no_cursor(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "x"})
    c.ok({"op": "ack", "session": "a", "cursor": "wait", "seq": 1})
    before = c.ok({"op": "cursors", "session": "a"})["cursors"]
    answer = c.ok({"op": "wait", "sessions": ["a"], "timeout_ms": 200})
    assert answer["timed_out"] is True and answer["batches"] == []
    assert c.ok({"op": "cursors", "session": "a"})["cursors"] == before


def test_a_timed_out_wait_on_a_new_cursor_creates_no_cursor(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    for i in range(16):
        c.ok({"op": "ack", "session": "a", "cursor": f"c{i}", "seq": 0})
    c.ok({"op": "wait", "sessions": ["a"], "cursor": "newcomer", "timeout_ms": 100})
    names = {row["name"] for row in c.ok({"op": "cursors", "session": "a"})["cursors"]}
    assert names == {f"c{i}" for i in range(16)}, "the wait must not evict anyone"


def test_a_follow_reader_does_not_take_a_firing_from_a_waiter(inproc: InProcDaemon) -> None:
    follower, monitor, sender = inproc.client(), inproc.client(), inproc.client()
    sender.ok({"op": "start", "session": "a"})
    follower.send({"op": "wait", "sessions": ["a"], "cursor": "follow"})
    sender.ok({"op": "send", "session": "a", "text": "for everyone"})
    got = follower.recv()
    follower.ok({"op": "ack", "session": "a", "cursor": "follow", "seq": got["batches"][0]["next"]})
    assert texts(monitor.ok({"op": "wait", "sessions": ["a"], "cursor": "wait"})) == [
        "for everyone"
    ]


def test_two_concurrent_waits_both_get_the_message(inproc: InProcDaemon) -> None:
    one, two, sender = inproc.client(), inproc.client(), inproc.client()
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
    inproc: InProcDaemon, tmp_path: Path
) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "m1"})
    c.ok({"op": "send", "session": "a", "text": "m2"})
    script = tmp_path / "client.py"
    script.write_text(KILLED_CLIENT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(inproc.port), inproc.token], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert b'"m1"' in first and b'"m2"' in first
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert texts(c.ok({"op": "wait", "sessions": ["a"]})) == ["m1", "m2"]


def test_stopping_a_session_answers_its_blocked_wait_with_session_stopped(
    inproc: InProcDaemon,
) -> None:
    waiter, other = inproc.client(), inproc.client()
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


def test_an_idle_wait_costs_no_evaluation(tmp_path: Path) -> None:
    """Blocked, a wait does no work, whatever time does: the daemon's clock moving a day on
    (what its timers go by), or its event loop's time passing 3 s, which the daemon itself
    reports by closing a connection that said nothing for its idle timeout (the waiter's
    connection is exempt while its wait blocks)."""
    clock = MovedClock()
    config = daemon_config(tmp_path / "home", limits=Limits(idle_timeout=3.0))
    with inproc_daemon(config, clock) as d:
        waiter, observer = d.client(), d.client()
        observer.ok({"op": "start", "session": "a"})
        waiter.send({"op": "wait", "sessions": ["a"]})
        eventually(lambda: waiters(observer, "a") == 1, 5, "the wait to block")
        before = evaluations(observer, "a")
        silent = d.client()  # from here on the daemon's loop times its idle timeout
        clock.advance(24 * 3600 * 1000)
        assert silent.recv()["code"] == "idle_timeout"
        assert silent.closed()
        observer = d.client()  # the first one was closed too, idle since before ``silent``
        assert evaluations(observer, "a") == before
        assert waiters(observer, "a") == 1
        assert not waiter.pending(0)


def test_a_disconnected_waiter_is_released_within_one_second(inproc: InProcDaemon) -> None:
    observer = inproc.client()
    observer.ok({"op": "start", "session": "a"})
    waiter = Client(inproc.port, inproc.token)
    waiter.send({"op": "wait", "sessions": ["a"]})
    eventually(lambda: waiters(observer, "a") == 1, 5, "the wait to block")
    waiter.close()
    eventually(lambda: waiters(observer, "a") == 0, 1.0, "the waiter released within 1 s")


def test_a_wait_on_two_sessions_returns_the_one_that_fired(inproc: InProcDaemon) -> None:
    waiter, sender = inproc.client(), inproc.client()
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


def test_a_wait_names_each_session_once_in_the_order_first_named_and_at_most_1024(
    inproc: InProcDaemon,
) -> None:
    """A wait that names one session 100,000 times is refused (``bad_request`` naming the
    bound), acknowledging nothing and keeping the connection; at the bound it is taken, and
    a session named twice is waited on once, its batch where it was first named."""
    c = inproc.client()
    for s in ("a", "b"):
        c.ok({"op": "start", "session": s})
        c.ok({"op": "send", "session": s, "text": f"for {s}"})
    many = {"op": "wait", "sessions": ["a"] * 100_000, "ack": {"a": 1}, "timeout_ms": 0}
    assert c.call(many) == {
        "ok": False,
        "code": "bad_request",
        "message": "wait names 100,000 sessions, more than the 1,024 one wait may name "
        "(a session named twice counts twice): wait on fewer",
    }
    assert c.call({**many, "sessions": ["a", "b"] * 513})["code"] == "bad_request"  # 1,026
    assert cursor_of(c, "a", "wait") is None  # its ack was not made
    answer = c.ok({"op": "wait", "sessions": ["b", "a"] * 512, "timeout_ms": 0})
    assert [b["session"] for b in answer["batches"]] == ["b", "a"]
    assert texts(answer) == ["for b", "for a"]


def test_a_wait_carries_the_previous_batchs_ack(inproc: InProcDaemon) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "1"})
    first = c.ok({"op": "wait", "sessions": ["a"], "cursor": "follow"})
    c.ok({"op": "send", "session": "a", "text": "2"})
    ack = {"a": first["batches"][0]["next"]}
    second = c.ok({"op": "wait", "sessions": ["a"], "cursor": "follow", "ack": ack})
    assert texts(second) == ["2"]
    assert cursor_of(c, "a", "follow") == 1


def test_a_burst_after_a_wake_comes_back_as_one_batch(tmp_path: Path) -> None:
    with inproc_daemon(daemon_config(tmp_path / "home", settle=0.3)) as d:
        waiter, sender = d.client(), d.client()
        sender.ok({"op": "start", "session": "a"})
        waiter.send({"op": "wait", "sessions": ["a"]})
        assert not pending(waiter, 0.2)
        # in one write: the three reach the daemon together, within the default quiet gap (0:
        # one turn of its loop with no new firing)
        sends = [{"op": "send", "session": "a", "text": str(i)} for i in range(3)]
        assert all(answer["ok"] for answer in pipelined(sender, sends))
        assert texts(waiter.recv()) == ["0", "1", "2"]


class Line:
    """An async JSON-lines connection, for tests that run the daemon in their own task group."""

    def __init__(self, stream: SocketStream) -> None:
        self.stream = stream
        self.lines = BufferedByteReceiveStream(stream)

    @classmethod
    async def connect(cls, port: int, token: str) -> Line:
        line = cls(await anyio.connect_tcp("127.0.0.1", port))
        await line.ok({"op": "auth", "token": token})
        return line

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        await self.stream.send(json.dumps(request).encode() + b"\n")
        answer: dict[str, Any] = json.loads(await self.lines.receive_until(b"\n", 1 << 20))
        return answer

    async def ok(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = await self.call(request)
        assert answer["ok"], answer
        return answer


async def cursor_seqs(line: Line, session: str) -> dict[str, int]:
    rows = (await line.ok({"op": "cursors", "session": session}))["cursors"]
    return {row["name"]: row["seq"] for row in rows}


@pytest.mark.anyio
async def test_a_wait_its_client_cut_off_moves_no_cursor(tmp_path: Path) -> None:
    """The client gives up on a blocked wait (``move_on_after``) and goes: no cursor moves."""
    home = tmp_path / "home"
    async with running_daemon(daemon_config(home)) as port:
        token = (home / "token").read_text().strip()
        observer = await Line.connect(port, token)
        async with observer.stream:
            await observer.ok({"op": "start", "session": "a"})
            await observer.ok({"op": "send", "session": "a", "text": "one"})
            await observer.ok({"op": "ack", "session": "a", "cursor": "wait", "seq": 1})
            waiter = await Line.connect(port, token)
            async with waiter.stream:
                with anyio.move_on_after(0.2) as cut:
                    await waiter.call({"op": "wait", "sessions": ["a"]})
            assert cut.cancelled_caught, "the wait must block: nothing is after its cursor"
            for _ in range(500):  # the daemon lets go of the vanished waiter
                if not (await observer.ok({"op": "stats"}))["daemon"]["waiters"]:
                    break
                await anyio.sleep(0.01)
            else:
                pytest.fail("the daemon still holds the wait of a client that went away")
            await observer.ok({"op": "send", "session": "a", "text": "two"})
            assert await cursor_seqs(observer, "a") == {"wait": 1}
            woken = await observer.ok({"op": "wait", "sessions": ["a"], "timeout_ms": 5000})
            assert [f["result"] for f in woken["batches"][0]["firings"]] == ["two"]


def test_sigterm_answers_waiters_and_exits_zero(daemon: DaemonProc) -> None:
    waiter = daemon.client()
    waiter.ok({"op": "start", "session": "a"})
    waiter.send({"op": "wait", "sessions": ["a"]})
    assert not pending(waiter, 0.2)
    assert daemon.stop() == 0
    answer = waiter.recv()
    assert answer["ok"] is False and answer["code"] == "shutting_down"
    assert waiter.closed()


def test_a_wait_after_a_seq_blocks_past_it_and_touches_no_cursor(inproc: InProcDaemon) -> None:
    """``wait`` with ``after`` (what an HTTP event stream does): no cursor read, made or moved."""
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "send", "session": "a", "text": "one"})
    got = c.ok({"op": "wait", "sessions": ["a"], "after": 0})
    assert [f["result"] for f in got["batches"][0]["firings"]] == ["one"]
    c.send({"op": "wait", "sessions": ["a"], "after": 1, "id": "w"})
    assert not pending(c, 0.2)
    other = inproc.client()
    other.ok({"op": "send", "session": "a", "text": "two"})
    woken = c.recv()
    assert woken["id"] == "w"
    assert [f["seq"] for f in woken["batches"][0]["firings"]] == [2]
    assert c.ok({"op": "cursors", "session": "a"})["cursors"] == []
    past = c.call({"op": "wait", "sessions": ["a"], "after": 9})
    assert (past["code"], past["message"]) == ("cursor_after_head", "after 9 is after head 2")


@pytest.mark.parametrize(
    ("extra", "code"),
    [
        ({"sessions": ["a", "b"], "after": 0}, "bad_request"),
        ({"sessions": ["a"], "after": 0, "ack": {"a": 1}}, "bad_request"),
        ({"sessions": ["a"], "after": -1}, "bad_seq"),
    ],
)
def test_a_wait_after_a_seq_is_on_one_session_with_no_ack(
    inproc: InProcDaemon, extra: dict[str, Any], code: str
) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    c.ok({"op": "start", "session": "b"})
    c.ok({"op": "send", "session": "a", "text": "one"})
    assert c.call({"op": "wait", **extra})["code"] == code
    assert c.ok({"op": "cursors", "session": "a"})["cursors"] == []


both_stores = pytest.mark.parametrize("inproc", ["memory", "durable"], indirect=True)


def blocked(client: Client, request: dict[str, Any], observer: Client, session: str) -> None:
    """Put ``request`` (a wait) on ``client`` and see it blocked on ``session``."""
    count = waiters(observer, session)
    client.send(request)
    eventually(lambda: waiters(observer, session) == count + 1, 5, "the wait to block")


@both_stores
def test_waiters_woken_by_one_send_each_get_their_own_answer(inproc: InProcDaemon) -> None:
    """The waiters of a fan-out at one position share one look of the session and one
    encoding of its answer; each still gets its own: its id, its sessions, its match, its
    kind of look, and one evaluation a look (rule S17)."""
    d = inproc
    sender = d.client()
    for session in ("a", "b"):
        sender.ok({"op": "start", "session": session})
    sender.ok({"op": "send", "session": "a", "text": "old"})
    sender.ok({"op": "ack", "session": "a", "cursor": "c", "seq": 1})
    sender.ok({"op": "ack", "session": "a", "cursor": "other", "seq": 1})
    waits = {
        "plain": {"op": "wait", "sessions": ["a"], "cursor": "c"},
        "plain too": {"op": "wait", "sessions": ["a"], "cursor": "c"},
        "with an id": {"op": "wait", "sessions": ["a"], "cursor": "c", "id": "mine"},
        "another id": {"op": "wait", "sessions": ["a"], "cursor": "c", "id": 7},
        "plain again": {"op": "wait", "sessions": ["a"], "cursor": "c"},
        "other cursor": {"op": "wait", "sessions": ["a"], "cursor": "other"},
        "after": {"op": "wait", "sessions": ["a"], "after": 1},
        "two sessions": {"op": "wait", "sessions": ["b", "a"], "cursor": "c"},
        "matching": {
            "op": "wait",
            "sessions": ["a"],
            "cursor": "c",
            "match": {"tags": {"k": None}},
        },
        "all": {"op": "wait", "sessions": ["a", "b"], "cursor": "c", "all": True},
    }
    clients = {name: d.client() for name in waits}
    for name, request in waits.items():
        blocked(clients[name], request, sender, "a")
    before = evaluations(sender, "a")
    sender.ok({"op": "send", "session": "a", "text": "new"})
    answers = {name: clients[name].recv() for name in waits if name not in ("matching", "all")}
    assert evaluations(sender, "a") == before + 1 + len(waits)  # the send, and a look each
    for name, answer in answers.items():
        assert [(b["session"], b["next"], b["lost"]) for b in answer["batches"]] == [("a", 2, 0)]
        assert texts(answer) == ["new"], name
        assert answer.get("id") == waits[name].get("id"), name
    assert not clients["matching"].pending(0.1) and not clients["all"].pending(0)
    sender.ok({"op": "send", "session": "a", "text": "tagged", "tags": {"k": "v"}})
    assert texts(clients["matching"].recv()) == ["tagged"]
    sender.ok({"op": "send", "session": "b", "text": "at last"})
    assert texts(clients["all"].recv()) == ["new", "tagged", "at last"]


@both_stores
def test_waiters_woken_by_several_firings_at_once_each_get_their_max(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    """Three timers due at once record three firings in one step: the waiters of its
    fan-out, each with its ``max``, get as many of them as each asked for."""
    d = inproc
    sender = d.client()
    sender.ok({"op": "start", "session": "a"})
    for i in range(3):
        sender.ok({"op": "schedule", "session": "a", "text": str(i), "in": "1h"})
    waits = {
        "one": {"op": "wait", "sessions": ["a"], "cursor": "c", "max": 1},
        "one too": {"op": "wait", "sessions": ["a"], "cursor": "c", "max": 1},
        "every": {"op": "wait", "sessions": ["a"], "cursor": "c"},
        "two": {"op": "wait", "sessions": ["a"], "cursor": "c", "max": 2, "id": "two"},
        "one again": {"op": "wait", "sessions": ["a"], "cursor": "c", "max": 1},
    }
    wanted = {"one": 1, "one too": 1, "every": 3, "two": 2, "one again": 1}
    clients = {name: d.client() for name in waits}
    for name, request in waits.items():
        blocked(clients[name], request, sender, "a")
    clock.advance(3600 * 1000)
    answers = {name: client.recv() for name, client in clients.items()}
    fired = texts(answers["every"])  # in the timers' order, which is not their scheduling's
    assert sorted(fired) == ["0", "1", "2"]
    for name, answer in answers.items():
        assert texts(answer) == fired[: wanted[name]], name
        assert answer["batches"][0]["next"] == wanted[name], name
        assert answer.get("id") == waits[name].get("id"), name
