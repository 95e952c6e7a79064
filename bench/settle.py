"""The settle (rule S8, amended; issue 50): what it costs a firing that comes alone.

A woken wait lingers until its sessions have been quiet for the quiet gap
(``--quiet-ms``), at most the settle time (``--settle-ms``), so that a burst
comes back as one batch. Three ``--memory --http`` daemons run side by
side: one at the defaults (settle 100 ms, its quiet gap the default, 0: one
turn of the daemon's loop with no new firing), the reference at
``--settle-ms 0``, and one with a longer gap, ``--quiet-ms 3`` (a note); every
figure is measured on each in the same run, alternating round by round, so
**the ratio is default ÷ settle 0**: what the settle costs a lone firing,
through each front end.

- CLI: a ``repl wait`` process blocked on a session (the daemon's ``stats``
  polled until it is), then a ``repl send`` process started; from just
  before that start to the waiter's printed line: both whole processes.
- line protocol: the wake row's waiter (bench/waiters.py), woken by one
  ``send`` over TCP, from just before the send to the waiter holding it.
- HTTP: the long-poll wake row's waiter (``GET /sessions/ID/wait``), woken
  the same way.
- MCP ``wait``: the SDK's stdio client and its ``repl mcp`` in a child
  process (as bench/mcp_agent.py drives them), its ``wait`` tool woken the
  same way.
- MCP ``request``: then, in the same child, its ``request`` tool, answered by
  a responder in that child (a ``wait`` over TCP on the asked session, then
  the reply's ``send``): from the call to its result, two settled wakes.
- bursts, for a note: what the settle is for. 20 sends over TCP, each after
  the last one's answer, to a session a waiter is blocked on (acknowledging
  by ``after``): how many batches it got, 10 bursts on each daemon.

The line protocol's, HTTP's and MCP's waits are woken in one alternation
(bench/paired_wakes.py), each blocked before any is woken.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from multiprocessing.connection import Connection
from typing import Any, TextIO

from bench.clients import LineClient, close_all, until
from bench.http_api import http_missing
from bench.measure import (
    Group,
    Setup,
    Sizes,
    percentile,
    run_async,
    send_request,
    start_sessions,
    stats,
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
from bench.procs import HOST, BenchError, Daemon
from bench.table import Goal, Row
from bench.waiters import Plan, WaiterProcess
from repl_daemon.config import DEFAULTS

SETTLE_MS: int = DEFAULTS["settle_ms"]
QUIET_MS: int = DEFAULTS["quiet_ms"]
#: the note's third daemon: a gap long enough to batch sends that each wait for their answer
LONGER_QUIET_MS = 3
TCP, POLL, MCP, ASK, ME, CLI, BURSTS = "tcp", "poll", "mcp", "ask", "me", "cli", "bursts"
SESSIONS = (TCP, POLL, MCP, ASK, ME, CLI, BURSTS)
BURST, BURSTS_RUN = 20, 10  # sends a burst, bursts on each daemon
KEYS = ("settle_cli", "settle_tcp", "settle_http", "settle_mcp_wait", "settle_mcp_request")
GOAL = Goal("ratio_le", 1.2, "≤ 1.2 × settle 0")


def wake_rounds(s: Sizes) -> tuple[int, int]:
    """Warm-up and timed wakes of each waiter: 25 and 200 (2 and 10 quick)."""
    return max(2, s.warmup // 40), max(10, s.wakes // 10)


def request_rounds(s: Sizes) -> tuple[int, int]:
    """Warm-up and timed ``request`` calls on each daemon: 5 and 100 (2 and 5 quick)."""
    return max(2, s.warmup // 200), max(5, s.wakes // 20)


# -- the agent's process -------------------------------------------------------------


@dataclass(frozen=True)
class AgentPlan:
    port: int
    token: str
    home: str
    wakes: int
    requests: int
    errlog: str
    deadline_s: float


def agent_child(plan: AgentPlan, pipe: Connection) -> None:
    """``("ready",)``, ``("round", t_held_ns, next)`` a wake; then, told ``"go"`` each time,
    ``("request", ns)`` a ``request`` call."""
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


async def responder(port: int, token: str) -> None:
    """Answer every request to session ``ask``: a wait over TCP, then the reply's send
    (to its ``reply-to``, with its ``corr``), as ``repl reply`` sends it."""
    client = await LineClient.connect(port, token)
    try:
        acked = 0
        while True:
            wait: dict[str, Any] = {"op": "wait", "sessions": [ASK], "cursor": "responder"}
            if acked:
                wait["ack"] = {ASK: acked}
            for batch in (await client.ok(wait))["batches"]:
                for firing in batch["firings"]:
                    tags = firing["tags"]
                    reply = {"session": tags["reply-to"], "text": "pong"}
                    await client.ok({"op": "send", **reply, "tags": {"corr": tags["corr"]}})
                acked = batch["next"]
    finally:
        await client.close()


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
        answering = asyncio.create_task(responder(plan.port, plan.token))
        pipe.send(("ready",))
        acked = 0
        for _round in range(plan.wakes):
            arguments: dict[str, Any] = {"sessions": MCP, "cursor": "bench", "timeout_s": 50}
            if acked:
                arguments["ack"] = {MCP: acked}
            result = await agent.call_tool("wait", arguments)
            t_held = time.perf_counter_ns()
            batches = structured(result, "wait")["batches"]
            if len(batches) != 1 or not batches[0]["firings"]:
                raise BenchError(f"the wait tool returned {batches}")
            acked = batches[0]["next"]
            pipe.send(("round", t_held, acked))
        request = {"session": ASK, "text": "ping", "reply_to": ME, "timeout_s": 50}
        for _round in range(plan.requests):
            await asyncio.to_thread(pipe.recv)  # the parent's turn to this daemon
            t0 = time.perf_counter_ns()
            result = await agent.call_tool("request", request)
            t1 = time.perf_counter_ns()
            if structured(result, "request")["reply"] is None:
                raise BenchError("the request tool timed out")
            pipe.send(("request", t1 - t0))
        answering.cancel()


# -- the parent's side -----------------------------------------------------------------


@dataclass
class Side:
    """One daemon's figures, ns each: ``cli``, ``tcp``, ``http``, ``mcp_wait``,
    ``mcp_request``."""

    times: dict[str, list[int]]
    #: per burst of ``BURST`` sends one at a time over TCP, the batches a waiter got
    batches: list[int] = field(default_factory=list)


async def burst_batches(daemon: Daemon, control: LineClient) -> int:
    """``BURST`` sends over TCP, each after the last one's answer, to a session a waiter
    (its own connection, a task of its own, waiting again as soon as it has a batch) is
    blocked on: the batches it got."""
    waiter = await LineClient.connect(daemon.port, daemon.token)
    try:
        head = (await stats(control, BURSTS))["sessions"][0]["head"]

        async def batches() -> int:
            count, position = 0, head
            while position < head + BURST:
                wait = {"op": "wait", "sessions": [BURSTS], "after": position}
                position = (await waiter.ok(wait))["batches"][0]["next"]
                count += 1
            return count

        waiting = asyncio.create_task(batches())
        await until(waiting_on(control, BURSTS), what="the burst's waiter", interval_s=0.002)
        for _ in range(BURST):
            await control.ok(send_request(BURSTS))
        return await waiting
    finally:
        await waiter.close()


async def cli_round(cli: str, daemon: Daemon, control: LineClient) -> int:
    """One ``repl wait`` process woken by one ``repl send`` process: ns from just before the
    send's start to the waiter's line."""
    env = daemon.env()
    pipe = asyncio.subprocess.PIPE
    waiter = await asyncio.create_subprocess_exec(
        cli, "wait", CLI, "--timeout", "60", stdout=pipe, stderr=pipe, env=env
    )
    await until(waiting_on(control, CLI), what="`repl wait` to block", interval_s=0.002)
    t0 = time.perf_counter_ns()
    sender = await asyncio.create_subprocess_exec(
        cli, "send", CLI, "lone", stdout=asyncio.subprocess.DEVNULL, env=env
    )
    assert waiter.stdout is not None
    line = await waiter.stdout.readline()
    t1 = time.perf_counter_ns()
    _out, err = await waiter.communicate()
    if await sender.wait() or waiter.returncode or b"lone" not in line:
        raise BenchError(f"`repl wait` printed {line!r}, status {waiter.returncode}: {err!r}")
    return t1 - t0


def waker(name: str, control: LineClient, plan: Plan) -> Waker:
    child = WaiterProcess(plan)
    return Waker(name, child, waiting_on(control, plan.session), send_fire(control, plan.session))


async def every_side(setup: Setup, daemons: list[Daemon]) -> list[Side]:
    """Each daemon's figures, measured on all of them in turn, round by round."""
    s = setup.sizes
    warm, timed = wake_rounds(s)
    rounds = warm + timed
    ask_warm, ask_timed = request_rounds(s)
    sides = [Side({}) for _ in daemons]
    controls = [await LineClient.connect(d.port, d.token) for d in daemons]
    try:
        for control in controls:
            await start_sessions(control, list(SESSIONS), len(SESSIONS))
        with_mcp = find_spec("mcp") is not None and find_spec("repl_cli.mcp.server") is not None
        errlog = str(setup.dir("settle") / "mcp-stderr.log")
        wakers: list[Waker] = []
        agents: list[ChildProcess] = []
        with children(wakers) as started:
            for daemon, control in zip(daemons, controls, strict=True):
                started.append(plain_waker(daemon, control, TCP, rounds))
                if daemon.http:
                    plan = Plan("longpoll", daemon.http_port, daemon.token, POLL, 1, rounds, 600)
                    started.append(waker("HTTP", control, plan))
                if with_mcp:
                    home, asks = str(daemon.home), ask_warm + ask_timed
                    plan_ = AgentPlan(daemon.port, daemon.token, home, rounds, asks, errlog, 600)
                    agent = ChildProcess(agent_child, plan_)
                    agents.append(agent)
                    blocked, fire = waiting_on(control, MCP), send_fire(control, MCP)
                    started.append(Waker("MCP", agent, blocked, fire))
            await alternate(started, rounds)
            each = len(started) // len(daemons)
            for i, side in enumerate(sides):
                for w in started[i * each : (i + 1) * each]:
                    side.times[{"plain": "tcp", "HTTP": "http", "MCP": "mcp_wait"}[w.name]] = (
                        w.times[warm:]
                    )
            for r in range(ask_warm + ask_timed if agents else 0):
                for side, agent in zip(sides, agents, strict=True):
                    agent.pipe.send("go")
                    _kind, ns = await agent.report(60)
                    if r >= ask_warm:
                        side.times.setdefault("mcp_request", []).append(ns)
        if setup.cli is not None:
            for r in range(s.cli_runs + 1):  # the first of each warms caches
                for side, daemon, control in zip(sides, daemons, controls, strict=True):
                    ns = await cli_round(str(setup.cli), daemon, control)
                    if r:
                        side.times.setdefault("cli", []).append(ns)
        for _burst in range(BURSTS_RUN):
            for side, daemon, control in zip(sides, daemons, controls, strict=True):
                side.batches.append(await burst_batches(daemon, control))
        return sides
    finally:
        await close_all(controls)


def settle_rows(_s: Sizes) -> list[Row]:
    ahead = "a lone firing's wake, default settle ÷ settle 0"
    return [
        Row("settle_cli", f"{ahead}: `repl wait` woken by `repl send` (whole processes), ms", GOAL),
        Row(
            "settle_tcp",
            f"{ahead}: `wait` over the line protocol woken by a TCP send, p50, ms",
            Goal("report", 0, "report (× settle 0)"),
        ),
        Row("settle_http", f"{ahead}: HTTP long poll woken by a TCP send, p50, ms", GOAL),
        Row("settle_mcp_wait", f"{ahead}: MCP `wait` tool woken by a TCP send, p50, ms", GOAL),
        Row(
            "settle_mcp_request",
            f"{ahead}: MCP `request` tool answered over TCP (two wakes), p50, ms",
            GOAL,
        ),
    ]


def ms(times: list[int], fraction: float) -> float:
    return percentile(times, fraction) / 1e6


def settle(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    http = not http_missing()
    daemons = [
        Daemon(setup.dir(name), memory=True, settle_ms=settle_ms, quiet_ms=quiet_ms, http=http)
        for name, settle_ms, quiet_ms in (
            ("settle-default", SETTLE_MS, None),  # the defaults
            ("settle-zero", 0, None),  # the reference
            ("settle-quiet-longer", SETTLE_MS, LONGER_QUIET_MS),  # for a note
        )
    ]
    with contextlib.ExitStack() as running:
        for daemon in daemons:
            running.enter_context(daemon.start())
        got = run_async(every_side(setup, daemons), s.deadline_s)
    missing = {
        "settle_cli": "CLI missing" if setup.cli is None else None,
        "settle_http": None if http else "http extra missing",
        "settle_mcp_wait": "mcp extra missing" if find_spec("mcp") is None else None,
        "settle_mcp_request": "mcp extra missing" if find_spec("mcp") is None else None,
    }
    lines = []
    for key in KEYS:
        name = key.removeprefix("settle_")
        row = rows[key]
        row.missing = missing.get(key)
        if name not in got[0].times:
            continue
        slow, fast, longer = (side.times[name] for side in got)
        if name == "cli":  # a whole process's run: the median, as the cli row gives
            row.repl, row.reference = statistics.median(slow) / 1e6, statistics.median(fast) / 1e6
        else:
            row.repl, row.reference = ms(slow, 0.5), ms(fast, 0.5)
        lines.append(f"{name} {' against '.join(p50_p99(t) for t in (slow, fast, longer))}")
    setup.notes.append(
        f"settle: {BURST} sends one at a time over TCP, the batches a waiter got, each of "
        f"{BURSTS_RUN} bursts: at the defaults {got[0].batches}, at --settle-ms 0 "
        f"{got[1].batches}, at --quiet-ms {LONGER_QUIET_MS} {got[2].batches}"
    )
    setup.notes.append(
        f"settle p50 / p99, ms: at the defaults (--settle-ms {SETTLE_MS}, --quiet-ms "
        f"{QUIET_MS}) against --settle-ms 0 against --quiet-ms {LONGER_QUIET_MS}: "
        + "; ".join(lines)
    )


def p50_p99(times: list[int]) -> str:
    return f"{ms(times, 0.5):.2f} / {ms(times, 0.99):.2f}"


SETTLE = Group("settle", settle_rows, settle)
