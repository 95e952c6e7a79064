"""The daemon's clock: the stamp of a firing, and the wall time timers are due by.

Timers are due at wall-clock times (rules T1-T6: ``--at`` names one), so they
are kept in milliseconds since the epoch, UTC, and the daemon sleeps until
the next one by the wall clock; a clock stepped back or forth only moves
when it wakes, never how many times a due time fires.

``Clock`` is that clock as one object, handed to the engine, its committer
and the shared timers when they are made, so nothing of theirs reads the
time any other way. ``REAL`` is the one a daemon runs on; a test hands its
own (one it moves by hand, tests/helpers/daemons.py ``MovedClock``), and a timer
task sleeping on it wakes when it is moved. The module functions are the
real clock's, for whatever has no clock to be handed (the CLI, the stores).

A woken wait's settle (rule S8: its quiet gap and its settle time) is timed
on the clock too, with ``monotonic`` and ``call_at``: the real clock's are
the event loop's own, which a stepped wall clock does not move; a test's
clock fires them when it is moved, so no test waits for a settle to pass.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Protocol

import anyio

from session.firing import TS_SECONDS, ms_to_ts

_second: list[tuple[int, str]] = [(-1, "")]


def utc_now() -> str:
    """Now as ISO 8601 UTC with milliseconds, e.g. ``2026-11-30T07:00:00.123Z``.

    Every send stamps one; formatting the date once a second keeps it cheap.
    """
    now = time.time()
    second = int(now)
    cached, prefix = _second[0]
    if cached != second:
        prefix = time.strftime(TS_SECONDS, time.gmtime(second))
        _second[0] = (second, prefix)
    return f"{prefix}.{int((now - second) * 1000):03d}Z"


def now_ms() -> int:
    """Now in milliseconds since the epoch, UTC: the clock timers are due by."""
    return time.time_ns() // 1_000_000


#: ``ms`` since the epoch as ISO 8601 UTC with milliseconds
ms_to_utc = ms_to_ts


class Timer(Protocol):
    """What ``Clock.call_at`` gives: a call that can be called off (``asyncio.TimerHandle``)."""

    def cancel(self) -> None: ...


class Clock:
    """The wall clock as the daemon reads it: this one is the real one."""

    def now_ms(self) -> int:
        """Now in milliseconds since the epoch, UTC."""
        return now_ms()

    def utc_now(self) -> str:
        """Now as ISO 8601 UTC with milliseconds: a firing's stamp."""
        return utc_now()

    async def sleep_until(self, due_ms: int | None, wake: anyio.Event) -> None:
        """Return once this clock reaches ``due_ms`` (never, when None) or ``wake`` is set.

        The timer tasks' one sleep: it may return early (the caller looks at
        the clock again), never late by more than the event loop's own delay.
        """
        delay = math.inf if due_ms is None else due_ms / 1000 - time.time()
        with anyio.move_on_after(delay):
            await wake.wait()

    def monotonic(self) -> float:
        """Seconds on a clock that only goes forward (the running event loop's)."""
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Call ``callback`` in the running event loop once ``monotonic`` reaches ``when``."""
        return asyncio.get_running_loop().call_at(when, callback)


#: the clock a daemon runs on
REAL = Clock()
