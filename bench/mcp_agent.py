"""Agents over MCP (SPEC §14): what ``repl mcp`` adds to a wake and to a send.

An agent harness starts ``repl mcp`` as a child and calls its tools over
stdio; so does this group, with the official SDK's own client
(``mcp.client.stdio.stdio_client`` and ``mcp.ClientSession``, as
tests/e2e/test_mcp.py drives it), against one ``--memory`` daemon with
settle 0. The reference column is the same figure over the line protocol
on the same daemon, with no CLI in between (bench/clients.py's
``LineClient``), measured in the same run, so the ratio says what the MCP
hop costs: the SDK client's JSON-RPC, the server's tool call (its pydantic
validation, the async API's request, the result's structured content),
and one more process on the way.

- wake: the MCP client and its ``repl mcp`` in a child process of their
  own, calling ``wait`` on cursor ``bench`` with the last batch's ``next``
  as ``ack``; the parent polls the daemon until the server's wait is
  blocked and wakes it with one ``send`` over TCP; from just before that
  send to the client holding the tool's result. The reference is the wake
  row's waiter (a ``wait`` over TCP in a child process, bench/waiters.py),
  woken the same way, the two alternating round by round
  (bench/paired_wakes.py).
- send: in the same child, once its waits are done, a ``send`` tool call
  and a ``send`` over TCP (another session), alternating request by
  request, one at a time, after a warm-up. A note gives the CPU a send took
  in the client and in the ``repl mcp`` server (/proc).

The module is not named ``mcp``: run as ``python bench/run.py``, this
directory is on ``sys.path``, and it would shadow the SDK.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from importlib.util import find_spec
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TextIO

from bench.clients import LineClient
from bench.measure import (
    PAYLOAD,
    Group,
    Setup,
    Sizes,
    fill_percentiles,
    on_daemon,
    percentile_rows,
    send_request,
    start_sessions,
)
from bench.paired_wakes import (
    ChildProcess,
    Waker,
    alternate,
    children,
    plain_waker,
    send_fire,
    waiting_on,
)
from bench.procs import HOST, BenchError, Daemon, cpu_seconds
from bench.table import Goal, Row

MISSING = "mcp extra missing"
HINT = "the mcp rows need the MCP SDK: `pip install -e '.[bench]'` (or the `mcp` extra)"
SESSIONS = ("mcp-wake", "tcp-wake", "mcp-send", "tcp-send")


def wake_rounds(s: Sizes) -> tuple[int, int]:
    """Warm-up and timed rounds of the wakes: 25 and 500 (2 and 10 quick)."""
    return max(2, s.warmup // 40), max(10, s.wakes // 4)


def send_counts(s: Sizes) -> tuple[int, int]:
    """Warm-up and timed sends on each side: 100 and 1,000 (5 and 20 quick)."""
    return max(5, s.warmup // 10), max(20, s.round_trips // 10)


# -- the agent's process -------------------------------------------------------------


@dataclass(frozen=True)
class AgentPlan:
    port: int
    token: str
    home: str
    rounds: int
    warmup: int
    sends: int
    errlog: str
    deadline_s: float


def agent_child(plan: AgentPlan, pipe: Connection) -> None:
    """The agent's process: ``("ready",)``, ``("round", t_held_ns, next)`` a wake, then
    ``("sends", mcp_ns, tcp_ns, cpu)``."""
    try:
        with open(plan.errlog, "a") as errlog:
            asyncio.run(_agent(plan, pipe, errlog))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def structured(result: Any, tool: str) -> dict[str, Any]:
    if result.is_error or result.structured_content is None:
        raise BenchError(f"the {tool} tool answered {result.content}")
    content: dict[str, Any] = result.structured_content
    return content


def child_pids() -> list[int]:
    """This process's children (the ``repl mcp`` server), from /proc."""
    try:
        text = Path(f"/proc/self/task/{os.getpid()}/children").read_text()
    except OSError:
        return []
    return [int(pid) for pid in text.split()]


async def _agent(plan: AgentPlan, pipe: Connection, errlog: TextIO) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {**os.environ, "REPL_ADDR": f"{HOST}:{plan.port}", "REPL_HOME": plan.home}
    params = StdioServerParameters(command=sys.executable, args=["-m", "repl_cli", "mcp"], env=env)
    async with (
        asyncio.timeout(plan.deadline_s),
        stdio_client(params, errlog=errlog) as (read, write),
        ClientSession(read, write) as agent,
    ):
        await agent.initialize()
        servers = child_pids()
        tcp = await LineClient.connect(plan.port, plan.token)
        pipe.send(("ready",))
        acked = 0
        for _round in range(plan.rounds):
            arguments: dict[str, Any] = {"sessions": "mcp-wake", "cursor": "bench"}
            if acked:
                arguments["ack"] = {"mcp-wake": acked}
            # the longest a wait may block (under the client's 60 s request timeout)
            result = await agent.call_tool("wait", {**arguments, "timeout_s": 50})
            t_held = time.perf_counter_ns()
            batches = structured(result, "wait")["batches"]
            if len(batches) != 1 or not batches[0]["firings"]:
                raise BenchError(f"the wait tool returned {batches}")
            acked = batches[0]["next"]
            pipe.send(("round", t_held, acked))

        times: tuple[list[int], list[int]] = ([], [])
        cpu = [0, 0]
        server0 = [cpu_seconds(pid) for pid in servers]
        request = send_request("tcp-send")
        send = {"session": "mcp-send", "text": PAYLOAD}
        for i in range(plan.warmup + plan.sends):
            if i == plan.warmup:
                server0 = [cpu_seconds(pid) for pid in servers]
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            structured(await agent.call_tool("send", send), "send")
            t1, c1 = time.perf_counter_ns(), time.process_time_ns()
            answer = await tcp.call(request)
            t2, c2 = time.perf_counter_ns(), time.process_time_ns()
            if not answer.get("ok"):
                raise BenchError(f"send failed: {answer}")
            if i >= plan.warmup:
                times[0].append(t1 - t0)
                times[1].append(t2 - t1)
                cpu[0] += c1 - c0
                cpu[1] += c2 - c1
        server_us = sum(cpu_seconds(pid) - c for pid, c in zip(servers, server0, strict=True))
        per = {
            "client_mcp": cpu[0] / 1e3 / plan.sends,
            "client_tcp": cpu[1] / 1e3 / plan.sends,
            "server": server_us * 1e6 / plan.sends if servers else None,
        }
        pipe.send(("sends", times[0], times[1], per))
        await tcp.close()


# -- the parent's side -----------------------------------------------------------------


@dataclass
class Figures:
    wake_mcp: list[int]
    wake_tcp: list[int]
    send_mcp: list[int]
    send_tcp: list[int]
    cpu: dict[str, float | None]


async def agent_figures(daemon: Daemon, setup: Setup) -> Figures:
    s = setup.sizes
    warm, timed = wake_rounds(s)
    rounds = warm + timed
    warmup, sends = send_counts(s)
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await start_sessions(control, list(SESSIONS), len(SESSIONS))
        tcp = plain_waker(daemon, control, "tcp-wake", rounds)
        with children([tcp]) as started:
            errlog = str(setup.dir("mcp") / "mcp-stderr.log")
            plan = AgentPlan(
                daemon.port, daemon.token, str(daemon.home), rounds, warmup, sends, errlog, 600
            )
            child = ChildProcess(agent_child, plan)
            blocked, fire = waiting_on(control, "mcp-wake"), send_fire(control, "mcp-wake")
            mcp = Waker("MCP", child, blocked, fire)
            started.append(mcp)
            await alternate(started, rounds)
            _kind, send_mcp, send_tcp, cpu = await child.report(s.deadline_s)
        return Figures(mcp.times[warm:], tcp.times[warm:], send_mcp, send_tcp, cpu)
    finally:
        await control.close()


def mcp_rows(_s: Sizes) -> list[Row]:
    wake = percentile_rows(
        "mcp_wake",
        "MCP wait's wake latency {} (the SDK's stdio client, `repl mcp`; settle 0), µs",
        Goal("report", 0, "report (× TCP wait)"),
    )
    send = percentile_rows(
        "mcp_send",
        "MCP send round trip {} (the SDK's stdio client, `repl mcp`), µs",
        Goal("report", 0, "report (× TCP send)"),
    )
    return [*wake, *send]


def mcp_group(setup: Setup, rows: dict[str, Row]) -> None:
    if find_spec("mcp") is None or find_spec("repl_cli.mcp.server") is None:
        setup.cannot_run(rows_of(rows), MISSING, HINT)
        return
    got: Figures = on_daemon(
        setup, "mcp-daemon", lambda d: agent_figures(d, setup), memory=True, settle_ms=0
    )
    fill_percentiles(rows, "mcp_wake", "repl", got.wake_mcp)
    fill_percentiles(rows, "mcp_wake", "reference", got.wake_tcp)
    fill_percentiles(rows, "mcp_send", "repl", got.send_mcp)
    fill_percentiles(rows, "mcp_send", "reference", got.send_tcp)
    server = got.cpu["server"]
    server_text = f", the `repl mcp` server {server:.0f} µs" if server is not None else ""
    warm, timed = wake_rounds(setup.sizes)
    setup.notes.append(
        f"MCP: {timed:,} wakes after {warm} (alternating with the TCP wait's), "
        f"{len(got.send_mcp):,} sends each side; CPU per send: the MCP client "
        f"{got.cpu['client_mcp']:.0f} µs{server_text}; "
        f"the TCP client {got.cpu['client_tcp']:.0f} µs"
    )


def rows_of(rows: dict[str, Row]) -> list[Row]:
    return [rows[f"{prefix}_{p}"] for prefix in ("mcp_wake", "mcp_send") for p in ("p50", "p99")]


MCP = Group("mcp", mcp_rows, mcp_group)
