"""The benchmark's idle group keeps repl's figures when its Redis reference fails.

In the run of 2026-12-04 the reference's 10,000 idle connections timed out,
and the whole group printed ``n/a (error)``, repl's rows too. Here the
reference is a ``redis-server`` that fails at once: repl's and the floor's
figures must stand, the reference's cells say ``n/a (error)``, and a note
says what failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.figures import blank_rows
from bench.measure import QUICK, Setup
from bench.waits import idle


@pytest.mark.timeout(120)
def test_a_failed_reference_leaves_repls_idle_figures_standing(tmp_path: Path) -> None:
    broken = tmp_path / "redis-server"
    broken.write_text("#!/bin/sh\necho 'this redis-server cannot start' >&2\nexit 1\n")
    broken.chmod(0o755)
    setup = Setup(
        sizes=QUICK,
        workdir=tmp_path / "work",
        redis_exe=str(broken),
        store_missing=False,
        cli=None,
        notes=[],
    )
    rows = {row.key: row for row in blank_rows(QUICK)["idle"]}
    idle(setup, rows)
    assert rows["idle_cpu"].repl is not None and rows["idle_mem"].repl is not None
    assert rows["idle_evals"].repl == 0
    assert rows["idle_mem"].floor is not None
    for key in ("idle_cpu", "idle_cpu_period", "idle_mem"):
        assert rows[key].reference is None
        assert rows[key].cells()[2] == "n/a (error)"
        assert not rows[key].cells()[1].startswith("n/a")
    assert any(note.startswith("idle: the Redis reference failed") for note in setup.notes)
