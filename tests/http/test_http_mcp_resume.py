"""A cut stream of ``/mcp`` resumes (SPEC §17, docs/semantics.md M7): every event carries an
``id:``, and ``GET /mcp`` with ``Last-Event-ID`` gives what came after it, or is refused
as JSON when the MCP session no longer keeps it.

The client is the SDK's own (``streamable_http_client``), through ``Cutter``: a loopback
proxy that can drop the client's side of an open stream while the daemon's side stays
open, as a network path that went away without a word (the daemon goes on writing into
it, and is never told). The SDK's client sees its stream end and asks again with the id
of the last event it had; what the daemon wrote into the void is given to it then. What
is checked: a GET stream's pushes written into the void arrive once each, in order, after
the resume (``ack=agent``), and are acknowledged once the resumed stream stayed open 2 s
(``ack=pipe``); a GET stream opened afresh, without ``Last-Event-ID``, is not a resume,
and stops that session's acknowledgements (``ack=pipe``); a tool call whose POST stream
was cut gets its answer on the resumed stream; a ``Last-Event-ID`` of no event of the
session is a JSON 400. Every wait is for an event, never for time to pass.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import msgspec
import pytest
from anyio.abc import SocketStream, TaskStatus
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._context_streams import create_context_streams
from mcp.types import JSONRPCNotification

from repl_cli.cli.daemon_entry import serving
from repl_cli.mcp import http as mcp_http
from repl_cli.mcp.push import CHANNEL_METHOD
from tests.helpers import Daemon, DaemonProc, daemon_config, eventually, free_port, inproc_daemon

pytestmark = pytest.mark.anyio

#: the generous bound of every wait for an event
BOUND = 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class McpDaemon(DaemonProc):
    module = "repl_cli.cli.daemon_entry"


@pytest.fixture(scope="module")
def mcpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    home: Path = tmp_path_factory.mktemp("http-mcp-resume") / "home"
    d = McpDaemon(home, "--http", "127.0.0.1:0", "--memory", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


class Conn:
    """One request through the proxy: its method, and once cut, what the daemon went on
    writing into it (``void``)."""

    def __init__(self, method: bytes, client: SocketStream) -> None:
        self.method = method
        self.client = client
        self.cut = False
        self.done = False
        self.void = b""
        self.heard = anyio.Event()

    async def into_void(self, until: bytes) -> None:
        """Wait until the daemon wrote ``until`` into this cut connection."""
        with anyio.fail_after(BOUND):
            while until not in self.void:
                await self.heard.wait()


class Cutter:
    """A loopback proxy to the daemon's HTTP port (each request on a connection of its own,
    its ``Host`` the daemon's); ``cut`` drops the client's side of the open requests of a
    method, keeping the daemon's. While ``held`` is set, a new GET waits for it to clear."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = 0
        self.conns: list[Conn] = []
        self.held: anyio.Event | None = None

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started(self.port)
            await listener.serve(self.handle)

    def url(self, query: str) -> str:
        return f"http://127.0.0.1:{self.port}/mcp?{query}"

    async def handle(self, client: SocketStream) -> None:
        async with client:
            await self.forward(client)

    async def forward(self, client: SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await client.receive()
        head, _, rest = head.partition(b"\r\n\r\n")
        request_line, *fields = head.split(b"\r\n")
        method = request_line.split(b" ", 1)[0]
        if method == b"GET" and self.held is not None:
            await self.held.wait()
        kept = [f for f in fields if f.split(b":", 1)[0].lower() not in (b"host", b"connection")]
        host = f"Host: 127.0.0.1:{self.upstream}".encode()
        head = b"\r\n".join([request_line, *kept, host, b"Connection: close"])
        conn = Conn(method, client)
        self.conns.append(conn)
        try:
            async with await anyio.connect_tcp("127.0.0.1", self.upstream) as upstream:
                await upstream.send(head + b"\r\n\r\n" + rest)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self.to_daemon, client, upstream)
                    await self.to_client(conn, upstream)
                    tg.cancel_scope.cancel()
        finally:
            conn.done = True

    @staticmethod
    async def to_daemon(client: SocketStream, upstream: SocketStream) -> None:
        try:
            async for chunk in client:
                await upstream.send(chunk)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass  # cut: the daemon's side stays open

    @staticmethod
    async def to_client(conn: Conn, upstream: SocketStream) -> None:
        try:
            async for chunk in upstream:
                if conn.cut:
                    conn.void += chunk
                    conn.heard.set()
                    conn.heard = anyio.Event()
                else:
                    await conn.client.send(chunk)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass

    async def cut(self, method: bytes) -> Conn:
        """Drop the client's side of the one open request of ``method``."""
        (conn,) = [c for c in self.conns if c.method == method and not (c.cut or c.done)]
        conn.cut = True
        await conn.client.aclose()
        return conn


@asynccontextmanager
async def cutter(d: DaemonProc) -> AsyncIterator[Cutter]:
    assert d.http_port is not None
    proxy = Cutter(d.http_port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy.serve)
        yield proxy
        tg.cancel_scope.cancel()


class Agent:
    """The SDK's client, and the channel notifications it was pushed, in order."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        self.arrived = anyio.Event()
        self.session: ClientSession

    async def tap(self, read: Any, into: Any) -> None:
        async with into:
            async for item in read:
                message = getattr(item, "message", None)
                if isinstance(message, JSONRPCNotification) and message.method == CHANNEL_METHOD:
                    self.got.append(message.params or {})
                    self.arrived.set()
                    self.arrived = anyio.Event()
                try:
                    await into.send(item)
                except anyio.BrokenResourceError:  # the session closed: nobody reads on
                    return

    async def pushed(self, n: int) -> list[str]:
        """The texts of the first ``n`` pushes (waited for)."""
        with anyio.fail_after(BOUND):
            while len(self.got) < n:
                await self.arrived.wait()
        return [p["content"] for p in self.got]


@asynccontextmanager
async def agent(d: DaemonProc, url: str) -> AsyncIterator[Agent]:
    heard = Agent()
    headers = {"Authorization": f"Bearer {d.token}"}
    into, tapped = create_context_streams[Any](0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(heard.tap, read, into)
        async with ClientSession(tapped, write) as session:
            heard.session = session
            await session.initialize()
            yield heard
        tg.cancel_scope.cancel()


def cursor_of(d: DaemonProc, session: str, cursor: str) -> int:
    rows = d.client().ok({"op": "cursors", "session": session})["cursors"]
    return next((int(row["seq"]) for row in rows if row["name"] == cursor), 0)


async def until(what: str, holds: Any) -> None:
    """Wait (in a thread: it asks the daemon) until ``holds()``."""
    await anyio.to_thread.run_sync(lambda: eventually(holds, what=what))


async def test_pushes_written_into_a_cut_get_stream_arrive_once_the_sdk_client_resumes(
    mcpd: DaemonProc,
) -> None:
    root = mcpd.client()
    root.ok({"op": "start", "session": "rs-agent"})
    async with cutter(mcpd) as proxy, agent(mcpd, proxy.url("follow=rs-agent")) as a:
        root.ok({"op": "send", "session": "rs-agent", "text": "one"})
        assert await a.pushed(1) == ["one"]
        proxy.held = anyio.Event()  # the client's next GET waits: the void gets the pushes
        void = await proxy.cut(b"GET")
        for text in ("two", "three"):
            root.ok({"op": "send", "session": "rs-agent", "text": text})
        await void.into_void(b'"three"')
        proxy.held.set()
        assert await a.pushed(3) == ["one", "two", "three"]  # once each, in order
        await a.session.call_tool("ack", {"session": "rs-agent", "seq": 3})
        assert cursor_of(mcpd, "rs-agent", "mcp") == 3


async def test_in_pipe_mode_pushes_resumed_after_a_cut_are_acknowledged(mcpd: DaemonProc) -> None:
    """``ack=pipe``: the pushes written into the void reach the client on the resumed
    stream, which then stays open: each is taken after all, and acknowledged."""
    root = mcpd.client()
    root.ok({"op": "start", "session": "rs-pipe"})
    async with cutter(mcpd) as proxy, agent(mcpd, proxy.url("follow=rs-pipe&ack=pipe")) as a:
        root.ok({"op": "send", "session": "rs-pipe", "text": "one"})
        assert await a.pushed(1) == ["one"]
        proxy.held = anyio.Event()
        void = await proxy.cut(b"GET")
        root.ok({"op": "send", "session": "rs-pipe", "text": "two"})
        await void.into_void(b'"two"')
        proxy.held.set()
        assert await a.pushed(2) == ["one", "two"]
        await until("both acknowledged", lambda: cursor_of(mcpd, "rs-pipe", "mcp") == 2)


HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


async def handshake(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """The ``initialize`` handshake by hand; the MCP session's header."""
    init = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "1"},
    }
    opened = await http.post(
        url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
    )
    assert opened.status_code == 200, opened.text
    sid = {"mcp-session-id": opened.headers["mcp-session-id"]}
    told = await http.post(
        url, headers=sid, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
    )
    assert told.status_code == 202
    return sid


async def first_push(stream: Any) -> tuple[str, dict[str, Any]]:
    """The id and the message of the first event with data on an open GET stream."""
    event_id = ""
    async for line in stream.aiter_lines():
        if line.startswith("id:"):
            event_id = line.removeprefix("id:").strip()
        elif line.startswith("data:") and line.removeprefix("data:").strip():
            return event_id, json.loads(line.removeprefix("data:"))
    raise AssertionError("the stream ended")


async def test_a_fresh_get_stream_is_no_resume_and_acknowledges_nothing(mcpd: DaemonProc) -> None:
    """``ack=pipe``: a push taken on a GET stream that was closed within 2 s, then a GET
    without ``Last-Event-ID`` (what the last stream wrote is not written again): the
    session acknowledges nothing more, as when its client left."""
    root = mcpd.client()
    root.ok({"op": "start", "session": "rs-fresh"})
    url = f"http://127.0.0.1:{mcpd.http_port}/mcp?follow=rs-fresh&ack=pipe&cursor=fresh"
    headers = {**HEADERS, "Authorization": f"Bearer {mcpd.token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        sid = await handshake(http, url)
        root.ok({"op": "send", "session": "rs-fresh", "text": "one"})
        with anyio.fail_after(BOUND):
            async with http.stream("GET", url, headers=sid) as stream:
                event_id, pushed = await first_push(stream)
        assert event_id and pushed["params"]["content"] == "one"
        with anyio.fail_after(BOUND):
            async with http.stream("GET", url, headers=sid) as stream:
                left = "the client left within 2 s of a push: nothing more is acknowledged"
                await until("the receipt refused", lambda: left in mcpd.log.read_text())
        assert cursor_of(mcpd, "rs-fresh", "fresh") == 0
        await http.delete(url, headers=sid)


async def test_a_tool_call_whose_post_stream_was_cut_gets_its_answer(mcpd: DaemonProc) -> None:
    """A ``wait`` blocked when its POST stream is cut: its answer, written into the void,
    is given to the SDK's client when it asks again with the stream's last event id."""
    root = mcpd.client()
    root.ok({"op": "start", "session": "rs-post"})
    async with cutter(mcpd) as proxy, agent(mcpd, proxy.url("")) as a:
        async with anyio.create_task_group() as tg:
            answers: list[Any] = []

            async def call() -> None:
                arguments = {"sessions": "rs-post", "timeout_s": BOUND}
                answers.append(await a.session.call_tool("wait", arguments))

            tg.start_soon(call)
            await until("the wait blocked", lambda: waiters(mcpd, "rs-post") == 1)
            proxy.held = anyio.Event()
            void = await proxy.cut(b"POST")
            root.ok({"op": "send", "session": "rs-post", "text": "late"})
            await void.into_void(b'"late"')
            proxy.held.set()
        (answer,) = answers
        assert not answer.is_error, answer.content
        [batch] = answer.structured_content["batches"]
        assert [f["result"] for f in batch["firings"]] == ["late"]


def waiters(d: Daemon, session: str) -> int:
    rows = d.client().ok({"op": "sessions"})["sessions"]
    return next(int(row["waiters"]) for row in rows if row["id"] == session)


async def test_a_last_event_id_of_no_event_of_the_session_is_refused_as_json(
    mcpd: DaemonProc,
) -> None:
    url = f"http://127.0.0.1:{mcpd.http_port}/mcp"
    headers = {**HEADERS, "Authorization": f"Bearer {mcpd.token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        sid = await handshake(http, url)
        for last in ("nope", "0-0-1", "x-0-99999"):
            refused = await http.get(url, headers={**sid, "Last-Event-ID": last})
            assert refused.status_code == 400, refused.text
            assert refused.json()["code"] == "bad_request"
            assert "open the stream without it" in refused.json()["message"]
        await http.delete(url, headers=sid)


def test_an_abandoned_mcp_session_stops_following(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that went without a DELETE: once the SDK ended its idle MCP session, what
    repl kept for it goes too: its follow (its wait in the daemon) and its events."""
    monkeypatch.setattr(mcp_http, "IDLE_S", 1.0)
    monkeypatch.setattr(mcp_http, "IDLE_AFTER_S", 1.0)
    port = free_port()
    config = daemon_config(tmp_path / "home")
    config = msgspec.structs.replace(config, http=("127.0.0.1", port), mcp=serving)
    with inproc_daemon(config) as d:
        d.client().ok({"op": "start", "session": "rs-idle"})
        url = f"http://127.0.0.1:{port}/mcp?follow=rs-idle"

        async def leave_without_a_word() -> None:
            headers = {**HEADERS, "Authorization": f"Bearer {d.token}"}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
                await handshake(http, url)

        anyio.run(leave_without_a_word)
        eventually(lambda: waiters(d, "rs-idle") == 1, what="the follow's wait")
        eventually(lambda: waiters(d, "rs-idle") == 0, what="the follow ended")
