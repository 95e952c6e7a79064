"""A session's timers (SPEC §9) in the core, the clock passed in.

Scheduling checks everything before it adds anything; a key names one
message (a pending timer, or the firing it or a send recorded); firing is
one step that records and moves or deletes; the delta hands a store exactly
the timers that changed; a snapshot brings them back. Hypothesis runs
random schedules, cancels and clock steps against a plain model.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from session.errors import BadHandler, BadKey, BadTime, NoSuchTimer, TooMany
from session.rules import MAX_TIMERS
from session.schedule import MAX_DUE_MS, Timer
from session.session import Fired, Scheduled, Session

TS = "2026-12-01T00:00:00.000Z"


def timer(
    name: str,
    due: int,
    every: int | None = None,
    key: str | None = None,
    handler: str = "on-message",
    text: str = "hi",
) -> Timer:
    return Timer(
        id=name, session="s", due_ms=due, every_ms=every, handler=handler, text=text, key=key
    )


def test_a_one_shot_fires_once_as_its_handler_and_is_gone() -> None:
    s = Session("s")
    assert s.schedule(timer("t1", 1000, text="remind")) == Scheduled(
        timer("t1", 1000, text="remind")
    )
    assert s.fire_timers(["t1"], 999, TS) == [Fired("t1", None, 1000)]
    assert s.head == 0
    assert s.fire_timers(["t1"], 1500, TS) == [Fired("t1", 1, None)]
    assert s.ring.firings()[0].result == "remind"
    assert s.timers == {}
    assert s.fire_timers(["t1"], 2000, TS) == [Fired("t1", None, None)]
    assert s.head == 1


def test_a_recurring_timer_fires_once_for_missed_periods_and_keeps_its_grid() -> None:
    s = Session("s")
    s.schedule(timer("tick", 10_000, every=1000, handler="on-tick", text=""))
    assert s.fire_timers(["tick"], 25_500, TS) == [Fired("tick", 1, 26_000)]
    assert s.ring.firings()[0].handler == "on-tick"
    assert s.ring.firings()[0].result == ""  # on-tick is a handler every session has
    assert s.timers["tick"].due_ms == 26_000


def test_due_timers_fire_earliest_first_in_one_step() -> None:
    s = Session("s")
    s.schedule(timer("b", 200, text="second"))
    s.schedule(timer("a", 100, text="first"))
    s.schedule(timer("c", 900, text="later"))
    fired = s.fire_timers(["b", "a", "c", "zz"], 500, TS)
    assert fired == [
        Fired("b", 2, None),
        Fired("a", 1, None),
        Fired("c", None, 900),
        Fired("zz", None, None),
    ]
    assert [f.result for f in s.ring.firings()] == ["first", "second"]
    assert s.timer_list() == [timer("c", 900, text="later")]
    assert s.next_due() == 900


def test_a_key_names_one_message_pending_or_fired() -> None:
    s = Session("s")
    first = timer("t1", 100, key="k")
    assert s.schedule(first) == Scheduled(first)
    assert s.schedule(timer("t2", 500, key="k")) == Scheduled(first, duplicate=True)
    assert list(s.timers) == ["t1"]
    s.fire_timers(["t1"], 100, TS)
    # fired: a retry finds its firing, and schedules nothing
    assert s.schedule(timer("t3", 900, key="k")) == Scheduled(None, duplicate=True, seq=1)
    # a send with the key was the message too
    s.record("on-message", "sent", TS, key="k2")
    assert s.schedule(timer("t4", 900, key="k2")) == Scheduled(None, duplicate=True, seq=2)
    assert s.timers == {}


def test_a_recurring_firing_carries_no_key_so_it_fires_every_time() -> None:
    s = Session("s")
    s.schedule(timer("tick", 1000, every=1000, key="beat"))
    for now in (1000, 2000, 3000):
        s.fire_timers(["tick"], now, TS)
    assert s.head == 3


def test_the_limit_of_timers_a_session_may_have() -> None:
    s = Session("s")
    for i in range(MAX_TIMERS):
        s.schedule(timer(f"t{i}", 10_000))
    before = s.changes
    with pytest.raises(TooMany, match="1,024 pending timers"):
        s.schedule(timer("one-more", 10_000))
    assert s.changes == before and len(s.timers) == MAX_TIMERS
    s.cancel_timer("t0")
    s.schedule(timer("one-more", 10_000))


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (timer("t", -1), BadTime),
        (timer("t", MAX_DUE_MS + 1), BadTime),
        (timer("t", 100, every=999), BadTime),
        (timer("t", 100, every=MAX_DUE_MS + 1), BadTime),
        (timer("t", 100, handler="a b"), BadHandler),
        (timer("t", 100, key=""), BadKey),
        (timer("", 100), BadTime),
        (timer("a b", 100), BadTime),
    ],
)
def test_a_bad_timer_is_refused_and_changes_nothing(bad: Timer, error: type[Exception]) -> None:
    s = Session("s")
    s.schedule(timer("t", 100))
    before, snapshot = s.changes, s.snapshot()
    with pytest.raises(error):
        s.schedule(bad)
    assert s.changes == before and s.snapshot() == snapshot


def test_a_timer_for_another_session_or_an_id_in_use_is_refused() -> None:
    s = Session("s")
    s.schedule(timer("t", 100))
    with pytest.raises(BadTime, match="already"):
        s.schedule(timer("t", 200))
    other = Timer(id="u", session="r", due_ms=1, handler="on-message", text="")
    with pytest.raises(BadTime, match="not 's'"):
        s.schedule(other)
    assert list(s.timers) == ["t"]


def test_cancel_removes_a_pending_timer_and_refuses_any_other() -> None:
    s = Session("s")
    s.schedule(timer("t", 100))
    assert s.cancel_timer("t") == timer("t", 100)
    with pytest.raises(NoSuchTimer, match="no pending timer 't'"):
        s.cancel_timer("t")
    assert s.fire_timers(["t"], 1000, TS) == [Fired("t", None, None)]


def test_the_delta_hands_over_exactly_the_timers_that_changed() -> None:
    s = Session("s")
    s.schedule(timer("a", 100))
    s.schedule(timer("b", 200, every=1000))
    first = s.take_delta()
    assert first.reset and [t.id for t in first.timers] == ["a", "b"] and first.timers_gone == []
    s.fire_timers(["a", "b"], 300, TS)
    delta = s.take_delta()
    assert not delta.reset
    assert delta.timers == [timer("b", 1200, every=1000)]
    assert delta.timers_gone == ["a"]
    assert [f.seq for f in delta.firings] == [1, 2]  # the firings ride in the same delta
    assert s.take_delta().timers == [] and not s.dirty


def test_a_snapshot_brings_the_timers_back_and_a_daemon_indexes_them_all() -> None:
    s = Session("s")
    s.schedule(timer("a", 100))
    s.schedule(timer("b", 50, every=1000))
    assert [t.id for t in s.take_moved_timers()] == ["a", "b"]
    assert s.take_moved_timers() == []
    back = Session.restore(s.snapshot())
    assert back.timers == s.timers
    assert sorted(t.id for t in back.take_moved_timers()) == ["a", "b"]
    assert not back.dirty


schedule_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.sampled_from("abcd"),
            st.integers(0, 5000),
            st.none() | st.integers(1000, 3000),
        ),
        st.tuples(st.just("cancel"), st.sampled_from("abcd"), st.just(0), st.none()),
        st.tuples(st.just("tick"), st.just(""), st.integers(1, 4000), st.none()),
    ),
    max_size=30,
)


@given(schedule_steps)
def test_timers_agree_with_a_model_that_counts_grid_points(
    steps: list[tuple[str, str, int, int | None]],
) -> None:
    """Every due time between two ticks fires once; the model keeps (due, every) a name."""
    s = Session("s")
    model: dict[str, tuple[int, int | None]] = {}
    now = 0
    for action, name, value, every in steps:
        if action == "add":
            if name in model:
                with pytest.raises(BadTime):
                    s.schedule(timer(name, now + value, every))
            else:
                s.schedule(timer(name, now + value, every, text=name))
                model[name] = (now + value, every)
        elif action == "cancel":
            if name in model:
                s.cancel_timer(name)
                del model[name]
            else:
                with pytest.raises(NoSuchTimer):
                    s.cancel_timer(name)
        else:
            now += value
            head = s.head
            due = sorted((d, n) for n, (d, _) in model.items() if d <= now)
            s.fire_timers(sorted(model), now, TS)
            assert [f.result for f in s.ring.events_after(head).firings] == [n for _, n in due]
            for _, n in due:
                d, e = model[n]
                if e is None:
                    del model[n]
                else:
                    model[n] = (d + ((now - d) // e + 1) * e, e)
        assert {i: (t.due_ms, t.every_ms) for i, t in s.timers.items()} == model
