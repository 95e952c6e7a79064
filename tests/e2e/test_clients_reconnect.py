"""Every client rides out an idle close and a daemon restart (SPEC §17, issue 46 item 4;
docs/semantics.md C12).

Each client the project ships is driven as its user drives it, against a real daemon
whose ``--idle-timeout`` is 2 s: the sync API (``repl_cli.api``), the async one
(``repl_cli.aio``), ``repl mcp`` over stdio with and without ``--follow`` (the SDK's
own stdio client), and an MCP session of ``/mcp`` (the SDK's Streamable HTTP client).
After one call, the test waits for the daemon to close the client's connection (its
connection count in ``stats`` falls), then makes three calls in a row, each answered;
and the same across a restart of the daemon between two calls (``/mcp`` has no such
test: its MCP sessions live in the daemon, and a restart ends them).

The one reconnect path's rules (``repl_cli/api/_async/operations.py``) where only a fault
can reach them are shown through a relay between a client and the daemon
(``FaultRelay``): a request written just as the daemon closed the connection is
answered ``idle_timeout`` and is sent once more (rule 2; a keyless send is recorded
once); a request whose answer is lost is sent again only when a repeat cannot change
what it did (rule 3: a keyed send, a read; never a keyless send), and once only.
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from repl_cli import aio, api
from repl_cli.api._common import resendable
from repl_cli.api.receipt import ReaderGone
from repl_cli.cli import client as cli
from repl_daemon import protocol as p
from repl_daemon.config import Limits
from tests.helpers import Client, DaemonProc, Repl, daemon_config, eventually, inproc_daemon

pytestmark = pytest.mark.anyio

#: the daemon's idle timeout in these tests, in seconds
IDLE_S = 2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class McpDaemon(DaemonProc):
    """A daemon as ``repl daemon`` runs it: with the MCP server at /mcp."""

    module = "repl_cli.cli.daemon_entry"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    home: Path = tmp_path_factory.mktemp("reconnect") / "home"
    d = McpDaemon(
        home, "--http", "127.0.0.1:0", "--memory", "--settle-ms", "0", "--idle-timeout", "2"
    )
    yield d
    d.close_clients()
    d.stop()


# -- each client, as its user calls it -------------------------------------------------


class Calls:
    """Calls every client has: send (its seq), read (the texts of a session) and wait (the
    texts after cursor ``c``, acknowledging nothing)."""

    async def send(self, session: str, text: str, key: str | None = None) -> int:
        raise NotImplementedError

    async def read(self, session: str) -> list[str]:
        raise NotImplementedError

    async def wait(self, session: str) -> list[str]:
        raise NotImplementedError


class SyncCalls(Calls):
    def __init__(self, repl: api.Repl) -> None:
        self.repl = repl

    async def send(self, session: str, text: str, key: str | None = None) -> int:
        return self.repl.send(session, text, key=key).seq

    async def read(self, session: str) -> list[str]:
        return [f.result or "" for f in self.repl.read(session, after=0).firings]

    async def wait(self, session: str) -> list[str]:
        woken = self.repl.wait(session, cursor="c", timeout=10)
        return [f.result or "" for b in woken.batches for f in b.firings]


class AsyncCalls(Calls):
    def __init__(self, repl: aio.AsyncRepl) -> None:
        self.repl = repl

    async def send(self, session: str, text: str, key: str | None = None) -> int:
        return (await self.repl.send(session, text, key=key)).seq

    async def read(self, session: str) -> list[str]:
        return [f.result or "" for f in (await self.repl.read(session, after=0)).firings]

    async def wait(self, session: str) -> list[str]:
        woken = await self.repl.wait(session, cursor="c", timeout=10)
        return [f.result or "" for b in woken.batches for f in b.firings]


class McpCalls(Calls):
    """The tools of an MCP session; a tool error fails the test with its text."""

    def __init__(self, session: ClientSession) -> None:
        self.session = session

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.session.call_tool(tool, arguments)
        assert not result.is_error, result.content
        assert result.structured_content is not None
        return result.structured_content

    async def send(self, session: str, text: str, key: str | None = None) -> int:
        seq: int = (await self.call("send", session=session, text=text, key=key))["seq"]
        return seq

    async def read(self, session: str) -> list[str]:
        return [f["result"] for f in (await self.call("read", session=session))["firings"]]


Kind = Literal["api", "aio", "mcp", "mcp-follow", "mcp-http"]


@asynccontextmanager
async def client(kind: Kind, d: DaemonProc, follow: str = "") -> AsyncIterator[Calls]:
    """A client of ``kind`` for daemon ``d`` (``mcp-follow`` follows session ``follow``)."""
    if kind == "api":
        with api.connect(d.addr, d.home) as repl:
            yield SyncCalls(repl)
    elif kind == "aio":
        async with aio.connect(d.addr, d.home) as arepl:
            yield AsyncCalls(arepl)
    elif kind == "mcp-http":
        headers = {"Authorization": f"Bearer {d.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(f"http://127.0.0.1:{d.http_port}/mcp", http_client=http) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield McpCalls(session)
    else:
        async with stdio_agent(d, *(["--follow", follow] if kind == "mcp-follow" else [])) as s:
            yield McpCalls(s)


@asynccontextmanager
async def stdio_agent(d: DaemonProc, *extra: str) -> AsyncIterator[ClientSession]:
    """``repl mcp`` for daemon ``d``, started by the SDK's stdio client as a harness does."""
    environment = {"REPL_ADDR": d.addr, "REPL_HOME": str(d.home)}
    # the SDK starts the server with a bare environment: coverage's variables go on
    environment.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "repl_cli", "mcp", *extra], env=environment
    )
    errlog = open(d.home.parent / "mcp-stderr.log", "a")  # noqa: ASYNC230, SIM115 - a log file
    try:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
    finally:
        errlog.close()


# -- what the daemon says ------------------------------------------------------------


def connections(d: DaemonProc) -> int:
    """The daemon's open connections, the one asking included."""
    asking = Client(d.port, d.token)
    try:
        count: int = asking.ok({"op": "stats"})["daemon"]["connections"]
        return count
    finally:
        asking.close()


async def idle_closed(d: DaemonProc, *, following: str = "") -> None:
    """Until the daemon has closed every connection it may close for idleness: all but the
    one asking and a following server's wait (which is exempt while it waits)."""
    repl = Repl(d)
    if following:
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: repl.waiters(following) == 1, what="the follow's wait")
        )
    left = 1 + bool(following)
    await anyio.to_thread.run_sync(
        lambda: eventually(lambda: connections(d) == left, what="the daemon's idle close")
    )


def head(d: DaemonProc, session: str) -> int:
    (listed,) = Repl(d).ask({"op": "sessions"})
    found: int = next(row["head"] for row in listed["sessions"] if row["id"] == session)
    return found


# -- an idle close, and a restart ------------------------------------------------------


@pytest.mark.parametrize("kind", ["api", "aio", "mcp", "mcp-follow", "mcp-http"])
async def test_each_client_answers_three_calls_after_an_idle_close(
    daemon: DaemonProc, kind: Kind
) -> None:
    s = Repl(daemon).session("idle")
    async with client(kind, daemon, follow=s) as calls:
        assert await calls.send(s, "before") == 1
        await idle_closed(daemon, following=s if kind == "mcp-follow" else "")
        assert await calls.send(s, "one") == 2
        assert await calls.read(s) == ["before", "one"]
        assert await calls.send(s, "three") == 3
    assert head(daemon, s) == 3  # each send recorded once


#: each client across a restart: a clean one (SIGTERM, as an upgrade) and a crash (SIGKILL)
RESTARTS = {
    "api-sigterm": ("api", False),
    "api-kill": ("api", True),
    "aio-sigterm": ("aio", False),
    "aio-kill": ("aio", True),
    "mcp-sigterm": ("mcp", False),
    "mcp-follow-kill": ("mcp-follow", True),
}


@pytest.mark.parametrize(("kind", "crash"), list(RESTARTS.values()), ids=list(RESTARTS))
async def test_each_client_answers_across_a_daemon_restart(
    tmp_path: Path, kind: Kind, crash: bool
) -> None:
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0")  # durable: the session outlives it
    try:
        s = Repl(d).session("restart")
        async with client(kind, d, follow=s) as calls:
            assert await calls.send(s, "before") == 1
            await anyio.to_thread.run_sync(lambda: d.restart(crash=crash))
            assert await calls.send(s, "one") == 2
            assert await calls.read(s) == ["before", "one"]
            assert await calls.send(s, "three") == 3
        assert head(d, s) == 3
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def test_a_quiet_connection_is_kept_until_the_daemon_closes_it(tmp_path: Path) -> None:
    """The sync API no longer replaces a connection for having been quiet a second (an auth
    each time): it is replaced when the daemon closed it, and only then."""
    config = daemon_config(tmp_path / "home", limits=Limits(idle_timeout=30.0))
    with inproc_daemon(config) as d, api.connect(d.addr, d.home) as repl:
        before = repl.stats().daemon.requests
        threading.Event().wait(1.5)  # quiet, but far from the daemon's idle timeout
        after = repl.stats().daemon.requests
        assert after - before == 1  # this stats alone: no auth of a new connection


async def test_a_cancelled_call_leaves_no_answer_for_the_next(daemon: DaemonProc) -> None:
    """A wait cancelled while it blocks leaves its answer owed on the connection: the next
    call gets its own answer on a new one, and the wait moved no cursor."""
    repl = Repl(daemon)
    s = repl.session("cut", "one")
    async with aio.connect(daemon.addr, daemon.home) as arepl:
        await arepl.read(s, after=0)
        with anyio.CancelScope() as scope:

            async def cancel_once_blocked() -> None:
                await anyio.to_thread.run_sync(
                    lambda: eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
                )
                scope.cancel()

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once_blocked)
                await arepl.wait(s, cursor="c", ack={s: 1}, timeout=5)
        assert (await arepl.ping()).version
        assert await AsyncCalls(arepl).read(s) == ["one"]
    assert repl.cursor(s, "c") == 1  # the ack went before the wait blocked; nothing more


def test_a_wait_cut_off_by_its_reader_leaving_leaves_no_answer_for_the_next(
    daemon: DaemonProc,
) -> None:
    """The sync API's cut-off call, as the CLI makes it: a wait whose watched pipe lost its
    reader (``repl wait | head``) ends at once with its answer owed; the next call is
    answered on a new connection."""
    repl = Repl(daemon)
    s = repl.session("gone", "one")
    reader, writer = os.pipe()

    def reader_leaves() -> None:
        eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
        os.close(reader)

    leaving = threading.Thread(target=reader_leaves)
    try:
        with cli.Repl(cli.Client(daemon.addr, daemon.home)) as sync:
            sync.watch = writer
            leaving.start()
            with pytest.raises(ReaderGone):
                sync.wait(s, cursor="c", ack={s: 1}, timeout=5)
            assert sync.ping().version
            assert [f.result for f in sync.read(s, after=0).firings] == ["one"]
    finally:
        leaving.join(15)
        os.close(writer)
    assert repl.cursor(s, "c") == 1


# -- the rules only a fault reaches ------------------------------------------------------


class FaultRelay:
    """A TCP relay to a daemon that, once armed, plays a fault on the next request line of
    a connection that has made its auth (``times`` such lines, each on its own
    connection), and otherwise relays as a wire does:

    - ``hold``: the request is kept from the daemon, which then closes the connection for
      its idle timeout; its ``idle_timeout`` line reaches the client (as when a request is
      written just as the daemon closes);
    - ``drop``: the request reaches the daemon, which carries it out; its answer does not
      reach the client, whose connection is closed (as when the daemon dies mid-request).
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.fault: str | None = None
        self.left = 0
        #: set once the fault armed was played as many times as asked
        self.played = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, fault: Literal["hold", "drop"], times: int = 1) -> None:
        self.played.clear()
        self.fault, self.left = fault, times

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(near,), daemon=True).start()

    def _relay(self, near: socket.socket) -> None:
        far = socket.create_connection(("127.0.0.1", self.upstream))
        authed = False
        with near, far:
            while True:
                ready, _, _ = select.select([near, far], [], [])
                if far in ready:
                    data = far.recv(65536)
                    if not data:
                        return
                    near.sendall(data)
                    authed = True
                if near in ready:
                    data = near.recv(65536)
                    if not data:
                        return
                    fault = self.fault if authed else None
                    if fault is None:
                        far.sendall(data)
                        continue
                    if fault == "drop":
                        far.sendall(data)
                    told = b""
                    while b"\n" not in told:  # the answer, or the idle line
                        chunk = far.recv(65536)
                        told += chunk
                        if not chunk:
                            break
                    if fault == "hold":
                        near.sendall(told)
                    self.left -= 1
                    if not self.left:
                        self.fault = None
                        self.played.set()
                    return


@pytest.fixture
def relay(daemon: DaemonProc) -> Iterator[FaultRelay]:
    r = FaultRelay(daemon.port)
    yield r
    r.close()


@asynccontextmanager
async def relayed(kind: Kind, d: DaemonProc, relay: FaultRelay) -> AsyncIterator[Calls]:
    if kind == "api":
        with api.connect(relay.addr, d.home) as repl:
            yield SyncCalls(repl)
    else:
        async with aio.connect(relay.addr, d.home) as arepl:
            yield AsyncCalls(arepl)


@pytest.mark.parametrize("kind", ["api", "aio"])
async def test_a_request_answered_idle_timeout_is_sent_once_more(
    daemon: DaemonProc, relay: FaultRelay, kind: Kind
) -> None:
    s = Repl(daemon).session("held")
    async with relayed(kind, daemon, relay) as calls:
        assert await calls.send(s, "before") == 1
        relay.arm("hold")
        assert await calls.send(s, "keyless") == 2  # held, closed for idleness, sent again
        assert relay.played.is_set()
        assert head(daemon, s) == 2  # the held request never ran; the second one did, once
        relay.arm("hold")
        assert await calls.wait(s) == ["before", "keyless"]  # a wait, the same
        assert relay.played.is_set()


@pytest.mark.parametrize("kind", ["api", "aio"])
async def test_a_lost_answer_is_sent_again_only_when_a_repeat_changes_nothing(
    daemon: DaemonProc, relay: FaultRelay, kind: Kind
) -> None:
    s = Repl(daemon).session("lost")
    async with relayed(kind, daemon, relay) as calls:
        relay.arm("drop")
        assert await calls.send(s, "keyed", key="k1") == 1  # sent again: the first's seq
        relay.arm("drop")
        assert await calls.read(s) == ["keyed"]  # a look: sent again
        relay.arm("drop")
        with pytest.raises(api.Unavailable, match="closed the connection"):
            await calls.send(s, "keyless")  # carried out, its answer lost: not sent again
        assert relay.played.is_set()
        assert await calls.read(s) == ["keyed", "keyless"]  # recorded once each
        relay.arm("drop", times=2)
        with pytest.raises(api.Unavailable, match="closed the connection"):
            await calls.read(s)  # sent again once, its answer lost again: no third time
        assert relay.played.is_set()


def test_which_requests_a_lost_answer_may_repeat() -> None:
    """Rule 3's table: what a repeat cannot change, and nothing else."""
    again = [
        p.Ping(),
        p.Stats(),
        p.Sessions(),
        p.Cursors(session="s"),
        p.Read(session="s", cursor="c"),
        p.Timers(),
        p.Groups(session="s"),
        p.Claims(session="s"),
        p.Ack(session="s", seq=1),
        p.Gather(session="s", corrs=["c"]),
        p.Join(session="s"),
        p.Send(session="s", text="t", key="k"),
        p.Schedule(session="s", in_="5m", key="k"),
        p.Token(action="list"),
    ]
    never = [
        p.Send(session="s", text="t"),
        p.Schedule(session="s", in_="5m"),
        p.Start(session="s", exist_ok=True),
        p.Stop(session="s"),
        p.Poll(session="s"),
        p.Buffer(session="s", limit=5),
        p.Finish(session="s", claim="c"),
        p.Release(session="s", claim="c"),
        p.Extend(session="s", claim="c"),
        p.Group(session="s", group="g"),
        p.Cancel(session="s", timer="t"),
        p.SetWebhook(session="s", secret=None),
        p.Token(action="add", name="n"),
        p.Token(action="revoke", name="n"),
        p.Shutdown(),
        p.Claim(session="s"),
        p.Wait(sessions=["s"]),
    ]
    assert [r for r in again if not resendable(r)] == []
    assert [r for r in never if resendable(r)] == []
    # the table's column is the rule: a verb it marks repeatable is one that only looks
    # (its answer waits for no store), or the ack
    marked = {v.op for v in p.VERBS if v.repeatable}
    assert marked == {v.op for v in p.VERBS if v.repeatable and not v.durable} | {"ack"}
