"""The generic tool: every verb whose row in the table (``repl_daemon.protocol.VERBS``)
has a ``Tool`` is served by ``VerbTool``, with no code of its own.

Its arguments are the request's fields (but ``op`` and ``id``), a field ``X_ms`` given
as ``X_s``, in seconds; its input and output schemas are ``msgspec.json.schema`` of the
request and answer Structs, so what the wire takes and answers is what the tool
publishes (the field descriptions are the Structs' own). A call is one request of the
async API (``AsyncOperations.op``, the one reconnect path), its answer the result (but
``id`` and ``ok``), structured and as JSON text; an argument of the wrong shape, or one
the tool does not take, is one plain line naming it, and a refusal the CLI's line in
MCP's words (``error_line``), as every tool's.

A long poll of the table (``Verb.long_poll``: a gather, a join) is bounded as every
blocking tool is (rule M3): its ``timeout_s`` (default 30) is at most ``MAX_WAIT_S``,
below the 60 s after which MCP clients commonly give up on a call, so it answers
``timed_out`` rather than the client failing; while it blocks, a progress notification
goes every ``progress_every`` seconds to a client that asked (``told``); and it blocks on
a connection of its own, one request for the whole call, so a blocked one holds up no
other tool, and a client that gives up on it closes that connection and the daemon lets
it go.

The tools written by hand (``repl_cli.mcp.server``, ``repl_cli.mcp.claims``) are those
that do what one request cannot: a wait and a claim (which acknowledge and take, told in
parts of their own), a read (which of its ways is asked), a start (an existing session
is fine for an agent), an ack (a following server's cursor, and its pushes told), a
schedule (``delay`` for the wire's ``in``), and request and reply (two requests each).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from mcp.types import Tool as MCPTool

from repl_cli.mcp.tools import (
    DEFAULT_WAIT_S,
    LOOKS,
    RECORDS,
    SETS,
    WAIT_SECONDS,
    Tools,
    told,
)
from repl_daemon import protocol as p

MS, S = "_ms", "_s"
#: a long poll's bound, as its tool takes it
TIMEOUT = "timeout_s"
#: what the wire's requests and answers carry that no tool argument or result does
WIRE_ONLY = ("op", "id", "ok")

#: changes something again each time it is called: ``extend`` moves the lease to
#: ``lease_s`` from now, so a second call moves it again (not idempotent, whatever the
#: arguments); it destroys nothing
MOVES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)
ANNOTATIONS = {
    p.Changes.NOTHING: LOOKS,
    p.Changes.SETS: SETS,
    p.Changes.RECORDS: RECORDS,
    p.Changes.MOVES: MOVES,
}


class VerbTool:
    """One verb of the table as a tool."""

    def __init__(self, verb: p.Verb) -> None:
        assert isinstance(verb.tool, p.Tool)
        self.verb = verb
        self.tool = verb.tool
        self.name = verb.op
        self.inputs = schema_of(verb.request, lengths=True)
        self.outputs = schema_of(verb.answer)
        if verb.long_poll:  # bounded below a client's request timeout, whatever the wire's
            assert "timed_out" in verb.answer.__struct_fields__
            self.inputs["properties"][TIMEOUT] = dict(WAIT_SECONDS)
        self.arguments = set(self.inputs["properties"])
        self.nullable = {
            name
            for name, field in self.inputs["properties"].items()
            if {"type": "null"} in field.get("anyOf", ())
        }

    def listed(self) -> MCPTool:
        return MCPTool(
            name=self.name,
            description=self.tool.description,
            input_schema=self.inputs,
            output_schema=self.outputs,
            annotations=ANNOTATIONS[self.tool.changes],
        )

    async def call(
        self, tools: Tools, arguments: dict[str, Any], ctx: Context | None = None
    ) -> CallToolResult:
        """The tool's result; ``ctx``, the request's, is where a long poll tells progress."""
        request = self.request(arguments)
        answer: p.Response
        if self.verb.long_poll:
            assert ctx is not None
            answer = await self.poll(tools, request, ctx)
        else:
            answer = await tools.call(lambda r: r.op(request, self.verb.answer))
        result = {k: v for k, v in msgspec.to_builtins(answer).items() if k not in WIRE_ONLY}
        text = json.dumps(result, indent=2, ensure_ascii=False)
        return CallToolResult(
            content=[TextContent(type="text", text=text)], structured_content=result
        )

    async def poll(self, tools: Tools, request: p.Request, ctx: Context) -> p.Response:
        """A long poll's answer, on a connection of its own that rides out a daemon restart
        within the timeout, with progress told while it blocks."""
        timeout_s = getattr(request, "timeout_ms") / 1000  # noqa: B009 - a long poll's field
        every = tools.settings.progress_every
        async with tools.own(reconnect=timeout_s) as repl:
            return await told(ctx, every, timeout_s, lambda: repl.op(request, self.verb.answer))

    def request(self, arguments: dict[str, Any]) -> p.Request:
        """The request the arguments ask for; a plain line naming what is wrong when not."""
        unknown = sorted(set(arguments) - self.arguments)
        if unknown:
            raise ToolError(
                f"repl: the {self.name} tool takes no {', '.join(unknown)}: its arguments are "
                f"{', '.join(sorted(self.arguments))}"
            )
        given: dict[str, Any] = {}
        fields = self.verb.request.__struct_fields__
        for name, value in arguments.items():
            if value is None and name not in self.nullable:
                continue  # null for an argument that has a default: the default, as omitted
            self.check_bounds(name, value)
            if name.endswith(S) and name.removesuffix(S) + MS in fields:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ToolError(f"repl: the {self.name} tool's arguments: {name}: a number")
                given[name.removesuffix(S) + MS] = round(value * 1000)
            else:
                given[name] = value
        if self.verb.long_poll:
            given.setdefault(TIMEOUT.removesuffix(S) + MS, round(DEFAULT_WAIT_S * 1000))
        try:
            request: p.Request = msgspec.convert(given, self.verb.request)
        except msgspec.ValidationError as exc:
            raise ToolError(f"repl: the {self.name} tool's arguments: {plain(str(exc))}") from None
        return request

    def check_bounds(self, name: str, value: Any) -> None:
        """The bounds the schema shows for an argument, told in the argument's own words
        (the core's refusal would speak of the wire's lengths)."""
        field = self.inputs["properties"][name]
        low, high = field.get("minimum"), field.get("maximum")
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        if (low is not None and value < low) or (high is not None and value > high):
            raise ToolError(
                f"repl: the {self.name} tool's arguments: {name}: {value:g} is not between "
                f"{low:g} and {high:g}"
            )


def plain(said: str) -> str:
    """msgspec's complaint, as one line naming the argument: ``lease_s: expected ...``."""
    what, _, where = said.partition(" - at `$.")
    if not where:
        return what[:1].lower() + what[1:]
    name = where.rstrip("`")
    if name.endswith(MS):
        name = name.removesuffix(MS) + S
    return f"{name}: {what[:1].lower()}{what[1:]}"


def schema_of(kind: type[msgspec.Struct], lengths: bool = False) -> dict[str, Any]:
    """The JSON schema of a request's or an answer's Struct as a tool's arguments or
    result: its object with the definitions it refers to, without what is only the wire's;
    with ``lengths`` (a request's: an answer's ``X_ms`` is a time), each ``X_ms`` field as
    ``X_s``, in seconds."""
    made = msgspec.json.schema(kind)
    defs: dict[str, Any] = made.pop("$defs", {})
    own = defs.pop(kind.__name__)
    properties: dict[str, Any] = {}
    for name, field in own["properties"].items():
        if name in WIRE_ONLY:
            continue
        if lengths and name.endswith(MS):
            name, field = name.removesuffix(MS) + S, seconds(field)
        properties[name] = field
    required = [
        n.removesuffix(MS) + S if lengths and n.endswith(MS) else n
        for n in own.get("required", [])
        if n not in WIRE_ONLY
    ]
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    if defs:
        schema["$defs"] = defs
    return schema


def seconds(field: dict[str, Any]) -> dict[str, Any]:
    """A length in ms, as a number of seconds."""
    made = dict(field)
    for key in ("minimum", "maximum", "default"):
        if isinstance(made.get(key), int | float):
            made[key] = made[key] / 1000
    if made.get("type") == "integer":
        made["type"] = "number"
    made["description"] = made.get("description", "").rstrip(".") + ", in seconds."
    return made


_made: dict[p.Verb, VerbTool] = {}


def verb_tools() -> dict[str, VerbTool]:
    """Every verb the generic tool serves, by name, in the table's order (each one made
    once: a verb registered later, a test's, is served from then on)."""
    served = {}
    for verb in p.VERBS:
        if isinstance(verb.tool, p.Tool):
            served[verb.op] = _made.get(verb) or _made.setdefault(verb, VerbTool(verb))
    return served
