"""``repl mcp``'s prompts and completions (rule M8): what a person picks from a client's
menu, and the names it offers while they type.

A prompt is a person's shortcut, not the model's tool (a client shows them as
commands: Claude Code as ``/mcp__repl__inbox``). Two are worth one:

- ``inbox`` (``session``, ``cursor``): "handle what is new in this session": the
  firings after the cursor (read, nothing acknowledged: rule M2), with how to
  acknowledge them once handled, how to answer a request, and how to wait for more;
- ``work`` (``session``, ``group``): "work through this session's jobs": the loop of
  ``claim``, then ``done``, ``release`` or ``extend``, for that group.

Completion (``completion/complete``) offers what an argument names, as the shell
completes the CLI's (``repl_cli.cli.main``'s ``complete_*``): the sessions the token sees
for a ``session`` (and the ``id`` of the resource template
``repl://sessions/{id}``), the session's cursors for a ``cursor``, its groups for a
``group``; those that start with what was typed, at most 100 (MCP's bound). Anything
else, and a daemon away, completes to nothing: completion never fails a client.

What must not live here: the tools (``repl_cli.mcp.server``, ``repl_cli.mcp.claims``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import (
    Completion,
    CompletionArgument,
    CompletionContext,
    PromptReference,
    ResourceTemplateReference,
)
from pydantic import Field

from repl_cli.api import aio
from repl_cli.api.errors import Error
from repl_cli.mcp.tools import SessionArg, Tools, firing_out, tools_of
from session.rules import DEFAULT_GROUP, WAIT_CURSOR

#: the most firings the ``inbox`` prompt shows (the next ``wait`` gives the rest)
INBOX_MAX = 20
#: the most values a completion gives (MCP's bound)
MAX_VALUES = 100

CursorArg = Annotated[
    str, Field(description=f"The cursor to read after and acknowledge on (default {WAIT_CURSOR}).")
]
GroupArg = Annotated[str, Field(description=f"The group of workers (default {DEFAULT_GROUP}).")]


async def inbox(ctx: Context, session: SessionArg, cursor: CursorArg = WAIT_CURSOR) -> str:
    """Handle what is new in a session: its firings after your cursor."""
    got = await tools_of(ctx).call(
        lambda r: r.read(session, cursor=cursor, peek=True, max=INBOX_MAX)
    )
    where = f"session {session} (cursor {cursor})"
    if not got.firings and not got.lost:
        return (
            f"Nothing is new in {where}. To wait until something comes, call the wait tool "
            f'with sessions "{session}" and cursor "{cursor}".'
        )
    lines = [json.dumps(firing_out(f), ensure_ascii=False) for f in got.firings]
    lost = f" ({got.lost} earlier ones were dropped before they could be read)" if got.lost else ""
    return (
        f"Here is what is new in {where}{lost}, one firing a line as JSON (its seq, who sent "
        f"it as by, its tags, and its text as result):\n\n"
        + "\n".join(lines)
        + f"\n\nHandle each of them, in order. A firing with a reply-to tag is a request: "
        f"answer it with the reply tool (its session and seq). When you have handled them, "
        f'acknowledge them with the ack tool (session "{session}", seq {got.next}, cursor '
        f'"{cursor}"), so that they are not given again. To wait for what comes next, call '
        f'the wait tool with sessions "{session}", cursor "{cursor}" and ack '
        f'{{"{session}": {got.next}}}.'
    )


async def work(session: SessionArg, group: GroupArg = DEFAULT_GROUP) -> str:
    """Work through a session's jobs, one at a time, with the other workers of a group."""
    return (
        f'Work through the jobs of session "{session}" for the group "{group}", one at a '
        f'time: call the claim tool (session "{session}", group "{group}"); it gives you '
        "one job (its firing: what to do is its text) and a claim token, yours alone for "
        "its lease. Do the job. Then call done with the claim token; or release it if you "
        "cannot do it (another worker will get it), or extend it to keep it longer than "
        "its lease. A done, release or extend refused with lease_lost means the job is no "
        "longer yours: drop it. A job whose attempt is above 1 was given up by a worker "
        "before: do it so that doing it twice is harmless. When claim answers timed_out "
        "there is no job: claim again to wait for the next, or stop."
    )


def completer(tools: Tools) -> Callable[..., Awaitable[Completion | None]]:
    """The completion of an argument, by ``tools``' connection."""

    async def complete(
        ref: PromptReference | ResourceTemplateReference,
        argument: CompletionArgument,
        context: CompletionContext | None,
    ) -> Completion | None:
        given = (context.arguments if context is not None else None) or {}
        names = await named(tools, argument.name, given.get("session") or given.get("id"))
        matching = sorted(name for name in names if name.startswith(argument.value))
        return Completion(
            values=matching[:MAX_VALUES],
            total=len(matching),
            has_more=len(matching) > MAX_VALUES,
        )

    return complete


async def named(tools: Tools, argument: str, session: str | None) -> list[str]:
    """What an argument named so may be: sessions, or a session's cursors or groups."""
    ask: Callable[[aio.AsyncRepl], Awaitable[list[str]]] | None = None
    if argument in ("session", "id"):
        ask = sessions_of
    elif argument == "cursor" and session:
        ask = cursors_of(session)
    elif argument == "group" and session:
        ask = groups_of(session)
    if ask is None:
        return []
    try:
        return await tools.call(ask, lambda exc: exc)
    except Error:  # the daemon away, a session not there: nothing to offer
        return []


async def sessions_of(r: aio.AsyncRepl) -> list[str]:
    return [row.id for row in await r.sessions()]


def cursors_of(session: str) -> Callable[[aio.AsyncRepl], Awaitable[list[str]]]:
    async def ask(r: aio.AsyncRepl) -> list[str]:
        return [c.name for c in await r.cursors(session)]

    return ask


def groups_of(session: str) -> Callable[[aio.AsyncRepl], Awaitable[list[str]]]:
    async def ask(r: aio.AsyncRepl) -> list[str]:
        return [g.name for g in await r.groups(session)]

    return ask


def install(server: MCPServer, tools: Tools) -> None:
    """Publish the prompts and serve completion on ``server``."""
    server.prompt(title="Handle what is new in a session")(inbox)
    server.prompt(title="Work through a session's jobs")(work)
    server.completion()(completer(tools))  # type: ignore[no-untyped-call]


__all__ = ["INBOX_MAX", "install"]
