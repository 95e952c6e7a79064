"""Readers that outlive a restart (rules C10): ``wait`` and ``follow`` ride out an outage.

When the daemon goes away (a restart, a crash, ``kill -9``), answers that it
is shutting down, or its store fails, a reader does not exit: it says so
once on stderr, tries again with a back-off that grows to at most 2 s, says
once more when it is back, and goes on from its cursor. Its cursor is the
daemon's, so what was printed and acknowledged before stays acknowledged,
and what was not comes again: at least once across the restart.

``--reconnect SECS`` (default 300, 0 = off) bounds one outage; after it the
reader exits 75 with the last reason. ``--timeout`` of a ``wait`` still
bounds the whole wait: ``deadline`` here, and ``TimedOut`` once it passes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

from repl_cli.api.client import Client
from repl_cli.cli.errors import UNAVAILABLE, CliError

T = TypeVar("T")

#: how long ``--reconnect`` tries by default, in seconds
DEFAULT_RECONNECT = 300.0
#: the first pause between two tries, doubled each time up to ``MAX_PAUSE``
FIRST_PAUSE = 0.1
MAX_PAUSE = 2.0


class TimedOut(Exception):
    """The wait's own ``--timeout`` passed while the daemon was away."""


def stderr_note(message: str) -> None:
    """One line ``repl: MESSAGE`` on stderr: an error, or an outage (the API logs those);
    nothing when stderr is closed (``2>&-``) or its reader left."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(f"repl: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass


class Outage:
    """The bookkeeping of riding out outages, with no clock or sleep of its own.

    ``lost(exc)`` tells the outage once, gives up (75) once ``seconds`` have
    passed since it began, and otherwise returns how long to pause before
    the next try: 0.1 s, doubling to ``MAX_PAUSE``. When that pause would
    reach ``deadline`` (a wait's own timeout), it returns what is left and
    sets ``timed_out``. ``back()`` tells that the reader is back. ``clock``
    is the caller's: ``time.monotonic`` here, the event loop's in ``aio``.
    """

    def __init__(
        self,
        seconds: float,
        addr: str,
        note: Callable[[str], None],
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.addr = addr
        self.note = note
        self.deadline = deadline
        self.clock = clock
        self.timed_out = False
        self._lost_at: float | None = None  # when the current outage began
        self._pause = FIRST_PAUSE

    def lost(self, exc: CliError, *, was_there: bool = True) -> float:
        """How long to pause after ``exc``; raises it again when it is no outage, or 75
        (``gave up after N s``) once the outage has lasted ``seconds``. ``was_there``: a
        daemon answered the reader before; riding out is for a daemon that was there, so a
        reader whose very first connection fails is refused at once."""
        if exc.status != UNAVAILABLE or not self.seconds or not was_there:
            raise exc
        now = self.clock()
        if self._lost_at is None:
            self._lost_at = now
            # what happened, without the advice to run the command again: it is being run
            reason = exc.message.rsplit(": ", 1)[0]
            self.note(f"{reason}; reconnecting for up to {self.seconds:g} s")
        if now - self._lost_at >= self.seconds:
            raise CliError(
                f"gave up after {self.seconds:g} s: {exc.message}", UNAVAILABLE, exc.code
            ) from None
        pause = min(self._pause, self._lost_at + self.seconds - now)
        self._pause = min(self._pause * 2, MAX_PAUSE)
        if self.deadline is not None and now + pause >= self.deadline:
            self.timed_out = True
            return max(0.0, self.deadline - now)
        return pause

    def back(self) -> None:
        if self._lost_at is not None:
            self._lost_at = None
            self._pause = FIRST_PAUSE
            self.note(f"reconnected to the daemon at {self.addr}")

    def remaining_ms(self) -> int | None:
        """What is left of the wait's own timeout, for the next wait request."""
        if self.deadline is None:
            return None
        return max(0, round((self.deadline - self.clock()) * 1000))


class Reconnect:
    """Runs a reader's steps again (on a new connection) while the daemon or its store is
    unavailable, sleeping between tries (``Outage`` decides how long)."""

    def __init__(
        self,
        client: Client,
        seconds: float,
        deadline: float | None = None,
        *,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.outage = Outage(seconds, client.addr, note or stderr_note, deadline)

    def run(self, step: Callable[[], T]) -> T:
        """``step()``, tried again until it is not refused as unavailable; any other error
        goes on at once (a stopped or missing session is no outage). ``TimedOut`` once the
        wait's own deadline passes while the daemon is away."""
        outage = self.outage
        while True:
            try:
                result = step()
            except CliError as exc:
                pause = outage.lost(exc, was_there=self.client.connected_once)
                self.client.close()
                time.sleep(pause)
                if outage.timed_out:
                    raise TimedOut() from None
                continue
            outage.back()
            return result

    def remaining_ms(self) -> int | None:
        return self.outage.remaining_ms()
