"""Scheduled firings (rules T1-T6): timers, their arithmetic, and the schedule of a daemon.

Pure and synchronous, with the clock passed in (milliseconds since the
epoch, UTC), so every rule here is tested without waiting:

- ``parse_duration`` (``250ms``, ``90s``, ``5m``, ``1h30m``, ``2d``),
  ``parse_time`` (RFC 3339) and ``parse_every`` (a duration of at least
  ``MIN_EVERY_MS``) refuse what does not parse with ``BadTime``, naming it;
- ``fire(timer, now)``: a timer due at or before ``now`` fires **once**; a
  one-shot is then gone, a recurring one moves to the first point of its
  grid (``due + k * every``) after ``now``, so however many periods a
  stopped daemon missed, they fire once and the schedule keeps its phase
  (systemd's ``Persistent=true``);
- ``Schedule``: the due times of every pending timer of a daemon in one
  heap, earliest first, so the daemon sleeps until ``next_due`` and never
  polls; the sessions hold the timers themselves (``Session.timers``).

A time in the past is not refused: the timer is due at once and fires on
the next turn (as ``at`` and systemd do), which is also what a restart
after downtime does.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import msgspec

from session.errors import BadTime
from session.rules import MAX_TIMERS, MIN_EVERY_MS, TICK_HANDLER

__all__ = [
    "MAX_TIMERS",
    "MIN_EVERY_MS",
    "TICK_HANDLER",
    "Schedule",
    "Timer",
    "fire",
    "parse_duration",
    "parse_every",
    "parse_time",
]
#: the latest due time a timer may have (9999-12-31, within what a double holds exactly)
MAX_DUE_MS = 253_402_300_799_999

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"([0-9]{1,15})(ms|s|m|h|d)")  # 15 digits of days pass the year 9999


class Timer(msgspec.Struct, frozen=True, kw_only=True):
    """A pending timer: it records ``handler``/``text`` in ``session`` at ``due_ms``."""

    id: str
    session: str
    due_ms: int
    every_ms: int | None = None  # None: a one-shot
    handler: str
    text: str
    key: str | None = None  # the dedup key that made it (a retried schedule finds it)
    tags: dict[str, str] | None = None  # what each of its firings carries (None: none)


def timer_order(timer: Timer) -> tuple[int, str, str]:
    """The order timers are listed and fired in: soonest first, then by session and id."""
    return timer.due_ms, timer.session, timer.id


def parse_duration(text: str) -> int:
    """``text`` (``250ms``, ``90s``, ``5m``, ``1h30m``, ``2d``) in milliseconds, above 0."""
    compact = text.strip()
    parts = _PART.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise BadTime(
            f"duration {text!r} is not a number and a unit (ms, s, m, h, d), "
            "for example 250ms, 90s, 5m or 1h30m"
        )
    total = sum(int(n) * _UNITS_MS[u] for n, u in parts)
    if total <= 0:
        raise BadTime(f"duration {text!r} is not above zero")
    return total


def parse_every(text: str) -> int:
    """A recurring timer's interval, in milliseconds: a duration of at least 1 s."""
    every = parse_duration(text)
    if every < MIN_EVERY_MS:
        raise BadTime(f"interval {text!r} is under {MIN_EVERY_MS // 1000} s, the shortest")
    return every


def parse_time(text: str) -> int:
    """An RFC 3339 time (``2026-12-01T05:00:00Z``, an offset, or UTC when it names none)
    in milliseconds since the epoch."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadTime(f"time {text!r} is not RFC 3339, for example 2026-12-01T05:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return round(when.timestamp() * 1000)


def fire(timer: Timer, now_ms: int) -> tuple[bool, Timer | None]:
    """Whether ``timer`` fires at ``now_ms``, and what is left of it after.

    Not due: (False, timer). Due: (True, None) for a one-shot, which is then
    gone; (True, the timer moved to its next grid point after ``now_ms``)
    for a recurring one: one firing for every period missed.
    """
    if timer.due_ms > now_ms:
        return False, timer
    if timer.every_ms is None:
        return True, None
    periods = (now_ms - timer.due_ms) // timer.every_ms + 1
    return True, msgspec.structs.replace(timer, due_ms=timer.due_ms + periods * timer.every_ms)


class Schedule:
    """When each pending timer of a daemon is due, earliest first: what it sleeps until.

    An index, not the truth: the sessions hold their timers, and ``live``
    (``live(session_id, timer_id, due_ms)``, true while that timer is still
    pending at that due time) tells a current entry from one left behind by
    a cancel, a stop or a move. Adding is O(log n) and a cancel costs
    nothing here; an entry left behind is dropped when it surfaces, or all
    at once by ``rebuild``.
    """

    def __init__(self, live: Callable[[str, str, int], bool]) -> None:
        self._live = live
        self._heap: list[tuple[int, str, str]] = []  # (due, session, timer)

    def __len__(self) -> int:
        """The entries held, current or left behind."""
        return len(self._heap)

    def add(self, timer: Timer) -> None:
        """Index ``timer`` at its due time (a new one, or one that moved)."""
        heapq.heappush(self._heap, timer_order(timer))

    def add_at(self, due_ms: int, session_id: str, timer_id: str) -> None:
        """Index an entry that is no ``Timer`` (a session's groups' next deadline, under
        an id no timer can have) at ``due_ms``."""
        heapq.heappush(self._heap, (due_ms, session_id, timer_id))

    def next_due(self) -> int | None:
        """When the earliest pending timer is due; None when there is none."""
        heap = self._heap
        while heap and not self._live(heap[0][1], heap[0][2], heap[0][0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def take_due(self, now_ms: int) -> dict[str, list[str]]:
        """Every timer due at or before ``now_ms``, by session, earliest first.

        Their entries leave the index: the caller fires them
        (``Session.fire_timers``) and ``add``s back the ones that moved.
        """
        due: dict[str, dict[str, None]] = {}  # ordered sets: an entry may be there twice
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            when, session_id, timer_id = heapq.heappop(heap)
            if self._live(session_id, timer_id, when):
                due.setdefault(session_id, {})[timer_id] = None
        return {session_id: list(ids) for session_id, ids in due.items()}

    def rebuild(
        self, timers: Iterable[Timer], entries: Iterable[tuple[int, str, str]] = ()
    ) -> None:
        """Index exactly ``timers`` (every pending one) and ``entries`` (``add_at``'s),
        dropping what was left behind."""
        self._heap = [timer_order(t) for t in timers]
        self._heap.extend(entries)
        heapq.heapify(self._heap)
