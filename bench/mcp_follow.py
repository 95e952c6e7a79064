"""The ``push`` group (issue 40): ``repl mcp --follow``'s pushes, its ``send`` tool, its idle cost.

Each figure against what the same work costs without it, measured in the same run,
on one ``--memory`` daemon with settle 0:

- push latency, in each of the two ``--ack`` modes (``agent``, the default: the server
  acknowledges nothing, the agent does; ``pipe``: the server acknowledges a push once
  taken and held 2 s): a channel harness as Claude Code is one (JSON-RPC lines written
  by hand on the stdin of ``repl mcp --follow push-wake-MODE --ack MODE``, its stdout
  read a line at a time, as tests/e2e/test_mcp_push.py's ``Harness`` does), in a child
  process of its own; from just before a ``send`` over TCP (the line protocol, as every
  other row sends) to the moment the harness has read the
  ``notifications/claude/channel`` line.
  The reference is the wake row's waiter, a ``wait`` over TCP blocked on the daemon
  (bench/waiters.py), woken by the same kind of send, from just before it to the
  wait's answer read. The three alternate round by round (bench/paired_wakes.py), each
  round waiting for the server's follow (or the wait) to be blocked in the daemon
  before its send, so one send at a time, each pushed before the next.
- the ``send`` tool: ``tools/call`` through the official SDK's client
  (``ClientSession`` over ``stdio_client``) to ``repl mcp``, one at a time. The
  reference (the floor of an MCP tool call) is the same client calling the same
  arguments on a minimal server of the same SDK, bench/mcp_floor.py (``MCPServer``,
  one tool that returns at once), over stdio too. The TCP ``send``'s round trip is
  printed beside them for scale. The three alternate request by request.
- idle followers: N ``repl mcp --follow`` servers (each made its handshake, each
  following a session of its own that nothing is sent to), blocked in the daemon's
  wait; over the idle window, the CPU time of the servers and of the daemon (/proc)
  and the daemon's evaluation count (``stats``), which must not move. A send to each
  session afterwards proves every server was following (each pushes it).

The module is not named ``mcp`` (see bench/mcp_agent.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.util import find_spec
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any

from bench.clients import LineClient, until
from bench.mcp_agent import structured
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
from bench.procs import HOST, BenchError, Daemon, cpu_seconds
from bench.table import Goal, Row

MISSING = "mcp extra missing"
HINT = "the push rows need the MCP SDK: `pip install -e '.[bench]'` (or the `mcp` extra)"
FLOOR_SCRIPT = Path(__file__).with_name("mcp_floor.py")
CHANNEL_METHOD = "notifications/claude/channel"
#: the protocol version a harness of today asks for in its handshake
HANDSHAKE = "2025-06-18"


def push_rounds(s: Sizes) -> tuple[int, int]:
    """Warm-up and timed pushes: 20 and 300 (2 and 10 quick)."""
    return max(2, s.warmup // 50), max(10, s.wakes * 3 // 20)


def tool_calls(s: Sizes) -> tuple[int, int]:
    """Warm-up and timed calls of each kind: 50 and 1,000 (5 and 20 quick)."""
    return max(5, s.warmup // 20), max(20, s.round_trips // 10)


def followers(s: Sizes) -> tuple[int, float]:
    """Idle followers and the window: 20 over 5 s (3 over 0.5 s quick)."""
    return (20, 5.0) if s.idle_window_s >= 5 else (3, s.idle_window_s)


# -- a channel harness: ``repl mcp --follow`` on pipes, JSON-RPC by hand ---------------


def server_env(port: int, home: str) -> dict[str, str]:
    return {**os.environ, "REPL_ADDR": f"{HOST}:{port}", "REPL_HOME": home}


class Harness:
    """``repl mcp --follow SESSION`` as a channel harness runs it: lines in, lines out."""

    def __init__(
        self,
        env: dict[str, str],
        session: str,
        errlog: IO[bytes],
        ack: str = "agent",
        extra: tuple[str, ...] = (),
    ) -> None:
        argv = [sys.executable, "-m", "repl_cli", "mcp", "--follow", session, "--ack", ack]
        argv += extra  # more options (bench/approvals.py: --approvals SESSION)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errlog, env=env
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def write(self, message: dict[str, Any]) -> None:
        self.stdin.write(json.dumps(message).encode() + b"\n")
        self.stdin.flush()

    def begin(self) -> None:
        """Send the handshake's request (the server starts following once it is done)."""
        params = {
            "protocolVersion": HANDSHAKE,
            "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"},
        }
        self.write({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})

    def finish(self) -> None:
        """Read the handshake's answer and confirm it."""
        answer = self.line()
        if answer.get("id") != 1 or "result" not in answer:
            raise BenchError(f"repl mcp answered the handshake with {answer}")
        self.write({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def line(self) -> dict[str, Any]:
        raw = self.stdout.readline()
        if not raw:
            raise BenchError(f"repl mcp closed its stdout (exit {self.proc.poll()})")
        message: dict[str, Any] = json.loads(raw)
        return message

    def channel(self) -> tuple[int, dict[str, Any]]:
        """The next channel notification's params, and the perf_counter_ns it was read at."""
        while True:
            message = self.line()
            t_read = time.perf_counter_ns()
            if message.get("method") == CHANNEL_METHOD:
                params: dict[str, Any] = message["params"]
                return t_read, params

    def close(self) -> None:
        """Close its stdin, as a harness that is done does: it exits."""
        if self.proc.poll() is None:
            self.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.stdout.close()


@dataclass(frozen=True)
class PushPlan:
    port: int
    home: str
    session: str
    rounds: int
    errlog: str
    ack: str


def harness_child(plan: PushPlan, pipe: Connection) -> None:
    """The harness's process: ``("ready",)``, then ``("round", t_read_ns, seq)`` a push."""
    try:
        with open(plan.errlog, "ab") as errlog:
            h = Harness(server_env(plan.port, plan.home), plan.session, errlog, plan.ack)
            try:
                h.begin()
                h.finish()
                pipe.send(("ready",))
                for _round in range(plan.rounds):
                    t_read, params = h.channel()
                    pipe.send(("round", t_read, params["meta"]["seq"]))
            finally:
                h.close()
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


@dataclass
class Pushes:
    """Push latencies in each ``--ack`` mode, and the TCP wait's, ns, after the warm-up."""

    agent: list[int]
    pipe: list[int]
    tcp: list[int]


async def push_figures(daemon: Daemon, setup: Setup) -> Pushes:
    warm, timed = push_rounds(setup.sizes)
    rounds = warm + timed
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        modes = ("agent", "pipe")
        await start_sessions(control, ["tcp-wake", *(f"push-wake-{m}" for m in modes)], 2)
        tcp = plain_waker(daemon, control, "tcp-wake", rounds)
        pushes: dict[str, Waker] = {}
        with children([tcp]) as started:
            for mode in modes:
                session = f"push-wake-{mode}"
                errlog = str(setup.dir("push") / f"follow-{mode}-stderr.log")
                plan = PushPlan(daemon.port, str(daemon.home), session, rounds, errlog, mode)
                child = ChildProcess(harness_child, plan)
                blocked, fire = waiting_on(control, session), send_fire(control, session)
                pushes[mode] = Waker(f"MCP push ({mode})", child, blocked, fire)
                started.append(pushes[mode])
            await alternate(started, rounds)
        return Pushes(pushes["agent"].times[warm:], pushes["pipe"].times[warm:], tcp.times[warm:])
    finally:
        await control.close()


# -- the send tool, against the SDK's floor --------------------------------------------


@dataclass
class Sends:
    mcp: list[int]
    floor: list[int]
    tcp: list[int]


async def send_figures(daemon: Daemon, setup: Setup, errlog: IO[str]) -> Sends:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    warmup, calls = tool_calls(setup.sizes)
    env = server_env(daemon.port, str(daemon.home))
    repl = StdioServerParameters(command=sys.executable, args=["-m", "repl_cli", "mcp"], env=env)
    floor = StdioServerParameters(command=sys.executable, args=[str(FLOOR_SCRIPT)], env=env)
    control = await LineClient.connect(daemon.port, daemon.token)
    await start_sessions(control, ["mcp-send", "tcp-send"], 2)
    times = Sends([], [], [])
    async with (
        stdio_client(repl, errlog=errlog) as (repl_read, repl_write),
        ClientSession(repl_read, repl_write) as agent,
        stdio_client(floor, errlog=errlog) as (floor_read, floor_write),
        ClientSession(floor_read, floor_write) as bare,
    ):
        await agent.initialize()
        await bare.initialize()
        arguments = {"session": "mcp-send", "text": PAYLOAD}
        request = send_request("tcp-send")
        for i in range(warmup + calls):
            t0 = time.perf_counter_ns()
            structured(await agent.call_tool("send", arguments), "send")
            t1 = time.perf_counter_ns()
            structured(await bare.call_tool("send", arguments), "floor's send")
            t2 = time.perf_counter_ns()
            await control.ok(request)
            t3 = time.perf_counter_ns()
            if i >= warmup:
                times.mcp.append(t1 - t0)
                times.floor.append(t2 - t1)
                times.tcp.append(t3 - t2)
    await control.close()
    return times


# -- idle followers --------------------------------------------------------------------


@dataclass
class IdleFollow:
    cpu_servers: float  # % of a core, all the servers together
    cpu_daemon: float
    evaluations: int


async def idle_figures(daemon: Daemon, setup: Setup, errlog: IO[bytes]) -> IdleFollow:
    count, window_s = followers(setup.sizes)
    names = [f"idle-follow-{i}" for i in range(count)]
    control = await LineClient.connect(daemon.port, daemon.token)
    harnesses: list[Harness] = []
    try:
        await start_sessions(control, names, count)
        env = server_env(daemon.port, str(daemon.home))
        harnesses = [Harness(env, name, errlog) for name in names]
        for h in harnesses:
            h.begin()
        for h in harnesses:  # each a blocking read, while the others start beside it
            await asyncio.to_thread(h.finish)

        async def all_blocked() -> bool:
            return bool((await stats(control))["daemon"]["waiters"] == count)

        await until(all_blocked, what=f"{count} followers blocked", deadline_s=120)
        await asyncio.sleep(setup.sizes.settle_s)
        pids = [h.proc.pid for h in harnesses]
        evaluations0 = (await stats(control))["daemon"]["evaluations"]
        servers0, daemon0 = [cpu_seconds(pid) for pid in pids], cpu_seconds(daemon.pid)
        t0 = time.monotonic()
        await asyncio.sleep(window_s)
        servers1, daemon1 = [cpu_seconds(pid) for pid in pids], cpu_seconds(daemon.pid)
        elapsed = time.monotonic() - t0
        evaluations1 = (await stats(control))["daemon"]["evaluations"]
        for name in names:  # each server was following: it pushes what comes
            await control.ok(send_request(name))
        for h, name in zip(harnesses, names, strict=True):
            _t, params = await asyncio.to_thread(h.channel)
            if params["meta"]["session"] != name:
                raise BenchError(f"the follower of {name} pushed {params}")
        spent = sum(b - a for a, b in zip(servers0, servers1, strict=True))
        return IdleFollow(
            100 * spent / elapsed,
            100 * (daemon1 - daemon0) / elapsed,
            int(evaluations1 - evaluations0),
        )
    finally:
        for h in harnesses:
            h.close()
        await control.close()


# -- the rows --------------------------------------------------------------------------


def push_rows(s: Sizes) -> list[Row]:
    count, window_s = followers(s)
    idle = f"{count} idle `repl mcp --follow` servers"
    return [
        *percentile_rows(
            "push",
            "MCP push latency {}, `--ack agent` (TCP send to the channel notification read "
            "from `repl mcp --follow`; settle 0), µs",
            Goal("ratio_le", 1.5, "≤ 1.5 × TCP wait woken by the send"),
        ),
        *percentile_rows(
            "push_pipe",
            "MCP push latency {}, `--ack pipe` (the same, the server acknowledging), µs",
            Goal("ratio_le", 1.5, "≤ 1.5 × TCP wait woken by the send"),
        ),
        *percentile_rows(
            "push_tool",
            "MCP `send` tool round trip {} (the SDK's stdio client, `repl mcp`), µs",
            Goal("ratio_le", 1.25, "≤ 1.25 × a no-op tool (same SDK, stdio)"),
        ),
        *percentile_rows(
            "push_tcp",
            "TCP send round trip {} beside those tool calls (for scale), µs",
            Goal("report", 0, "report"),
        ),
        Row(
            "push_idle_cpu",
            f"{idle} and the daemon: CPU over {window_s:g} s, % of a core",
            Goal("abs_eq", 0, "= 0 %"),
        ),
        Row(
            "push_idle_evals",
            f"{idle}: the daemon's evaluations over {window_s:g} s",
            Goal("abs_eq", 0, "= 0"),
        ),
    ]


def push_group(setup: Setup, rows: dict[str, Row]) -> None:
    if find_spec("mcp") is None or find_spec("repl_cli.mcp.push") is None:
        setup.cannot_run(rows_of(rows), MISSING, HINT)
        return

    logs = setup.dir("push")
    with (
        open(logs / "send-stderr.log", "a") as send_log,
        open(logs / "idle-stderr.log", "ab") as idle_log,
    ):

        async def measure(daemon: Daemon) -> tuple[Pushes, Sends, IdleFollow]:
            return (
                await push_figures(daemon, setup),
                await send_figures(daemon, setup, send_log),
                await idle_figures(daemon, setup, idle_log),
            )

        pushes, sends, idle = on_daemon(setup, "push-daemon", measure, memory=True, settle_ms=0)
    fill_percentiles(rows, "push", "repl", pushes.agent)
    fill_percentiles(rows, "push", "reference", pushes.tcp)
    fill_percentiles(rows, "push_pipe", "repl", pushes.pipe)
    fill_percentiles(rows, "push_pipe", "reference", pushes.tcp)
    fill_percentiles(rows, "push_tool", "repl", sends.mcp)
    fill_percentiles(rows, "push_tool", "reference", sends.floor)
    fill_percentiles(rows, "push_tcp", "repl", sends.tcp)
    rows["push_idle_cpu"].repl = idle.cpu_servers + idle.cpu_daemon
    rows["push_idle_evals"].repl = idle.evaluations
    warm, timed = push_rounds(setup.sizes)
    count, window_s = followers(setup.sizes)
    setup.notes.append(
        f"push: {timed:,} pushes of each mode after {warm} (alternating with the TCP "
        "wait's), "
        f"{len(sends.mcp):,} tool calls of each kind; idle: {count} servers "
        f"{idle.cpu_servers:.2f} % and the daemon {idle.cpu_daemon:.2f} % of a core "
        f"over {window_s:g} s"
    )


def rows_of(rows: dict[str, Row]) -> list[Row]:
    prefixes = ("push", "push_pipe", "push_tool", "push_tcp")
    keys = [f"{prefix}_{p}" for prefix in prefixes for p in ("p50", "p99")]
    return [rows[key] for key in [*keys, "push_idle_cpu", "push_idle_evals"]]


PUSH = Group("push", push_rows, push_group)
