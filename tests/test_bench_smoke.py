"""The benchmark runs end to end in its quick mode and prints its whole table.

No timing is asserted (figures belong in the table, not in tests): only that
every row is there, that its numbers parse, and that without redis-server
the reference column is left empty and the install hint is printed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

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


def run_quick(*extra: str) -> tuple[str, list[dict[str, str]]]:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == COLUMNS
    rows = []
    for line in table[2:]:  # after the header and its rule
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.append(dict(zip(COLUMNS, cells, strict=True)))
    return done.stdout, rows


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


@pytest.mark.timeout(120)
def test_quick_benchmark_prints_every_row_with_numbers() -> None:
    _out, rows = run_quick()
    check_rows(rows)


@pytest.mark.timeout(120)
def test_without_redis_server_the_reference_column_is_empty_and_the_hint_printed() -> None:
    out, rows = run_quick("--redis-server", "/nonexistent/redis-server")
    check_rows(rows)
    assert "apt-get install redis-server" in out
    for row in rows:
        if "Redis" in row["goal"]:
            assert row["reference"] == "", row
            assert row["ratio"] == "", row
            assert row["met?"] == "n/a", row
