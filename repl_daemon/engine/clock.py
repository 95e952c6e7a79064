"""The daemon's clock: the stamp of a firing, and the wall time timers are due by.

Timers are due at wall-clock times (SPEC §9: ``--at`` names one), so they
are kept in milliseconds since the epoch, UTC, and the daemon sleeps until
the next one by the wall clock; a clock stepped back or forth only moves
when it wakes, never how many times a due time fires.
"""

from __future__ import annotations

import time

_second: list[tuple[int, str]] = [(-1, "")]


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds, e.g. ``2026-11-30T07:00:00.123Z``.

    Every send stamps one; formatting the date once a second keeps it cheap.
    """
    now = time.time()
    second = int(now)
    cached, prefix = _second[0]
    if cached != second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second[0] = (second, prefix)
    return f"{prefix}.{int((now - second) * 1000):03d}Z"


def now_ms() -> int:
    """Now in milliseconds since the epoch, UTC: the clock timers are due by."""
    return time.time_ns() // 1_000_000


def ms_to_utc(ms: int) -> str:
    """``ms`` since the epoch as ISO 8601 UTC with milliseconds."""
    second, milli = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + f".{milli:03d}Z"
