"""``repl mcp`` driven by the official SDK's own stdio client (docs/semantics.md M1-M3).

Each test starts ``repl mcp`` as an agent harness does, through
``mcp.client.stdio.stdio_client``, and talks to it with ``mcp.ClientSession``;
the daemon is a real process, and the CLI that wakes a blocked wait is the
real ``repl`` in a subprocess. What is checked: the tools and their schemas;
send then read; a blocked wait woken by a CLI send; a wait without ack gives
the same firings again and one with ack moves the cursor; a wait the client
gave up on acknowledges nothing; a timeout is a result; progress arrives; a
missing session is a tool error with the CLI's line and the server stays up;
a scoped token limits it; a daemon restart between two calls; request and
reply between two agents.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.helpers import DaemonProc, Repl, eventually

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module, so the tests share one server (it takes seconds to
    start: the SDK's own import)."""
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("mcp") / "home", "--memory", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


@asynccontextmanager
async def agent(
    d: DaemonProc, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    """``repl mcp`` for daemon ``d``, as a harness starts it, and the SDK's session with it."""
    environment = {"REPL_ADDR": d.addr, "REPL_HOME": str(d.home), **(env or {})}
    # the SDK starts the server with a bare environment: pass coverage's on, so the
    # server is measured like every other child the tests start
    environment.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "repl_cli", "mcp", "--progress-every", "0.5", *extra],
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


@pytest.fixture(scope="module")
async def shared(daemon: DaemonProc) -> AsyncIterator[ClientSession]:
    """One ``repl mcp`` for the tests that need nothing of their own."""
    async with agent(daemon) as session:
        yield session


async def call(client: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; the test fails on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: ClientSession, tool: str, /, **arguments: Any) -> str:
    """A tool error's text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text: str = result.content[0].text  # type: ignore[union-attr]
    assert "Traceback" not in text
    return text


async def test_the_tools_are_listed_with_schemas_and_send_then_read(
    daemon: DaemonProc, shared: ClientSession
) -> None:
    session = shared
    listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    wanted = {"send", "wait", "read", "sessions", "start", "ack", "cursors", "schedule"}
    assert wanted | {"request", "reply"} <= set(listed)
    for tool in listed.values():
        assert tool.description and len(tool.description) < 300
        assert tool.input_schema["type"] == "object" and tool.output_schema
    wait = listed["wait"].input_schema["properties"]
    assert {"sessions", "cursor", "ack", "timeout_s", "match"} <= set(wait)
    assert (await call(session, "start", session="m-send"))["created"] is True
    sent = await call(session, "send", session="m-send", text="hello", tags={"k": "v"})
    assert sent == {"seq": 1, "duplicate": False}
    again = await call(session, "send", session="m-send", text="hello", key="k1")
    assert (await call(session, "send", session="m-send", text="x", key="k1")) == {
        "seq": again["seq"],
        "duplicate": True,
    }
    got = await call(session, "read", session="m-send")
    assert [f["result"] for f in got["firings"]] == ["hello", "hello"]
    assert got["firings"][0]["tags"] == {"k": "v"} and got["firings"][1]["tags"] == {}
    last = await call(session, "read", session="m-send", last=1)
    assert [f["seq"] for f in last["firings"]] == [2] and last["lost"] == 0
    rows = (await call(session, "sessions"))["sessions"]
    assert any(row["id"] == "m-send" and row["head"] == 2 for row in rows)


async def test_a_blocked_wait_is_woken_by_a_cli_send(
    daemon: DaemonProc, shared: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("m-wake")
    session = shared
    async with anyio.create_task_group() as tg:
        answers: list[dict[str, Any]] = []

        async def waiting() -> None:
            answers.append(await call(session, "wait", sessions=s, timeout_s=30))

        tg.start_soon(waiting)
        await anyio.to_thread.run_sync(
            lambda: eventually(lambda: repl.waiters(s) == 1, what="the MCP wait to block")
        )
        assert repl.ok("send", s, "wake up") == "1\n"
    (woken,) = answers
    assert woken["timed_out"] is False
    assert [f["result"] for b in woken["batches"] for f in b["firings"]] == ["wake up"]


async def test_a_wait_acks_only_what_the_next_call_acks(
    daemon: DaemonProc, shared: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("m-ack", "one", "two")
    session = shared
    first = await call(session, "wait", sessions=s, cursor="agent", timeout_s=5)
    again = await call(session, "wait", sessions=s, cursor="agent", timeout_s=5)
    assert first == again  # nothing was acknowledged: duplicates, never loss
    assert repl.cursor(s, "agent") is None
    (batch,) = first["batches"]
    assert batch["next"] == 2
    done = await call(session, "wait", sessions=s, cursor="agent", ack={s: 2}, timeout_s=0.2)
    assert done["timed_out"] is True and done["batches"] == []
    assert repl.cursor(s, "agent") == 2
    assert await call(session, "ack", session=s, seq=2, cursor="other") == {
        "cursor": "other",
        "seq": 2,
    }
    assert [c["name"] for c in (await call(session, "cursors", session=s))["cursors"]] == [
        "other",
        "agent",
    ]


async def test_a_wait_the_client_gave_up_on_acknowledges_nothing(
    daemon: DaemonProc, shared: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("m-gave-up", "seen")
    repl.ask({"op": "ack", "session": s, "cursor": "agent", "seq": 1})
    session = shared
    with pytest.raises(Exception, match=r"(?i)tim"):
        await session.call_tool(
            "wait", {"sessions": s, "cursor": "agent", "timeout_s": 30}, read_timeout_seconds=1
        )
    # the daemon let the wait go, and nothing moved
    await anyio.to_thread.run_sync(
        lambda: eventually(lambda: repl.waiters(s) == 0, what="the wait to be let go")
    )
    repl.send(s, "after")
    assert repl.cursor(s, "agent") == 1
    got = await call(session, "wait", sessions=s, cursor="agent", timeout_s=5)
    assert [f["result"] for f in got["batches"][0]["firings"]] == ["after"]
    assert (await call(session, "sessions"))["sessions"]  # the server is still up


async def test_a_timeout_is_a_result_and_progress_comes_while_it_blocks(
    daemon: DaemonProc,
    shared: ClientSession,
) -> None:
    repl = Repl(daemon)
    s = repl.session("m-timeout")
    session = shared
    progress: list[tuple[float, float | None, str | None]] = []

    async def told(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    result = await session.call_tool(
        "wait", {"sessions": s, "timeout_s": 1.6}, progress_callback=told
    )
    assert not result.is_error
    assert result.structured_content == {"batches": [], "timed_out": True}
    assert len(progress) >= 2 and all(total == 1.6 for _, total, _ in progress)
    assert all(message and "still waiting" in message for _, _, message in progress)


async def test_a_missing_session_is_a_tool_error_in_the_tools_words(
    daemon: DaemonProc, shared: ClientSession
) -> None:
    session = shared
    text = await refused(session, "read", session="m-nosuch")
    assert text == (
        "repl: no session 'm-nosuch': start it with the start tool (session \"m-nosuch\") "
        "(code no_such_session)"
    )
    assert "code bad_tag" in await refused(
        session, "send", session="m-nosuch", text="x", tags={"Bad": "x"}
    )
    assert "give one of after, last and cursor" in await refused(
        session, "read", session="m-nosuch", after=0, last=1
    )
    assert "acknowledges nothing" in await refused(
        session, "wait", sessions="m-nosuch", match={"k": None}, ack={"m-nosuch": 1}
    )
    assert (await call(session, "sessions"))["sessions"] is not None  # still up


async def test_a_wait_names_each_session_once_and_at_most_1024(
    daemon: DaemonProc, shared: ClientSession
) -> None:
    """The wait tool's sessions are the daemon's (rule 14): over the bound, one plain line
    naming it, and nothing waited on; a session named twice is waited on once, its batch
    where it was first named."""
    repl = Repl(daemon)
    first, second = repl.session("m-twice", "one"), repl.session("m-twice", "two")
    text = await refused(shared, "wait", sessions=[first] * 1_025, timeout_s=0)
    assert text == "repl: sessions names 1,025: one wait takes at most 1,024"
    got = await call(shared, "wait", sessions=[second, first, second], timeout_s=0)
    assert [b["session"] for b in got["batches"]] == [second, first]
    assert [f["result"] for b in got["batches"] for f in b["firings"]] == ["two", "one"]


async def test_every_error_speaks_of_tools_and_arguments_never_commands_or_upgrades(
    daemon: DaemonProc, shared: ClientSession
) -> None:
    session = shared
    await call(session, "start", session="m-words")
    said = {
        "exists": await refused(session, "start", session="m-words", exist_ok=False),
        "no time": await refused(session, "schedule", session="m-words", text="x"),
        "ack elsewhere": await refused(
            session, "wait", sessions="m-words", ack={"m-other": 1}, timeout_s=0
        ),
        "after head": await refused(session, "read", session="m-words", after=99),
        "wrong type": await refused(session, "wait", sessions="m-words", timeout_s="soon"),
        "too long": await refused(session, "wait", sessions="m-words", timeout_s=65),
    }
    assert said["exists"] == (
        "repl: session 'm-words' exists: stop it first, or give exist_ok true (code session_exists)"
    )
    assert "schedule needs delay, at or every" in said["no time"]
    own = await refused(
        session, "request", session="m-words", text="x", reply_to="m-words", tags={"corr": "c"}
    )
    assert own == "repl: tag corr is the request's own: leave it out"
    assert "which the wait is not on (code bad_request)" in said["ack elsewhere"]
    assert "(the sessions tool shows it)" in said["after head"]
    assert said["wrong type"] == (
        "repl: the wait tool's arguments: timeout_s: input should be a valid number, "
        "unable to parse string as a number"
    )
    assert said["too long"] == (
        "repl: the wait tool's arguments: timeout_s: input should be less than or equal to 50"
    )
    for line in said.values():
        assert "\n" not in line and "http" not in line and "Error executing" not in line
        assert "upgrade" not in line and "`repl" not in line and "--" not in line, line


async def test_tools_that_change_nothing_are_read_only_and_waits_end_before_60_s(
    shared: ClientSession,
) -> None:
    listed = {tool.name: tool for tool in (await shared.list_tools()).tools}
    looks = {name for name, tool in listed.items() if tool.annotations.read_only_hint}
    assert looks == {"read", "sessions", "cursors", "approvals", "gather", "join"}
    for tool in listed.values():
        hints = tool.annotations
        assert hints.open_world_hint is False and hints.destructive_hint in (None, False)
    assert listed["ack"].annotations.idempotent_hint is True
    assert listed["send"].annotations.idempotent_hint is False
    for name in ("wait", "request", "claim", "gather", "join"):
        timeout = listed[name].input_schema["properties"]["timeout_s"]
        assert timeout["maximum"] < 60 and str(int(timeout["maximum"])) in timeout["description"]
    read = listed["read"].input_schema["properties"]
    for option, others in (("after", "last or cursor"), ("last", "after or cursor")):
        assert f"not with {others}" in read[option]["description"]


async def test_a_keyed_duplicate_schedule_answers_the_seq_it_fired_as(
    shared: ClientSession,
) -> None:
    await call(shared, "start", session="m-sched")
    first = await call(shared, "schedule", session="m-sched", text="now", delay="1ms", key="k")
    assert first["seq"] is None and first["duplicate"] is False

    # the timer fires on the daemon's clock: a wait returns with its firing
    got = await call(shared, "wait", sessions="m-sched", cursor="x", timeout_s=20)
    assert [f["result"] for b in got["batches"] for f in b["firings"]] == ["now"]
    again = await call(shared, "schedule", session="m-sched", text="now", delay="1ms", key="k")
    assert again["duplicate"] is True and again["seq"] == 1 and again["timer"] == first["timer"]


async def test_a_scoped_token_limits_it_as_it_limits_the_cli(
    daemon: DaemonProc, tmp_path: Path
) -> None:
    repl = Repl(daemon)
    mine, other = repl.session("m-mine", "for me"), repl.session("m-other", "not for me")
    made = repl.ask(
        {"op": "token", "action": "add", "name": "m-agent", "sessions": [mine], "can": ["read"]}
    )[0]
    token_file = tmp_path / "agent.token"
    token_file.write_text(made["token"])
    async with agent(daemon, env={"REPL_HOME": str(tmp_path / "none")}) as nobody:
        assert "cannot read the token" in await refused(nobody, "sessions")
    async with agent(daemon, "--token-file", str(token_file)) as session:
        rows = (await call(session, "sessions"))["sessions"]
        assert [row["id"] for row in rows] == [mine]
        assert (await call(session, "read", session=mine))["firings"][0]["result"] == "for me"
        hidden = await refused(session, "read", session=other)
        assert "no session" in hidden and "code no_such_session" in hidden
        assert "code forbidden" in await refused(session, "send", session=mine, text="x")


async def test_a_daemon_restart_between_two_calls(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0")
    try:
        repl = Repl(d)
        s = repl.session("m-restart", "before")
        async with agent(d) as session:
            assert (await call(session, "read", session=s))["firings"][0]["result"] == "before"
            d.stop()
            away = await refused(session, "read", session=s)
            assert "no daemon at" in away or "closed the connection" in away, away
            assert "code" not in away or "store" in away
            d.start(d.port)
            got = await call(session, "read", session=s)  # the next call connects again
            assert got["firings"][0]["result"] == "before"
            sent = await call(session, "send", session=s, text="after")
            assert sent["seq"] == 2
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


async def test_two_agents_ask_and_answer(daemon: DaemonProc, shared: ClientSession) -> None:
    repl = Repl(daemon)
    jobs, me = repl.session("m-jobs"), repl.session("m-me")
    asker = shared
    async with agent(daemon) as worker:
        answers: list[dict[str, Any]] = []

        async def ask() -> None:
            answers.append(
                await call(asker, "request", session=jobs, text="2+2?", reply_to=me, timeout_s=30)
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            woken = await call(worker, "wait", sessions=jobs, match={"reply-to": None})
            request = woken["batches"][0]["firings"][0]
            assert request["tags"]["reply-to"] == me and request["tags"]["corr"]
            await call(worker, "reply", session=jobs, seq=request["seq"], text="4")
        (answer,) = answers
        assert answer["timed_out"] is False and answer["reply"]["result"] == "4"
        assert answer["reply"]["tags"] == {"corr": request["tags"]["corr"]}
        late = await call(asker, "request", session=jobs, text="?", reply_to=me, timeout_s=0.3)
        assert late == {"reply": None, "timed_out": True}
        timer = await call(asker, "schedule", session=jobs, text="later", delay="1h")
        assert timer["timer"].startswith("t-") and timer["every_ms"] is None


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_wait_at_its_longest_answers_a_client_that_gives_up_after_60_s(
    shared: ClientSession,
) -> None:
    """A client whose request timeout is 60 s (the SDK's own default, and many harnesses')
    gets ``timed_out`` from a ``wait`` of the longest ``timeout_s`` the schema allows, not a
    protocol error of its own time-out. Slow: it waits the 50 s out."""
    listed = {tool.name: tool for tool in (await shared.list_tools()).tools}
    longest = listed["wait"].input_schema["properties"]["timeout_s"]["maximum"]
    await call(shared, "start", session="m-longest")
    result = await shared.call_tool(
        "wait",
        {"sessions": "m-longest", "cursor": "x", "timeout_s": longest},
        read_timeout_seconds=60,
    )
    assert not result.is_error, result.content
    assert result.structured_content == {"batches": [], "timed_out": True}
