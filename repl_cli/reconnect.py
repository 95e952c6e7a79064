"""Readers that outlive a restart (SPEC §8): ``wait`` and ``follow`` ride out an outage.

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

from repl_cli.client import Client
from repl_cli.errors import UNAVAILABLE, CliError

T = TypeVar("T")

#: how long ``--reconnect`` tries by default, in seconds
DEFAULT_RECONNECT = 300.0
#: the first pause between two tries, doubled each time up to ``MAX_PAUSE``
FIRST_PAUSE = 0.1
MAX_PAUSE = 2.0


class TimedOut(Exception):
    """The wait's own ``--timeout`` passed while the daemon was away."""


def stderr_note(message: str) -> None:
    """How ``repl`` tells of an outage: one line on stderr (the API logs instead)."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(f"repl: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass


class Reconnect:
    """Runs a reader's steps again while the daemon or its store is unavailable."""

    def __init__(
        self,
        client: Client,
        seconds: float,
        deadline: float | None = None,
        *,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.seconds = seconds
        self.note = note or stderr_note
        self.deadline = deadline  # time.monotonic() past which a wait times out
        self._lost_at: float | None = None  # when the current outage began

    def run(self, step: Callable[[], T]) -> T:
        """``step()``, tried again (on a new connection) until it is not refused as unavailable.

        Any other error goes on at once: a stopped or missing session is no outage.
        """
        pause = FIRST_PAUSE
        while True:
            try:
                result = step()
            except CliError as exc:
                if exc.status != UNAVAILABLE or not self.seconds:
                    raise
                self.client.close()
                pause = self._wait_out(exc, pause)
                continue
            if self._lost_at is not None:
                self._lost_at = None
                self.note(f"reconnected to the daemon at {self.client.addr}")
            return result

    def _wait_out(self, exc: CliError, pause: float) -> float:
        """Note the outage (once), sleep the pause, and return the next; exit when out of time."""
        now = time.monotonic()
        if self._lost_at is None:
            self._lost_at = now
            # what happened, without the advice to run the command again: it is being run
            reason = exc.message.rsplit(": ", 1)[0]
            self.note(f"{reason}; reconnecting for up to {self.seconds:g} s")
        if now - self._lost_at >= self.seconds:
            raise CliError(
                f"gave up after {self.seconds:g} s: {exc.message}", UNAVAILABLE, exc.code
            ) from None
        sleep = min(pause, self._lost_at + self.seconds - now)
        if self.deadline is not None and now + sleep >= self.deadline:
            time.sleep(max(0.0, self.deadline - now))
            raise TimedOut()
        time.sleep(sleep)
        return min(pause * 2, MAX_PAUSE)

    def remaining_ms(self) -> int | None:
        """What is left of the wait's ``--timeout``, for the next wait request."""
        if self.deadline is None:
            return None
        return max(0, round((self.deadline - time.monotonic()) * 1000))
