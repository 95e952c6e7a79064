"""CLI start-up: the whole ``repl read`` process on an empty session, against bare imports.

The reference is ``python -c "import click, msgspec, socket"`` on the same
interpreter; the two are run alternately, so both see the same machine.
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


def cli_rows(_s: Sizes) -> list[Row]:
    goal = Goal("ratio_le", 1.25, "≤ 1.25 × python -c 'import click, msgspec, socket'")
    return [Row("cli_read", "`repl read` on an empty session, whole process, ms", goal)]


def cli(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["cli_read"]
    reference = [sys.executable, "-c", "import click, msgspec, socket"]
    ref_times: list[float] = []
    repl_times: list[float] = []
    if setup.cli is None:
        setup.cannot_run([row], "CLI missing")
        for _ in range(s.cli_runs + 1):
            ref_times.append(_run_ms(reference)[0])
    else:
        with Daemon(setup.dir("cli-daemon"), memory=True).start() as daemon:

            async def start_empty() -> None:
                client = await LineClient.connect(daemon.port, daemon.token)
                await client.ok({"op": "start", "session": "empty"})
                await client.close()

            run_async(start_empty(), 30)
            command = [str(setup.cli), "read", "empty"]
            env = daemon.env()
            compile_project()
            # alternate the two, so both see the same machine; the first of each warms caches
            for _ in range(s.cli_runs + 1):
                ref_times.append(_run_ms(reference)[0])
                elapsed, out = _run_ms(command, env)
                if out.strip():
                    raise BenchError(f"`repl read` on an empty session printed {out!r}")
                repl_times.append(elapsed)
        row.repl = statistics.median(repl_times[1:])
    row.reference = statistics.median(ref_times[1:])


CLI = Group("cli", cli_rows, cli)
