"""The benchmark runs end to end in its quick mode and prints both its tables.

No timing is asserted (figures belong in the table, not in tests): only that
every row is there, that its numbers parse, and that without redis-server
the reference column and the scale-out rows that need Redis are left empty
and the install hint is printed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a stable fragment of each row's label, in table order
ROWS = (
    "send round trip p50",
    "send round trip p99",
    "wake latency p50",
    "wake latency p99",
    "pipelined sends/s, one client, --memory",
    "pipelined sends/s, one client, durable",
    "daemon CPU over",
    "idle-timeout period",
    "evaluations over",
    "memory per waiter",
    "fan-out, one send to",
    "memory per retained firing",
    "`repl read` on an empty session",
    "restart until",
)
COLUMNS = ["figure", "repl", "reference", "ratio", "goal", "met?", "floor"]

# the second table: several daemons on one Redis (bench/scaleout.py)
SCALE_ROWS = (
    "wake p50 (settle 0), µs; 2: waiter on B",
    "wake p99 (settle 0), µs; 2: waiter on B",
    "wake p50 (settle 0), µs; one daemon, --memory",
    "wake p99 (settle 0), µs; one daemon, --memory",
    "wake p50 (settle 0), µs; one daemon, SQLite",
    "wake p99 (settle 0), µs; one daemon, SQLite",
    "pipelined sends/s, 6 clients, one shared session",
    "sends refused (store_failed), one shared session",
    "commit attempts (EVALSHA) per send, one shared session",
    "session reloads (MULTI/EXEC) per send, one shared session",
    "daemons' CPU per send, µs, one shared session",
    "redis-server CPU per send, µs, one shared session",
    "pipelined sends/s, 6 clients, one session per daemon",
    "daemons' CPU per send, µs, one session per daemon",
    "redis-server CPU per send, µs, one session per daemon",
)
SCALE_COLUMNS = ["figure", "1 daemon", "2 daemons", "3 daemons", "2 / 1", "3 / 1", "Redis alone"]
# rows measured with one daemon only, without Redis
CONTEXT = ("one daemon, --memory", "one daemon, SQLite")


def parse_table(lines: list[str], columns: list[str]) -> list[dict[str, str]]:
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == columns
    rows = []
    for line in lines[2:]:  # after the header and its rule
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append(dict(zip(columns, cells, strict=True)))
    return rows


def run_quick(*extra: str) -> tuple[str, list[dict[str, str]], list[dict[str, str]]]:
    """The output, the main table's rows and the scale-out table's rows."""
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    tables: list[list[str]] = []
    previous = ""
    for line in done.stdout.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    assert len(tables) == 2, done.stdout
    return done.stdout, parse_table(tables[0], COLUMNS), parse_table(tables[1], SCALE_COLUMNS)


def parse_number(cell: str) -> float:
    return float(cell.replace(",", ""))


def check_rows(rows: list[dict[str, str]]) -> None:
    assert len(rows) == len(ROWS)
    for fragment, row in zip(ROWS, rows, strict=True):
        assert fragment in row["figure"], (fragment, row)
        if row["repl"].startswith("n/a"):
            # only a piece that does not exist yet may leave repl unmeasured
            assert row["repl"] in ("n/a (store missing)", "n/a (CLI missing)"), row
        else:
            parse_number(row["repl"])
        for column in ("reference", "ratio", "floor"):
            if row[column]:
                parse_number(row[column])
        assert row["met?"] in ("yes", "no", "n/a"), row


def check_scale_rows(rows: list[dict[str, str]], *, redis: bool) -> None:
    assert len(rows) == len(SCALE_ROWS)
    for fragment, row in zip(SCALE_ROWS, rows, strict=True):
        assert fragment in row["figure"], (fragment, row)
        cells = [row[column] for column in SCALE_COLUMNS[1:]]
        if any(context in row["figure"] for context in CONTEXT):
            # one daemon without Redis: measured either way, nothing to compare
            parse_number(row["1 daemon"])
            assert cells[1:] == [""] * 5, row
        elif redis:
            for cell in cells:
                if cell:
                    parse_number(cell)
            for column in ("1 daemon", "2 daemons"):
                parse_number(row[column])
            if not row["figure"].startswith("wake"):
                parse_number(row["3 daemons"])
        else:
            assert cells == ["n/a (no redis-server)"] + [""] * 5, row


@pytest.mark.timeout(150)
def test_quick_benchmark_prints_every_row_with_numbers() -> None:
    _out, rows, scale = run_quick()
    check_rows(rows)
    check_scale_rows(scale, redis=True)


@pytest.mark.timeout(150)
def test_without_redis_server_the_reference_column_is_empty_and_the_hint_printed() -> None:
    out, rows, scale = run_quick("--redis-server", "/nonexistent/redis-server")
    check_rows(rows)
    check_scale_rows(scale, redis=False)
    assert "apt-get install redis-server" in out
    for row in rows:
        if "Redis" in row["goal"]:
            assert row["reference"] == "", row
            assert row["ratio"] == "", row
            assert row["met?"] == "n/a", row
