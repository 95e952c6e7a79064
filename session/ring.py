"""The ring: the newest ``limit`` firings of a session, and its head.

Seqs are consecutive: the ring always holds the seqs ``head - len + 1`` to
``head``, so a firing's position follows from its seq and no search is
needed. Only the bound removes firings; reading never does.

``visible`` lets a caller hide the newest firings from readers (the daemon
shows only what its store has made durable); it defaults to the head, and a
value outside 0 to the head is clamped into it, so no cap can show a reader
a seq that was never recorded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from itertools import islice

from session.errors import BadLimit, BadMax, BadSeq, CursorAfterHead
from session.firing import Batch, Firing

DEFAULT_LIMIT = 256
MAX_LIMIT = 65_536


def check_limit(limit: int) -> int:
    if not 0 <= limit <= MAX_LIMIT:
        raise BadLimit(f"limit {limit} is outside 0 to {MAX_LIMIT:,}")
    return limit


class Ring:
    """The newest ``limit`` firings, the head, and reads after a seq."""

    __slots__ = ("_firings", "_head")

    def __init__(
        self, limit: int = DEFAULT_LIMIT, head: int = 0, firings: Iterable[Firing] = ()
    ) -> None:
        if head < 0:
            raise BadSeq(f"head {head} is negative")
        self._firings: deque[Firing] = deque(firings, maxlen=check_limit(limit))
        self._head = head
        # Every read finds a firing by its seq's offset from ``first``, so a ring
        # rebuilt from a store must hold exactly the seqs up to its head.
        if self._firings and (self._firings[0].seq != self.first or self._firings[-1].seq != head):
            raise BadSeq(
                f"firings {self._firings[0].seq} to {self._firings[-1].seq} "
                f"are not the newest {len(self._firings)} up to head {head}"
            )

    @property
    def head(self) -> int:
        """The seq of the newest firing ever recorded (0 when none)."""
        return self._head

    @property
    def limit(self) -> int:
        limit = self._firings.maxlen
        assert limit is not None
        return limit

    @property
    def retained(self) -> int:
        return len(self._firings)

    @property
    def first(self) -> int:
        """The seq of the oldest retained firing; ``head + 1`` when none is."""
        return self._head - len(self._firings) + 1

    @property
    def dropped(self) -> int:
        """How many firings the bound has removed so far."""
        return self._head - len(self._firings)

    def visible_head(self, visible: int | None = None) -> int:
        """The newest seq a reader capped at ``visible`` may see: within 0 to the head."""
        return self._head if visible is None else min(max(visible, 0), self._head)

    def firings(self) -> list[Firing]:
        return list(self._firings)

    def append(self, handler: str, result: str | None, event: str | None, ts: str) -> Firing:
        """Record the next firing; when the ring is full the oldest goes."""
        firing = Firing(self._head + 1, handler, result, event, ts)
        self._head += 1
        self._firings.append(firing)
        return firing

    def set_limit(self, limit: int) -> int:
        """Change the bound, keeping the newest; returns how many firings it trimmed."""
        check_limit(limit)
        before = len(self._firings)
        self._firings = deque(self._firings, maxlen=limit)
        return before - len(self._firings)

    def events_after(self, after: int, max: int | None = None, visible: int | None = None) -> Batch:
        """The firings with seq > ``after``, oldest first, at most ``max`` (SPEC rule 3)."""
        head = self.visible_head(visible)
        if after < 0:
            raise BadSeq(f"seq {after} is negative")
        if after > head:
            raise CursorAfterHead(f"cursor {after} is after head {head}")
        if max is not None and max < 1:
            raise BadMax(f"max {max} is below 1")
        first = self.first
        lost = max_(0, min(first, head + 1) - after - 1)
        start = max_(after + 1, first)
        stop = head + 1 if max is None else min(head + 1, start + max)
        firings = self._slice(start - first, stop - first) if stop > start else []
        return Batch(firings[-1].seq if firings else after + lost, lost, firings)

    def _slice(self, start: int, stop: int) -> list[Firing]:
        # A deque is cheap to walk from either end, so walk from the nearer one.
        size = len(self._firings)
        if start <= size - stop:
            return list(islice(self._firings, start, stop))
        tail = list(islice(reversed(self._firings), size - stop, size - start))
        tail.reverse()
        return tail


max_ = max
