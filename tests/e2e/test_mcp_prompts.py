"""``repl mcp``'s prompts, completions and log messages (docs/semantics.md M8), through the
SDK's own stdio client against a real daemon.

What is checked: the handshake declares prompts, completions and logging; the ``inbox``
prompt gives the firings after a cursor and how to acknowledge them, and acknowledges
nothing itself; the ``work`` prompt gives the claim loop for a group; completion offers the
sessions the token sees (a prompt's ``session``, the resource template's ``id``), a
session's cursors and groups, what starts with what was typed, and nothing for what it does
not know (or a daemon away); a client that set a level is sent the server's own lines (a
followed session stopped) as log messages, at that level or above, and one that did not is
sent none.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.types import LoggingMessageNotificationParams, PromptReference, ResourceTemplateReference

from tests.helpers import DaemonProc, Repl

pytestmark = pytest.mark.anyio

#: the generous bound of every wait for an event
BOUND = 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("mcp-prompts") / "home", "--memory")
    yield d
    d.close_clients()
    d.stop()


@asynccontextmanager
async def client(d: DaemonProc, *args: str, **kwargs: Any) -> AsyncIterator[ClientSession]:
    """The SDK's session with ``repl mcp ARGS``, initialized."""
    environment = {"REPL_ADDR": d.addr, "REPL_HOME": str(d.home)}
    environment.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "repl_cli", "mcp", *args], env=environment
    )
    with open(d.home.parent / "mcp-prompts.log", "a") as errlog:  # noqa: ASYNC230 - a log file
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, **kwargs) as session,
        ):
            with anyio.fail_after(BOUND):
                await session.initialize()
            yield session


def text_of(result: Any) -> str:
    [message] = result.messages
    assert message.role == "user"
    return str(message.content.text)


async def test_the_inbox_prompt_gives_what_is_new_and_acknowledges_nothing(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s = repl.session("inbox", "one")
    repl.ok("send", s, "two", "--tag", "reply-to=alice.inbox")
    async with client(daemon) as session:
        hello = session.initialize_result
        assert hello is not None
        caps = hello.capabilities
        assert caps.prompts and caps.completions and caps.logging
        listed = {p.name: p for p in (await session.list_prompts()).prompts}
        assert set(listed) == {"inbox", "work"}
        assert [(a.name, a.required) for a in listed["inbox"].arguments or []] == [
            ("session", True),
            ("cursor", False),
        ]
        with anyio.fail_after(BOUND):
            got = text_of(await session.get_prompt("inbox", {"session": s}))
        assert '"result": "one"' in got and '"reply-to": "alice.inbox"' in got
        assert f'ack tool (session "{s}", seq 2, cursor "wait")' in got
        assert repl.ok("cursors", s, "--json").strip() == "[]"  # the prompt acknowledged nothing
        repl.ok("ack", s, "2", "--cursor", "wait")
        with anyio.fail_after(BOUND):
            nothing = text_of(await session.get_prompt("inbox", {"session": s}))
        assert nothing.startswith(f"Nothing is new in session {s} (cursor wait)")
        with anyio.fail_after(BOUND):
            work = text_of(await session.get_prompt("work", {"session": s, "group": "g"}))
        assert f'claim tool (session "{s}", group "g")' in work
        # a failure is one line, a bad parameter (the SDK's own is an internal error)
        for name, given, words in (
            ("inbox", {"session": "not-there"}, "(code no_such_session)"),
            ("inbox", {}, "the inbox prompt: Missing required arguments"),
            ("other", {}, "no prompt 'other': the prompts are inbox and work"),
        ):
            with anyio.fail_after(BOUND), pytest.raises(MCPError) as refused:
                await session.get_prompt(name, given)
            assert refused.value.error.code == -32602 and words in refused.value.error.message


async def test_completion_offers_sessions_cursors_and_groups(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    s = repl.session("complete-me", "a job")
    repl.ok("read", s, "--cursor", "reader-1")
    repl.ok("group", s, "builders")
    inbox = PromptReference(type="ref/prompt", name="inbox")
    work = PromptReference(type="ref/prompt", name="work")
    template = ResourceTemplateReference(type="ref/resource", uri="repl://sessions/{id}")
    async with client(daemon) as session:

        async def offered(ref: Any, name: str, value: str, **given: str) -> list[str]:
            with anyio.fail_after(BOUND):
                done = await session.complete(ref, {"name": name, "value": value}, given or None)
            return done.completion.values

        assert s in await offered(inbox, "session", "complete-")
        assert await offered(template, "id", s[:-1]) == [s]
        assert await offered(inbox, "session", "zz-none") == []
        assert await offered(inbox, "cursor", "reader", session=s) == ["reader-1"]
        assert await offered(work, "group", "", session=s) == ["builders"]
        assert await offered(work, "group", "", session="no-such-session") == []
        assert await offered(inbox, "cursor", "") == []  # no session given yet
        assert await offered(PromptReference(type="ref/prompt", name="other"), "x", "") == []


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_the_servers_own_lines_go_to_a_client_that_set_a_level(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    logged, lines = anyio.create_memory_object_stream[LoggingMessageNotificationParams](10)

    async def heard(params: LoggingMessageNotificationParams) -> None:
        await logged.send(params)

    s, quiet = repl.session("logged"), repl.session("not-logged")
    async with (
        logged,
        lines,
        client(daemon, "--follow", s, logging_callback=heard) as session,
        client(daemon, "--follow", quiet, logging_callback=heard) as unasked,
    ):
        with pytest.warns(MCPDeprecationWarning):
            await session.set_logging_level("warning")
        assert unasked.initialize_result is not None
        repl.ok("stop", quiet)  # told on the unasked one's stderr only
        repl.ok("stop", s)
        with anyio.fail_after(BOUND):
            told = await lines.receive()
        assert (told.level, told.logger) == ("error", "repl")
        assert f"following {s} stopped" in str(told.data)
        assert lines.statistics().current_buffer_used == 0
