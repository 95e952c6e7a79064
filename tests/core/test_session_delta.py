"""The core's own bookkeeping for stores: deltas, the continuity check, the operations as values.

A store is handed ``Session.take_delta()`` and nothing else, so the deltas
must carry exactly the change: here a plain model store applies them the
way the store contract (``repl_daemon.backends.local.store``) says, and what it holds
must always restore to the session as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from session.delta import Delta, Webhook, gap
from session.errors import AckAfterHead, BadCursorName, BadMax, BadSeq, ReplError
from session.firing import Firing
from session.ops import (
    Ack,
    CursorTable,
    Describe,
    Poll,
    ReadAfter,
    ReadCursor,
    Record,
    SetLimit,
    ack_all,
)
from session.rules import MAX_KEYS
from session.schedule import Timer
from session.session import Session, Snapshot, Summary

TS = "2026-12-01T06:00:00.000Z"


@dataclass
class ModelStore:
    """What a store keeps of one session, applying deltas by the contract's words alone."""

    limit: int = 0
    head: int = 0
    uses: int = 0
    firings: list[Firing] = field(default_factory=list)
    cursors: list = field(default_factory=list)  # type: ignore[type-arg]
    keys: list[tuple[str, int]] = field(default_factory=list)
    present: bool = False

    def apply(self, delta: Delta) -> None:
        if delta.gone:
            self.__init__()  # type: ignore[misc]
            return
        if delta.reset:
            self.__init__()  # type: ignore[misc]
        assert self.present or delta.reset, "a change to a session the store never had"
        assert gap(delta, self.head) is None
        self.present = True
        self.limit, self.head, self.uses = delta.limit, delta.head, delta.uses
        self.firings = [f for f in self.firings + delta.firings if f.seq >= delta.oldest]
        if delta.cursors is not None:
            self.cursors = list(delta.cursors)
        for key, seq in delta.keys:
            self.keys = [(k, s) for k, s in self.keys if k != key] + [(key, seq)]
        self.keys = self.keys[-delta.max_keys :]

    def snapshot(self, session_id: str) -> Snapshot:
        return Snapshot(
            session_id, self.limit, self.head, self.firings, self.cursors, self.uses, self.keys
        )


steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["send", "send", "keyed", "ack", "read", "peek", "poll", "limit", "take", "take"]
        ),
        st.integers(0, 40),
    ),
    max_size=80,
)


def step(session: Session, kind: str, n: int, cursors: int) -> None:
    """One operation of a random history on ``session``: ``kind``, with ``n`` choosing
    its text, key, cursor (of ``cursors``), seq, limit or timer."""
    if kind == "send":
        session.record("on-message", f"t{n}", TS)
    elif kind == "tagged":
        session.record("on-message", f"g{n}", TS, tags={"k": f"v{n % 3}"})
    elif kind == "keyed":
        session.record("on-message", f"k{n}", TS, key=f"k{n % 5}")
    elif kind == "ack":
        session.ack(f"c{n % cursors}", min(n, session.head))
    elif kind == "read":
        session.read(f"c{n % cursors}")
    elif kind == "peek":
        session.read(f"c{n % cursors}", touch=False)
    elif kind == "poll":
        session.poll()
    elif kind == "limit":
        session.set_limit(n % 7)
    elif kind in ("timer", "cancel"):
        timer_id = f"t{n % 4}"
        pending = timer_id in {t.id for t in session.timer_list()}
        if kind == "timer" and not pending:
            session.schedule(Timer(id=timer_id, session="s", due_ms=n, handler="h", text="x"))
        elif kind == "cancel" and pending:
            session.cancel_timer(timer_id)
    elif kind == "fire":
        session.fire_timers([t.id for t in session.timer_list()], 40, TS)
    elif kind == "hook":
        session.set_webhook(Webhook(f"secret{n % 2}") if n % 3 else None)
    elif kind == "reset":
        session.mark_reset()
    else:
        raise AssertionError(f"no such step: {kind}")


@settings(max_examples=200, deadline=None)
@given(steps=steps, limit=st.integers(0, 6))
def test_what_the_deltas_carry_restores_to_the_session_as_it_is(
    steps: list[tuple[str, int]], limit: int
) -> None:
    session = Session("s", limit)
    store = ModelStore()
    for kind, n in steps:
        if kind != "take":
            step(session, kind, n, 18)
        else:
            store.apply(session.take_delta())
            assert not session.dirty
            assert Session.restore(store.snapshot("s")).snapshot() == session.snapshot()
    store.apply(session.take_delta())
    assert Session.restore(store.snapshot("s")).snapshot() == session.snapshot()


def test_a_new_session_hands_over_a_reset_then_only_what_changed() -> None:
    session = Session("s", 4)
    assert session.dirty
    first = session.take_delta()
    assert first.reset and first.head == 0 and first.firings == [] and first.max_keys == MAX_KEYS
    assert not session.dirty and not session.take_delta().reset
    session.record("on-message", "one", TS, key="k")
    session.record("on-message", "two", TS)
    delta = session.take_delta()
    assert not delta.reset and [f.seq for f in delta.firings] == [1, 2]
    assert delta.keys == [("k", 1)]
    assert session.take_delta().firings == [] and session.take_delta().keys == []


def test_a_duplicate_send_and_a_peek_change_nothing_to_hand_over() -> None:
    session = Session("s")
    session.record("on-message", "one", TS, key="k")
    session.take_delta()
    changes = session.changes
    session.record("on-message", "again", TS, key="k")
    session.read("read", touch=False)
    session.read_after(0)
    session.cursor_table()
    session.summary()
    assert session.changes == changes and not session.dirty


def test_every_change_counts_and_marks_the_session_dirty() -> None:
    session = Session("s")
    session.take_delta()
    for change in (
        lambda: session.record("on-message", "x", TS),
        lambda: session.read("read"),
        lambda: session.ack("read", 1),
        lambda: session.poll(),
        lambda: session.set_limit(8),
    ):
        before = session.changes
        change()
        assert session.changes > before and session.dirty
        session.take_delta()


def test_a_restored_session_has_nothing_to_hand_over_until_it_changes() -> None:
    session = Session("s")
    for n in range(3):
        session.record("on-message", str(n), TS)
    restored = Session.restore(session.snapshot())
    assert not restored.dirty
    restored.record("on-message", "3", TS)
    delta = restored.take_delta()
    assert not delta.reset and [f.seq for f in delta.firings] == [4]


def test_mark_reset_hands_over_the_whole_session_again() -> None:
    session = Session("s")
    session.record("on-message", "one", TS, key="k")
    session.take_delta()
    session.mark_reset()
    assert session.dirty
    delta = session.take_delta()
    assert delta.reset and [f.seq for f in delta.firings] == [1] and delta.keys == [("k", 1)]


def position(session: Session, cursor: str) -> int | None:
    """Where ``cursor`` stands in ``session``, as a store keeps it; None when it has none."""
    return next((c.seq for c in session.cursor_states() if c.name == cursor), None)


def firing(seq: int) -> Firing:
    return Firing(seq, "on-message", str(seq), None, TS)


@pytest.mark.parametrize(
    ("delta", "stored", "problem"),
    [
        (Delta("s", limit=4, head=3, firings=[firing(3)]), 2, None),
        (Delta("s", limit=4, head=3, firings=[firing(2), firing(3)]), 1, None),
        (Delta("s", limit=4, head=3, firings=[firing(3)]), 1, "do not continue"),
        # the ring is bound at 2: seqs 1 and 2 are gone, so 3 and 4 continue head 1
        (Delta("s", limit=2, head=4, firings=[firing(3), firing(4)]), 1, None),
        (Delta("s", limit=0, head=5), 3, None),
        (Delta("s", limit=4, head=2), 3, "stored head 3"),
        (Delta("s", reset=True, limit=4, head=2, firings=[firing(1), firing(2)]), 9, None),
        (Delta("s", reset=True, limit=4, head=2, firings=[firing(2)]), 0, "(2 to 2)"),
        (Delta("s", limit=4, head=1, retained=0), 0, None),
        (Delta("s", limit=4, head=2, retained=1, firings=[firing(1)]), 0, "(1 to 1)"),
    ],
)
def test_gap_says_when_new_firings_do_not_continue_the_stored_ones(
    delta: Delta, stored: int, problem: str | None
) -> None:
    found = gap(delta, stored)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_each_operation_runs_the_core_method_of_its_name() -> None:
    session = Session("s", 8)
    assert Record.durable and Ack.durable and Poll.durable and SetLimit.durable
    assert not (ReadAfter.durable or ReadCursor.durable or CursorTable.durable)
    assert not Describe.durable
    assert Record("on-message", "one", TS).run(session, None).seq == 1
    assert Record("on-build", "raw", TS, key="k").run(session, None).seq == 2
    assert Record("on-build", "again", TS, key="k").run(session, None).duplicate
    assert [f.seq for f in ReadAfter(0, 1).run(session, None).firings] == [1]
    assert ReadAfter(0).run(session, 1).next == 1  # capped at visible
    assert ReadCursor("r").run(session, None).next == 2
    assert Ack("r", 1).run(session, None) == 1
    assert [c.name for c in CursorTable().run(session, None)] == ["r"]
    assert ReadCursor("peek", touch=False).run(session, None).next == 2
    assert [c.name for c in CursorTable().run(session, None)] == ["r"]
    assert Poll().run(session, None).next == 2
    assert SetLimit(1).run(session, None) == 1
    assert Describe().run(session, 1) == Summary(
        id="s",
        head=1,
        retained=1,
        limit=1,
        cursors=2,
        recorded=2,
        lost=1,
        evaluations=session.evaluations,
    )


def test_ack_all_applies_every_ack_when_all_are_good() -> None:
    a, b = Session("a"), Session("b")
    for s in (a, b):
        s.record("on-message", "one", TS)
        s.record("on-message", "two", TS)
    assert ack_all([(a, 2, None), (b, 1, None)], "wait") == [2, 1]
    assert position(a, "wait") == 2 and position(b, "wait") == 1


@settings(max_examples=200, deadline=None)
@given(
    seqs=st.lists(st.integers(-2, 5), min_size=1, max_size=4),
    visible=st.integers(0, 3),
    cursor=st.sampled_from(["wait", "", "two words"]),
)
def test_ack_all_acks_none_when_any_ack_is_refused(
    seqs: list[int], visible: int, cursor: str
) -> None:
    sessions = [Session(f"s{i}") for i in range(len(seqs))]
    for s in sessions:
        for n in range(3):
            s.record("on-message", str(n), TS)
    before = [(s.snapshot(), s.evaluations, s.changes) for s in sessions]
    acks = [(s, seq, visible) for s, seq in zip(sessions, seqs, strict=True)]
    good = cursor == "wait" and all(0 <= seq <= visible for seq in seqs)
    if good:
        ack_all(acks, cursor)
        assert [position(s, cursor) for s in sessions] == seqs
        return
    with pytest.raises((BadSeq, AckAfterHead, BadCursorName)):
        ack_all(acks, cursor)
    assert [(s.snapshot(), s.evaluations, s.changes) for s in sessions] == before


def test_check_ack_raises_what_ack_would_and_changes_nothing() -> None:
    session = Session("s")
    session.record("on-message", "one", TS)
    for seq, error in ((-1, BadSeq), (2, AckAfterHead)):
        with pytest.raises(error):
            session.check_ack(seq)
    with pytest.raises(AckAfterHead):
        session.check_ack(1, visible=0)
    session.check_ack(1)
    assert session.cursor_table() == [] and session.evaluations == 1


def test_a_read_with_a_bad_max_is_refused_before_it_counts() -> None:
    session = Session("s")
    with pytest.raises(BadMax):
        ReadCursor("r", max=0).run(session, None)
    assert session.evaluations == 0 and session.cursor_table() == []
    assert isinstance(BadMax("x"), ReplError)


def test_new_keys_never_pile_up_where_no_store_takes_deltas() -> None:
    """--memory takes no delta: past the dedup window the next delta is a rewrite instead."""
    session = Session("s")
    session.take_delta()
    for n in range(MAX_KEYS + 1):
        session.record("on-message", str(n), TS, key=f"k{n}")
    assert len(session._new_keys) <= MAX_KEYS
    delta = session.take_delta()
    assert delta.reset and len(delta.keys) == MAX_KEYS
    assert delta.keys[-1] == (f"k{MAX_KEYS}", MAX_KEYS + 1)
    store = ModelStore()
    store.apply(delta)
    assert Session.restore(store.snapshot("s")).snapshot() == session.snapshot()


twin_steps = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "send",
                "send",
                "send",
                "tagged",
                "keyed",
                "ack",
                "read",
                "peek",
                "limit",
                "timer",
                "cancel",
                "fire",
                "hook",
                "reset",
                "take",
                "take",
                "take",
            ]
        ),
        st.integers(0, 40),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps=twin_steps, limit=st.integers(0, 6))
def test_a_sends_short_delta_is_the_whole_deltas_answer(
    steps: list[tuple[str, int]], limit: int
) -> None:
    """``take_delta`` has a short cut for a delta of new firings alone: two twins go through
    the same operations, one handing over by ``take_delta`` and one by the whole
    computation, and every delta and the state after it are the same."""
    twins = Session("s", limit), Session("s", limit)
    for kind, n in steps:
        if kind != "take":
            for s in twins:
                step(s, kind, n, 3)
        if kind == "take":
            quick, whole = twins
            assert quick.take_delta() == whole._take_whole_delta()
            assert quick.snapshot() == whole.snapshot() and not quick.dirty and not whole.dirty
    quick, whole = twins
    assert quick.take_delta() == whole._take_whole_delta()
    assert quick.take_delta() == whole._take_whole_delta()  # nothing since: the same empty one
