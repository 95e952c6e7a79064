"""What every tool of ``repl mcp`` shares: the settings and the connections the tools
call the daemon through (``Tools``, ``tools_of``), their errors in MCP's words, the
arguments described for a model, a firing as a result, the row of a tool table
(``Tool``) and the annotations it gives, and a long wait told as progress (``waited``,
in parts; ``told``, beside one request).

``repl_cli.mcp.server`` (the server, and most tools) and ``repl_cli.mcp.claims`` (the
tools of groups and claims) both build on it, and neither imports the other's tools
but the server, which publishes them all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypeVar, cast

import anyio
import msgspec
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from typing_extensions import TypedDict

from repl_cli.api import aio
from repl_cli.api.errors import Error
from repl_cli.mcp.push import HOLD_S, MCP_CURSOR, Ack
from session.advice import advised
from session.firing import Firing

T = TypeVar("T")
W = TypeVar("W")
Out = TypeVar("Out")

#: how often a blocked wait tells a client that asked for progress that it is still there
PROGRESS_EVERY = 5.0

#: the longest a ``wait`` or ``request`` blocks: below the 60 s that MCP clients commonly
#: give a request (the SDK's default among them) whether or not progress resets it, so a
#: wait at its longest still answers ``timed_out`` rather than the client giving up with a
#: protocol error; an agent that wants to wait longer calls again (nothing is lost between)
MAX_WAIT_S = 50.0
#: how long a blocking tool waits when it is not told
DEFAULT_WAIT_S = 30.0

#: what each tool may do, for a harness deciding whether to ask a person first (MCP's tool
#: annotations): nothing ever reaches past the daemon (openWorldHint false), and nothing
#: deletes what cannot be had again (destructiveHint false: a cursor never moves back)
LOOKS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
#: changes only what doing it again leaves as it is (a cursor set to max(seq), a start with
#: exist_ok)
SETS = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
#: records something new each time (a firing, a timer) unless a dedup key says otherwise
RECORDS = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


# -- results, as their schemas are published -------------------------------------------


class FiringOut(TypedDict):
    seq: int
    handler: str
    result: str | None
    event: str | None
    ts: str
    tags: dict[str, str]
    #: who sent it: a token's name, root, timer or webhook (None: not known)
    by: str | None


def out(kind: type[Out], answer: msgspec.Struct) -> Out:
    """A result of ``kind`` (a TypedDict, whose schema the SDK publishes) from the wire's
    answer: the answer's fields of ``kind``'s names, in ``kind``'s order, as JSON has them
    (a firing a dict, as ``FiringOut`` is). Derived from the answer's Struct, never copied
    field by field: a result and its answer name their fields alike."""
    fields = msgspec.to_builtins(answer)
    return cast(Out, {name: fields[name] for name in kind.__annotations__})


def firing_out(firing: Firing) -> FiringOut:
    return out(FiringOut, firing)


# -- the arguments, described for a model ----------------------------------------------

SessionArg = Annotated[str, Field(description="The session's id.")]
MatchArg = Annotated[
    dict[str, str | None] | None,
    Field(
        description="Only firings whose tags match: each KEY must be there with that value "
        "(null: any value)."
    ),
]
WaitSeconds = Annotated[
    float,
    Field(
        ge=0,
        le=MAX_WAIT_S,
        description=f"How long to wait at most, in seconds (at most {MAX_WAIT_S:g}: call "
        "again to wait longer).",
    ),
]
#: ``WaitSeconds`` as a JSON schema, for a tool whose schema is not pydantic's (a long poll
#: of the table's, ``repl_cli.mcp.verbs``)
WAIT_SECONDS = {
    "type": "number",
    "minimum": 0,
    "maximum": MAX_WAIT_S,
    "default": DEFAULT_WAIT_S,
    "description": f"How long to wait at most, in seconds (at most {MAX_WAIT_S:g}: call again "
    "to wait longer).",
}
TagsArg = Annotated[
    dict[str, str] | None,
    Field(description="Tags the firing carries, KEY: VALUE (at most 16)."),
]


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the daemon is and who we are, as the CLI's global options give them."""

    addr: str | None = None
    home: Path | None = None
    token_file: Path | None = None
    #: the token itself (/mcp over HTTP: the one its client presented), before token_file
    token: str | None = None
    tls_ca: Path | None = None
    progress_every: float = PROGRESS_EVERY
    #: the sessions whose new firings are pushed to the client (none: nothing is pushed)
    follow: tuple[str, ...] = ()
    #: the cursor what was pushed is acknowledged on
    cursor: str = MCP_CURSOR
    #: the senders whose firings are pushed (None: every sender)
    allow_from: frozenset[str] | None = None
    #: who acknowledges what was pushed: the agent, or the pipe's receipt
    ack: Ack = Ack.AGENT
    #: ``--ack pipe``: how long a client must stay after taking a push
    hold: float = HOLD_S
    #: where the agent's permission prompts are recorded (None: they are not relayed)
    approvals: str | None = None
    #: the senders whose verdict on a prompt counts
    approvers: tuple[str, ...] = ("root",)


class Tools:
    """The tools' shared connection (for the calls that answer at once) and their errors.

    The shared connection lives as long as the server: the API replaces it when the
    daemon closed it (an idle agent, a restart), so an agent's next call is answered
    whatever it did meanwhile (``AsyncOperations._call``, the one reconnect path)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.quick = self.connection(reconnect=0)
        self.lock = anyio.Lock()  # one request at a time on the shared connection

    def connection(self, reconnect: float) -> aio.AsyncRepl:
        s = self.settings
        return aio.connect(
            s.addr,
            s.home,
            reconnect=reconnect,
            token=s.token,
            token_file=s.token_file,
            tls_ca=s.tls_ca,
        )

    async def call(
        self,
        step: Callable[[aio.AsyncRepl], Awaitable[T]],
        failed: Callable[[Error], Exception] | None = None,
    ) -> T:
        """``step`` on the shared connection; a failure as a tool error (``error_line``), or
        as ``failed`` makes it (a resource's error)."""
        async with self.lock:
            try:
                return await step(self.quick)
            except Error as exc:
                raise (failed or tool_error)(exc) from None

    @asynccontextmanager
    async def own(self, reconnect: float) -> AsyncIterator[aio.AsyncRepl]:
        """A connection of its own, for a call that blocks; closed with the call."""
        repl = self.connection(reconnect)
        try:
            yield repl
        except Error as exc:
            raise tool_error(exc) from None
        finally:
            await repl.aclose()


def error_line(exc: Error) -> str:
    """One line in MCP's words (tools and their arguments, not commands and flags), with
    the wire code when the daemon gave one; the library's message as it is when it did not
    (the daemon away, a token file missing: what a person must fix, not the agent)."""
    if exc.code is None:
        return f"repl: {exc.message}"
    return f"repl: {advised(exc.code, exc.message, 'mcp')} (code {exc.code})"


def tool_error(exc: Error) -> ToolError:
    return ToolError(error_line(exc))


def tools_of(ctx: Context) -> Tools:
    """The connections of the server a tool is called on."""
    tools = getattr(ctx.mcp_server, "tools", None)  # the server of ``repl_cli.mcp.server``
    assert isinstance(tools, Tools)
    return tools


def check(condition: bool, message: str) -> None:
    if not condition:
        raise ToolError(f"repl: {message}")


async def waited(
    ctx: Context,
    every: float,
    timeout_s: float,
    once: Callable[[float, bool], Awaitable[W]],
    got: Callable[[W], bool],
) -> W:
    """A wait of at most ``timeout_s``, made of daemon waits of at most ``every`` seconds
    (``once(seconds, first)``) until one ``got`` something, with a progress notification
    between two of them (the SDK sends it only to a client that asked for progress). Only
    the first carries the ack. A daemon wait that ends with nothing took nothing (a wait's,
    a claim's), so the parts are as one."""
    deadline = anyio.current_time() + timeout_s
    first, began = True, anyio.current_time()
    while True:
        left = max(0.0, deadline - anyio.current_time())
        woken = await once(min(every, left), first)
        first = False
        if got(woken) or left <= every:
            return woken
        waited_s = anyio.current_time() - began
        await ctx.report_progress(waited_s, timeout_s, f"still waiting after {waited_s:.0f} s")


async def told(ctx: Context, every: float, timeout_s: float, call: Callable[[], Awaitable[W]]) -> W:
    """``call()``, one request that blocks for at most ``timeout_s``, with a progress
    notification every ``every`` seconds while it blocks, as ``waited`` tells its own: for
    a request that is one wait for the same thing however long it blocks (a gather, a
    join: a join's ``upto`` fixed once, an outage ridden out within the whole timeout)."""
    began = anyio.current_time()
    telling = anyio.CancelScope()  # the progress's alone: the call is never cancelled by it

    async def tell() -> None:
        with telling:
            while True:
                await anyio.sleep(every)
                waited_s = anyio.current_time() - began
                told = f"still waiting after {waited_s:.0f} s"
                await ctx.report_progress(waited_s, timeout_s, told)

    answered: list[W] = []
    failed: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(tell)
        try:
            answered.append(await call())
        except Exception as exc:  # raised as it came, not in the group's ExceptionGroup
            failed = exc
        telling.cancel()
    if failed is not None:
        raise failed
    return answered[0]


class Tool(NamedTuple):
    """A tool as it is published: the function (its arguments' schema is its signature's),
    what it may do (``LOOKS``, ``SETS``, ``RECORDS``), and its description for a model."""

    fn: Callable[..., Awaitable[Any]]
    annotations: ToolAnnotations
    description: str
