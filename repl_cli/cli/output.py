"""Every format the CLI prints, so that every verb prints the same way.

Firings (``read``, ``wait``, ``follow``, ``poll``) come in three formats,
rules C1-C11: text (``HANDLER: RESULT``, for people), ``--full`` (one
S-expression-like line a firing, strings as JSON literals) and ``--json``
(JSON Lines). ``FiringFormat.lines`` turns a batch into lines, each paired
with the seq that may be acknowledged once that line is delivered.

Listings (``sessions``, ``cursors``, ``stats``) are a rich table on a
terminal, tab-separated with a header line when piped, or JSON; which
columns each shows is decided here too, and so is how a ping's uptime reads.

Colour only on a terminal and never under ``NO_COLOR``; rich is imported
only then, because ``repl read`` piped into a program must start fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from repl_cli.cli.sink import write_text
from session.firing import Firing

if TYPE_CHECKING:
    from rich.console import Console

    from repl_daemon.protocol import (
        Pong,
        Sent,
        SessionInfo,
        StatsReply,
        TimerInfo,
        TimerSet,
        TokenInfo,
    )
    from session.firing import CursorInfo

TEXT = "text"
FULL = "full"
JSON = "json"

_encode = msgspec.json.Encoder().encode

# (text, rich style) pieces of one line; the style is used only in colour
Pieces = list[tuple[str, str]]


def json_string(text: str) -> str:
    """A JSON string literal, as ``json.dumps(text, ensure_ascii=False)`` writes it."""
    return _encode(text).decode()


def json_line(value: Any) -> str:
    """One line of JSON, spaced as ``json.dumps`` spaces it."""
    return msgspec.json.format(_encode(value), indent=0).decode()


def on_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def colour_wanted() -> bool:
    return on_terminal() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class FiringFormat:
    """How ``read``, ``wait``, ``follow`` and ``poll`` print a batch."""

    # a plain class, not a dataclass: importing dataclasses costs `repl read` time
    def __init__(
        self,
        style: str = TEXT,
        *,
        seq: bool = False,
        several: bool = False,
        colour: bool = False,
        ts: bool = False,
    ) -> None:
        self.style = style
        self.seq = seq  # text only: `#SEQ ` before each firing
        self.ts = ts  # text only: the firing's time (UTC) before it
        self.several = several  # waiting on several sessions: prefix lines with the id
        self.colour = colour

    def lines(
        self, session: str, next_seq: int, lost: int, firings: Sequence[Firing]
    ) -> list[tuple[str, int]]:
        """The batch's lines, each with the seq to acknowledge once it is delivered.

        The header (the loss line, ``NEXT LOST``, or the JSON header)
        acknowledges up to just before the first firing: the reader has
        been told of the loss.
        """
        before_first = firings[0].seq - 1 if firings else next_seq
        out: list[tuple[str, int]] = []
        header = self._header(session, next_seq, lost)
        if header is not None:
            out.append((header, before_first))
        out.extend((self._firing(session, f), f.seq) for f in firings)
        return out

    def _header(self, session: str, next_seq: int, lost: int) -> str | None:
        if self.style == JSON:
            head: dict[str, Any] = {"session": session} if self.several else {}
            head.update(next=next_seq, lost=lost)
            return json_line(head)
        if self.style == FULL:
            return self._paint([*self._prefix(session), (f"{next_seq} {lost}", "dim")])
        if lost:
            dropped = f"({lost} earlier firing{'s' if lost != 1 else ''} dropped)"
            return self._paint([*self._prefix(session), (dropped, "bold red")])
        return None

    def _firing(self, session: str, f: Firing) -> str:
        if self.style == JSON:
            obj: dict[str, Any] = {"session": session} if self.several else {}
            obj.update(msgspec.structs.asdict(f))  # every field of the firing, in its order
            return json_line(obj)
        pieces = self._prefix(session)
        if self.style == FULL:
            if f.result is not None or f.event is None:
                body = f"{json_string(f.handler)} {json_string(f.result or '')}"
            else:
                body = f"{json_string(f.handler)} nil {json_string(f.event)}"
            pieces += [(f"({f.seq} ", "dim"), (body, ""), (")", "dim")]
            return self._paint(pieces)
        if self.seq:
            pieces.append((f"#{f.seq} ", "dim"))
        if self.ts:
            pieces.append((f"{f.ts} ", "green"))
        if f.result is not None or f.event is None:
            pieces += [(f.handler, "bold cyan"), (": ", ""), (f.result or "", "")]
        else:
            pieces += [(f.handler, "bold yellow"), (" (unhandled)", "yellow"), (": ", "")]
            pieces.append((f.event, ""))
        return self._paint(pieces)

    def _prefix(self, session: str) -> Pieces:
        return [(session, "magenta"), (" ", "")] if self.several else []

    def _paint(self, pieces: Pieces) -> str:
        if not self.colour:
            return "".join(text for text, _ in pieces)
        from rich.text import Text

        console = _console()
        with console.capture() as captured:
            console.print(Text.assemble(*pieces), end="")
        return captured.get()


_consoles: list[Console] = []


def _console() -> Console:
    if not _consoles:
        from rich.console import Console

        _consoles.append(Console(highlight=False, soft_wrap=True))
    return _consoles[0]


# -- listings ---------------------------------------------------------------


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    title: str = "",
    whole: Sequence[str] = (),
) -> None:
    """A listing: a rich table on a terminal, else a header line and tab-separated rows.

    The cells of the ``whole`` columns are never cut short or wrapped (ids
    and times a user copies): a table too wide for the terminal is wrapped
    by the terminal instead. Without ``whole`` a cell wraps.
    """
    if on_terminal():
        from rich import box
        from rich.table import Table

        grid = Table(
            box=box.SIMPLE,
            pad_edge=False,
            title=title or None,
            title_justify="left",
            header_style="bold",
        )
        for name in columns:
            numeric = bool(rows) and all(isinstance(row[columns.index(name)], int) for row in rows)
            # a header is never cut short: a wide table wraps rather than truncates
            width = len(name)
            if name in whole:
                width = max([width, *(len(str(row[columns.index(name)])) for row in rows)])
            grid.add_column(
                name,
                justify="right" if numeric else "left",
                min_width=width,
                no_wrap=name in whole,
            )
        for row in rows:
            grid.add_row(*(str(cell) for cell in row))
        _console().print(grid)
        return
    lines = ["\t".join(columns)]
    lines.extend("\t".join(str(cell) for cell in row) for row in rows)
    write_text("\n".join(lines) + "\n")


SESSION_COLUMNS = ("id", "head", "retained", "limit", "cursors", "waiters")
CURSOR_COLUMNS = ("name", "seq", "lag")
STATS_COLUMNS: tuple[str, ...] = ("id", "head", "retained", "limit", "firings", "lost")
STATS_COLUMNS += ("evaluations", "waiters", "cursors")
DAEMON_COUNTERS: tuple[str, ...] = ("version", "uptime_s", "store", "sessions", "firings", "lost")
DAEMON_COUNTERS += ("evaluations", "waiters", "connections", "requests")
#: the daemon's counters as ``repl stats`` names them: those counted since it started say so
DAEMON_LABELS = {
    name: f"{name} since start" for name in ("firings", "lost", "evaluations", "requests")
}
DAEMON_LABELS["sessions"] = "sessions now"
DAEMON_LABELS["waiters"] = "waiters now"
DAEMON_LABELS["connections"] = "connections now"


def _rows(items: Sequence[Any], columns: Sequence[str]) -> list[list[Any]]:
    return [[getattr(item, name) for name in columns] for item in items]


def session_table(sessions: Sequence[SessionInfo]) -> None:
    """``repl sessions``."""
    table(SESSION_COLUMNS, _rows(sessions, SESSION_COLUMNS))


def cursor_table(cursors: Sequence[CursorInfo]) -> None:
    """``repl cursors ID``."""
    table(CURSOR_COLUMNS, _rows(cursors, CURSOR_COLUMNS))


def stats_tables(stats: StatsReply, *, with_daemon: bool) -> None:
    """``repl stats``: the daemon's counters (unless one session was asked for), then sessions."""
    if not with_daemon:
        table(STATS_COLUMNS, _rows(stats.sessions, STATS_COLUMNS))
        return
    # the daemon counts since it started, a session over its whole life: said on both
    counters = [
        [DAEMON_LABELS.get(name, name), getattr(stats.daemon, name)] for name in DAEMON_COUNTERS
    ]
    table(("counter", "value"), counters, title="the daemon, since it started")
    line("")
    table(
        STATS_COLUMNS,
        _rows(stats.sessions, STATS_COLUMNS),
        title="sessions, over each one's life (firings, lost, evaluations)",
    )


def token_table(tokens: Sequence[TokenInfo]) -> None:
    """``repl token list``: one row a scoped token, its patterns and rights comma-joined."""
    rows = [(t.name, ",".join(t.sessions), ",".join(t.can)) for t in tokens]
    table(("name", "sessions", "can"), rows, whole=("name",))


def pong(answer: Pong, addr: str) -> None:
    """``repl ping``: the daemon's version, address, pid, store and uptime."""
    line(
        f"repl daemon {answer.version} at {addr}, pid {answer.pid}, store {answer.store}, "
        f"up {duration(answer.uptime_s)}"
    )


def sent(answer: Sent, as_json: bool = False) -> None:
    """``repl send``: the seq, or ``SEQ duplicate`` for a deduplicated send; or JSON."""
    if as_json:
        print_answer(answer)
        return
    line(f"{answer.seq} duplicate" if answer.duplicate else str(answer.seq))


TIMER_COLUMNS = ("timer", "session", "due", "every", "handler", "text")
#: what ``send --in/--at --json`` and ``every --json`` print: the answer less its wire-only
#: fields (``ok``, ``due_ms``)
TIMER_SET_FIELDS = ("timer", "due", "every_ms", "duplicate", "seq")


def timer_set(answer: TimerSet, as_json: bool = False) -> None:
    """``repl send --in/--at`` and ``repl every``: the timer's id (``ID duplicate`` for a
    retry its key found; ``ID duplicate fired SEQ`` once that one fired); or JSON with
    ``timer``, ``due``, ``every_ms``, ``duplicate`` and ``seq`` (docs/protocol.md)."""
    if as_json:
        print_answer(answer, TIMER_SET_FIELDS)
        return
    if answer.seq is not None:
        line(f"{answer.timer} duplicate fired {answer.seq}")
    else:
        line(f"{answer.timer} duplicate" if answer.duplicate else answer.timer)


def timer_table(timers: Sequence[TimerInfo]) -> None:
    """``repl timers``: one row a pending timer, soonest first."""
    rows = [
        [
            t.timer,
            t.session,
            t.due,
            "" if t.every_ms is None else every(t.every_ms),
            t.handler,
            _shortened(t.text.translate(_ONE_LINE)),
        ]
        for t in timers
    ]
    table(TIMER_COLUMNS, rows, whole=("timer", "session", "due", "every", "handler"))


# a row is one line: a text's tab or newline is shown as its escape (``--json`` has it whole)
_ONE_LINE = str.maketrans({"\t": "\\t", "\n": "\\n", "\r": "\\r"})
#: how much of a timer's text its row shows on a terminal
TEXT_SHOWN = 32


def _shortened(text: str) -> str:
    return text if len(text) <= TEXT_SHOWN or not on_terminal() else text[: TEXT_SHOWN - 1] + "…"


def every(ms: int) -> str:
    """An interval as a duration repl takes back: ``1m``, ``1h30m``, ``1500ms``."""
    parts = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    if ms:
        parts.append(f"{ms}ms")
    return "".join(parts)


def duration(seconds: float) -> str:
    """An uptime as people read it: ``12.5 s``, ``3m 20s``, ``2h 5m 0s``, ``4d 1h 30m``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    return f"{minutes}m {secs}s"


def listing(rows: Sequence[Any], as_json: bool, shown: Callable[[Sequence[Any]], None]) -> None:
    """A list command's answer: one JSON document with ``--json``, else ``shown`` (its
    table)."""
    if as_json:
        print_json(rows)
        return
    shown(rows)


def print_json(value: Any) -> None:
    """A whole answer as one JSON document (``sessions``, ``cursors``, ``stats`` ``--json``)."""
    write_text(json_line(msgspec.to_builtins(value)) + "\n")


#: what every answer carries for the wire alone, and no printed object does
WIRE_ONLY = ("id", "ok")


def answer_fields(answer: msgspec.Struct, names: Sequence[str] | None = None) -> dict[str, Any]:
    """An answer's fields as JSON has them, less the wire's own (``WIRE_ONLY``), or only
    ``names``, in their order: taken from the answer's Struct, never copied field by field,
    so a field the wire adds is printed without a change here."""
    fields: dict[str, Any] = msgspec.to_builtins(answer)
    if names is None:
        return {name: value for name, value in fields.items() if name not in WIRE_ONLY}
    return {name: fields[name] for name in names}


def print_answer(answer: msgspec.Struct, names: Sequence[str] | None = None) -> None:
    """``--json`` of a command whose answer is the wire's: ``answer_fields``, one document."""
    print_json(answer_fields(answer, names))


def line(text: str) -> None:
    """One plain line of output (an id, a seq, a ping)."""
    write_text(text + "\n")
