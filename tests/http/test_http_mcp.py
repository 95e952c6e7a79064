"""The MCP server over Streamable HTTP at /mcp (SPEC §14 "Over HTTP too"), against a daemon
started as ``repl daemon`` starts it (``python -m repl_cli.cli.daemon_entry --http``), driven by
the SDK's own client (``mcp.client.streamable_http``) with the bearer token.

Each tool call is made with the token the client presented: the root's firings say
``by`` root, a scoped token's its name, and a scoped token neither sees nor reads a
session outside its patterns. No token, or a wrong one, is 401 with the challenge; a Host
that is not the listener's is refused by the SDK's DNS-rebinding protection; a daemon
started without the MCP server (``python -m repl_daemon``) answers 501 naming the extra.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import PromptReference

from repl_cli.mcp.http import security
from repl_daemon.http.mcp import Listener, connect_host
from tests.helpers import DaemonProc

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class McpDaemon(DaemonProc):
    module = "repl_cli.cli.daemon_entry"


@pytest.fixture(scope="module")
def mcpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    home: Path = tmp_path_factory.mktemp("http-mcp") / "home"
    d = McpDaemon(home, "--http", "127.0.0.1:0", "--memory", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


def url(d: DaemonProc) -> str:
    return f"http://127.0.0.1:{d.http_port}/mcp"


@asynccontextmanager
async def agent(d: DaemonProc, token: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(url(d), http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(client: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def post(d: DaemonProc, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """A bare initialize POST to /mcp: the status, the headers and the body."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    request = urllib.request.Request(
        url(d),
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            **headers,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


async def test_tools_and_resources_with_the_root_token(mcpd: DaemonProc) -> None:
    async with agent(mcpd, mcpd.token) as session:
        init = session.initialize_result
        assert init is not None
        caps = init.capabilities
        assert caps.tools is not None and caps.resources is not None
        assert caps.prompts and caps.completions and caps.logging  # as on stdio
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"send", "read", "wait", "sessions", "start"} <= names
        assert (await call(session, "start", session="h-mcp"))["created"] is True
        assert (await call(session, "send", session="h-mcp", text="hi"))["seq"] == 1
        got = await call(session, "read", session="h-mcp")
        assert [(f["result"], f["by"]) for f in got["firings"]] == [("hi", "root")]
        uris = [str(r.uri) for r in (await session.list_resources()).resources]
        assert "repl://sessions/h-mcp" in uris


async def test_a_scoped_token_has_its_rights_and_no_more(mcpd: DaemonProc) -> None:
    root = mcpd.client()
    root.ok({"op": "start", "session": "h-other"})
    root.ok({"op": "start", "session": "h-own1"})
    made = root.ok(
        {
            "op": "token",
            "action": "add",
            "name": "agent1",
            "sessions": ["h-own*"],
            "can": ["send", "read"],
        }
    )
    async with agent(mcpd, made["token"]) as session:
        await call(session, "send", session="h-own1", text="mine")
        got = await call(session, "read", session="h-own1")
        assert [(f["result"], f["by"]) for f in got["firings"]] == [("mine", "agent1")]
        rows = (await call(session, "sessions"))["sessions"]
        assert [row["id"] for row in rows] == ["h-own1"]
        refused = await session.call_tool("read", {"session": "h-other"})
        assert refused.is_error
        assert "no_such_session" in refused.content[0].text  # type: ignore[union-attr]


async def test_a_scoped_tokens_claim_tools_stay_inside_its_patterns(mcpd: DaemonProc) -> None:
    """The claim tools of /mcp with a worker's token on exactly h-jobs: on another tenant's
    session each is a tool error as for a missing session (its held job stays held); a
    first claim that would make a group whose dead letters go to h-jobs.dead (which the
    token does not see) is refused and makes nothing; a group made for it is claimed."""
    root = mcpd.client()
    for session in ("h-jobs", "h-theirs"):
        root.ok({"op": "start", "session": session})
        root.ok({"op": "send", "session": session, "text": f"job of {session}"})
    held = root.ok({"op": "claim", "session": "h-theirs", "timeout_ms": 0})["claim"]
    add = {"op": "token", "action": "add", "name": "h-worker", "sessions": ["h-jobs"]}
    made = root.ok({**add, "can": ["read"]})
    async with agent(mcpd, made["token"]) as session:
        for tool, arguments in (
            ("claim", {"timeout_s": 0}),
            ("done", {"claim": held}),
            ("release", {"claim": held}),
            ("extend", {"claim": held}),
        ):
            refused = await session.call_tool(tool, {"session": "h-theirs", **arguments})
            assert refused.is_error, tool
            assert refused.content[0].text == (  # type: ignore[union-attr]
                "repl: no session 'h-theirs': this token sees only h-jobs: check the id "
                "(code no_such_session)"
            )
        refused = await session.call_tool("claim", {"session": "h-jobs", "timeout_s": 0})
        assert refused.is_error
        text = refused.content[0].text  # type: ignore[union-attr]
        assert "'h-jobs.dead', which this token does not see" in text, text
        assert text.endswith("(code forbidden)") and "`repl" not in text
        assert root.ok({"op": "groups", "session": "h-jobs"})["groups"] == []
        root.ok({"op": "group", "session": "h-jobs", "group": "work"})
        taken = await call(session, "claim", session="h-jobs", timeout_s=5)
        assert taken["claim"] == "work:1:1"
        assert await call(session, "done", session="h-jobs", claim="work:1:1") == {"seq": 1}
    claims = root.ok({"op": "claims", "session": "h-theirs"})["claims"]
    assert [(c["seq"], c["attempt"]) for c in claims] == [(1, 1)]


async def test_a_wait_names_each_session_once_and_at_most_1024(mcpd: DaemonProc) -> None:
    root = mcpd.client()
    root.ok({"op": "start", "session": "h-w1"})
    root.ok({"op": "send", "session": "h-w1", "text": "one"})
    async with agent(mcpd, mcpd.token) as session:
        refused = await session.call_tool("wait", {"sessions": ["h-w1"] * 1_025, "timeout_s": 0})
        assert refused.is_error
        assert refused.content[0].text == (  # type: ignore[union-attr]
            "repl: sessions names 1,025: one wait takes at most 1,024"
        )
        got = await call(session, "wait", sessions=["h-w1"] * 1_024, timeout_s=0)
        assert [b["session"] for b in got["batches"]] == ["h-w1"]


def test_no_token_or_a_wrong_one_is_401(mcpd: DaemonProc) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
        status, answer, body = post(mcpd, headers)
        assert status == 401, body
        assert answer["www-authenticate"] == "Bearer"
        assert json.loads(body)["code"] == "unauthorized"


INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

#: each refusal of /mcp: what is asked (method, query, headers over the right ones, body),
#: and the status, the code and words of the answer
REFUSALS = {
    "no token": ("POST", "", {"Authorization": ""}, INIT, 401, "unauthorized", "no token"),
    "a wrong token": ("POST", "", {"Authorization": "Bearer x"}, INIT, 401, "unauthorized", ""),
    "a foreign Host": (
        "POST", "", {"Host": "evil.example:80"}, INIT, 421, "bad_request", "(DNS rebinding)"
    ),
    "a foreign Origin": (
        "POST", "", {"Origin": "http://evil.example"}, INIT, 403, "forbidden", "DNS rebinding"
    ),
    "no such MCP session": (
        "POST", "", {"Mcp-Session-Id": "0" * 32}, LIST, 404, "no_such_session",
        "initialize a new one",
    ),
    "no MCP session named": ("GET", "", {}, None, 400, "bad_request", "Mcp-Session-Id header"),
    "a method it does not take": (
        "PUT", "", {}, INIT, 405, "unknown_op", "PUT is not served on /mcp"
    ),
    "an Accept it cannot meet": (
        "POST", "", {"Accept": "text/plain"}, INIT, 406, "bad_request", "give Accept"
    ),
    "a body that is not JSON": (
        "POST", "", {"Content-Type": "text/plain"}, INIT, 400, "bad_request", "Content-Type"
    ),
    "a bad ack": ("POST", "follow=x&ack=never", {}, INIT, 400, "bad_request", "ack='never'"),
}  # fmt: skip


@pytest.mark.parametrize("what", REFUSALS)
def test_every_refusal_of_mcp_is_the_daemons_json(mcpd: DaemonProc, what: str) -> None:
    """As every refusal of the daemon's HTTP: JSON with the code its status has, and a
    message that says what to do; the SDK's own plain-text and JSON-RPC refusals too."""
    method, query, given, body, status, code, words = REFUSALS[what]
    headers = {
        "Authorization": f"Bearer {mcpd.token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **given,
    }
    headers = {k: v for k, v in headers.items() if v}
    with httpx2.Client(timeout=30) as http:
        answer = http.request(method, f"{url(mcpd)}?{query}", headers=headers, json=body)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    refusal = answer.json()
    assert set(refusal) == {"code", "message"} and refusal["code"] == code
    assert words in refusal["message"]
    if status == 405:
        assert answer.headers["allow"] == "GET, POST, DELETE"


def test_a_second_get_stream_of_a_session_is_refused_as_json(mcpd: DaemonProc) -> None:
    headers = {
        "Authorization": f"Bearer {mcpd.token}",
        "Accept": "application/json, text/event-stream",
    }
    with httpx2.Client(headers=headers, timeout=30) as http:
        opened = http.post(url(mcpd), json=INIT)
        sid = {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
        with http.stream("GET", url(mcpd), headers=sid) as first:
            assert first.status_code == 200
            second = http.get(url(mcpd), headers=sid)
            assert second.status_code == 409
            assert second.json()["code"] == "bad_request"
            assert "one at a time" in second.json()["message"]
        http.delete(url(mcpd), headers=sid)


def test_a_json_rpc_error_answering_a_message_is_mcps_own(mcpd: DaemonProc) -> None:
    """Left as the SDK wrote it: a client of the 2026-07-28 protocol reads it (an unknown
    method is 404 with -32601), as does one whose message could not be parsed."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    headers = {
        "Authorization": f"Bearer {mcpd.token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
    }
    asked = {"jsonrpc": "2.0", "id": 6, "method": "no/such", "params": {"_meta": meta}}
    with httpx2.Client(headers=headers, timeout=30) as http:
        unknown = http.post(url(mcpd), headers={"Mcp-Method": "no/such"}, json=asked)
        garbled = http.post(url(mcpd), content=b"{not json")
    assert unknown.status_code == 404
    assert (unknown.json()["id"], unknown.json()["error"]["code"]) == (6, -32601)
    assert garbled.status_code == 400 and garbled.json()["error"]["code"] == -32700


def test_a_daemon_without_the_mcp_server_says_how_to_get_it(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--http", "127.0.0.1:0", "--memory")
    try:
        status, _, body = post(d, {"Authorization": f"Bearer {d.token}"})
        assert status == 501
        assert "pip install 'repl-inbox[mcp]'" in json.loads(body)["message"]
        assert post(d, {})[0] == 401
    finally:
        d.stop()


def test_dns_rebinding_protection_is_for_loopback_only() -> None:
    home = Path("/nonexistent")
    wide = Listener("127.0.0.1:1", home, None, "0.0.0.0", 8080, False)
    assert security(wide) is None
    v6 = security(wide._replace(http_host="::1", http_tls=True))
    assert v6 is not None and "[::1]:8080" in v6.allowed_hosts
    assert "https://localhost:8080" in v6.allowed_origins
    assert [connect_host(h) for h in ("0.0.0.0", "::", "", "10.0.0.1")] == [
        "127.0.0.1",
        "::1",
        "127.0.0.1",
        "10.0.0.1",
    ]


async def test_two_clients_of_one_token_at_once(mcpd: DaemonProc) -> None:
    async def one(i: int) -> None:
        async with agent(mcpd, mcpd.token) as session:
            await call(session, "start", session=f"h-par{i}")
            await call(session, "send", session=f"h-par{i}", text=str(i))

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(one, i)


async def test_prompts_and_completion_over_http(mcpd: DaemonProc) -> None:
    """The stdio server's prompts and completion (tests/e2e/test_mcp_prompts.py), the same
    over /mcp, scoped by the token: a scoped token is offered its sessions only."""
    root = mcpd.client()
    root.ok({"op": "start", "session": "hp-own-prompt"})
    root.ok({"op": "start", "session": "hp-else-prompt"})
    root.ok({"op": "send", "session": "hp-own-prompt", "text": "look at this"})
    add = {"op": "token", "action": "add", "name": "prompter", "sessions": ["hp-own*"]}
    made = root.ok({**add, "can": ["read"]})
    inbox = PromptReference(type="ref/prompt", name="inbox")
    async with agent(mcpd, made["token"]) as session:
        got = await session.get_prompt("inbox", {"session": "hp-own-prompt"})
        assert '"result": "look at this"' in got.messages[0].content.text  # type: ignore[union-attr]
        offered = await session.complete(inbox, {"name": "session", "value": "hp-"})
        assert offered.completion.values == ["hp-own-prompt"]
