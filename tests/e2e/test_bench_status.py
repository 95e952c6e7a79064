"""A benchmark row that cannot run says why, and the run exits 1 (issue 50).

README's bench command installs the ``bench`` extra, which brings the ``http`` and
``mcp`` extras: every row can run. A run that lacks one (an install made another way)
used to print ``n/a (http extra missing)`` and exit 0, as if it had measured what
README says. Here the benchmark runs in a process where the MCP SDK and Starlette
cannot be imported (``sys.modules[name] = None``: ``find_spec`` finds nothing and an
import fails, as when the package is not installed; nothing is uninstalled), with only
the groups that need them, which stop at once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.run import exit_status, unrun_note

ROOT = Path(__file__).resolve().parents[2]

#: the bench, with the http and mcp extras' first packages not importable
WITHOUT_EXTRAS = """
import sys
sys.modules["mcp"] = None
sys.modules["starlette"] = None
from bench.run import main
sys.exit(main(["--quick", "--only", "http,mcp,push,approve"]))
"""


def test_a_row_whose_extra_is_missing_says_so_and_the_run_exits_1() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert rows, done.stdout
    cells = [[cell.strip() for cell in row.strip("|").split("|")][1] for row in rows]
    assert set(cells) == {"n/a (http extra missing)", "n/a (mcp extra missing)"}, cells
    # what to install, once each, and what was not measured
    assert done.stdout.count("the http rows need the http extra") == 1, done.stdout
    for group in ("mcp", "push", "approve"):
        assert f"the {group} rows need the MCP SDK" in done.stdout, done.stdout
    assert (
        f"note: rows not measured: http extra missing (6 rows), mcp extra missing "
        f"({len(cells) - 6} rows); the exit status is 1"
    ) in done.stdout, done.stdout


def test_the_exit_status_is_1_for_a_failed_group_or_a_row_not_measured() -> None:
    assert exit_status([], {}) == 0
    assert exit_status(["http"], {}) == 1
    assert exit_status([], {"http_rt": "http extra missing"}) == 1
    assert unrun_note({}) is None
    assert unrun_note({"cli_read": "CLI missing"}) == (
        "rows not measured: CLI missing (1 row); the exit status is 1"
    )
