"""Run the benchmark and print its tables: ``python -m bench [--quick] [--only GROUPS]``.

The main table compares one daemon with Redis Streams and the floor; the
``scaleout`` group prints two more, several daemons sharing sessions
through one Redis and through a 3-primary Redis Cluster (bench/scaleout.py).

Also runs as a script, ``python bench/run.py``, with the project's Python
(the one that has repl installed). Each figure group starts its own
servers and its failure is reported in its rows, never hidden: a figure
that cannot be measured says why ("http extra missing") and makes the exit
status 1 (``exit_status``), as an error in a group does; a Redis reference
that cannot be run (no redis-server) leaves its cell empty and a line under
the table says how to get it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import scaleout
from bench.figures import GROUPS, blank_rows
from bench.measure import FULL, QUICK, Setup
from bench.procs import BenchError, raise_nofile
from bench.table import Row, render

# the main table's groups, then the scale-out group, whose rows are tables of their own
ALL_GROUPS = [*GROUPS, "scaleout"]
ALL_RUNNERS = {name: group.run for name, group in GROUPS.items()} | {"scaleout": scaleout.scaleout}

REDIS_HINT = (
    "redis-server not found: the reference column and the scale-out rows are empty. "
    "Install it with `apt-get install redis-server` (Debian/Ubuntu; "
    "do not start it as a service, the benchmark starts its own)."
)
REDIS_PY_HINT = (
    "the `redis` Python package is missing: the reference column and the scale-out rows "
    "are empty. "
    "Install the bench extra: `pip install -e '.[bench]'`."
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Measure the repl daemon against Redis Streams."
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a few seconds")
    parser.add_argument(
        "--only",
        default=None,
        help=f"comma-separated groups to run (default all): {', '.join(ALL_GROUPS)}",
    )
    parser.add_argument(
        "--redis-server",
        default=None,
        help="the redis-server executable (default: redis-server on PATH)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (logs, homes) for a look"
    )
    return parser.parse_args(argv)


def find_redis(path: str | None, notes: list[str]) -> str | None:
    """The redis-server to use, or None with a note for each missing piece saying how to get it."""
    exe = shutil.which(path or "redis-server")
    hints = [] if exe else [REDIS_HINT]
    if importlib.util.find_spec("redis") is None:
        hints.append(REDIS_PY_HINT)
    for hint in hints:
        notes.append(hint)
        print(hint, file=sys.stderr)
    return None if hints else exe


def find_cli() -> Path | None:
    """The `repl` script beside this interpreter, if the CLI package is there to run it."""
    if importlib.util.find_spec("repl_cli.cli.main") is None:
        return None
    script = Path(sys.executable).parent / "repl"
    if script.exists():
        return script
    found = shutil.which("repl")
    return Path(found) if found else None


def fsync_ms(directory: Path, count: int = 20) -> float:
    """Median time of a 4 KiB write plus fsync in ``directory``: what durability costs here."""
    times = []
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return sorted(times)[len(times) // 2]


def machine(redis_exe: str | None, workdir: Path) -> list[str]:
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    redis = "none"
    if redis_exe:
        out = subprocess.run([redis_exe, "--version"], capture_output=True, text=True, timeout=10)
        redis = out.stdout.split(" sha=")[0].strip()
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return [
        f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"machine: {os.cpu_count()} cores ({cpu}), {mem_kib / 1024 / 1024:.1f} GiB memory, "
        f"{platform.system()} {platform.release()}",
        f"python: {platform.python_version()} ({sys.executable}); redis: {redis}",
        f"daemon event loop: {daemon_loop()} (repl daemon --loop auto)",
        f"disk: a 4 KiB write + fsync takes {fsync_ms(workdir):.2f} ms (median of 20)",
        "load average at start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()),
    ]


def daemon_loop() -> str:
    """The event loop a daemon started here runs on: uvloop when it is installed."""
    from importlib.util import find_spec

    return "uvloop" if find_spec("uvloop") is not None else "asyncio"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    groups = ALL_GROUPS if args.only is None else args.only.split(",")
    unknown = [g for g in groups if g not in ALL_GROUPS]
    if unknown:
        print(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(ALL_GROUPS)}")
        return 64
    # this process holds one socket per waiter; each server holds the other end
    limit = raise_nofile(sizes.idle_waiters * 2 + 1_000)
    notes: list[str] = []
    if limit < sizes.idle_waiters + 500:
        notes.append(
            f"open-file limit {limit} is below what {sizes.idle_waiters:,} waits need; "
            "raise the hard limit (ulimit -Hn) to measure them"
        )
    workdir = Path(tempfile.mkdtemp(prefix="repl-bench-"))
    redis_exe = find_redis(args.redis_server, notes)
    setup = Setup(
        sizes=sizes,
        workdir=workdir,
        redis_exe=redis_exe,
        store_missing=importlib.util.find_spec("repl_daemon.backends.local.sqlite") is None,
        cli=find_cli(),
        notes=notes,
    )
    table = blank_rows(sizes)
    by_key = {row.key: row for rows in table.values() for row in rows}
    scale_tables = scaleout.blank_tables(sizes)
    setup.scale.update((key, {row.key: row for row in rows}) for key, rows in scale_tables.items())
    failed = []
    header = machine(redis_exe, workdir)
    started = time.monotonic()
    try:
        for group in groups:
            t0 = time.monotonic()
            print(f"... {group}", file=sys.stderr, flush=True)
            others = [row for name, rows in table.items() if name != group for row in rows]
            before = cells(others)
            try:
                ALL_RUNNERS[group](setup, by_key)
                if cells(others) != before:
                    after = cells(others)
                    wrote = [r.key for r, b, a in zip(others, before, after, strict=True) if a != b]
                    raise BenchError(f"{group} wrote rows of other groups: {', '.join(wrote)}")
            except Exception as exc:
                failed.append(group)
                traceback.print_exc()
                notes.append(f"error in {group}: {type(exc).__name__}: {exc}")
                for row in table.get(group, ()):
                    if row.repl is None and row.missing is None:
                        row.missing = "error"
                if group == "scaleout":
                    for scale_rows in scale_tables.values():
                        scaleout.mark_missing(scale_rows, "error")
            print(f"    {group}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    shown = [row for name, rows in table.items() if name in groups for row in rows]
    mode = "quick" if args.quick else "full"
    print(f"repl benchmark ({mode}, {time.monotonic() - started:.0f} s)")
    for line in header:
        print(line)
    print()
    if shown:
        print(render(shown))
        print()
    if "scaleout" in groups:
        print(scaleout.render_all(scale_tables))
    notes.append("load average at end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if setup.store_missing:
        notes.append("durable rows: repl_daemon.backends.local.sqlite does not exist yet")
    if setup.cli is None:
        notes.append("CLI row: repl_cli.cli.main (the `repl` command) does not exist yet")
    if args.keep:
        notes.append(f"work directory kept: {workdir}")
    for note in notes:
        print(f"note: {note}")
    if failed:
        print(f"note: the group(s) {', '.join(failed)} failed (tracebacks on stderr)")
    unrun = unrun_note(setup.unrun)
    if unrun:
        print(f"note: {unrun}")
    return exit_status(failed, setup.unrun)


def unrun_note(unrun: dict[str, str]) -> str | None:
    """What the rows that could not run lack, with how many each (None: every row ran)."""
    if not unrun:
        return None
    counts = Counter(unrun.values())
    lacking = ", ".join(f"{why} ({n} row{'s' if n > 1 else ''})" for why, n in counts.items())
    return f"rows not measured: {lacking}; the exit status is 1"


def cells(rows: list[Row]) -> list[tuple[object, ...]]:
    """What a group may write in each of ``rows``: a group that writes another's is a fault
    of the benchmark (a cli group that set every row's reference once went unseen)."""
    return [(r.repl, r.reference, r.floor, r.missing, r.reference_missing) for r in rows]


def exit_status(failed: list[str], unrun: dict[str, str]) -> int:
    """1 when a group failed, or a row could not run for a piece not installed (what
    README's bench command installs measures every row: issue 50); else 0."""
    return 1 if failed or unrun else 0


if __name__ == "__main__":
    sys.exit(main())
