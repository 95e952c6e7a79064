"""What a daemon learned of each session's head from Redis, to notice Redis taking it back.

While a session lives its head never goes back: every firing takes the
next seq. A Redis that loses answered writes breaks that: a failover to a
replica that lagged (changes that did not wait for a replica, ``?replicas=0``),
or a Redis restarted from older data. The session's head is then below
seqs that were answered, and the next firings take those seqs again, for
other texts. The daemon cannot undo it, but it can see it and say so.

The comparison is made against what the daemon knew *when it sent* the
operation, never against answers that came in meanwhile: operations on
their way at once may be answered in any order (on a cluster with
``?replicas=N`` each change has a connection of its own), but one sent after
an answer arrived ran in Redis after that answer's change, so it must find
the head at least where that answer left it. Each session's start writes a
random incarnation into its ``meta`` hash, and every answer that carries the
head carries it too: a session stopped and started again (here or on
another daemon) starts at seq 1 legitimately, and heads are compared within
one incarnation only. A session made by a daemon too old to write one has
no incarnation, and is never compared.

Pure: no I/O, no clock, no asyncio; ``repl_daemon.backends.redis.store`` calls
``before`` as it sends an operation and ``learned`` with its answer.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the most sessions whose heads are kept (then all are forgotten: a miss, never a false alarm)
MAX_WATCHED = 65_536

#: what the daemon knew of a session's head when it sent an operation: (incarnation, the
#: highest head learned in it, epoch); the epoch is bumped each time the head is seen going
#: back, so what was on its way then is not compared again. A plain tuple: one is made each
#: time a send moves the head, on the send path.
Known = tuple[bytes, int, int]


@dataclass(frozen=True)
class WentBack:
    """A session's head, as Redis answered, below one the daemon had learned before."""

    session: str
    #: the head the daemon knew when it sent the operation
    highest: int
    #: the head the operation found in Redis
    head: int
    #: the first time for this session since the daemon started (log it)
    first: bool


class Heads:
    """The highest head learned from Redis per session, within its incarnation."""

    def __init__(self, bound: int = MAX_WATCHED) -> None:
        self.bound = bound
        self._known: dict[str, Known] = {}
        #: the sessions whose head went back already (each is logged once)
        self._told: set[str] = set()
        #: how many times a head was seen going back
        self.went_back = 0

    def before(self, session_id: str) -> Known | None:
        """What is known of the session now: pass it to ``learned`` with the answer."""
        return self._known.get(session_id)

    def learned(
        self, session_id: str, before: Known | None, incarnation: bytes, found: int, head: int
    ) -> WentBack | None:
        """An answer: the operation ``found`` the head there and left it at ``head``.

        A send found its seq less one; a read, or a send its key deduplicated,
        found the head it left. ``before`` is what ``before`` said when the
        operation was sent. Returns the head's going back, if it went back.
        """
        if not incarnation:  # a session that does not say which it is: not compared
            return None
        known = self._known.get(session_id)
        if known is None or known[0] != incarnation:
            if known is None and len(self._known) >= self.bound:
                self._known.clear()
            self._known[session_id] = (incarnation, head, 0)
            return None
        if (
            before is not None
            and found < before[1]
            and before[0] == incarnation
            and before[2] == known[2]
        ):
            self._known[session_id] = (incarnation, head, known[2] + 1)
            self.went_back += 1
            first = session_id not in self._told
            if first:
                if len(self._told) >= self.bound:
                    self._told.clear()
                self._told.add(session_id)
            return WentBack(session_id, before[1], found, first)
        if head > known[1]:
            self._known[session_id] = (incarnation, head, known[2])
        return None

    def incarnation(self, session_id: str) -> bytes | None:
        """The session's incarnation as the daemon's last answer about it said (None when
        it has had none, or it says none)."""
        known = self._known.get(session_id)
        return None if known is None else known[0]

    def forget(self, session_id: str) -> None:
        """The session was stopped: nothing more to compare."""
        self._known.pop(session_id, None)
