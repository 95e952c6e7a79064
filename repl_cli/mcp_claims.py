"""The tools of groups and claims (SPEC §16), for agents that share work: ``claim``,
``done``, ``release``, ``extend``.

A coordinator sends jobs to a session; each worker agent calls ``claim``, which
blocks until the group has a firing no other worker holds and takes it under a
lease, then ``done`` when the work is finished (or ``release`` to give it back,
``extend`` to keep it longer). Each tool is one call of the async API
(``repl_cli.aio``), as every tool of ``repl_cli.mcp_server`` is, which publishes
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
from mcp.types import ToolAnnotations
from pydantic import Field
from typing_extensions import TypedDict

from repl_cli.mcp_tools import (
    RECORDS,
    SETS,
    FiringOut,
    MatchArg,
    SessionArg,
    Tool,
    WaitSeconds,
    firing_out,
    tools_of,
    waited,
)
from repl_daemon import protocol as p
from session.rules import DEFAULT_GROUP, DEFAULT_LEASE_MS, MAX_DELAY_MS, MAX_LEASE_MS, MIN_LEASE_MS

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


class DoneOut(TypedDict):
    seq: int


class ReleasedOut(TypedDict):
    #: that was its last attempt: it is in the group's dead-letter session now
    dead: bool


class ExtendedOut(TypedDict):
    lease_until: str


#: changes something again each time it is called: ``extend`` moves the lease to
#: ``lease_s`` from now, so a second call moves it again (not idempotent, whatever the
#: arguments); it destroys nothing
MOVES = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
)


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
    timeout_s: WaitSeconds = 30.0,
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
    return ClaimOut(
        claim=claimed.claim,
        seq=claimed.seq,
        attempt=claimed.attempt,
        lease_until=claimed.lease_until,
        lost=claimed.lost,
        firing=firing_out(claimed.firing),
        timed_out=False,
    )


async def done(ctx: Context, session: SessionArg, claim: ClaimArg) -> DoneOut:
    seq = await tools_of(ctx).call(lambda r: r.done(session, claim))
    return DoneOut(seq=seq)


async def release(
    ctx: Context,
    session: SessionArg,
    claim: ClaimArg,
    delay_s: Annotated[
        float,
        Field(
            ge=0,
            le=MAX_DELAY_MS / 1000,
            description="Claimable again only after this many seconds (0: at once).",
        ),
    ] = 0,
) -> ReleasedOut:
    dead = await tools_of(ctx).call(lambda r: r.release(session, claim, delay=delay_s))
    return ReleasedOut(dead=dead)


async def extend(
    ctx: Context,
    session: SessionArg,
    claim: ClaimArg,
    lease_s: LeaseSeconds = DEFAULT_LEASE_MS / 1000,
) -> ExtendedOut:
    extended = await tools_of(ctx).call(lambda r: r.extend(session, claim, lease=lease_s))
    return ExtendedOut(lease_until=extended.lease_until)


CLAIM_TOOLS = (
    Tool(
        claim,
        RECORDS,
        "Take the next job: the oldest firing of the session that no other worker of the "
        "group holds, yours for lease_s. Returns its claim token (for done, release, "
        "extend), attempt (above 1: a retry) and the firing; or timed_out, nothing taken.",
    ),
    Tool(
        done,
        SETS,
        "Finish a claimed job: it is never offered to the group again. An error naming "
        "lease_lost means the claim is no longer yours (its lease ran out and another "
        "worker may have it, or it is done): nothing changed.",
    ),
    Tool(
        release,
        SETS,
        "Give a claimed job back to its group, claimable again at once or after delay_s. "
        "dead true: that was its last attempt, and it went to the dead-letter session. "
        "lease_lost: the claim is no longer yours.",
    ),
    Tool(
        extend,
        MOVES,
        "Keep a claimed job lease_s longer from now: a heartbeat for long work, before "
        "lease_until passes. Returns the new lease_until. lease_lost: the claim is no "
        "longer yours; stop working on it.",
    ),
)
