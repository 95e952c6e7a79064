"""Join as MCP tools (SPEC §18, docs/semantics.md J6): the ``wait`` tool's ``all``, and the
``gather`` and ``join`` tools, driven by the official SDK's own clients as an agent harness
drives them: ``repl mcp`` on stdio (``mcp.client.stdio``) and ``/mcp`` over Streamable HTTP
(``mcp.client.streamable_http``), each test once on each, against one real daemon process.

What is checked: the tools are listed with what an agent needs (bounded below the 60 s
a client gives a call, read-only, their results' schemas the wire's answers'); each
blocks until the last piece arrives, sent by another client, and answers with all of it;
at ``timeout_s`` each answers ``timed_out`` (with what came, what is missing, what is
left) and moves nothing; a refusal is a tool error naming its code (a bad group name,
``upto`` after the head, a session that is not there, a token without ``read``); a
blocked gather tells its progress, and one the client gave up on is let go.

A blocked call runs in a task of its own; the test waits for the daemon to count its
wait among the session's waiters (a bounded wait for an event, never a sleep) before it
sends what completes it, and an answer that came too early would lack what came after.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from tests.helpers import DaemonProc, Repl, eventually

pytestmark = pytest.mark.anyio

STDIO, HTTP = "stdio", "/mcp"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module, so the tests of a transport share one client."""
    return "asyncio"


class McpDaemon(DaemonProc):
    module = "repl_cli.cli.daemon_entry"  # as ``repl daemon`` runs it: with /mcp


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    home = tmp_path_factory.mktemp("mcp-join") / "home"
    d = McpDaemon(home, "--memory", "--http", "127.0.0.1:0", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


@asynccontextmanager
async def connect(
    d: DaemonProc, transport: str, token: str | None = None
) -> AsyncIterator[ClientSession]:
    """An agent's session with the daemon's MCP server: ``repl mcp`` started as a harness
    starts it (``token``: REPL_TOKEN), or ``/mcp`` with the bearer token (the root's)."""
    if transport == HTTP:
        headers = {"Authorization": f"Bearer {token or d.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(f"http://127.0.0.1:{d.http_port}/mcp", http_client=http) as (
                read,
                write,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
        return
    environment = {"REPL_ADDR": d.addr, "REPL_HOME": str(d.home)}
    if token is not None:
        environment["REPL_TOKEN"] = token
    environment.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "repl_cli", "mcp", "--progress-every", "0.5"],
        env=environment,
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


@pytest.fixture(scope="module", params=[STDIO, HTTP])
def transport(request: pytest.FixtureRequest) -> str:
    chosen: str = request.param
    return chosen


@pytest.fixture(scope="module")
async def agent(daemon: DaemonProc, transport: str) -> AsyncIterator[ClientSession]:
    """One agent of the root token, on each transport."""
    async with connect(daemon, transport) as session:
        yield session


async def call(client: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; the test fails on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    got: dict[str, Any] | None = result.structured_content
    assert got is not None
    return got


async def refused(client: ClientSession, tool: str, /, **arguments: Any) -> str:
    """A tool error's one line."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    (content,) = result.content
    assert isinstance(content, TextContent)
    assert "Traceback" not in content.text and "\n" not in content.text
    return content.text


async def blocked(repl: Repl, *sessions: str) -> None:
    """Once the daemon counts a waiter on each of ``sessions``."""
    for session in sessions:
        await anyio.to_thread.run_sync(
            lambda s=session: eventually(lambda: repl.waiters(s) == 1, what=f"a wait on {s}")
        )


def send(repl: Repl, session: str, text: str, **tags: str) -> None:
    repl.ask({"op": "send", "session": session, "text": text, "tags": tags})


def claim(repl: Repl, session: str) -> str:
    (claimed,) = repl.ask({"op": "claim", "session": session, "timeout_ms": 0})
    token: str = claimed["claim"]
    return token


def cursors(repl: Repl, session: str) -> list[dict[str, Any]]:
    (listed,) = repl.ask({"op": "cursors", "session": session})
    rows: list[dict[str, Any]] = listed["cursors"]
    return rows


# -- listed --------------------------------------------------------------------------


async def test_the_tools_are_listed_bounded_read_only_with_the_wires_answers(
    agent: ClientSession,
) -> None:
    listed = {tool.name: tool for tool in (await agent.list_tools()).tools}
    assert listed["wait"].input_schema["properties"]["all"]["type"] == "boolean"
    for name, arguments in (
        ("gather", {"session", "corrs", "timeout_s"}),
        ("join", {"session", "group", "upto", "timeout_s"}),
    ):
        tool = listed[name]
        assert set(tool.input_schema["properties"]) == arguments
        assert tool.input_schema["required"] == (
            ["session", "corrs"] if name == "gather" else ["session"]
        )
        timeout = tool.input_schema["properties"]["timeout_s"]
        assert (timeout["type"], timeout["minimum"], timeout["default"]) == ("number", 0, 30)
        assert (
            timeout["maximum"] < 60
            and f"at most {timeout['maximum']:g}" in (timeout["description"])
        )
        assert tool.description is not None and len(tool.description) < 300
        for words in ("timed_out", "moves nothing", "called again"):
            assert words in tool.description, (name, words)
        hints = tool.annotations
        assert hints is not None and hints.read_only_hint is True
        assert hints.open_world_hint is False
    gather_out = listed["gather"].output_schema or {}
    assert set(gather_out["properties"]) == {"firings", "missing", "timed_out"}
    assert "Firing" in gather_out["$defs"]  # a firing as the wire gives it, tags and by
    join_out = listed["join"].output_schema or {}
    assert set(join_out["properties"]) == {
        "upto",
        "done",
        "dead",
        "ready",
        "held",
        "delayed",
        "timed_out",
    }
    assert listed["join"].input_schema["properties"]["group"]["default"] == "work"


# -- answered when the last piece arrives ---------------------------------------------


async def test_a_wait_on_all_answers_once_the_last_session_has_firings(
    daemon: DaemonProc, agent: ClientSession
) -> None:
    repl = Repl(daemon)
    a, b, c = repl.session("mj-a"), repl.session("mj-b", "b early"), repl.session("mj-c")
    answers: list[dict[str, Any]] = []
    async with anyio.create_task_group() as tg:

        async def waiting() -> None:
            asked = {"sessions": [a, b, c], "all": True, "cursor": "agent", "timeout_s": 30}
            answers.append(await call(agent, "wait", **asked))

        tg.start_soon(waiting)
        await blocked(repl, a, b, c)
        send(repl, a, "a")
        send(repl, c, "c last")
    (woken,) = answers
    assert woken["timed_out"] is False
    got = [(x["session"], [f["result"] for f in x["firings"]]) for x in woken["batches"]]
    assert got == [(a, ["a"]), (b, ["b early"]), (c, ["c last"])]
    assert [repl.cursor(s, "agent") for s in (a, b, c)] == [None, None, None]
    # the next wait acknowledges all of them together, before it waits
    acks = {x["session"]: x["next"] for x in woken["batches"]}
    again = await call(
        agent, "wait", sessions=[a, b, c], all=True, cursor="agent", ack=acks, timeout_s=0
    )
    assert again == {"batches": [], "timed_out": True}
    assert [repl.cursor(s, "agent") for s in (a, b, c)] == [1, 1, 1]


async def test_a_gather_answers_when_the_last_reply_comes(
    daemon: DaemonProc, agent: ClientSession
) -> None:
    repl = Repl(daemon)
    me = repl.session("mj-me")
    send(repl, me, "w2's early reply", corr="c-2")
    answers: list[dict[str, Any]] = []
    async with anyio.create_task_group() as tg:

        async def gathering() -> None:
            answers.append(await call(agent, "gather", session=me, corrs=["c-1", "c-2"]))

        tg.start_soon(gathering)
        await blocked(repl, me)
        send(repl, me, "a retry of w2's", corr="c-2")
        send(repl, me, "not a reply")
        send(repl, me, "w1's reply", corr="c-1")
    (gathered,) = answers
    assert [f["result"] for f in gathered["firings"]] == ["w1's reply", "w2's early reply"]
    assert [f["tags"]["corr"] for f in gathered["firings"]] == ["c-1", "c-2"]
    assert gathered["firings"][0]["by"] == "root"
    assert (gathered["missing"], gathered["timed_out"]) == ([], False)
    # it moved nothing: called again, it answers the same
    assert await call(agent, "gather", session=me, corrs=["c-1", "c-2"], timeout_s=0) == gathered
    assert cursors(repl, me) == []


async def test_a_join_answers_when_the_last_job_is_done(
    daemon: DaemonProc, agent: ClientSession
) -> None:
    repl = Repl(daemon)
    jobs = repl.session("mj-jobs", "job 1", "job 2")
    first, second = claim(repl, jobs), claim(repl, jobs)
    answers: list[dict[str, Any]] = []
    async with anyio.create_task_group() as tg:

        async def joining() -> None:
            answers.append(await call(agent, "join", session=jobs))

        tg.start_soon(joining)
        await blocked(repl, jobs)
        repl.ask({"op": "done", "session": jobs, "claim": first})
        send(repl, jobs, "a job posted after the join began: not waited for")
        repl.ask({"op": "done", "session": jobs, "claim": second})
    (joined,) = answers
    assert joined == {
        "upto": 2,
        "done": 2,
        "dead": 0,
        "ready": 0,
        "held": 0,
        "delayed": 0,
        "timed_out": False,
    }
    (groups,) = repl.ask({"op": "groups", "session": jobs})
    assert groups["groups"][0]["ready"] == 1  # the third job is there still: nothing taken


# -- at timeout_s: timed_out, nothing moved ---------------------------------------------


async def test_at_timeout_s_each_answers_timed_out_and_moves_nothing(
    daemon: DaemonProc, agent: ClientSession
) -> None:
    repl = Repl(daemon)
    a, b = repl.session("mj-ta"), repl.session("mj-tb")
    send(repl, a, "job, and x's reply", corr="x")
    woken = await call(agent, "wait", sessions=[a, b], all=True, cursor="co", timeout_s=0.2)
    assert woken == {"batches": [], "timed_out": True}
    gathered = await call(agent, "gather", session=a, corrs=["y", "x", "z"], timeout_s=0.2)
    assert [f["result"] for f in gathered["firings"]] == ["job, and x's reply"]
    assert (gathered["missing"], gathered["timed_out"]) == (["y", "z"], True)
    held = claim(repl, a)
    joined = await call(agent, "join", session=a, timeout_s=0.2)
    assert (joined["upto"], joined["done"], joined["held"], joined["timed_out"]) == (1, 0, 1, True)
    assert cursors(repl, a) == []
    repl.ask({"op": "done", "session": a, "claim": held})  # the claim was still the test's
    finished = await call(agent, "join", session=a, upto=1, timeout_s=0)
    assert (finished["done"], finished["timed_out"]) == (1, False)


# -- refusals --------------------------------------------------------------------------


async def test_a_refusal_is_a_tool_error_naming_its_code(
    daemon: DaemonProc, agent: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("mj-r", "one")
    said = {
        "bad group": await refused(agent, "join", session=s, group="bad name!", timeout_s=0),
        "after head": await refused(agent, "join", session=s, upto=2, timeout_s=0),
        "no join session": await refused(agent, "join", session="mj-none", timeout_s=0),
        "no gather session": await refused(agent, "gather", session="mj-none", corrs=["a"]),
        "no wait session": await refused(agent, "wait", sessions=[s, "mj-none"], all=True),
        "no corrs": await refused(agent, "gather", session=s, corrs=[], timeout_s=0),
        "too long": await refused(agent, "gather", session=s, corrs=["a"], timeout_s=65),
        "unknown": await refused(agent, "join", session=s, grop="work"),
        "not a list": await refused(agent, "gather", session=s, corrs="c-1", timeout_s=0),
        "not seconds": await refused(agent, "join", session=s, timeout_s="soon"),
    }
    assert said["bad group"].endswith("(code bad_group_name)") and "bad name!" in said["bad group"]
    assert said["after head"].endswith("(code bad_seq)") and "upto 2" in said["after head"]
    for what in ("no join session", "no gather session", "no wait session"):
        assert said[what].startswith("repl: no session 'mj-none'"), said[what]
        assert said[what].endswith("(code no_such_session)"), said[what]
    assert said["no corrs"].endswith("(code bad_request)")
    assert said["too long"] == (
        "repl: the gather tool's arguments: timeout_s: 65 is not between 0 and 50"
    )
    assert said["unknown"] == (
        "repl: the join tool takes no grop: its arguments are group, session, timeout_s, upto"
    )
    assert said["not a list"] == (
        "repl: the gather tool's arguments: corrs: expected `array`, got `str`"
    )
    assert said["not seconds"] == "repl: the join tool's arguments: timeout_s: a number"
    # null for an argument with a default is the default, as when it is not given
    joined = await call(agent, "join", session=s, group=None, upto=None, timeout_s=0)
    assert (joined["upto"], joined["ready"]) == (1, 1)
    send(repl, s, "a reply", corr="c")
    gathered = await call(agent, "gather", session=s, corrs=["c"], timeout_s=None)
    assert [f["result"] for f in gathered["firings"]] == ["a reply"]
    for line in said.values():  # in the words of tools, never of commands
        assert "`repl" not in line and "--" not in line and "upgrade" not in line, line
    assert cursors(repl, s) == []
    (groups,) = repl.ask({"op": "groups", "session": s})
    assert groups["groups"] == []


async def test_a_token_without_read_is_forbidden_and_one_that_does_not_see_is_told_so(
    daemon: DaemonProc, transport: str
) -> None:
    repl = Repl(daemon)
    mine, other = repl.session("mj-mine", "job"), repl.session("mj-other")
    tokens = {}
    for can in ("send", "read"):
        name = f"mj-{can}-{'stdio' if transport == STDIO else 'http'}"
        add = {"op": "token", "action": "add", "name": name, "sessions": [mine], "can": [can]}
        tokens[can] = repl.ask(add)[0]["token"]
    async with connect(daemon, transport, tokens["send"]) as sender:
        for tool, arguments in (
            ("gather", {"session": mine, "corrs": ["a"]}),
            ("join", {"session": mine}),
            ("wait", {"sessions": [mine], "all": True}),
        ):
            said = await refused(sender, tool, **arguments, timeout_s=0)
            assert said.endswith("(code forbidden)") and "read" in said, (tool, said)
    async with connect(daemon, transport, tokens["read"]) as reader:
        hidden = await refused(reader, "join", session=other, timeout_s=0)
        assert hidden.endswith("(code no_such_session)"), hidden
        joined = await call(reader, "join", session=mine, timeout_s=0)
        assert (joined["ready"], joined["timed_out"]) == (1, True)


# -- bounded, never silent ------------------------------------------------------------


async def test_a_blocked_gather_tells_its_progress_and_one_given_up_on_is_let_go(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    me = repl.session("mj-progress")
    progress: list[tuple[float, float | None, str | None]] = []

    async def told(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    async with connect(daemon, STDIO) as agent:
        result = await agent.call_tool(
            "gather", {"session": me, "corrs": ["never"], "timeout_s": 1.6}, progress_callback=told
        )
        assert result.structured_content == {"firings": [], "missing": ["never"], "timed_out": True}
        assert len(progress) >= 2 and all(total == 1.6 for _, total, _ in progress)
        assert all(message and "still waiting" in message for _, _, message in progress)
        jobs = repl.session("mj-gave-up", "a job nobody does")
        with pytest.raises(Exception, match=r"(?i)tim"):
            await agent.call_tool("join", {"session": jobs}, read_timeout_seconds=1)
        # its own connection closed with the call: the daemon let the join go
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: repl.waiters(jobs) == 0, what="the join let go")
        )
        assert (await call(agent, "sessions"))["sessions"]  # the server is still up


async def test_a_gather_rides_out_a_daemon_restart_within_its_timeout(tmp_path: Path) -> None:
    """One request for the whole call: the daemon restarted while it blocks, the gather is
    sent again on the new connection and answers with the reply sent after the restart
    (and the one from before it, which the ring kept)."""
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0")
    try:
        repl = Repl(d)
        me = repl.session("mj-restart")
        send(repl, me, "before", corr="c-1")
        async with connect(d, STDIO) as agent, anyio.create_task_group() as tg:
            answers: list[dict[str, Any]] = []

            async def gathering() -> None:
                asked = {"session": me, "corrs": ["c-1", "c-2"], "timeout_s": 40}
                answers.append(await call(agent, "gather", **asked))

            tg.start_soon(gathering)
            await blocked(repl, me)
            await anyio.to_thread.run_sync(d.restart)
            send(repl, me, "after", corr="c-2")
        (gathered,) = answers
        assert [f["result"] for f in gathered["firings"]] == ["before", "after"]
        assert gathered["timed_out"] is False
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
