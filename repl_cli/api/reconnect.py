"""Readers that outlive a restart (rules C10): ``wait`` and ``follow`` ride out an outage.

When the daemon goes away (a restart, a crash, ``kill -9``), answers that it
is shutting down, or its store fails, a reader does not give up: it says so
once (the ``repl`` logger, or the CLI's stderr), tries again with a back-off
that grows to at most 2 s, says once more when it is back, and goes on from
its cursor. Its cursor is the daemon's, so what was handled and
acknowledged before stays acknowledged, and what was not comes again: at
least once across the restart.

``reconnect`` seconds (default 300, 0 = off) bound one outage; after it the
reader raises ``Unavailable`` with the last reason. A wait's own timeout
still bounds the whole wait: ``deadline`` here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from repl_cli.api.errors import Error, Unavailable

#: how long ``--reconnect`` tries by default, in seconds
DEFAULT_RECONNECT = 300.0
#: the first pause between two tries, doubled each time up to ``MAX_PAUSE``
FIRST_PAUSE = 0.1
MAX_PAUSE = 2.0


def what_happened(exc: Error) -> str:
    """An outage's cause as its note tells it: the error's message without the advice that
    ends it (to run the command again: it is being run again). The client's own messages
    end with their advice; a daemon's, when it gives its own (``said_what_to_do``)."""
    from session.advice import said_what_to_do  # here: only an outage needs it

    if exc.code is not None and not said_what_to_do(exc.message):
        return exc.message
    return exc.message.rsplit(": ", 1)[0]


class Outage:
    """The bookkeeping of riding out outages, with no clock or sleep of its own.

    ``lost(exc)`` tells the outage once, gives up (``Unavailable``) once ``seconds`` have
    passed since it began, and otherwise returns how long to pause before
    the next try: 0.1 s, doubling to ``MAX_PAUSE``. When that pause would
    reach ``deadline`` (a wait's own timeout), it returns what is left and
    sets ``timed_out``. ``back()`` tells that the reader is back. ``clock``
    is the caller's: ``time.monotonic`` for the blocking API, the event loop's in ``aio``.
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

    def lost(self, exc: Error, *, was_there: bool = True) -> float:
        """How long to pause after ``exc``; raises it again when it is no outage, or
        ``Unavailable`` (``gave up after N s``) once the outage has lasted ``seconds``.
        ``was_there``: a daemon answered the reader before; riding out is for a daemon that
        was there, so a reader whose very first connection fails is refused at once."""
        if not isinstance(exc, Unavailable) or not self.seconds or not was_there:
            raise exc
        now = self.clock()
        if self._lost_at is None:
            self._lost_at = now
            self.note(f"{what_happened(exc)}; reconnecting for up to {self.seconds:g} s")
        if now - self._lost_at >= self.seconds:
            raise Unavailable(
                f"gave up after {self.seconds:g} s: {exc.message}", exc.code
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
