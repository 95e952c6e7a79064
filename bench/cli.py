"""CLI start-up: whole ``repl read``, ``repl send`` and ``repl wait`` processes, against bare
imports.

Agents and scripts run ``repl`` anew for each step, so its start-up is their latency. The
reference is ``python -c "import click, msgspec, socket"`` on the same interpreter: what
any client of the daemon built on the same libraries would load. Each round runs the
reference and the three commands in turn, so all of them see the same machine:

- ``repl read`` on a session that holds nothing (it prints nothing);
- ``repl send`` of one short text (it prints the seq);
- ``repl wait`` on a session holding one firing it has not seen, which the benchmark
  sends over its own connection, untimed, just before: the wait returns at once,
  prints it and acknowledges it (the step a monitor takes after each wake).

Each figure is the median of ``cli_runs`` (after one round that warms caches); each
row's reference is the median of the reference's runs of the same rounds.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.clients import LineClient
from bench.measure import Group, Setup, Sizes, run_async
from bench.procs import BenchError, Daemon
from bench.table import Goal, Row

PACKAGES = ("session", "repl_daemon", "repl_cli")
REFERENCE = "import click, msgspec, socket"
GOAL = Goal("ratio_le", 1.25, f"≤ 1.25 × python -c '{REFERENCE}'")
#: the sessions the commands run on: read's stays empty, wait's gets one firing a round
EMPTY, SENDS, WAITS = "empty", "sends", "waits"


def _run_ms(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed, done.stdout


def compile_project() -> None:
    """As an installed copy would be: the project's modules compiled to bytecode, which
    PYTHONDONTWRITEBYTECODE (set in some sandboxes) would otherwise make every run of a
    ``repl`` command compile again."""
    packages = [str(Path(__file__).resolve().parent.parent / n) for n in PACKAGES]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)


def cli_rows(s: Sizes) -> list[Row]:
    runs = f"whole process (median of {s.cli_runs}), ms"
    return [
        Row("cli_read", f"`repl read` on an empty session, {runs}", GOAL),
        Row("cli_send", f"`repl send` of one firing, {runs}", GOAL),
        Row("cli_wait", f"`repl wait` that returns at once with one firing, {runs}", GOAL),
    ]


def cli(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    reference = [sys.executable, "-c", REFERENCE]
    ref_times: list[float] = []
    mine = [rows[row.key] for row in cli_rows(s)]  # ``rows`` holds every group's
    if setup.cli is None:
        setup.cannot_run(mine, "CLI missing")
        for _ in range(s.cli_runs + 1):
            ref_times.append(_run_ms(reference)[0])
    else:
        times = _measure(setup, setup.cli, reference, ref_times)
        for key, measured in times.items():
            rows[key].repl = statistics.median(measured[1:])
    for row in mine:
        row.reference = statistics.median(ref_times[1:])


def _measure(
    setup: Setup, cli: Path, reference: list[str], ref_times: list[float]
) -> dict[str, list[float]]:
    """The three commands' times, a list each (the first run of each warms caches),
    alternating with the reference's, appended to ``ref_times``."""
    times: dict[str, list[float]] = {"cli_read": [], "cli_send": [], "cli_wait": []}
    with Daemon(setup.dir("cli-daemon"), memory=True).start() as daemon:

        async def call(*requests: dict[str, str]) -> None:
            client = await LineClient.connect(daemon.port, daemon.token)
            for request in requests:
                await client.ok(request)
            await client.close()

        run_async(call(*({"op": "start", "session": n} for n in (EMPTY, SENDS, WAITS))), 30)
        env = daemon.env()
        compile_project()
        for i in range(setup.sizes.cli_runs + 1):
            ref_times.append(_run_ms(reference)[0])
            elapsed, out = _run_ms([str(cli), "read", EMPTY], env)
            if out.strip():
                raise BenchError(f"`repl read` on an empty session printed {out!r}")
            times["cli_read"].append(elapsed)
            elapsed, out = _run_ms([str(cli), "send", SENDS, "x" * 100], env)
            if out.strip() != str(i + 1):
                raise BenchError(f"`repl send` printed {out!r}, not its seq {i + 1}")
            times["cli_send"].append(elapsed)
            run_async(call({"op": "send", "session": WAITS, "text": f"wake {i}"}), 30)
            elapsed, out = _run_ms([str(cli), "wait", WAITS], env)
            if out.strip() != f"on-message: wake {i}":
                raise BenchError(f"`repl wait` printed {out!r}, not the one firing sent")
            times["cli_wait"].append(elapsed)
    return times


CLI = Group("cli", cli_rows, cli)
