"""The table of verbs (``repl_daemon.protocol.VERBS``, issue 47): every front end serves a
verb from its row.

- Every verb has its engine step, and every step a verb; every route and tool the table
  serves is in the documents that list them (docs/http.md's routes, GUIDE.md's tools).
- A throwaway verb, ``echo``, added here with nothing but what a new verb brings (its
  request and answer Structs and its row, its core rule, its engine step, and its CLI
  command) is served at once over the line protocol, HTTP (the generic route: path,
  query, body, the right checked first) and MCP (the generic tool: its schema from the
  Structs, its arguments checked), each as the others are.

The daemon runs in this process (the table is this process's), its HTTP on a port of
its own; MCP is the server ``repl mcp`` builds, over the SDK's in-memory streams.
"""

from __future__ import annotations

import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import click
import msgspec
import pytest
from click.testing import CliRunner
from mcp import ClientSession
from mcp.shared.memory import create_client_server_memory_streams

from repl_daemon import protocol as p
from repl_daemon.config import Config, Limits
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.steps import STEPS, step
from session.rules import READ
from session.session import Summary
from tests.helpers import InProcDaemon, free_port

ROOT = Path(__file__).parents[2]


def test_every_verb_has_its_step_and_every_step_its_verb() -> None:
    assert {verb.request for verb in p.VERBS} == set(STEPS)
    assert tuple(verb.op for verb in p.VERBS) == p.OPS


def test_every_route_and_tool_the_table_serves_is_documented() -> None:
    routes = (ROOT / "docs" / "http.md").read_text()
    guide = (ROOT / "GUIDE.md").read_text()
    tools = guide[guide.index("\n## Agents over MCP\n") :]  # the section that lists the tools
    tools = tools[: tools.index("\n## ", 1)]
    for verb in p.VERBS:
        if isinstance(verb.http, p.Http):
            path = re.sub(r"\{session\}", "{id}", verb.http.path)
            path = re.sub(r"\{(\w+)(:path)?\}", r"{\1}", path).replace("{cursor}", "{name}")
            path = path.replace("{group}", "{name}")
            for method in verb.http.methods:
                # `GET /path`, or one of several methods: `POST`/`PUT /path`
                shown = rf"`{method} {re.escape(path)}`|`{method}`/(`[A-Z]+`/)*`[A-Z]+ "
                shown += rf"{re.escape(path)}`"
                assert re.search(shown, routes), f"{method} {path} is not in docs/http.md"
        if isinstance(verb.tool, p.Tool):
            assert f"| `{verb.op}`" in tools or f", `{verb.op}`" in tools, (
                f"the {verb.op} tool is not in GUIDE.md's table of tools"
            )


# -- a throwaway verb -------------------------------------------------------------------


class Echo(p.Request, tag="echo"):
    """Say a session's head back, with a word."""

    session: p.SessionId
    word: Annotated[str, msgspec.Meta(description="What to say back.")] = "hello"
    wait_ms: Annotated[int, msgspec.Meta(description="Not waited: a length, for the units.")] = 0


class Echoed(p.Response, kw_only=True):
    session: str
    word: str
    head: int
    wait_ms: int


ECHO = p.Verb(
    Echo,
    Echoed,
    READ,
    False,
    p.Http(("GET",), "/sessions/{session}/echo"),
    p.Tool("Say a session's head back, with a word.", p.Changes.NOTHING),
)


def echoed(summary: Summary, req: Echo) -> Echoed:
    """Its core rule: what it says of a session."""
    return Echoed(
        id=req.id, session=summary.id, word=req.word, head=summary.head, wait_ms=req.wait_ms
    )


def echo_step(engine: Any, req: Echo, committer: Any, token: Any) -> Outcome[p.Response]:
    """Its engine step: the session's summary, as the token sees it, said back."""
    rows: Outcome[list[Summary]] = committer.summaries(req.session)
    return rows.then(lambda found: echoed(found[0], req))


@click.command("echo")
@click.argument("session")
@click.option("--word", default="hello")
@click.pass_obj
def echo_command(repl: Any, session: str, word: str) -> None:
    """Its CLI command: one call of the API, the answer printed."""
    said = repl.op(Echo(session=session, word=word), Echoed)
    click.echo(f"{said.session} {said.head} {said.word}")
    repl.close()  # the command's process would end here; this test's goes on


@pytest.fixture
def echo_verb() -> Iterator[None]:
    from repl_cli.cli.main import cli

    p.register(ECHO)
    step(Echo)(echo_step)
    cli.add_command(echo_command)
    try:
        yield
    finally:
        p.unregister("echo")
        del STEPS[Echo]
        cli.commands.pop("echo")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcDaemon]:
    config = Config(
        home=tmp_path / "home",
        host="127.0.0.1",
        port=0,
        memory=True,
        settle=0.0,
        limits=Limits(idle_timeout=5.0),
        http=("127.0.0.1", free_port()),
    )
    d = InProcDaemon(config)
    yield d
    d.close_clients()
    d.stop()


def test_a_new_verb_is_served_everywhere_from_its_row(
    echo_verb: None, daemon: InProcDaemon
) -> None:
    c = daemon.client()
    c.ok({"op": "start", "session": "ec"})
    c.ok({"op": "send", "session": "ec", "text": "one"})
    # the line protocol: decoded, checked, stepped
    said = c.ok({"op": "echo", "session": "ec", "word": "hi", "id": 7})
    assert said == {"id": 7, "ok": True, "session": "ec", "word": "hi", "head": 1, "wait_ms": 0}
    assert c.call({"op": "nonsense"})["message"].endswith(", join, echo")
    # HTTP: the generic route, its query typed by the Struct (a length in seconds)
    assert daemon.config.http is not None
    status, body = get(daemon, "/sessions/ec/echo?word=yo&wait=1.5")
    assert (status, body) == (200, {"session": "ec", "word": "yo", "head": 1, "wait_ms": 1500})
    assert get(daemon, "/sessions/nope/echo")[0] == 404
    # a token without the right is refused before anything else
    made = c.ok(
        {"op": "token", "action": "add", "name": "ec-sender", "sessions": ["ec"], "can": ["send"]}
    )
    status, refused = get(daemon, "/sessions/ec/echo", made["token"])
    assert (status, refused["code"]) == (403, "forbidden")
    # MCP: the generic tool, its schema from the Structs
    listed, called, wrong = anyio.run(mcp_echo, daemon)
    assert listed["inputSchema"]["properties"]["wait_s"]["type"] == "number"
    assert listed["annotations"]["readOnlyHint"] is True
    assert called == {"session": "ec", "word": "hey", "head": 1, "wait_ms": 2000}
    assert wrong == "repl: the echo tool takes no wurd: its arguments are session, wait_s, word"
    # the CLI: its command, one call of the API
    from repl_cli.cli.main import cli

    argv = ["--addr", daemon.addr, "--home", str(daemon.home), "echo", "ec", "--word", "yes"]
    run = CliRunner().invoke(cli, argv)
    assert run.output == "ec 1 yes\n", run.output


def get(d: InProcDaemon, path: str, token: str | None = None) -> tuple[int, Any]:
    assert d.config.http is not None
    conn = http.client.HTTPConnection(*d.config.http, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token or d.token}"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


async def mcp_echo(d: InProcDaemon) -> tuple[dict[str, Any], dict[str, Any], str]:
    from repl_cli.mcp.server import Settings, build

    server = build(Settings(addr=d.addr, home=d.home))
    async with (
        create_client_server_memory_streams() as (client, served),
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(server.lowlevel.run, *served, server.initialization_options())
        async with ClientSession(*client) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            listed = tools["echo"].model_dump(mode="json", by_alias=True, exclude_none=True)
            result = await session.call_tool("echo", {"session": "ec", "word": "hey", "wait_s": 2})
            called = result.structured_content or {}
            refused = await session.call_tool("echo", {"session": "ec", "wurd": "x"})
            assert refused.is_error
            wrong = refused.content[0].text  # type: ignore[union-attr]
        tg.cancel_scope.cancel()
    await server.tools.quick.aclose()
    return listed, called, wrong
