"""The Python API, sync (``repl_cli.api``) and async (``repl_cli.aio``), on real daemons.

Typed answers (the protocol's Structs), exceptions that carry ``repl``'s exit
status and the wire code, and ``follow`` as an iterator that acknowledges a
batch when the next is asked for and rides out a daemon restart in the
middle (a SIGTERM and a ``kill -9``), as ``repl follow`` does.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import anyio
import pytest

from repl_cli import aio, api
from repl_daemon import protocol as p
from session.firing import Firing
from tests.helpers import DaemonProc, InProcDaemon, free_port


def test_every_operation_answers_its_struct(inproc: InProcDaemon) -> None:
    with api.connect(inproc.addr, inproc.home) as repl:
        assert repl.ping().pid > 0
        started = repl.start("api-a", buffer=8)
        assert isinstance(started, p.Started) and started.created
        assert not repl.start("api-a", exist_ok=True).created
        assert repl.send("api-a", "one").seq == 1
        again = repl.send("api-a", "two", key="k")
        assert (again.seq, repl.send("api-a", "two", key="k").duplicate) == (2, True)
        got = repl.read("api-a")
        assert isinstance(got, p.Firings) and [f.result for f in got.firings] == ["one", "two"]
        assert all(isinstance(f, Firing) for f in got.firings)
        assert repl.read("api-a").next == 2  # read acknowledges nothing: ack the batch's next
        assert repl.ack("api-a", got.next, cursor="read").seq == 2
        assert repl.read("api-a").firings == []
        assert [(c.name, c.seq) for c in repl.cursors("api-a")] == [("read", 2)]
        assert "api-a" in [s.id for s in repl.sessions()]
        assert repl.stats("api-a").sessions[0].head == 2
        assert repl.buffer("api-a", 1).trimmed == 1
        assert [f.result for f in repl.poll("api-a").firings] == ["two"]
        woken = repl.wait("api-a", cursor="w", timeout=0.05)
        assert isinstance(woken, p.Woken) and woken.batches[0].firings[0].result == "two"
        assert repl.wait("api-a", cursor="w", timeout=0.05, ack={"api-a": 2}).timed_out
        repl.stop("api-a")


def test_errors_are_typed_and_carry_the_wire_code(inproc: InProcDaemon, tmp_path: Path) -> None:
    """The library raises its own classes (one a meaning), with the daemon's code and its
    message as it said it: no exit status, no hint of the CLI's."""
    with api.connect(inproc.addr, inproc.home) as repl:
        with pytest.raises(api.NotFound) as missing:
            repl.send("api-nope", "x")
        assert missing.value.code == "no_such_session"
        assert "repl start api-nope" in missing.value.message
        assert str(missing.value) == missing.value.message
        assert not hasattr(missing.value, "status")
        with pytest.raises(api.BadInput) as bad:
            repl.send("bad id", "x")
        assert bad.value.code == "bad_session_id"
        repl.start("api-errors", exist_ok=True)
        with pytest.raises(api.AfterHead) as after:
            repl.read("api-errors", after=99)
        assert after.value.message.endswith("99 is after head 0")  # the CLI adds its hint
        assert "`" not in after.value.message
    (tmp_path / "token").write_text("t\n")
    with api.connect(f"127.0.0.1:{free_port()}", tmp_path, reconnect=0) as away:
        with pytest.raises(api.Unavailable) as gone:
            away.ping()
        assert gone.value.code is None and "no daemon at" in gone.value.message
        with pytest.raises(api.Unavailable):
            away.wait("s", timeout=1)


def test_follow_acknowledges_a_batch_when_the_next_is_asked_for(inproc: InProcDaemon) -> None:
    with api.connect(inproc.addr, inproc.home) as repl:
        repl.start("api-f")
        repl.send("api-f", "one")
        for batch in repl.follow("api-f"):
            assert [f.result for f in batch.firings] == ["one"]
            break  # handed out, never asked past: not acknowledged
        assert repl.cursors("api-f") == []
        repl.send("api-f", "two")
        stream = repl.follow("api-f")
        assert [f.result for f in next(stream).firings] == ["one", "two"]
        with api.connect(inproc.addr, inproc.home) as other:
            sender = threading.Timer(0.2, lambda: other.send("api-f", "three"))
            sender.start()
            assert [f.result for f in next(stream).firings] == ["three"]  # asked for the next
            sender.join()
        stream.close()
        assert [(c.name, c.seq) for c in repl.cursors("api-f")] == [("follow", 2)]


def test_follow_acknowledges_what_the_caller_sends_and_stops_after_count(
    inproc: InProcDaemon,
) -> None:
    """The CLI's follow is this one: a batch handled in part is acknowledged up to the seq
    sent back, and with ``count`` the last batch is acknowledged as the iteration ends."""
    with api.connect(inproc.addr, inproc.home) as repl:
        repl.start("api-g")
        for text in ("a", "b", "c"):
            repl.send("api-g", text)
        stream = repl.follow("api-g", cursor="part")
        assert [f.seq for f in next(stream).firings] == [1, 2, 3]
        again = stream.send(1)  # only firing 1 was handled: 2 and 3 come again
        assert [f.seq for f in again.firings] == [2, 3]
        stream.close()
        assert [(c.name, c.seq) for c in repl.cursors("api-g")] == [("part", 1)]
        counted = list(repl.follow("api-g", cursor="counted", count=2))
        assert [f.seq for b in counted for f in b.firings] == [1, 2]
        cursors = {c.name: c.seq for c in repl.cursors("api-g")}
        assert cursors["counted"] == 2  # acknowledged as the iteration ended, and no further


def test_follow_with_count_rides_out_an_outage_for_its_last_ack() -> None:
    """``repl follow --count N`` acknowledges its last batch alone: a restart of the daemon
    just then is ridden out (the ack tried again), never an exit 0 with it unacknowledged.
    The operations run here over a link that fails that ack once, as a restart would."""
    from repl_cli.api._common import R
    from repl_cli.api._sync.operations import Operations
    from repl_cli.api.errors import Unavailable
    from session.firing import NO_TAGS

    class Link(Operations):
        reconnect = 30.0

        def __init__(self) -> None:
            self.acks: list[tuple[str, int]] = []
            self.refusals = 1
            self.now = 0.0
            self.note = lambda message: None

        @property
        def addr(self) -> str:
            return "a link that fails once"

        def close(self) -> None:
            pass

        def _request(self, request: p.Request, expect: type[R]) -> R:
            assert isinstance(request, p.Ack)
            if self.refusals:
                self.refusals -= 1
                raise Unavailable("the daemon at it closed the connection")
            self.acks.append((request.cursor, request.seq))
            return expect(cursor=request.cursor, seq=request.seq)  # type: ignore[call-arg]

        def _blocking(self, request: p.Request, expect: type[R]) -> R:
            assert expect is p.Woken
            firings = [
                Firing(n, "on-message", f"f{n}", None, "2026-12-04T00:00:00.000Z", NO_TAGS)
                for n in (1, 2)
            ]
            woken = p.Woken(batches=[p.SessionBatch("s", 2, 0, firings)], timed_out=False)
            return woken  # type: ignore[return-value]

        def _answered_once(self) -> bool:
            return True

        def _clock(self) -> float:
            return self.now

        def _sleep(self, seconds: float) -> None:
            self.now += seconds

    link = Link()
    batches = list(link.follow("s", cursor="c", count=2))
    assert [f.seq for b in batches for f in b.firings] == [1, 2]
    assert link.acks == [("c", 2)] and link.refusals == 0 and link.now > 0


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "kill-9"])
def test_follow_rides_out_a_restart_in_the_middle(
    durable_daemon: DaemonProc, crash: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="repl")
    with api.connect(f"127.0.0.1:{durable_daemon.port}", durable_daemon.home) as repl:
        repl.start("api-r")
        repl.send("api-r", "before")
        stream = repl.follow("api-r")
        assert [f.result for f in next(stream).firings] == ["before"]

        def restart_then_send() -> None:
            durable_daemon.restart(crash=crash)
            with api.connect(f"127.0.0.1:{durable_daemon.port}", durable_daemon.home) as other:
                other.send("api-r", "after")

        helper = threading.Timer(0.3, restart_then_send)  # while follow blocks in its wait
        helper.start()
        try:
            assert [f.result for f in next(stream).firings] == ["after"]
        finally:
            helper.join(30)
        stream.close()
        assert [(c.name, c.seq) for c in repl.cursors("api-r")] == [("follow", 1)]
    notes = [r.getMessage() for r in caplog.records if r.name == "repl"]
    assert any("reconnecting for up to 300 s" in n for n in notes), notes
    assert any(n.startswith("reconnected to the daemon at") for n in notes), notes


@pytest.mark.anyio
async def test_the_async_api_answers_the_same(inproc: InProcDaemon) -> None:
    async with aio.connect(inproc.addr, inproc.home) as repl:
        assert (await repl.ping()).version == p.VERSION
        await repl.start("aio-a")
        assert (await repl.send("aio-a", "one")).seq == 1
        got = await repl.read("aio-a")
        assert [f.result for f in got.firings] == ["one"]
        assert (await repl.ack("aio-a", got.next)).seq == 1
        assert [(c.name, c.seq) for c in await repl.cursors("aio-a")] == [("read", 1)]
        assert (await repl.wait("aio-a", cursor="read", timeout=0.05)).timed_out
        with pytest.raises(api.NotFound) as missing:
            await repl.read("aio-nope")
        assert missing.value.code == "no_such_session"


@pytest.mark.anyio
async def test_the_async_api_runs_every_operation_the_blocking_one_does(
    inproc: InProcDaemon,
) -> None:
    """The same operations, written once (repl_cli/api/_async/operations.py), awaited: each
    answers its struct, and the compound reads are one request each."""
    async with aio.connect(inproc.addr, inproc.home) as repl:
        await repl.start("aio-b", buffer=3)
        for n in range(1, 6):
            await repl.send("aio-b", f"f{n}", tags={"n": str(n % 2)})
        assert (await repl.buffer("aio-b", 3)).limit == 3
        last = await repl.read("aio-b", last=2)
        assert [f.result for f in last.firings] == ["f4", "f5"]
        since = await repl.read("aio-b", since="2000-01-01T00:00:00Z", last=1)
        assert [f.result for f in since.firings] == ["f5"]
        assert (await repl.firing("aio-b", 4)).result == "f4"
        for seq, words in ((0, "seqs start at 1"), (9, "has no firing 9: its head is 5")):
            with pytest.raises(api.Error, match=words):
                await repl.firing("aio-b", seq)
        with pytest.raises(api.Error, match="no longer in its ring"):
            await repl.firing("aio-b", 1)
        assert [f.result for f in (await repl.poll("aio-b", max=1)).firings] == ["f3"]
        # a matching follow with no cursor goes on after what it looked at
        stream = repl.follow("aio-b", cursor=None, match={"n": "1"})
        first = await anext(stream)
        assert [f.result for f in first.firings] == ["f3", "f5"]
        await repl.send("aio-b", "f6", tags={"n": "0"})
        await repl.send("aio-b", "f7", tags={"n": "1"})
        with anyio.fail_after(10):
            second = await anext(stream)
        assert [f.result for f in second.firings] == ["f7"]
        await stream.aclose()
        made = await repl.token_add("aio-t", ["aio-b"], ["read"])
        assert made.token and [t.name for t in await repl.token_list()] == ["aio-t"]
        await repl.token_revoke("aio-t")
        timer = await repl.schedule("aio-b", "later", in_="1h")
        assert [t.timer for t in await repl.timers("aio-b")] == [timer.timer]
        assert (await repl.cancel("aio-b", timer.timer)).timer == timer.timer
        await repl.webhook("aio-b", "s3cret")
        await repl.webhook("aio-b", None)
        await repl.stop("aio-b")
        assert "aio-b" not in [s.id for s in await repl.sessions()]


@pytest.mark.anyio
async def test_the_async_follow_rides_out_a_restart_in_the_middle(
    durable_daemon: DaemonProc,
) -> None:
    notes: list[str] = []
    addr = f"127.0.0.1:{durable_daemon.port}"
    async with aio.AsyncRepl(addr, durable_daemon.home, note=notes.append) as repl:
        await repl.start("aio-r")
        await repl.send("aio-r", "one")
        stream = repl.follow("aio-r")
        first = await anext(stream)
        assert [f.result for f in first.firings] == ["one"]

        async def restart_then_send() -> None:
            async with aio.connect(addr, durable_daemon.home) as looking:
                with anyio.fail_after(10):  # the follow's next wait is blocked: crash then
                    while (await looking.stats("aio-r")).sessions[0].waiters != 1:  # noqa: ASYNC110 - a bounded look at the daemon's state
                        await anyio.sleep(0.01)
            await anyio.to_thread.run_sync(lambda: durable_daemon.restart(crash=True))
            async with aio.connect(addr, durable_daemon.home) as other:
                await other.send("aio-r", "two")

        async with anyio.create_task_group() as tg:
            tg.start_soon(restart_then_send)
            with anyio.fail_after(30):
                second = await anext(stream)
        assert [f.result for f in second.firings] == ["two"]
        await stream.aclose()
        assert [(c.name, c.seq) for c in await repl.cursors("aio-r")] == [("follow", 1)]
    assert notes[0].endswith("reconnecting for up to 300 s"), notes
    assert notes[1] == f"reconnected to the daemon at {addr}"


@pytest.mark.anyio
async def test_the_async_api_with_no_daemon_is_unavailable_at_once(tmp_path: Path) -> None:
    """Riding out is for a daemon that was there: a wait whose first connection fails is
    refused at once, however long ``reconnect`` is."""
    (tmp_path / "token").write_text("t\n")
    async with aio.connect(f"127.0.0.1:{free_port()}", tmp_path, reconnect=300) as repl:
        with pytest.raises(api.Unavailable):
            await repl.ping()
        with anyio.fail_after(10), pytest.raises(api.Unavailable, match=r"^no daemon at "):
            await repl.wait("s")


#: what only one of the twins has, and why: the blocking one closes with ``close``, the
#: async one with ``aclose``, as anyio's objects do (the CLI's ``again`` and ``watch`` are
#: the CLI's own, ``repl_cli.cli.client.Repl``)
ONLY_BLOCKING = {"close"}
ONLY_ASYNC = {"aclose"}


def public(cls: type) -> dict[str, object]:
    """Every public attribute of ``cls``, its bases' too, as the class it is found on has it."""
    found: dict[str, object] = {}
    for base in reversed(cls.__mro__):
        found.update((k, v) for k, v in vars(base).items() if not k.startswith("_"))
    return found


def test_the_two_apis_have_the_same_methods_with_the_same_signatures() -> None:
    """``repl_cli.api.Repl`` and ``repl_cli.aio.AsyncRepl`` are one body of operations (the
    blocking one written from the async one by scripts/unasync.py), each over its own I/O:
    a method or an argument that only one of them has fails here."""
    import inspect

    blocking, asynchronous = public(api.Repl), public(aio.AsyncRepl)
    assert set(blocking) - set(asynchronous) == ONLY_BLOCKING
    assert set(asynchronous) - set(blocking) == ONLY_ASYNC
    for name in sorted(set(blocking) & set(asynchronous)):
        one, other = blocking[name], asynchronous[name]
        if isinstance(one, property):
            assert isinstance(other, property), name
            continue
        assert callable(one) and callable(other), name
        if inspect.isgeneratorfunction(one):
            assert inspect.isasyncgenfunction(other), name
        else:
            assert inspect.iscoroutinefunction(other), f"AsyncRepl.{name} is not async"
        mine, theirs = inspect.signature(one), inspect.signature(other)
        assert [(p.name, p.kind, p.default, p.annotation) for p in mine.parameters.values()] == [
            (p.name, p.kind, p.default, p.annotation) for p in theirs.parameters.values()
        ], name
        returned = str(mine.return_annotation).replace("Iterator[", "AsyncIterator[")
        if returned.startswith("Generator[") and returned.endswith(", None]"):
            returned = "Async" + returned.removesuffix(", None]") + "]"  # no return type
        assert returned == str(theirs.return_annotation), name


@pytest.mark.anyio
async def test_done_with_next_takes_the_next_job_in_both_apis(inproc: InProcDaemon) -> None:
    """``done(next=True)``: the next claim as ``claim`` answers it, or ``timed_out`` (the
    done made); ``done`` alone answers the seq; a stale claim is ``LeaseLost``."""
    async with aio.connect(inproc.addr, inproc.home) as repl:
        await repl.start("aio-next")
        for n in (1, 2):
            await repl.send("aio-next", f"job {n}")
        first = await repl.claim("aio-next", timeout=5)
        assert first.claim is not None
        following = await repl.done("aio-next", first.claim, next=True, lease=30, timeout=5)
        assert following.claim == "work:2:1" and following.firing is not None
        assert following.firing.result == "job 2"
        nothing = await repl.done("aio-next", following.claim, next=True, timeout=0)
        assert nothing.timed_out and nothing.claim is None
        with pytest.raises(api.LeaseLost):
            await repl.done("aio-next", following.claim, next=True, timeout=0)
    with api.connect(inproc.addr, inproc.home) as blocking:
        blocking.send("aio-next", "job 3")
        third = blocking.claim("aio-next", timeout=5)
        assert third.claim == "work:3:1"
        assert blocking.done("aio-next", third.claim) == 3
