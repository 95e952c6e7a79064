"""The ``approve`` group (issue 49): a verdict's latency, from ``repl approve`` to the agent.

One ``--memory`` daemon, settle 0. A channel harness as Claude Code is one (JSON-RPC
lines written by hand on the stdin of ``repl mcp --follow approve-inbox --approvals
approve-asks``, its stdout read a line at a time: bench/mcp_follow.py's ``Harness``)
sends ``notifications/claude/channel/permission_request`` with a fresh request id a
round; once the relay has recorded the prompt in the session and its follow of the
verdicts is blocked in the daemon again, the round starts a ``repl approve
approve-asks ID`` process. The figure: from just before that process is started to the
moment the harness has read ``notifications/claude/channel/permission`` ``{request_id,
behavior: "allow"}``. The reference is what a person's other command costs: a ``repl
send`` process, from its start to its exit, to a session of its own on the same
daemon. The two alternate round by round (which goes first alternates too), the same
``repl`` script, the project compiled to bytecode first (bench/cli.py).

What the figure holds beyond the reference: ``repl approve``'s two more round trips
(it reads the prompt before it records the verdict, and reads it again after, to say
whether its verdict counts), the daemon waking the relay's matching wait, the relay's
notification written on its stdout and read by the harness. A note gives the approve
process's own whole time (start to exit), and how far before or after its exit the
harness had the notification.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

from bench.cli import compile_project
from bench.clients import LineClient, until
from bench.mcp_follow import Harness, server_env
from bench.measure import PAYLOAD, Group, Setup, Sizes, on_daemon, percentile, stats
from bench.procs import BenchError, Daemon
from bench.table import Goal, Row

MISSING = "mcp extra missing"
HINT = "the approve rows need the MCP SDK: `pip install -e '.[bench]'` (or the `mcp` extra)"
REQUEST = "notifications/claude/channel/permission_request"
PERMISSION = "notifications/claude/channel/permission"
ASKS, INBOX, SENDS = "approve-asks", "approve-inbox", "approve-sends"
#: the letters of Claude Code's request ids: a-z without l
LETTERS = "abcdefghijkmnopqrstuvwxyz"
PERCENTILES = (("p50", 0.5), ("p90", 0.9))


def rounds(s: Sizes) -> tuple[int, int]:
    """Warm-up and timed rounds: 2 and 30 (1 and 5 quick); each is two processes."""
    return (2, 30) if s.cli_runs >= 20 else (1, 5)


def request_id(n: int) -> str:
    """The ``n``-th of five-letter request ids, each new."""
    letters = []
    for _ in range(5):
        n, digit = divmod(n, len(LETTERS))
        letters.append(LETTERS[digit])
    return "".join(reversed(letters))


@dataclass
class Verdicts:
    """Nanoseconds a round, after the warm-up."""

    verdict: list[int] = field(default_factory=list)  # approve's start to the notification read
    approve: list[int] = field(default_factory=list)  # approve's start to its exit
    send: list[int] = field(default_factory=list)  # send's start to its exit


def ask(h: Harness, rid: str) -> None:
    """Claude Code's prompt, as it writes it on the server's stdin."""
    params = {
        "request_id": rid,
        "tool_name": "Bash",
        "description": f"run Bash for {rid}",
        "input_preview": '{"command": "ls"}',
    }
    h.write({"jsonrpc": "2.0", "method": REQUEST, "params": params})


def permission(h: Harness) -> tuple[int, dict[str, Any]]:
    """The next permission notification's params, and the perf_counter_ns it was read at."""
    while True:
        message = h.line()
        t_read = time.perf_counter_ns()
        if message.get("method") == PERMISSION:
            params: dict[str, Any] = message["params"]
            return t_read, params


def exited(proc: subprocess.Popen[bytes], argv: list[str], expect: str) -> int:
    """The perf_counter_ns at which ``proc`` was seen to exit (its output checked).

    By its pipes' end, which its exit closes (``communicate``), not by ``wait`` with a
    timeout: that polls, at up to 50 ms apart once the process is 100 ms old, which
    added up to 50 ms to a whole ``repl`` process in a first version of this group."""
    out, err = proc.communicate(timeout=60)
    t_exit = time.perf_counter_ns()
    if proc.returncode != 0 or not out.decode().startswith(expect):
        raise BenchError(f"{' '.join(argv)} exited {proc.returncode}: {out!r} {err[-500:]!r}")
    return t_exit


def spawn(argv: list[str], env: dict[str, str]) -> tuple[int, subprocess.Popen[bytes]]:
    """The process of ``argv`` started, and the perf_counter_ns just before. In the
    event loop's thread, as a user's shell starts it: nothing else runs in the loop
    meanwhile (the harness's reads are in threads of their own)."""
    t0 = time.perf_counter_ns()
    return t0, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def one_verdict(h: Harness, argv: list[str], env: dict[str, str], rid: str) -> list[int]:
    """A ``repl approve`` of ``rid``: [to the notification read, to its exit], ns."""
    t0, proc = spawn(argv, env)
    (t_read, params), t_exit = await asyncio.gather(
        asyncio.to_thread(permission, h), asyncio.to_thread(exited, proc, argv, f"{rid}: allow")
    )
    if params != {"request_id": rid, "behavior": "allow"}:
        raise BenchError(f"the relay sent {params} for the verdict on {rid}")
    return [t_read - t0, t_exit - t0]


def one_send(argv: list[str], env: dict[str, str]) -> int:
    """A whole ``repl send`` process, ns."""
    t0, proc = spawn(argv, env)
    return exited(proc, argv, "") - t0


async def verdict_figures(daemon: Daemon, setup: Setup, cli: Path, errlog: IO[bytes]) -> Verdicts:
    warm, timed = rounds(setup.sizes)
    env = daemon.env()
    send = [str(cli), "send", SENDS, PAYLOAD]
    got = Verdicts()
    control = await LineClient.connect(daemon.port, daemon.token)
    relay = ("--approvals", ASKS)
    h = Harness(server_env(daemon.port, str(daemon.home)), INBOX, errlog, extra=relay)
    try:
        for name in (ASKS, INBOX, SENDS):
            await control.ok({"op": "start", "session": name})
        h.begin()
        await asyncio.to_thread(h.finish)
        head = 0  # the session's firings: a prompt and a verdict a round

        async def ready() -> bool:
            """The prompt recorded, and the relay's follow blocked in the daemon."""
            row = (await stats(control, ASKS))["sessions"][0]
            return bool(row["head"] == head and row["waiters"] == 1)

        for r in range(warm + timed):
            rid = request_id(r)
            ask(h, rid)
            head += 1
            await until(ready, what=f"the prompt {rid} recorded", interval_s=0.001)
            approve = [str(cli), "approve", ASKS, rid]
            if r % 2:
                sent = one_send(send, env)
                verdict, whole = await one_verdict(h, approve, env, rid)
            else:
                verdict, whole = await one_verdict(h, approve, env, rid)
                sent = one_send(send, env)
            head += 1
            if r >= warm:
                got.verdict.append(verdict)
                got.approve.append(whole)
                got.send.append(sent)
    finally:
        h.close()
        await control.close()
    return got


def ms(times: list[int], fraction: float) -> float:
    return percentile(times, fraction) / 1e6


def approve_rows(_s: Sizes) -> list[Row]:
    goal = Goal("ratio_le", 1.25, "≤ 1.25 × `repl send`, whole process")
    figure = (
        "verdict latency {} (`repl approve` started to the permission notification read "
        "from `repl mcp --approvals`; settle 0), ms"
    )
    return [Row(f"approve_{name}", figure.format(name), goal) for name, _ in PERCENTILES]


def keys() -> list[str]:
    return [f"approve_{name}" for name, _ in PERCENTILES]


def approve_group(setup: Setup, rows: dict[str, Row]) -> None:
    if find_spec("mcp") is None or find_spec("repl_cli.mcp.approvals") is None:
        setup.cannot_run([rows[key] for key in keys()], MISSING, HINT)
        return
    if setup.cli is None:
        setup.cannot_run([rows[key] for key in keys()], "CLI missing")
        return
    cli = setup.cli
    compile_project()
    with open(setup.dir("approve") / "relay-stderr.log", "ab") as errlog:
        got = on_daemon(
            setup,
            "approve-daemon",
            lambda d: verdict_figures(d, setup, cli, errlog),
            memory=True,
            settle_ms=0,
        )
    for name, fraction in PERCENTILES:
        rows[f"approve_{name}"].repl = ms(got.verdict, fraction)
        rows[f"approve_{name}"].reference = ms(got.send, fraction)
    after = sorted(v - w for v, w in zip(got.verdict, got.approve, strict=True))
    warm, timed = rounds(setup.sizes)
    setup.notes.append(
        f"approve: {timed} rounds after {warm}, `repl approve` and `repl send` alternating, "
        "p50 / p90 ms: verdict to the notification read "
        f"{ms(got.verdict, 0.5):.1f} / {ms(got.verdict, 0.9):.1f}, the approve process to "
        f"its exit {ms(got.approve, 0.5):.1f} / {ms(got.approve, 0.9):.1f}, the send process "
        f"{ms(got.send, 0.5):.1f} / {ms(got.send, 0.9):.1f}; the notification read "
        f"{after[len(after) // 2] / 1e6:+.2f} ms from the approve's exit (median)"
    )


APPROVE = Group("approve", approve_rows, approve_group)
