"""The main table: its groups of rows in table order, each measured by its own module.

- bench/sends.py: ``roundtrip``, ``pipelined``, ``durable``
- bench/waits.py: ``wake``, ``idle``, ``fanout``
- bench/memory.py: ``memory``; bench/cli.py: ``cli``; bench/restart.py: ``restart``
- bench/timers.py: ``timers`` (SPEC §9)
- bench/http_api.py: ``http``, the HTTP routes beside the line protocol (SPEC §10)
- bench/tls.py: ``tls``, TLS beside plain TCP (SPEC §12)
- bench/matching.py: ``tags``, tagged sends and firings, matching waits (SPEC §15)
- bench/mcp_agent.py: ``mcp``, the MCP server's tools beside the line protocol (SPEC §14)
- bench/mcp_follow.py: ``push``, ``repl mcp --follow``'s pushes, its ``send`` tool against
  the SDK's floor, idle followers (issue 40)
- bench/claims.py: ``claims``, jobs through groups and claims against Redis consumer
  groups, a blocked claim's wake, idle claimers (SPEC §16, issue 41)
- bench/join.py: ``join``, a wait on all of several sessions and a gather against a plain
  wait's wake, idle gathers and joins, a join's cost per job done (SPEC §18, issue 48)
- bench/approvals.py: ``approve``, a verdict's latency from ``repl approve`` to the
  agent's permission notification, against a whole ``repl send`` (SPEC §19, issue 49)
- bench/settle.py: ``settle``, a lone firing's wake at the default settle against settle 0,
  through the CLI, the line protocol, HTTP and MCP (rule S8, issue 50)

The ``scaleout`` group prints a table of its own (bench/scaleout.py). What
the groups share (sizes, servers, requests, percentiles, rows) is in
bench/measure.py.
"""

from __future__ import annotations

from bench import (
    approvals,
    claims,
    cli,
    full,
    http_api,
    join,
    many,
    matching,
    mcp_agent,
    mcp_follow,
    memory,
    restart,
    sends,
    settle,
    timers,
    tls,
    waits,
)
from bench.measure import Group, Sizes
from bench.table import Row

# run.py runs the groups in this order, and the table shows their rows in it
GROUPS: dict[str, Group] = {
    group.name: group
    for group in (
        sends.ROUNDTRIP,
        waits.WAKE,
        sends.PIPELINED,
        sends.DURABLE,
        many.MANY,
        waits.IDLE,
        waits.FANOUT,
        memory.MEMORY,
        cli.CLI,
        restart.RESTART,
        full.FULL,
        timers.TIMERS,
        http_api.HTTP,
        tls.TLS,
        matching.TAGS,
        mcp_agent.MCP,
        mcp_follow.PUSH,
        claims.CLAIMS,
        join.JOIN,
        approvals.APPROVE,
        settle.SETTLE,
    )
}


def blank_rows(s: Sizes) -> dict[str, list[Row]]:
    """Every group's rows, in table order, before anything is measured."""
    return {name: group.rows(s) for name, group in GROUPS.items()}
