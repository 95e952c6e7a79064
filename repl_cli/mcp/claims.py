"""The tools of groups and claims (SPEC §16), for agents that share work: ``claim``,
``done``, ``release``, ``extend``.

A coordinator sends jobs to a session; each worker agent calls ``claim``, which
blocks until the group has a firing no other worker holds and takes it under a
lease, then ``done`` when the work is finished (or ``release`` to give it back,
``extend`` to keep it longer). Each tool is one call of the async API
(``repl_cli.api.aio``), as every tool of ``repl_cli.mcp.server`` is, which publishes
them from ``CLAIM_TOOLS`` with its own.

A claim keeps the rules of a wait (M1-M3): bounded by ``timeout_s`` (at most
``MAX_WAIT_S``), it answers ``timed_out`` with nothing taken, tells its progress
meanwhile, and blocks on a connection of its own; a claim the client cancels
took nothing (the API's promise: its connection closes before an answer, and
the daemon gives back what it was taking).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated

from mcp.server.mcpserver import Context
from pydantic import Field
from typing_extensions import TypedDict

from repl_cli.mcp.tools import (
    DEFAULT_WAIT_S,
    RECORDS,
    FiringOut,
    MatchArg,
    SessionArg,
    Tool,
    WaitSeconds,
    out,
    tools_of,
    waited,
)
from repl_daemon import protocol as p
from session.rules import DEFAULT_GROUP, DEFAULT_LEASE_MS, MAX_LEASE_MS, MIN_LEASE_MS

# -- results, as their schemas are published -------------------------------------------


class ClaimOut(TypedDict):
    #: the token done, release and extend take; None: nothing was taken
    claim: str | None
    seq: int | None
    #: 1 the first time the firing is claimed; more: an earlier claimer did not finish it
    attempt: int | None
    #: when the lease ends (RFC 3339, UTC) unless extended
    lease_until: str | None
    #: firings the ring dropped before the group had them
    lost: int
    firing: FiringOut | None
    timed_out: bool


# -- the arguments, described for a model ----------------------------------------------

ClaimArg = Annotated[str, Field(description="The claim token that claim returned.")]
LeaseSeconds = Annotated[
    float,
    Field(
        ge=MIN_LEASE_MS / 1000,
        le=MAX_LEASE_MS / 1000,
        description="How long the job is yours, in seconds; then it is offered to another "
        "worker unless you extend it.",
    ),
]


# -- the tools ---------------------------------------------------------------------------


async def claim(
    ctx: Context,
    session: SessionArg,
    group: Annotated[
        str, Field(description="The group of workers that share the session's jobs.")
    ] = DEFAULT_GROUP,
    lease_s: LeaseSeconds = DEFAULT_LEASE_MS / 1000,
    timeout_s: WaitSeconds = DEFAULT_WAIT_S,
    match: MatchArg = None,
) -> ClaimOut:
    async with tools_of(ctx).own(reconnect=timeout_s) as repl:

        def once(seconds: float, first: bool) -> Awaitable[p.Claimed]:
            return repl.claim(session, group=group, lease=lease_s, timeout=seconds, match=match)

        every = tools_of(ctx).settings.progress_every
        claimed = await waited(ctx, every, timeout_s, once, got=lambda c: c.claim is not None)
    if claimed.claim is None or claimed.firing is None:
        return ClaimOut(
            claim=None,
            seq=None,
            attempt=None,
            lease_until=None,
            lost=0,
            firing=None,
            timed_out=True,
        )
    return out(ClaimOut, claimed)


CLAIM_TOOLS = (
    Tool(
        claim,
        RECORDS,
        "Take the next job: the oldest firing of the session that no other worker of the "
        "group holds, yours for lease_s. Returns its claim token (for done, release, "
        "extend), attempt (above 1: a retry) and the firing; or timed_out, nothing taken.",
    ),
)
