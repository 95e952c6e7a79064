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

from collections import OrderedDict

import msgspec

from session.delta import CursorState, Delta, Webhook
from session.errors import (
    AckAfterHead,
    BadKey,
    BadMax,
    BadRequest,
    BadSeq,
    BadTime,
    CursorAfterHead,
    NoSuchSession,
    NoSuchTimer,
    SessionExists,
    TooMany,
    no_such_session,
)
from session.firing import NO_TAGS, Batch, CursorInfo, Firing
from session.group import GroupSnapshot
from session.groups import Groups
from session.names import check_cursor_name, check_handler, check_session_id, is_name
from session.ring import Fold, Image, Ring, check_last, only, since_of
from session.rules import (
    DEFAULT_LIMIT,
    HANDLERS,
    MAX_CURSORS,
    MAX_KEY_LENGTH,
    MAX_KEYS,
    MAX_SECRET_LENGTH,
    MAX_TIMERS,
    MIN_EVERY_MS,
    POLL_CURSOR,
)
from session.schedule import MAX_DUE_MS, Timer, fire, timer_order
from session.tags import TIMER, Match, check_tags


def no_session(session_id: str) -> NoSuchSession:
    """What an operation on a session that does not exist is refused: ``bad_session_id``
    for an id no session could have, else ``no_such_session``."""
    check_session_id(session_id)
    return no_such_session(session_id)


def session_exists(session_id: str) -> SessionExists:
    """What a ``start`` of a session that exists is refused, without ``exist_ok``."""
    return SessionExists(f"session {session_id!r} exists: stop it first, or pass --exist-ok")


def check_key(key: str) -> str:
    if not 0 < len(key) <= MAX_KEY_LENGTH:
        raise BadKey(f"dedup key must be 1-{MAX_KEY_LENGTH} characters, got {len(key)}")
    return key


def check_webhook(webhook: Webhook) -> Webhook:
    if not 0 < len(webhook.secret) <= MAX_SECRET_LENGTH:
        raise BadKey(f"a webhook secret must be 1-{MAX_SECRET_LENGTH} characters")
    check_handler(webhook.handler)
    return webhook


def check_timer(timer: Timer) -> Timer:
    """What a timer must be before a session takes it (rules T1-T6), its session's state aside."""
    if not is_name(timer.id):
        raise BadTime(f"timer id {timer.id!r} is not 1-64 printable characters without whitespace")
    check_handler(timer.handler)
    if timer.key is not None:
        check_key(timer.key)
    if timer.tags:
        check_tags(timer.tags)
    if not 0 <= timer.due_ms <= MAX_DUE_MS:
        raise BadTime(f"due time {timer.due_ms} ms is not between 1970 and the end of 9999")
    if timer.every_ms is not None:
        if timer.every_ms < MIN_EVERY_MS:
            raise BadTime(
                f"interval {timer.every_ms} ms is under {MIN_EVERY_MS // 1000} s, the shortest"
            )
        if timer.every_ms > MAX_DUE_MS:
            raise BadTime(f"interval {timer.every_ms} ms is longer than the calendar goes")
    return timer


# The refusals of a session's timers, made here for the core and for a store
# that applies the rules itself (the Redis scripts), so both say the same.


def timer_exists(session_id: str, timer_id: str) -> BadTime:
    return BadTime(f"session {session_id!r} has a timer {timer_id!r} already")


def too_many_timers(session_id: str) -> TooMany:
    return TooMany(
        f"session {session_id!r} has {MAX_TIMERS:,} pending timers, its limit: "
        "cancel some first (`repl timers` lists them)"
    )


def no_such_timer(session_id: str, timer_id: str) -> NoSuchTimer:
    return NoSuchTimer(
        f"session {session_id!r} has no pending timer {timer_id!r}: "
        "it fired, was cancelled, or never was"
    )


class Recorded(msgspec.Struct, frozen=True):
    """What a send returns: its seq, whether an earlier send with its key had it, and
    whether the ring keeps the new firing (not with a limit of 0: a reader after the seq
    before it is told of one lost firing instead)."""

    seq: int
    duplicate: bool = False
    retained: bool = True


class Summary(msgspec.Struct, frozen=True):
    """A session's figures as ``sessions`` and ``stats`` list them.

    ``head`` is the newest seq readers may see; ``recorded`` the newest
    recorded (they differ only while a firing is on its way to the disk);
    ``lag`` how far the furthest-behind cursor is from ``head`` (0 with none).
    """

    id: str
    head: int
    retained: int
    limit: int
    cursors: int
    recorded: int
    lost: int
    evaluations: int
    lag: int = 0


class Scheduled(msgspec.Struct, frozen=True):
    """What scheduling a timer returns: the timer, or the earlier one its key names.

    ``duplicate``: the key was used before; ``timer`` is the pending timer it
    made, or None when that one has fired already, as firing ``seq``.
    """

    timer: Timer | None
    duplicate: bool = False
    seq: int | None = None


class Fired(msgspec.Struct, frozen=True):
    """One timer a ``fire_timers`` was asked to fire: the firing it recorded (None: it
    was not due, or is not pending), and when it is due next (None: it is gone)."""

    timer: str
    seq: int | None
    due_ms: int | None


class Snapshot(msgspec.Struct, frozen=True):
    """Everything a store must keep to bring a session back exactly.

    ``firings`` are the ring's retained firings, oldest first; with an ``image`` (a store
    that keeps rings as they keep themselves, ``Ring.image``) they are the firings recorded
    after it, and the ring is the image (its items from the ring's first retained seq on)
    followed by them. With a ``fold`` the ring's firings are still in the store, which
    brings them in when the ring is first looked into (``Ring.folded``; ``firings`` and
    ``image`` are then empty).
    """

    id: str
    limit: int
    head: int
    firings: list[Firing]
    cursors: list[CursorState]
    uses: int
    keys: list[tuple[str, int]]
    timers: list[Timer] = []
    webhook: Webhook | None = None
    image: Image | None = None
    fold: Fold | None = None
    groups: list[GroupSnapshot] = []


class Session:
    """A named inbox. rules S1-S17 are the rules each method keeps."""

    __slots__ = (
        "_cursors",
        "_cursors_changed",
        "_keys",
        "_moved_timers",
        "_new_keys",
        "_persisted",
        "_reset",
        "_timer_changes",
        "_uses",
        "_webhook_changed",
        "changes",
        "dirty",
        "evaluations",
        "groups",
        "id",
        "ring",
        "timers",
        "webhook",
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
        #: a cursor moved, or was used, since the last delta
        self._cursors_changed = False
        self._uses = 0
        self._keys: OrderedDict[str, int] = OrderedDict()
        #: the pending timers (rules T1-T6), by id
        self.timers: dict[str, Timer] = {}
        # timers added, moved (a Timer) or gone (None) since the last delta
        self._timer_changes: dict[str, Timer | None] = {}
        # timers added or moved since the last ``take_moved_timers`` (a daemon's schedule)
        self._moved_timers: list[Timer] = []
        #: the session's webhook, if it has one (rules H1-H7)
        self.webhook: Webhook | None = None
        self._webhook_changed = False
        #: the session's groups and their claims (SPEC §16), ``session.groups``
        self.groups = Groups(self.id)

    # -- recording --------------------------------------------------------

    @property
    def head(self) -> int:
        return self.ring.head

    def record(
        self,
        handler: str,
        text: str,
        ts: str,
        *,
        key: str | None = None,
        handled: bool | None = None,
        tags: dict[str, str] = NO_TAGS,
        by: str | None = None,
    ) -> Recorded:
        """Record a firing for ``handler`` (rules S1, S2, S13), carrying ``tags``, sent by
        ``by`` (what the daemon knows sent it: a token's name, ``root``, ``timer``...).

        Its text is the result when the session has the handler (``HANDLERS``),
        else the event; ``handled`` says which instead (a webhook's firing is
        handled whatever its handler is named, rules H1-H7).
        """
        check_handler(handler)
        if key is not None:  # the order of ``ops.Record.check``: one request, one refusal
            check_key(key)
        if tags:
            check_tags(tags)
        if key is not None:
            seq = self._keys.get(key)
            if seq is not None:
                self.evaluations += 1
                return Recorded(seq, duplicate=True)
        if handler in HANDLERS if handled is None else handled:
            seq = self.ring.record(handler, text, None, ts, tags=tags, by=by)
        else:
            seq = self.ring.record(handler, None, text, ts, tags=tags, by=by)
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
        return Recorded(seq, retained=self.ring.limit > 0)

    def set_limit(self, limit: int) -> int:
        """Change the ring bound; returns how many firings it trimmed."""
        trimmed = self.ring.set_limit(limit)
        self.evaluations += 1
        self.changes += 1
        self.dirty = True
        return trimmed

    # -- reading ----------------------------------------------------------

    def read_after(
        self,
        after: int | None,
        max: int | None = None,
        visible: int | None = None,
        match: Match | None = None,
    ) -> Batch:
        """Read without a cursor: nothing about the session changes but the count. ``after``
        None is the whole ring (a matching reader's look with no position of its own)."""
        batch = self.ring.events_after(after, max, visible, "after", match)
        self.evaluations += 1
        return batch

    def read_recent(
        self,
        last: int | None,
        since: str | None,
        max: int | None = None,
        visible: int | None = None,
        match: Match | None = None,
    ) -> Batch:
        """The newest ``last`` firings, or (with ``since``) those recorded since a time, in
        one look: no cursor, nothing changed but the count. With ``last`` alone it reads
        after ``head - last``, so a loss is reported when the N reach back past the ring."""
        if last is not None:
            check_last(last)
        if max is not None and max < 1:
            raise BadMax(f"max {max} is below 1")
        if since is None:
            if last is None:
                raise BadRequest("a recent read needs last, since or both")
            head = self.ring.visible_head(visible)
            bound = last if max is None else min(last, max)
            batch = self.ring.events_after(max_(0, head - last), bound, visible, "after", match)
        else:
            whole = self.ring.events_after(0, None, visible, "after")
            batch = since_of(whole, since, last, max, match)
        self.evaluations += 1
        return batch

    def read_seq(self, seq: int, visible: int | None = None) -> Batch:
        """Firing ``seq`` alone: a batch of it, or of none with ``lost`` 1 when the ring no
        longer holds it; ``seq`` after the head is refused (there is no such firing yet)."""
        if seq < 1:
            raise BadSeq(f"seq {seq} names no firing: seqs start at 1")
        head = self.ring.visible_head(visible)
        if seq > head:
            raise CursorAfterHead(f"no firing {seq}: its head is {head}")
        batch = only(self.ring.events_after(seq - 1, 1, visible, "after"), seq)
        self.evaluations += 1
        return batch

    def read(
        self,
        cursor: str,
        max: int | None = None,
        visible: int | None = None,
        touch: bool = True,
        match: Match | None = None,
    ) -> Batch:
        """Read after ``cursor``'s position; an unknown cursor reads from 0.

        The read is a use of the cursor (it is created if new) unless
        ``touch`` is false, as for a peek. With ``match``, only the firings
        that match come back (``next`` is the last seq looked at).
        """
        check_cursor_name(cursor)
        entry = self._cursors.get(cursor)
        batch = self.ring.events_after(entry[0] if entry else 0, max, visible, "cursor", match)
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
        self.dirty = self._cursors_changed = True
        entry = self._cursors.pop(cursor, None)
        if entry is None:
            if len(self._cursors) >= MAX_CURSORS:
                del self._cursors[next(iter(self._cursors))]
            entry = [0, self._uses]
        else:
            entry[1] = self._uses
        self._cursors[cursor] = entry
        return entry

    # -- the webhook (rules H1-H7) -----------------------------------------------

    def set_webhook(self, webhook: Webhook | None) -> None:
        """Give the session a webhook secret and handler, or (None) take its webhook away."""
        if webhook is not None:
            check_webhook(webhook)
        self.webhook = webhook
        self._webhook_changed = True
        self._changed()
        self.evaluations += 1

    # -- timers (rules T1-T6) ----------------------------------------------------

    def schedule(self, timer: Timer) -> Scheduled:
        """Add a pending timer; with a ``key``, a retry finds what the first one made.

        A key names one message: a pending timer made with it, or a firing
        recorded with it (by that timer, or by a send), makes this a
        duplicate, and nothing is added. A one-shot records its firing with
        its key.
        """
        check_timer(timer)
        if timer.session != self.id:
            raise BadTime(f"timer {timer.id!r} is for session {timer.session!r}, not {self.id!r}")
        key = timer.key
        if key is not None:
            for pending in self.timers.values():
                if pending.key == key:
                    self.evaluations += 1
                    return Scheduled(pending, duplicate=True)
            seq = self._keys.get(key)
            if seq is not None:
                self.evaluations += 1
                return Scheduled(None, duplicate=True, seq=seq)
        if timer.id in self.timers:
            raise timer_exists(self.id, timer.id)
        if len(self.timers) >= MAX_TIMERS:
            raise too_many_timers(self.id)
        self._set_timer(timer)
        self.evaluations += 1
        return Scheduled(timer)

    def cancel_timer(self, timer_id: str) -> Timer:
        """Remove a pending timer; ``NoSuchTimer`` when there is none with that id."""
        timer = self.timers.get(timer_id)
        if timer is None:
            raise no_such_timer(self.id, timer_id)
        del self.timers[timer_id]
        self._timer_changes[timer_id] = None
        self._changed()
        self.evaluations += 1
        return timer

    def timer_list(self) -> list[Timer]:
        """The pending timers, soonest first (then by id)."""
        return sorted(self.timers.values(), key=timer_order)

    def next_due(self) -> int | None:
        """When the soonest pending timer is due; None when there is none."""
        return min((t.due_ms for t in self.timers.values()), default=None)

    def fire_timers(self, timer_ids: list[str], now_ms: int, ts: str) -> list[Fired]:
        """Fire each of ``timer_ids`` that is due at ``now_ms``, earliest first: one step.

        Each records its firing (a one-shot with its key) and is deleted
        (a one-shot) or moved to its next due time (``schedule.fire``), so a
        store that keeps the step whole fires every due time exactly once.
        An id that is not pending, or not due, fires nothing.
        """
        pending = [self.timers[i] for i in dict.fromkeys(timer_ids) if i in self.timers]
        fired: dict[str, Fired] = {}
        for timer in sorted(pending, key=timer_order):
            due, left = fire(timer, now_ms)
            if not due:
                continue
            key = timer.key if timer.every_ms is None else None
            recorded = self.record(
                timer.handler, timer.text, ts, key=key, tags=timer.tags or NO_TAGS, by=TIMER
            )
            if left is None:
                del self.timers[timer.id]
                self._timer_changes[timer.id] = None
            else:
                self._set_timer(left)
            fired[timer.id] = Fired(timer.id, recorded.seq, None if left is None else left.due_ms)
        if fired:
            self._changed()
        self.evaluations += 1
        return [
            fired.get(i) or Fired(i, None, t.due_ms if (t := self.timers.get(i)) else None)
            for i in timer_ids
        ]

    def take_moved_timers(self) -> list[Timer]:
        """The timers added or moved since the last call (what a daemon's schedule indexes)."""
        moved = self._moved_timers
        if moved:  # most changes (every send) move no timer: no new list for them
            self._moved_timers = []
        return moved

    def _set_timer(self, timer: Timer) -> None:
        self.timers[timer.id] = timer
        self._timer_changes[timer.id] = timer
        self._moved_timers.append(timer)
        self._changed()

    def _changed(self) -> None:
        self.changes += 1
        self.dirty = True

    def stepped(self, changed: bool) -> None:
        """A step of the groups ran (``session.ops``' claims): an evaluation, and a
        change when ``changed`` (the groups' own flag says what to hand a store)."""
        self.evaluations += 1
        if changed:
            self._changed()

    # -- inspection -------------------------------------------------------

    def cursor_table(self, visible: int | None = None) -> list[CursorInfo]:
        """The cursors, most recently used first, with their lag behind the head."""
        head = self.ring.visible_head(visible)
        rows = reversed(self._cursors.items())
        return [CursorInfo(name, seq, max_(0, head - seq)) for name, (seq, _) in rows]

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
        head = ring.visible_head(visible)
        return Summary(
            id=self.id,
            head=head,
            retained=ring.retained,
            limit=ring.limit,
            cursors=len(self._cursors),
            recorded=ring.head,
            lost=ring.dropped,
            evaluations=self.evaluations,
            lag=max_(0, head - min_((seq for seq, _ in self._cursors.values()), default=head)),
        )

    # -- handing changes to a store --------------------------------------

    def take_delta(self) -> Delta:
        """What changed since the last delta (everything, after a reset); tracking starts afresh."""
        if (
            self._reset
            or self._cursors_changed
            or self._webhook_changed
            or self._new_keys
            or self._timer_changes
            or self.groups.changed
        ):
            return self._take_whole_delta()
        # what most deltas are, a send's: new firings and the figures, and nothing to start
        # afresh. A commit across many sessions takes one of each, so every object this
        # does not touch or make counts (1.3 µs a session less, over 10,000 of them);
        # _take_whole_delta hands over the same (tests/core/test_session_delta.py)
        ring = self.ring
        head = ring.head
        delta = Delta(
            self.id,
            limit=ring.limit,
            head=head,
            uses=self._uses,
            retained=ring.retained,
            firings=ring.recorded_after(self._persisted),
            webhook=self.webhook,
        )
        self.dirty = False
        self._persisted = head
        return delta

    def _take_whole_delta(self) -> Delta:
        ring = self.ring
        timers_gone: list[str] = []
        if self._reset:
            firings = ring.firings()
            keys = list(self._keys.items())
            timers = self.timer_list()
        else:
            firings = ring.recorded_after(self._persisted)
            keys = self._new_keys
            timers = [t for t in self._timer_changes.values() if t is not None]
            timers_gone = [i for i, t in self._timer_changes.items() if t is None]
        delta = Delta(
            self.id,
            reset=self._reset,
            limit=ring.limit,
            head=ring.head,
            uses=self._uses,
            retained=ring.retained,
            firings=firings,
            # only when one moved or was used: a send hands over no cursor to rewrite
            cursors=self.cursor_states() if self._reset or self._cursors_changed else None,
            keys=keys,
            max_keys=MAX_KEYS,
            timers=timers,
            timers_gone=timers_gone,
            webhook_changed=self._reset or self._webhook_changed,
            webhook=self.webhook,
            groups=self.groups.snapshot() if self._reset or self.groups.changed else None,
        )
        self._webhook_changed = self._cursors_changed = self.groups.changed = False
        self._reset = self.dirty = False
        self._new_keys = []
        self._timer_changes = {}
        self._persisted = ring.head
        return delta

    def mark_reset(self) -> None:
        """Make the next delta rewrite the whole session (after a store lost track of it)."""
        self._reset = self.dirty = True
        self._new_keys = []
        self._timer_changes = {}

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
            timers=self.timer_list(),
            webhook=self.webhook,
            groups=self.groups.snapshot(),
        )

    @classmethod
    def restore(cls, snapshot: Snapshot) -> Session:
        """Rebuild a session from a snapshot taken by :meth:`snapshot`.

        Only the 16 most recently used cursors and the newest 1,024 keys come
        back, whatever the store held.
        """
        session = cls(snapshot.id, snapshot.limit)
        if snapshot.fold is not None:
            session.ring = Ring.folded(snapshot.limit, snapshot.head, snapshot.fold)
        elif snapshot.image is None:
            session.ring = Ring(snapshot.limit, snapshot.head, snapshot.firings)
        else:
            session.ring = Ring.from_image(
                snapshot.limit, snapshot.head, snapshot.image, snapshot.firings
            )
        ordered = sorted(snapshot.cursors, key=lambda c: c.last_use)[-MAX_CURSORS:]
        session._cursors = {c.name: [c.seq, c.last_use] for c in ordered}
        # a store that held more than come back is told so with the next delta
        session._cursors_changed = len(ordered) != len(snapshot.cursors)
        session._uses = max_([snapshot.uses, *(c.last_use for c in ordered)])
        session._keys = OrderedDict(snapshot.keys[-MAX_KEYS:])
        session.timers = {t.id: t for t in snapshot.timers}
        session.webhook = snapshot.webhook
        session.groups.restore(snapshot.groups)
        session._moved_timers = list(snapshot.timers)  # a daemon's schedule indexes them all
        # it is as stored: nothing to hand back until it changes
        session._reset = session.dirty = False
        session._persisted = snapshot.head
        return session


max_ = max
min_ = min
