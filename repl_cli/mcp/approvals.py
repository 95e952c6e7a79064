"""The relay of an agent's permission prompts through a session (SPEC §19).

Claude Code (2.1.81+) relays a tool-permission prompt to a channel server that
declares the experimental capability ``claude/channel/permission``: it sends
``notifications/claude/channel/permission_request`` with ``request_id`` (five
letters a-z without l), ``tool_name``, ``description`` and ``input_preview``, and
applies the first ``notifications/claude/channel/permission`` ``{request_id,
behavior: "allow"|"deny"}`` it gets (its local dialog stays open: the first answer
wins). ``repl mcp --follow ID --approvals SESSION [--approvers NAME,...]`` (and each
MCP session of ``/mcp?follow=ID&approvals=SESSION&approvers=...``, ``repl_cli.mcp.http``,
a relay of its own):

- declares the capability (only with ``--approvals``);
- records each prompt as a firing of SESSION (``session.approvals``: its text the
  tool and the description, tagged ``approval``, ``tool``, ``preview`` and the
  ``approvers``), sent as the server's token;
- follows SESSION for verdicts, a matching reader after the head it found when it
  started (no cursor: several servers share one SESSION, none takes another's; no
  polling), and sends the permission notification for the first verdict on one of
  its own prompts whose ``by`` is an approver (default: ``root``). A verdict by
  anybody else, and a plain message with the right words, send nothing. A daemon
  restart is ridden out as ``wait`` rides it out: a verdict given meanwhile is
  found after it.

What counts is ``session.approvals``'s rule, the one ``repl approve`` and ``repl
approvals`` read the session with.

``APPROVAL_TOOLS`` are the same for a supervising agent: ``approvals`` (the pending
prompts, or every one with its verdict), ``approve`` and ``deny`` (its token must be
one of the prompt's approvers for its verdict to count).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import anyio
import msgspec
from mcp.server.mcpserver import Context
from pydantic import Field
from typing_extensions import TypedDict

from repl_cli import aio
from repl_cli.api.errors import Error
from repl_cli.mcp.tools import LOOKS, RECORDS, SessionArg, Tool, out, tools_of
from session import approvals as ap
from session.errors import BadRequest

log = logging.getLogger("repl.mcp")

#: the experimental capability a server that relays prompts declares
PERMISSION_CAPABILITY = "claude/channel/permission"
#: what Claude Code sends for a prompt, and what it applies as the verdict
PERMISSION_REQUEST = "notifications/claude/channel/permission_request"
PERMISSION = "notifications/claude/channel/permission"
#: how long the relay's connections ride out the daemon away, in seconds
RECONNECT_S = 300.0

Notify = Callable[[str, dict[str, Any]], Awaitable[Any]]


class Relay:
    """One client's prompts recorded in ``session``, and their verdicts sent back."""

    def __init__(
        self,
        session: str,
        approvers: tuple[str, ...],
        connect: Callable[[float], aio.AsyncRepl],
    ) -> None:
        self.session = session
        self.approvers = approvers
        self.connect = connect
        #: the request ids this server recorded (a verdict on another's is not its own)
        self.asked: set[str] = set()
        #: the request ids whose verdict was sent to the client: each is sent once
        self.told: set[str] = set()
        #: set once the relay knows where it follows from: a prompt recorded before
        #: that would have its verdict missed, so ``asked_for`` waits for it
        self.following = anyio.Event()
        self._writer: aio.AsyncRepl | None = None
        #: the prompts the client sent, recorded in order by ``run`` (``ask``)
        self._asking, self._asked = anyio.create_memory_object_stream[dict[str, Any]](math.inf)

    def ask(self, params: dict[str, Any]) -> None:
        """A ``permission_request``'s params, as the transport took them off the wire:
        recorded in the session by ``run``, in the order they came."""
        self._asking.send_nowait(params)

    async def asked_for(self, params: dict[str, Any]) -> None:
        """Record a ``permission_request``'s prompt in the session. One that is not one
        (no request id of five letters) is told on stderr and dropped: Claude Code's own
        dialog still asks."""
        request_id = str(params.get("request_id", ""))
        tool = str(params.get("tool_name", ""))
        try:
            ap.check_request_id(request_id)
        except BadRequest as exc:
            log.warning("a permission request not recorded: %s", exc.message)
            return
        description = str(params.get("description", ""))
        tags = ap.prompt_tags(
            request_id, tool, str(params.get("input_preview", "")), self.approvers
        )
        await self.following.wait()
        self.asked.add(request_id)  # before it is recorded: a verdict may come at once
        if self._writer is None:
            self._writer = self.connect(RECONNECT_S)
        try:
            await self._writer.send(
                self.session,
                ap.prompt_text(tool, description),
                handler=ap.PROMPT_HANDLER,
                tags=tags,
            )
        except Error as exc:
            log.warning(
                "permission request %s not recorded in %s: %s (answer it at the terminal)",
                request_id,
                self.session,
                exc.message,
            )

    async def run(self, notify: Notify) -> None:
        """Record the prompts asked (``ask``) and follow the session's verdicts, sending
        each that counts, until cancelled."""
        try:
            async with anyio.create_task_group() as tg, self._asked:
                tg.start_soon(self._follow, notify)
                async for params in self._asked:  # one at a time: in the order asked
                    await self.asked_for(params)
        finally:  # over HTTP a relay ends with its MCP session, not with the process
            if self._writer is not None:
                with anyio.CancelScope(shield=True):
                    await self._writer.aclose()

    async def _follow(self, notify: Notify) -> None:
        async with self.connect(RECONNECT_S) as repl:
            try:
                after = (await repl.stats(self.session)).sessions[0].head
            except Error as exc:
                log.warning("cannot relay permission prompts through %s: %s", self.session, exc)
                self.following.set()  # each prompt is still tried, and told when not recorded
                return
            self.following.set()
            while True:
                woken = await repl.wait(
                    self.session, cursor=None, match={ap.VERDICT: None}, after=after
                )
                for batch in woken.batches:
                    for firing in batch.firings:
                        verdict = ap.verdict_of(firing)
                        if verdict is not None and self._counts(verdict):
                            self.told.add(verdict.request_id)
                            said = {"request_id": verdict.request_id, "behavior": verdict.behavior}
                            await notify(PERMISSION, said)
                    after = batch.next

    def _counts(self, verdict: ap.Verdict) -> bool:
        """A verdict on one of this server's prompts, by an approver, the first."""
        return (
            verdict.request_id in self.asked
            and verdict.request_id not in self.told
            and verdict.by in self.approvers
        )


# -- the tools of a supervising agent ----------------------------------------------------


class VerdictOut(TypedDict):
    request_id: str
    #: allow or deny
    behavior: str
    #: why, as the verdict's text (may be empty)
    reason: str
    #: who gave it (a token's name, root)
    by: str | None
    seq: int
    #: when (RFC 3339, UTC)
    ts: str


class PromptOut(TypedDict):
    request_id: str
    tool: str
    description: str
    #: about 200 characters of the tool's input
    preview: str
    #: whose verdict counts
    approvers: list[str]
    seq: int
    #: when it was asked (RFC 3339, UTC)
    ts: str


class ApprovalOut(TypedDict):
    prompt: PromptOut
    #: the verdict that counts; None: still pending
    verdict: VerdictOut | None


class ApprovalsOut(TypedDict):
    approvals: list[ApprovalOut]


RequestIdArg = Annotated[
    str, Field(description="The prompt's request id: five letters, as approvals lists it.")
]
ReasonArg = Annotated[str, Field(description="Why, kept with the verdict (may be empty).")]


def _approval_out(entry: ap.Answered) -> ApprovalOut:
    fields = msgspec.to_builtins(entry)
    return ApprovalOut(prompt=fields["prompt"], verdict=fields["verdict"])


async def approvals(
    ctx: Context,
    session: SessionArg,
    all: Annotated[
        bool, Field(description="Every prompt, with the verdict that counts: the audit.")
    ] = False,
) -> ApprovalsOut:
    entries = await tools_of(ctx).call(lambda r: r.approvals(session))
    shown = [e for e in entries if all or e.verdict is None]
    return ApprovalsOut(approvals=[_approval_out(e) for e in shown])


async def _verdict(
    ctx: Context, session: str, request_id: str, behavior: str, reason: str
) -> VerdictOut:
    given = await tools_of(ctx).call(
        lambda r: r.verdict(session, request_id, behavior, reason=reason)
    )
    return out(VerdictOut, given)


async def approve(
    ctx: Context, session: SessionArg, request_id: RequestIdArg, reason: ReasonArg = ""
) -> VerdictOut:
    return await _verdict(ctx, session, request_id, ap.ALLOW, reason)


async def deny(
    ctx: Context, session: SessionArg, request_id: RequestIdArg, reason: ReasonArg = ""
) -> VerdictOut:
    return await _verdict(ctx, session, request_id, ap.DENY, reason)


APPROVAL_TOOLS = (
    Tool(
        approvals,
        LOOKS,
        "List another agent's permission prompts recorded in a session (repl mcp "
        "--approvals SESSION): request id, tool, description, the tool's input preview, "
        "who may answer. Only those waiting for a verdict, unless all.",
    ),
    Tool(
        approve,
        RECORDS,
        "Let the agent do what its permission prompt request_id asks: the verdict is "
        "recorded in the session as yours and sent to it. Refused when the prompt was "
        "answered already (the error says by whom); it does not count unless your token "
        "is one of the prompt's approvers.",
    ),
    Tool(
        deny,
        RECORDS,
        "Refuse what the agent's permission prompt request_id asks (reason: why); as approve.",
    ),
)
