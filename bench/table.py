"""The one table a benchmark run prints: a row per figure, its reference, its goal.

A row holds numbers only; whether a goal is met is computed here from the
goal's kind (a ratio to the reference, or an absolute bound), so the table
cannot say "yes" for a figure that was not measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

GoalKind = Literal["ratio_le", "ratio_ge", "abs_le", "abs_eq", "report"]
COLUMNS = ("figure", "repl", "reference", "ratio", "goal", "met?", "floor")


@dataclass(frozen=True)
class Goal:
    kind: GoalKind
    value: float
    text: str


@dataclass
class Row:
    """One figure. ``missing`` explains a repl cell that has no number ("store missing")."""

    key: str
    figure: str
    goal: Goal
    repl: float | None = None
    reference: float | None = None
    floor: float | None = None
    missing: str | None = None
    #: why the reference cell has no number (its measurement failed; repl's still stands)
    reference_missing: str | None = None

    def ratio(self) -> float | None:
        if self.repl is None or not self.reference:
            return None
        return self.repl / self.reference

    def met(self) -> str:
        if self.repl is None:
            return "n/a"
        kind, bound = self.goal.kind, self.goal.value
        if kind == "report":
            return "n/a"
        if kind == "abs_le":
            return _yes(self.repl <= bound)
        if kind == "abs_eq":
            return _yes(self.repl == bound)
        ratio = self.ratio()
        if ratio is None:
            return "n/a"
        return _yes(ratio <= bound if kind == "ratio_le" else ratio >= bound)

    def cells(self) -> list[str]:
        repl = number(self.repl) if self.repl is not None else f"n/a ({self.missing or '?'})"
        ratio = self.ratio()
        return [
            self.figure,
            repl,
            f"n/a ({self.reference_missing})" if self.reference_missing else number(self.reference),
            _ratio_text(ratio, self.goal),
            self.goal.text,
            self.met(),
            number(self.floor),
        ]


def _ratio_text(ratio: float | None, goal: Goal) -> str:
    if ratio is None:
        return ""
    # a ratio that rounds onto its bound gets a third decimal, so "no" next to it reads right
    close = goal.kind in ("ratio_le", "ratio_ge") and abs(ratio - goal.value) < 0.005
    return f"{ratio:.3f}" if close else f"{ratio:.2f}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def number(value: float | None) -> str:
    """Readable and parseable: thousands separated by commas, 2-3 significant decimals."""
    if value is None:
        return ""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def render(rows: list[Row]) -> str:
    """The main table."""
    return grid(COLUMNS, [row.cells() for row in rows])


def grid(columns: Sequence[str], rows: list[list[str]]) -> str:
    """A Markdown pipe table, padded so it also reads as plain text (both tables use it)."""
    lines = [list(columns), *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]

    def line(cells: list[str]) -> str:
        padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(lines[0]), rule, *(line(cells) for cells in lines[1:])])
