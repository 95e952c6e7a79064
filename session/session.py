"""A session: its ring, its cursors, its dedup keys, and the operations on them.

Every public method validates everything before it changes anything, so a
method that raises leaves the session exactly as it was. ``evaluations``
counts the operations that touched the session's state; the daemon reports
it so that a test can see that an idle waiter costs nothing.

``visible`` on the read operations caps what readers may see at a seq below
the head; the daemon passes the seq its store has made durable, so a reader
never sees a firing that a crash could still take back.

A session also tracks what changed since a store was last handed its state:
``changes`` counts the operations that changed something (so a caller can
tell whether the one it ran did), and ``take_delta`` returns the change as a
``Delta`` and starts tracking afresh. A new session's first delta is a
reset: it rewrites whatever a store held under its id.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import msgspec

from session.delta import CursorState, Delta
from session.errors import AckAfterHead, BadCursorName, BadHandler, BadKey, BadSeq, BadSessionId
from session.firing import Batch, CursorInfo, Firing
from session.ring import Ring
from session.rules import (
    DEFAULT_LIMIT,
    HANDLERS,
    MAX_CURSORS,
    MAX_KEY_LENGTH,
    MAX_KEYS,
    MAX_NAME_LENGTH,
    POLL_CURSOR,
)

_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_session_id(session_id: str) -> str:
    if not _SESSION_ID.fullmatch(session_id):
        raise BadSessionId(
            f"session id {session_id!r} is not 1-64 of A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return session_id


def _is_name(name: str) -> bool:
    # Every whitespace character but the ASCII space is already unprintable
    # (a control or separator), so one substring test finishes the rule; a
    # per-character isspace() scan cost ten times as much on every send and ack.
    return 0 < len(name) <= MAX_NAME_LENGTH and name.isprintable() and " " not in name


def check_cursor_name(name: str) -> str:
    if not _is_name(name):
        raise BadCursorName(
            f"cursor name {name!r} is not 1-64 printable characters without whitespace"
        )
    return name


def check_handler(handler: str) -> str:
    if not _is_name(handler):
        raise BadHandler(
            f"handler name {handler!r} is not 1-64 printable characters without whitespace"
        )
    return handler


def check_key(key: str) -> str:
    if not 0 < len(key) <= MAX_KEY_LENGTH:
        raise BadKey(f"dedup key must be 1-{MAX_KEY_LENGTH} characters, got {len(key)}")
    return key


class Recorded(msgspec.Struct, frozen=True):
    """What a send returns: its seq, and whether an earlier send with its key had it."""

    seq: int
    duplicate: bool = False


class Summary(msgspec.Struct, frozen=True):
    """A session's figures as ``sessions`` and ``stats`` list them.

    ``head`` is the newest seq readers may see; ``recorded`` the newest
    recorded (they differ only while a firing is on its way to the disk).
    """

    id: str
    head: int
    retained: int
    limit: int
    cursors: int
    recorded: int
    lost: int
    evaluations: int


class Snapshot(msgspec.Struct, frozen=True):
    """Everything a store must keep to bring a session back exactly."""

    id: str
    limit: int
    head: int
    firings: list[Firing]
    cursors: list[CursorState]
    uses: int
    keys: list[tuple[str, int]]


class Session:
    """A named inbox. See SPEC.md §3 for the rules each method keeps."""

    __slots__ = (
        "_cursors",
        "_keys",
        "_new_keys",
        "_persisted",
        "_reset",
        "_uses",
        "changes",
        "dirty",
        "evaluations",
        "id",
        "ring",
    )

    def __init__(self, session_id: str, limit: int = DEFAULT_LIMIT) -> None:
        self.id = check_session_id(session_id)
        self.ring = Ring(limit)
        self.evaluations = 0
        #: operations that changed the session's state, ever
        self.changes = 0
        #: whether anything changed since the last ``take_delta``
        self.dirty = True
        self._reset = True
        self._persisted = 0  # the head as of the last delta
        self._new_keys: list[tuple[str, int]] = []
        # name -> [seq, last_use], least recently used first; last_use is a
        # logical clock, not time. Keeping the dict in use order makes the
        # eviction O(1) and lets a snapshot list the cursors in the one order
        # that restore rebuilds.
        self._cursors: dict[str, list[int]] = {}
        self._uses = 0
        self._keys: OrderedDict[str, int] = OrderedDict()

    # -- recording --------------------------------------------------------

    @property
    def head(self) -> int:
        return self.ring.head

    def record(self, handler: str, text: str, ts: str, key: str | None = None) -> Recorded:
        """Record a firing for ``handler`` (SPEC rules 1, 2, 13)."""
        check_handler(handler)
        if key is not None:
            check_key(key)
            seq = self._keys.get(key)
            if seq is not None:
                self.evaluations += 1
                return Recorded(seq, duplicate=True)
        if handler in HANDLERS:
            seq = self.ring.record(handler, text, None, ts)
        else:
            seq = self.ring.record(handler, None, text, ts)
        if key is not None:
            self._keys[key] = seq
            self._new_keys.append((key, seq))
            if len(self._new_keys) > MAX_KEYS:
                # more new keys than a store keeps: a rewrite hands over the same keys,
                # and a session no store takes deltas from (--memory) stays bounded
                self._new_keys = []
                self._reset = True
            if len(self._keys) > MAX_KEYS:
                self._keys.popitem(last=False)
        self.evaluations += 1
        self.changes += 1
        self.dirty = True
        return Recorded(seq)

    def set_limit(self, limit: int) -> int:
        """Change the ring bound; returns how many firings it trimmed."""
        trimmed = self.ring.set_limit(limit)
        self.evaluations += 1
        self.changes += 1
        self.dirty = True
        return trimmed

    # -- reading ----------------------------------------------------------

    def read_after(self, after: int, max: int | None = None, visible: int | None = None) -> Batch:
        """Read without a cursor: nothing about the session changes but the count."""
        batch = self.ring.events_after(after, max, visible, what="after")
        self.evaluations += 1
        return batch

    def read(
        self, cursor: str, max: int | None = None, visible: int | None = None, touch: bool = True
    ) -> Batch:
        """Read after ``cursor``'s position; an unknown cursor reads from 0.

        The read is a use of the cursor (it is created if new) unless
        ``touch`` is false, as for a peek.
        """
        check_cursor_name(cursor)
        entry = self._cursors.get(cursor)
        batch = self.ring.events_after(entry[0] if entry else 0, max, visible)
        if touch:
            self._use(cursor)
        self.evaluations += 1
        return batch

    def check_ack(self, seq: int, visible: int | None = None) -> None:
        """Raise what ``ack`` would raise for ``seq``, changing nothing."""
        head = self.ring.visible_head(visible)
        if seq < 0:
            raise BadSeq(f"seq {seq} is negative")
        if seq > head:
            raise AckAfterHead(f"cannot ack {seq}: head is {head}")

    def ack(self, cursor: str, seq: int, visible: int | None = None) -> int:
        """Move ``cursor`` to ``max(current, seq)``; returns where it is (rule 5)."""
        check_cursor_name(cursor)
        self.check_ack(seq, visible)
        entry = self._use(cursor)
        entry[0] = max(entry[0], seq)
        self.evaluations += 1
        return entry[0]

    def poll(self, max: int | None = None, visible: int | None = None) -> Batch:
        """Read after cursor ``poll`` and ack it in one step (rule 7)."""
        entry = self._cursors.get(POLL_CURSOR)
        batch = self.ring.events_after(entry[0] if entry else 0, max, visible)
        entry = self._use(POLL_CURSOR)
        entry[0] = max_(entry[0], batch.next)
        self.evaluations += 1
        return batch

    def _use(self, cursor: str) -> list[int]:
        """Mark a use of ``cursor``, creating it at 0 and evicting the LRU one if needed."""
        self._uses += 1
        self.changes += 1
        self.dirty = True
        entry = self._cursors.pop(cursor, None)
        if entry is None:
            if len(self._cursors) >= MAX_CURSORS:
                del self._cursors[next(iter(self._cursors))]
            entry = [0, self._uses]
        else:
            entry[1] = self._uses
        self._cursors[cursor] = entry
        return entry

    # -- inspection -------------------------------------------------------

    def cursor_table(self, visible: int | None = None) -> list[CursorInfo]:
        """The cursors, most recently used first, with their lag behind the head."""
        head = self.ring.visible_head(visible)
        rows = reversed(self._cursors.items())
        return [CursorInfo(name, seq, max_(0, head - seq)) for name, (seq, _) in rows]

    def cursor_position(self, cursor: str) -> int | None:
        entry = self._cursors.get(cursor)
        return None if entry is None else entry[0]

    def cursor_states(self) -> list[CursorState]:
        """The cursor table as a store keeps it: least recently used first, with last uses."""
        return [CursorState(name, seq, use) for name, (seq, use) in self._cursors.items()]

    @property
    def uses(self) -> int:
        """The logical clock that orders cursor uses."""
        return self._uses

    def summary(self, visible: int | None = None) -> Summary:
        """The figures ``sessions`` and ``stats`` list; looking is not an evaluation."""
        ring = self.ring
        return Summary(
            id=self.id,
            head=ring.visible_head(visible),
            retained=ring.retained,
            limit=ring.limit,
            cursors=len(self._cursors),
            recorded=ring.head,
            lost=ring.dropped,
            evaluations=self.evaluations,
        )

    # -- handing changes to a store --------------------------------------

    def take_delta(self) -> Delta:
        """What changed since the last delta (everything, after a reset); tracking starts afresh."""
        ring = self.ring
        if self._reset:
            firings = ring.firings()
            keys = list(self._keys.items())
        else:
            firings = ring.events_after(min(self._persisted, ring.head)).firings
            keys = self._new_keys
        delta = Delta(
            self.id,
            reset=self._reset,
            limit=ring.limit,
            head=ring.head,
            uses=self._uses,
            retained=ring.retained,
            firings=firings,
            cursors=self.cursor_states(),
            keys=keys,
            max_keys=MAX_KEYS,
        )
        self._reset = self.dirty = False
        self._new_keys = []
        self._persisted = ring.head
        return delta

    def mark_reset(self) -> None:
        """Make the next delta rewrite the whole session (after a store lost track of it)."""
        self._reset = self.dirty = True
        self._new_keys = []

    # -- persistence ------------------------------------------------------

    def snapshot(self) -> Snapshot:
        return Snapshot(
            id=self.id,
            limit=self.ring.limit,
            head=self.ring.head,
            firings=self.ring.firings(),
            cursors=self.cursor_states(),
            uses=self._uses,
            keys=list(self._keys.items()),
        )

    @classmethod
    def restore(cls, snapshot: Snapshot) -> Session:
        """Rebuild a session from a snapshot taken by :meth:`snapshot`.

        Only the 16 most recently used cursors and the newest 1,024 keys come
        back, whatever the store held.
        """
        session = cls(snapshot.id, snapshot.limit)
        session.ring = Ring(snapshot.limit, snapshot.head, snapshot.firings)
        ordered = sorted(snapshot.cursors, key=lambda c: c.last_use)[-MAX_CURSORS:]
        session._cursors = {c.name: [c.seq, c.last_use] for c in ordered}
        session._uses = max_([snapshot.uses, *(c.last_use for c in ordered)])
        session._keys = OrderedDict(snapshot.keys[-MAX_KEYS:])
        # it is as stored: nothing to hand back until it changes
        session._reset = session.dirty = False
        session._persisted = snapshot.head
        return session


max_ = max
