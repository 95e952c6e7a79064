"""Approvals over ``/mcp`` (SPEC §19, docs/semantics.md P4): ``/mcp?follow=ID&approvals=SESSION``
relays an agent's permission prompts as ``repl mcp --approvals`` does on stdio, for each
MCP session apart, driven by hand over HTTP as Claude Code drives it: the handshake, the
GET stream, and Claude Code's exact ``permission_request`` notification POSTed.

What is checked: the capability ``claude/channel/permission`` is declared only with
``approvals``; the notification is answered 202 and recorded as the URL's token; the
first verdict by an approver (``repl approve`` from a shell, or the HTTP route) comes back
on the session's GET stream as ``notifications/claude/channel/permission``, once; a
verdict by anybody else sends nothing; the query's approvals are checked as the CLI's
options are. Every wait is for an event (a line of the stream, with a bound).
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

from repl_cli.mcp.http import BadQuery, Spec, spec_of
from tests.helpers import DaemonProc, Repl, eventually
from tests.http.test_http_mcp_push import BOUND, HEADERS, McpDaemon

pytestmark = pytest.mark.anyio

PERMISSION_REQUEST = "notifications/claude/channel/permission_request"
PERMISSION = "notifications/claude/channel/permission"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def mcpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    home: Path = tmp_path_factory.mktemp("http-mcp-approvals") / "home"
    d = McpDaemon(home, "--http", "127.0.0.1:0", "--memory", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


def message_of(response: httpx2.Response) -> dict[str, Any]:
    """A POST's answer, as JSON or as the one message of its SSE stream."""
    if response.headers["content-type"].startswith("application/json"):
        answer: dict[str, Any] = response.json()
        return answer
    for line in response.text.splitlines():
        if line.startswith("data:") and line.removeprefix("data:").strip():
            found: dict[str, Any] = json.loads(line.removeprefix("data:"))
            return found
    raise AssertionError(f"no message in {response.text!r}")


class Agent:
    """Claude Code's side of one MCP session, by hand: its handshake, its GET stream (every
    message on it, in order), and the notifications it POSTs."""

    def __init__(self, http: httpx2.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.sid: dict[str, str] = {}
        self.initialized: dict[str, Any] = {}
        self.heard: list[dict[str, Any]] = []
        self.arrived = anyio.Event()
        self.listening = anyio.Event()

    async def handshake(self) -> None:
        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "claude-code", "version": "2.1.332"},
        }
        opened = await self.http.post(
            self.url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
        )
        assert opened.status_code == 200, opened.text
        self.initialized = message_of(opened)["result"]
        self.sid = {"mcp-session-id": opened.headers["mcp-session-id"]}
        told = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert told.status_code == 202

    async def post(self, message: dict[str, Any]) -> httpx2.Response:
        return await self.http.post(self.url, headers=self.sid, json=message)

    async def ask(self, request_id: str, tool: str = "Bash", preview: str = "{}") -> None:
        """Claude Code's prompt, as it sends it: a notification, answered 202."""
        asked = await self.post(
            {
                "jsonrpc": "2.0",
                "method": PERMISSION_REQUEST,
                "params": {
                    "request_id": request_id,
                    "tool_name": tool,
                    "description": f"run {tool} for {request_id}",
                    "input_preview": preview,
                },
            }
        )
        assert (asked.status_code, asked.text) == (202, "")

    async def listen(self) -> None:
        async with self.http.stream("GET", self.url, headers=self.sid) as stream:
            assert stream.status_code == 200
            self.listening.set()
            async for line in stream.aiter_lines():
                data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
                if data:
                    self.heard.append(json.loads(data))
                    self.arrived.set()
                    self.arrived = anyio.Event()

    async def next(self) -> dict[str, Any]:
        with anyio.fail_after(BOUND):
            while not self.heard:
                await self.arrived.wait()
        return self.heard.pop(0)


@asynccontextmanager
async def agent(d: DaemonProc, token: str, query: str) -> AsyncIterator[Agent]:
    headers = {**HEADERS, "Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{d.http_port}/mcp?{query}"
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        a = Agent(http, url)
        await a.handshake()
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.listen)
            with anyio.fail_after(BOUND):
                await a.listening.wait()
            yield a
            tg.cancel_scope.cancel()
        await http.delete(url, headers=a.sid)


def prompts(repl: Repl, session: str) -> list[dict[str, Any]]:
    out = repl.ok("read", session, "--after", "0", "--json", "--match", "approval")
    return [json.loads(line) for line in out.splitlines()[1:]]


def scoped(repl: Repl, name: str, sessions: str) -> str:
    rights = ["read", "send"]
    (made,) = repl.ask(
        {"op": "token", "action": "add", "name": name, "sessions": [sessions], "can": rights}
    )
    secret: str = made["token"]
    return secret


async def test_the_capability_is_declared_only_with_approvals(mcpd: DaemonProc) -> None:
    repl = Repl(mcpd)
    inbox, asks = repl.session("inbox"), repl.session("asks")
    async with agent(mcpd, mcpd.token, f"follow={inbox}") as plain:
        assert plain.initialized["capabilities"]["experimental"] == {"claude/channel": {}}
    async with agent(mcpd, mcpd.token, f"follow={inbox}&approvals={asks}") as relaying:
        assert relaying.initialized["capabilities"]["experimental"] == {
            "claude/channel": {},
            "claude/channel/permission": {},
        }


async def test_a_prompt_posted_is_recorded_and_the_approvers_verdict_comes_back_once(
    mcpd: DaemonProc,
) -> None:
    """A worker agent's MCP session (its own token, ``hm-worker``) asks twice; the approver
    is ``hm-alice``: a verdict by root (no approver here) and a plain message send nothing,
    alice's ``repl approve`` and her verdict over the HTTP route each come back once, on
    the GET stream, in the order given."""
    repl = Repl(mcpd)
    inbox, asks = repl.session("inbox"), repl.session("asks")
    worker = scoped(repl, "hm-worker", "*")
    alice = scoped(repl, "hm-alice", asks)
    query = f"follow={inbox}&approvals={asks}&approvers=hm-alice"
    async with agent(mcpd, worker, query) as a:
        await a.ask("tbxkq", preview='{"command": "rm -rf build/"}')
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: len(prompts(repl, asks)) == 1, what="the prompt")
        )
        (prompt,) = prompts(repl, asks)
        assert prompt["event"] == "Bash: run Bash for tbxkq"
        assert prompt["tags"] == {
            "approval": "tbxkq",
            "tool": "Bash",
            "preview": '{"command": "rm -rf build/"}',
            "approvers": "hm-alice",
        }
        assert prompt["by"] == "hm-worker"
        repl.ok("send", asks, "yes tbxkq")  # a plain message with the right words
        refused = repl.run("approve", asks, "tbxkq")  # root: not an approver here
        assert refused.returncode == 77 and "does not count" in refused.stderr
        as_alice = {**repl.env, "REPL_TOKEN": alice}
        approved = repl.run("approve", asks, "tbxkq", env=as_alice)
        assert approved.returncode == 0, approved.stderr
        assert await a.next() == {
            "jsonrpc": "2.0",
            "method": PERMISSION,
            "params": {"request_id": "tbxkq", "behavior": "allow"},
        }
        await a.ask("mnopq", tool="Write")
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: len(prompts(repl, asks)) == 4, what="the second prompt")
        )
        async with httpx2.AsyncClient(timeout=30) as http:
            denied = await http.post(
                f"http://127.0.0.1:{mcpd.http_port}/sessions/{asks}/approvals/mnopq",
                headers={"Authorization": f"Bearer {alice}"},
                json={"behavior": "deny", "reason": "not on main"},
            )
        assert denied.status_code == 201, denied.text
        # the next message: nothing was sent for root's verdict, nor again for tbxkq
        assert (await a.next())["params"] == {"request_id": "mnopq", "behavior": "deny"}
        assert a.heard == []


async def test_a_verdict_on_another_sessions_prompt_is_not_its_own(mcpd: DaemonProc) -> None:
    """Two MCP sessions of one URL share the approvals session; each is sent the verdicts on
    its own prompts only."""
    repl = Repl(mcpd)
    inbox, asks = repl.session("inbox"), repl.session("asks")
    query = f"follow={inbox}&approvals={asks}"
    async with agent(mcpd, mcpd.token, query) as one, agent(mcpd, mcpd.token, query) as two:
        await one.ask("abcde")
        await two.ask("fghij")
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: len(prompts(repl, asks)) == 2, what="both prompts")
        )
        repl.ok("deny", asks, "fghij")
        repl.ok("approve", asks, "abcde")
        assert (await two.next())["params"] == {"request_id": "fghij", "behavior": "deny"}
        assert (await one.next())["params"] == {"request_id": "abcde", "behavior": "allow"}
        assert one.heard == two.heard == []


async def test_the_querys_approvals_are_checked_as_the_clis_options(mcpd: DaemonProc) -> None:
    headers = {**HEADERS, "Authorization": f"Bearer {mcpd.token}"}
    base = f"http://127.0.0.1:{mcpd.http_port}/mcp"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        for query, said in [
            ("approvals=asks", "approvals= relays prompts over the channel: give follow=ID"),
            ("approvers=alice", "approvers= relays prompts over the channel: give follow=ID"),
            ("follow=a&approvers=alice", "give approvals=SESSION too"),
            ("follow=a&approvals=bad%20id", "approvals: session id 'bad id'"),
            ("follow=a&approvals=asks&approvers=no%20one", "approvals: token name 'no one'"),
        ]:
            refused = await http.post(f"{base}?{query}", json=ping)
            assert refused.status_code == 400, query
            assert refused.json()["code"] == "bad_request"
            assert said in refused.json()["message"], (query, refused.json())


def test_the_query_says_where_prompts_are_relayed() -> None:
    def spec(query: str) -> Spec:
        return spec_of({"query_string": query.encode()})

    assert spec("follow=a&approvals=x&approvals=asks") == Spec(
        ("a",), approvals="asks", approvers=("root",)
    )
    assert spec("follow=a&approvals=asks&approvers=bob,alice&approvers=bob").approvers == (
        "alice",
        "bob",
    )
    assert spec("follow=a").approvals is None and spec("follow=a").approvers == ()
    with pytest.raises(BadQuery, match="give follow=ID too"):
        spec("approvals=asks")
