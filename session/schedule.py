"""Scheduled firings (SPEC §9): timers, their arithmetic, and the schedule of a daemon.

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
- ``Schedule``: every pending timer of a daemon in one heap, earliest
  first, so the daemon sleeps until ``next_due`` and never polls; a
  cancelled timer leaves its heap entry behind until it surfaces.

A time in the past is not refused: the timer is due at once and fires on
the next turn (as ``at`` and systemd do), which is also what a restart
after downtime does.
"""

from __future__ import annotations

import heapq
import re
from datetime import UTC, datetime

import msgspec

from session.errors import BadTime

#: the shortest interval of a recurring timer
MIN_EVERY_MS = 1000
#: the most timers one session may have pending
MAX_TIMERS = 1024
#: the handler of a recurring firing unless it names another (its result is the text)
TICK_HANDLER = "on-tick"

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d)")


class Timer(msgspec.Struct, frozen=True, kw_only=True):
    """A pending timer: it records ``handler``/``text`` in ``session`` at ``due_ms``."""

    id: str
    session: str
    due_ms: int
    every_ms: int | None = None  # None: a one-shot
    handler: str
    text: str
    key: str | None = None  # the dedup key that made it (a retried schedule finds it)


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
    """Every pending timer, earliest first: what a daemon sleeps until, with no polling."""

    def __init__(self) -> None:
        self._timers: dict[str, Timer] = {}
        self._heap: list[tuple[int, str]] = []  # (due, id); a stale entry is skipped

    def __len__(self) -> int:
        return len(self._timers)

    def __contains__(self, timer_id: object) -> bool:
        return timer_id in self._timers

    def get(self, timer_id: str) -> Timer | None:
        return self._timers.get(timer_id)

    def timers(self) -> list[Timer]:
        """Every pending timer, soonest first (then by id)."""
        return sorted(self._timers.values(), key=lambda t: (t.due_ms, t.id))

    def add(self, timer: Timer) -> None:
        """Schedule ``timer`` (replacing a pending one with its id)."""
        self._timers[timer.id] = timer
        heapq.heappush(self._heap, (timer.due_ms, timer.id))

    def cancel(self, timer_id: str) -> Timer | None:
        """Forget a timer; the one it was, or None when there is no such timer."""
        return self._timers.pop(timer_id, None)

    def next_due(self) -> int | None:
        """When the earliest pending timer is due; None when there is none."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def take_due(self, now_ms: int) -> list[Timer]:
        """Remove and return every timer due at or before ``now_ms``, earliest first.

        The caller fires each (``fire``) and ``add``s back what is left of it.
        """
        due: list[Timer] = []
        while True:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now_ms:
                return due
            _, timer_id = heapq.heappop(self._heap)
            due.append(self._timers.pop(timer_id))

    def _drop_stale(self) -> None:
        """Pop heap entries whose timer was cancelled or moved."""
        heap, timers = self._heap, self._timers
        while heap:
            due, timer_id = heap[0]
            timer = timers.get(timer_id)
            if timer is not None and timer.due_ms == due:
                return
            heapq.heappop(heap)
