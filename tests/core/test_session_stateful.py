"""Random sequences of session operations against a reference model (SPEC §3).

Hypothesis drives a real ``Session`` and a deliberately naive model (plain
lists and dicts, no arithmetic shortcuts) through the same record / read /
ack / poll / resize / dedup / snapshot-restore steps, and after every step
checks that they agree and that every rule still holds: seqs gapless, the
ring within its limit, ``lost`` and ``next`` as rule 3 states them, order,
cursors that never move back, at most 16 cursors evicted least recently
used first, and a dedup window of 1,024 keys. A failing step must raise the
error the model predicts and change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import msgspec
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from session.errors import (
    AckAfterHead,
    BadCursorName,
    BadHandler,
    BadKey,
    BadLimit,
    BadMax,
    BadSeq,
    CursorAfterHead,
    ReplError,
)
from session.firing import Batch, Firing
from session.rules import MAX_CURSORS, MAX_KEYS
from session.session import Recorded, Session, Snapshot
from tests.helpers import examples

T = TypeVar("T")

CURSORS = ["read", "follow", "wait", "poll", *(f"c{n}" for n in range(16)), "bad name", ""]
HANDLERS = ["on-message", "on-message", "on-tick", "on-webhook", "bad handler"]
KEYS = [None, None, None, "a", "b", "c", "d", ""]
LIMITS = [-1, 0, 1, 2, 3, 5, 8, 16, 256, 65_536, 65_537]
START = datetime(2024, 2, 28, 23, 59, 58, tzinfo=UTC)  # sends cross seconds, a leap day


def stamp(n: int) -> str:
    """Send ``n``'s ts: as the daemon writes one (the ring packs it), but every fifth not."""
    if n % 5 == 0:
        return f"t{n}"
    when = START + timedelta(milliseconds=337 * n)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def text(n: int) -> str:
    return [f"text {n}", "", f"ünïcode ✓ {n}"][n % 3]


class Model:
    """What a session must hold, kept the slow and obvious way."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = 0
        self.ring: list[Firing] = []  # retained firings, oldest first
        self.cursors: dict[str, int] = {}  # least recently used first
        self.keys: dict[str, int] = {}  # oldest first
        self.evaluations = 0

    def trim(self) -> int:
        extra = max(0, len(self.ring) - self.limit)
        del self.ring[:extra]
        return extra

    def record(self, handler: str, text: str, ts: str, key: str | None) -> Recorded:
        if key in self.keys:
            event("a duplicate send")
            return Recorded(self.keys[key], duplicate=True)
        self.head += 1
        if handler in ("on-message", "on-tick"):  # the handlers every session has
            self.ring.append(Firing(self.head, handler, text, None, ts))
        else:
            self.ring.append(Firing(self.head, handler, None, text, ts))
        self.trim()
        if key is not None:
            self.keys[key] = self.head
            if len(self.keys) > MAX_KEYS:
                event("a key left the dedup window")
                del self.keys[next(iter(self.keys))]
        return Recorded(self.head, retained=self.limit > 0)

    def cap(self, visible: int | None) -> int:
        return self.head if visible is None else min(max(visible, 0), self.head)

    def read_error(
        self, after: int, most: int | None, visible: int | None
    ) -> type[ReplError] | None:
        if after < 0:
            return BadSeq
        if after > self.cap(visible):
            return CursorAfterHead
        if most is not None and most < 1:
            return BadMax
        return None

    def batch(self, after: int, most: int | None, visible: int | None) -> Batch:
        head = self.cap(visible)
        held = [f for f in self.ring if after < f.seq <= head]
        # every seq in (after, head] that the ring does not hold is lost
        lost = (head - after) - len(held)
        if lost:
            event("a reader was told of a loss")
        firings = held[:most]
        return Batch(firings[-1].seq if firings else after + lost, lost, firings)

    def use(self, cursor: str) -> int:
        seq = self.cursors.pop(cursor, None)
        if seq is None:
            if len(self.cursors) >= MAX_CURSORS:
                event("a cursor was evicted")
                del self.cursors[next(iter(self.cursors))]
            seq = 0
        self.cursors[cursor] = seq
        return seq


def bad_name(name: str) -> bool:
    return name == "" or " " in name


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.session = Session("s")
        self.model = Model(256)
        self.sends = 0

    @initialize(limit=st.sampled_from([0, 1, 3, 4, 8, 256]))
    def start(self, limit: int) -> None:
        self.session = Session("s", limit)
        self.model = Model(limit)

    # -- helpers -----------------------------------------------------------------------

    def attempt(self, error: type[ReplError] | None, call: Callable[[], T]) -> T | None:
        """Run ``call``; when the model predicts ``error``, check it raised and changed nothing."""
        if error is None:
            result = call()
            self.model.evaluations += 1
            return result
        before = self.session.snapshot()
        evaluations = self.session.evaluations
        event(f"a step failed with {error.__name__}")
        with pytest.raises(error):
            call()
        assert self.session.snapshot() == before
        assert self.session.evaluations == evaluations
        return None

    def position(self, from_head: bool, offset: int) -> int:
        return self.model.head - offset if from_head else offset

    def visible(self, back: int | None) -> int | None:
        return None if back is None else self.model.head - back

    def check_batch(self, batch: Batch, after: int, most: int | None, visible: int | None) -> None:
        """Rule 3 and rule 15 in their own words, on top of agreeing with the model."""
        head = self.model.cap(visible)
        got = [f.seq for f in batch.firings]
        if got:
            assert got == list(range(got[0], got[-1] + 1))  # oldest first, no seq skipped
        assert all(after < seq <= head for seq in got)
        assert len(got) <= self.model.limit
        if most is not None:
            assert len(got) <= most
        shown = [f for f in self.model.ring if f.seq <= head]
        if shown:
            assert batch.lost == max(0, shown[0].seq - after - 1)
            if got:
                assert got[0] == max(after + 1, shown[0].seq)  # nothing held is skipped
        else:
            assert batch.lost == max(0, head - after)
        assert batch.next == (got[-1] if got else after + batch.lost)

    # -- rules -------------------------------------------------------------------------

    @rule(handler=st.sampled_from(HANDLERS), key=st.sampled_from(KEYS))
    def record(self, handler: str, key: str | None) -> None:
        self.sends += 1
        text, ts = f"text {self.sends}", stamp(self.sends)
        error = BadHandler if " " in handler else BadKey if key == "" else None
        got = self.attempt(error, lambda: self.session.record(handler, text, ts, key=key))
        if got is not None:
            assert got == self.model.record(handler, text, ts, key)

    @rule(
        count=st.integers(1, 40) | st.sampled_from([MAX_KEYS - 1, MAX_KEYS + 1, MAX_KEYS + 300]),
        keyed=st.booleans(),
        new_handlers=st.booleans(),
    )
    def flood(self, count: int, keyed: bool, new_handlers: bool) -> None:
        """Many sends in one step: wraps the ring and pushes keys out of the dedup window.

        With ``new_handlers`` every send names a handler never seen before, so
        the ring's table of handlers grows and is rebuilt.
        """
        for _ in range(count):
            self.sends += 1
            ts = stamp(self.sends)
            handler = f"h{self.sends}" if new_handlers else "on-message"
            key = f"f{self.sends}" if keyed else None
            got = self.session.record(handler, text(self.sends), ts, key=key)
            assert got == self.model.record(handler, text(self.sends), ts, key)
            self.model.evaluations += 1

    @rule(
        from_head=st.booleans(),
        offset=st.integers(-2, 12) | st.integers(13, 400),
        most=st.none() | st.integers(0, 6),
        back=st.none() | st.integers(-2, 6),
    )
    def read_after(self, from_head: bool, offset: int, most: int | None, back: int | None) -> None:
        after, visible = self.position(from_head, offset), self.visible(back)
        error = self.model.read_error(after, most, visible)
        got = self.attempt(error, lambda: self.session.read_after(after, most, visible))
        if got is not None:
            assert got == self.model.batch(after, most, visible)
            self.check_batch(got, after, most, visible)
            assert self.session.read_after(after, most, visible) == got  # reading removes nothing
            self.model.evaluations += 1

    @rule(
        cursor=st.sampled_from(CURSORS),
        most=st.none() | st.integers(0, 6),
        back=st.none() | st.integers(-2, 6),
        touch=st.booleans(),
    )
    def read(self, cursor: str, most: int | None, back: int | None, touch: bool) -> None:
        visible = self.visible(back)
        after = self.model.cursors.get(cursor, 0)
        error = BadCursorName if bad_name(cursor) else self.model.read_error(after, most, visible)
        got = self.attempt(error, lambda: self.session.read(cursor, most, visible, touch))
        if got is not None:
            assert got == self.model.batch(after, most, visible)
            self.check_batch(got, after, most, visible)
            if touch:
                self.model.use(cursor)

    @rule(
        cursor=st.sampled_from(CURSORS),
        from_head=st.booleans(),
        offset=st.integers(-2, 12) | st.integers(13, 400),
        back=st.none() | st.integers(-2, 6),
    )
    def ack(self, cursor: str, from_head: bool, offset: int, back: int | None) -> None:
        seq, visible = self.position(from_head, offset), self.visible(back)
        if bad_name(cursor):
            error: type[ReplError] | None = BadCursorName
        elif seq < 0:
            error = BadSeq
        elif seq > self.model.cap(visible):
            error = AckAfterHead
        else:
            error = None
        got = self.attempt(error, lambda: self.session.ack(cursor, seq, visible))
        if got is not None:
            old = self.model.use(cursor)
            self.model.cursors[cursor] = max(old, seq)
            assert got == self.model.cursors[cursor] >= old  # never moves back

    @rule(
        cursors=st.lists(st.sampled_from(CURSORS[:-2]), min_size=1, max_size=24),
        offset=st.integers(0, 3),
    )
    def many_readers(self, cursors: list[str], offset: int) -> None:
        """Several readers ack in one step, so the table fills up and evicts."""
        for cursor in cursors:
            self.ack(cursor, True, min(offset, self.model.head), None)

    @rule(most=st.none() | st.integers(0, 6), back=st.none() | st.integers(-2, 6))
    def poll(self, most: int | None, back: int | None) -> None:
        visible = self.visible(back)
        after = self.model.cursors.get("poll", 0)
        others = {n: s for n, s in self.model.cursors.items() if n != "poll"}
        error = self.model.read_error(after, most, visible)
        got = self.attempt(error, lambda: self.session.poll(most, visible))
        if got is not None:
            assert got == self.model.batch(after, most, visible)
            self.check_batch(got, after, most, visible)
            self.model.use("poll")
            self.model.cursors["poll"] = max(after, got.next)
            survivors = {n: s for n, s in self.model.cursors.items() if n != "poll"}
            assert survivors.items() <= others.items()  # poll moved no other cursor

    @rule(limit=st.sampled_from(LIMITS) | st.integers(0, 40))
    def set_limit(self, limit: int) -> None:
        error = BadLimit if not 0 <= limit <= 65_536 else None
        got = self.attempt(error, lambda: self.session.set_limit(limit))
        if got is not None:
            self.model.limit = limit
            assert got == self.model.trim()

    @rule()
    def snapshot_and_restore(self) -> None:
        snapshot = self.session.snapshot()
        stored = msgspec.json.decode(msgspec.json.encode(snapshot), type=Snapshot)
        restored = Session.restore(stored)
        assert restored.snapshot() == snapshot
        restored.evaluations = self.session.evaluations  # as the daemon carries it over
        self.session = restored

    # -- after every step --------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        session, model = self.session, self.model
        assert session.head == model.head
        assert session.ring.limit == model.limit
        assert session.ring.firings() == model.ring
        assert [(c.name, c.seq) for c in session.cursor_states()] == list(model.cursors.items())
        assert session.snapshot().keys == list(model.keys.items())
        assert session.evaluations == model.evaluations

    @invariant()
    def keeps_every_bound(self) -> None:
        session = self.session
        held = [f.seq for f in session.ring.firings()]
        assert held == list(range(session.head - len(held) + 1, session.head + 1))  # gapless
        assert len(held) <= session.ring.limit
        cursors = session.cursor_states()
        assert len(cursors) <= MAX_CURSORS
        assert all(0 <= c.seq <= session.head for c in cursors)
        uses = [c.last_use for c in cursors]
        assert uses == sorted(uses) and all(u <= session.uses for u in uses)
        assert len(session.snapshot().keys) <= MAX_KEYS


# each example is up to 50 steps, and a flood step sends up to 1,324 firings: 40 examples
# are some 5 s of the suite (STATEFUL_EXAMPLES=N for more); the slow variant runs 300
SessionMachine.TestCase.settings = settings(
    max_examples=examples(40, "STATEFUL_EXAMPLES"),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_a_session_keeps_every_rule_under_random_operations = SessionMachine.TestCase


class LongSessionMachine(SessionMachine):
    """The same machine, searched longer: ``pytest -m slow``."""


LongSessionMachine.TestCase.settings = settings(
    SessionMachine.TestCase.settings, max_examples=examples(300, "STATEFUL_EXAMPLES")
)
test_a_session_keeps_every_rule_under_a_long_search = pytest.mark.timeout(900)(
    pytest.mark.slow(LongSessionMachine.TestCase)
)
