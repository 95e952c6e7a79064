"""Pushes over Streamable HTTP (SPEC §14 "Over HTTP too", §17): ``/mcp?follow=ID`` pushes each
firing to every MCP session of that URL over its GET stream, against a daemon started as
``repl daemon`` starts it, driven by the SDK's own client with the bearer token.

What is checked: a firing sent after the client connected is pushed as
``notifications/claude/channel`` with its meta and ``by``, and as
``notifications/resources/updated`` to a client that subscribed; the agent acknowledges
with its ``ack`` tool (``ack=agent``, the default), or the push is acknowledged once
handed to the GET stream and held 2 s (``ack=pipe``); a health check acknowledges nothing
in either; ``server/discover`` is refused with -32601, so that Claude Code makes the
handshake its channels need; ``allow_from`` pushes only the senders it names and the
cursor passes the others; two clients of one token of their own cursors each get every
push. Every wait is for an event (``anyio.fail_after``, the daemon's state looked at).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._context_streams import create_context_streams
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import (
    JSONRPCNotification,
    LoggingMessageNotificationParams,
    ResourceUpdatedNotification,
)

from repl_cli.mcp.http import BadQuery, Spec, spec_of
from repl_cli.mcp.push import CHANNEL, CHANNEL_METHOD, UPDATED_METHOD, Ack
from tests.helpers import Client, DaemonProc, eventually

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
    home: Path = tmp_path_factory.mktemp("http-mcp-push") / "home"
    d = McpDaemon(home, "--http", "127.0.0.1:0", "--memory", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


class Agent:
    """A client's MCP session, and what was pushed to it, in order: each notification as
    its method and params (the channel's is not one the SDK's ``ClientSession`` knows, so
    the read stream is tapped for it; the others reach its ``message_handler``)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.arrived = anyio.Event()
        self.session: ClientSession

    def heard(self, method: str, params: dict[str, Any]) -> None:
        self.got.append((method, params))
        self.arrived.set()
        self.arrived = anyio.Event()

    async def handler(self, message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            self.heard(message.method, {"uri": str(message.params.uri)})

    async def tap(self, read: Any, into: Any) -> None:
        async with into:
            async for item in read:
                message = getattr(item, "message", None)
                if isinstance(message, JSONRPCNotification) and message.method == CHANNEL_METHOD:
                    self.heard(message.method, message.params or {})
                try:
                    await into.send(item)
                except anyio.BrokenResourceError:  # the session closed: nobody reads on
                    return

    async def next(self) -> tuple[str, dict[str, Any]]:
        """The next notification pushed (waited for)."""
        with anyio.fail_after(BOUND):
            while not self.got:
                await self.arrived.wait()
        return self.got.pop(0)


@asynccontextmanager
async def agent(d: DaemonProc, token: str, query: str) -> AsyncIterator[Agent]:
    heard = Agent()
    headers = {"Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{d.http_port}/mcp?{query}"
    into, tapped = create_context_streams[Any](0)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(heard.tap, read, into)
        async with ClientSession(tapped, write, message_handler=heard.handler) as session:
            heard.session = session
            await session.initialize()
            yield heard
        tg.cancel_scope.cancel()


def cursor_of(d: DaemonProc, session: str, cursor: str) -> int:
    """Where ``cursor`` of ``session`` stands."""
    rows = d.client().ok({"op": "cursors", "session": session})["cursors"]
    return next((int(row["seq"]) for row in rows if row["name"] == cursor), 0)


async def test_a_firing_is_pushed_with_its_meta_and_by(mcpd: DaemonProc) -> None:
    root = mcpd.client()
    root.ok({"op": "start", "session": "hp-a"})
    async with agent(mcpd, mcpd.token, "follow=hp-a&cursor=t1") as a:
        init = a.session.initialize_result
        assert init is not None and CHANNEL in (init.capabilities.experimental or {})
        assert init.instructions is not None and "hp-a" in init.instructions
        with pytest.warns(MCPDeprecationWarning):
            await a.session.subscribe_resource("repl://sessions/hp-a")
        root.ok({"op": "send", "session": "hp-a", "text": "hello", "tags": {"reply-to": "x"}})
        method, params = await a.next()
        assert method == CHANNEL_METHOD and params["content"] == "hello"
        meta = params["meta"]
        assert (meta["session"], meta["seq"], meta["by"], meta["tag_reply_to"]) == (
            "hp-a",
            "1",
            "root",
            "x",
        )
        assert await a.next() == (UPDATED_METHOD, {"uri": "repl://sessions/hp-a"})
        with pytest.warns(MCPDeprecationWarning):
            await a.session.unsubscribe_resource("repl://sessions/hp-a")


async def test_allow_from_pushes_only_those_senders_and_the_cursor_passes_the_others(
    mcpd: DaemonProc,
) -> None:
    root = mcpd.client()
    root.ok({"op": "start", "session": "hp-gate"})
    made = root.ok(
        {"op": "token", "action": "add", "name": "alice", "sessions": ["hp-*"], "can": ["send"]}
    )
    alice = Client(mcpd.port, made["token"])
    mcpd.clients.append(alice)
    async with agent(mcpd, mcpd.token, "follow=hp-gate&cursor=t2&allow_from=alice") as a:
        root.ok({"op": "send", "session": "hp-gate", "text": "from root"})
        alice.ok({"op": "send", "session": "hp-gate", "text": "from alice"})
        method, params = await a.next()
        assert (method, params["content"], params["meta"]["by"]) == (
            CHANNEL_METHOD,
            "from alice",
            "alice",
        )
        # the agent's ack: its default cursor, here, is the follow's
        acked = await a.session.call_tool("ack", {"session": "hp-gate", "seq": 2})
        assert acked.structured_content == {"cursor": "t2", "seq": 2}
        root.ok({"op": "send", "session": "hp-gate", "text": "from root again"})
        eventually(lambda: cursor_of(mcpd, "hp-gate", "t2") == 3, what="the cursor at 3")


async def test_two_clients_of_one_token_each_get_every_push(mcpd: DaemonProc) -> None:
    root = mcpd.client()
    root.ok({"op": "start", "session": "hp-two"})
    # one cursor is one reader (as two `repl follow`s of one cursor are): each its own
    async with (
        agent(mcpd, mcpd.token, "follow=hp-two&cursor=t3a") as a,
        agent(mcpd, mcpd.token, "follow=hp-two&cursor=t3b") as b,
    ):
        root.ok({"op": "send", "session": "hp-two", "text": "to both"})
        for one in (a, b):
            method, params = await one.next()
            assert (method, params["content"]) == (CHANNEL_METHOD, "to both")


def test_the_query_says_what_to_follow() -> None:
    def spec(query: str) -> Spec:
        return spec_of({"query_string": query.encode()})

    assert spec("") == Spec() == spec("cursor=x&allow_from=a")
    assert spec("follow=a,b&follow=b&cursor=x&cursor=y&allow_from=") == Spec(
        ("a", "b"), "y", frozenset()
    )
    assert spec("follow=a&allow_from=al,bo") == Spec(("a",), "mcp", frozenset({"al", "bo"}))
    assert spec("follow=a&ack=agent&ack=pipe").ack is Ack.PIPE
    with pytest.raises(BadQuery, match="ack='never' is not agent or pipe"):
        spec("follow=a&ack=never")


async def test_a_push_is_held_until_the_session_opens_its_get_stream(mcpd: DaemonProc) -> None:
    """By hand: the handshake (made twice), a subscription refused before it, a GET of a
    session that is not there (404), and the firing that came before the GET stream opened,
    pushed on it once it did, and acknowledged (``ack=pipe``) once the stream stayed open
    2 s after it."""
    root = mcpd.client()
    root.ok({"op": "start", "session": "hp-held"})
    url = f"http://127.0.0.1:{mcpd.http_port}/mcp?follow=hp-held&cursor=t4&ack=pipe"
    headers = {
        "Authorization": f"Bearer {mcpd.token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    init = {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    }
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        opened = await http.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
        )
        assert opened.status_code == 200, opened.text
        sid = {"mcp-session-id": opened.headers["mcp-session-id"]}
        early = await http.post(
            url,
            headers=sid,
            json={
                "jsonrpc": "2.0",
                "id": 2,
                "method": "resources/subscribe",
                "params": {"uri": "repl://sessions/hp-held"},
            },
        )
        assert "handshake" in early.text
        for _ in range(2):
            told = await http.post(
                url, headers=sid, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
            )
            assert told.status_code == 202
        root.ok({"op": "send", "session": "hp-held", "text": "held"})
        gone = await http.get(url, headers={"mcp-session-id": "0" * 32})
        assert gone.status_code == 404
        with anyio.fail_after(BOUND):
            async with http.stream("GET", url, headers=sid) as stream:
                lines = stream.aiter_lines()  # not left (which would close the stream)
                while not (line := await lines.__anext__()).startswith("data:"):
                    pass
                pushed = json.loads(line.removeprefix("data:"))
                assert cursor_of(mcpd, "hp-held", "t4") == 0
                await anyio.to_thread.run_sync(
                    lambda: eventually(lambda: cursor_of(mcpd, "hp-held", "t4") == 1, what="1")
                )
        assert (pushed["method"], pushed["params"]["content"]) == (CHANNEL_METHOD, "held")
        await http.delete(url, headers=sid)


HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


async def handshake(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    """The ``initialize`` handshake by hand; the MCP session's header."""
    init = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "health", "version": "1"},
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


async def test_discover_is_refused_so_that_the_handshake_is_made(mcpd: DaemonProc) -> None:
    """Claude Code's probe over HTTP, as it sends it: -32601 on a following URL (it falls
    back to the handshake), the SDK's answer on a URL that follows nothing."""
    probe = {
        "jsonrpc": "2.0",
        "id": "server-discover-probe-1",
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "claude-code", "version": "2"},
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    headers = {**HEADERS, "Authorization": f"Bearer {mcpd.token}"}
    base = f"http://127.0.0.1:{mcpd.http_port}/mcp"
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        refused = await http.post(f"{base}?follow=hp-probe", json=probe)
        assert refused.status_code == 200
        assert refused.json()["id"] == "server-discover-probe-1"
        assert refused.json()["error"]["code"] == -32601
        bad = await http.post(f"{base}?follow=hp-probe&ack=never", json=probe)
        assert bad.status_code == 400 and bad.json()["code"] == "bad_request"
        assert "ack='never'" in bad.json()["message"]


@pytest.mark.parametrize("mode", ["agent", "pipe"])
async def test_a_health_check_over_http_consumes_nothing(mcpd: DaemonProc, mode: str) -> None:
    """Connect, make the handshake, open the GET stream, take a push, list the tools and
    hang up (DELETE) at once: nothing acknowledged; the next session gets it again."""
    root = mcpd.client()
    name = f"hp-health-{mode}"
    root.ok({"op": "start", "session": name})
    root.ok({"op": "send", "session": name, "text": "first"})
    url = f"http://127.0.0.1:{mcpd.http_port}/mcp?follow={name}&ack={mode}"
    headers = {**HEADERS, "Authorization": f"Bearer {mcpd.token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        for _ in range(2):
            sid = await handshake(http, url)
            with anyio.fail_after(BOUND):
                async with http.stream("GET", url, headers=sid) as stream:
                    async for line in stream.aiter_lines():
                        if line.startswith("data:") and line.removeprefix("data:").strip():
                            assert json.loads(line.removeprefix("data:"))["params"]["content"]
                            break  # (the first, with no data, primes the stream: its id)
                    listed = await http.post(
                        url, headers=sid, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
                    )
                    assert listed.status_code == 200
                    await http.delete(url, headers=sid)
        assert cursor_of(mcpd, name, "mcp") == 0


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_a_sessions_own_lines_go_to_its_client_only(mcpd: DaemonProc) -> None:
    """One daemon serves every client of /mcp in one process: a line the follow of one MCP
    session writes (its session stopped) goes to that session's client, if it set a level,
    on its GET stream, and to no other."""
    root = mcpd.client()
    heard: dict[str, list[str]] = {"a": [], "b": []}
    arrived = anyio.Event()

    @asynccontextmanager
    async def logged(name: str) -> AsyncIterator[ClientSession]:
        async def told(params: LoggingMessageNotificationParams) -> None:
            heard[name].append(f"{params.level}: {params.data}")
            arrived.set()

        root.ok({"op": "start", "session": f"hp-log-{name}"})
        url = f"http://127.0.0.1:{mcpd.http_port}/mcp?follow=hp-log-{name}"
        headers = {"Authorization": f"Bearer {mcpd.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write, logging_callback=told) as session,
        ):
            await session.initialize()
            await session.set_logging_level("info")
            yield session

    async with logged("a"), logged("b"):
        for name in ("a", "b"):
            root.ok({"op": "stop", "session": f"hp-log-{name}"})
            with anyio.fail_after(BOUND):
                while not heard[name]:
                    await arrived.wait()
                    arrived = anyio.Event()
        for name, lines in heard.items():
            assert len(lines) == 1, heard
            assert lines[0].startswith(f"error: following hp-log-{name} stopped: session ")
