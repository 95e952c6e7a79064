"""The schedule arithmetic of timed firings (``session.schedule``), the clock passed in.

Durations, intervals and times parse or are refused with one line; a due
timer fires once; a recurring one fires once for every run of missed
periods and keeps its grid; the schedule hands out due timers earliest
first and knows what to sleep until. Hypothesis checks ``fire`` and
``Schedule`` against plain models.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from session.errors import BadTime, Code
from session.schedule import (
    MIN_EVERY_MS,
    Schedule,
    Timer,
    fire,
    parse_duration,
    parse_every,
    parse_time,
)


def timer(due: int, every: int | None = None, name: str = "t1") -> Timer:
    return Timer(id=name, session="s", due_ms=due, every_ms=every, handler="on-tick", text="")


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("90s", 90_000), ("5m", 300_000), ("1h30m", 5_400_000), ("2d", 172_800_000)],
)
def test_durations_parse(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "10", "s", "5 m", "1.5s", "-3s", "0s", "3w", "1h30"])
def test_a_duration_that_does_not_parse_is_refused_as_bad_input(text: str) -> None:
    with pytest.raises(BadTime) as refused:
        parse_duration(text)
    assert refused.value.code is Code.BAD_TIME
    assert repr(text) in refused.value.message


def test_an_interval_is_at_least_one_second() -> None:
    assert parse_every("1s") == MIN_EVERY_MS
    with pytest.raises(BadTime, match="under 1 s"):
        parse_every("999ms")


def test_times_parse_as_rfc3339_in_utc() -> None:
    assert parse_time("2026-12-01T05:00:00Z") == 1_796_101_200_000
    assert parse_time("2026-12-01T07:00:00+02:00") == 1_796_101_200_000
    assert parse_time("2026-12-01T05:00:00") == 1_796_101_200_000  # no zone: UTC
    assert parse_time("2026-12-01T05:00:00.250Z") == 1_796_101_200_250
    with pytest.raises(BadTime, match="RFC 3339"):
        parse_time("tomorrow at nine")


def test_a_one_shot_fires_once_when_due_and_is_gone() -> None:
    assert fire(timer(1000), 999) == (False, timer(1000))
    assert fire(timer(1000), 1000) == (True, None)
    assert fire(timer(1000), 86_400_000) == (True, None)  # late: still once


def test_a_recurring_timer_fires_once_for_missed_periods_and_keeps_its_grid() -> None:
    every = timer(10_000, every=1000)
    assert fire(every, 10_000) == (True, timer(11_000, every=1000))
    assert fire(every, 10_999) == (True, timer(11_000, every=1000))
    # down from 10 s to 25.5 s: 16 periods missed, one firing, back on the grid at 26 s
    assert fire(every, 25_500) == (True, timer(26_000, every=1000))


@given(
    due=st.integers(0, 10_000),
    every=st.none() | st.integers(MIN_EVERY_MS, 5000),
    steps=st.lists(st.integers(1, 7000), min_size=1, max_size=20),
)
def test_fire_agrees_with_a_model_that_counts_grid_points(
    due: int, every: int | None, steps: list[int]
) -> None:
    """At each check, a timer fires iff a point of its grid (one point for a one-shot)
    fell in (previous check, now]; then it is due at the first point after now."""
    points = [due] if every is None else [due + k * every for k in range(200)]
    current: Timer | None = timer(due, every)
    now = last = -1
    for step in steps:
        now += step
        fell = [g for g in points if last < g <= now]
        if current is None:
            assert not fell or every is None
        else:
            fired, current = fire(current, now)
            assert fired == bool(fell)
            if current is not None:
                assert current.due_ms == min(g for g in points if g > now)
        last = now


class Pending:
    """The truth a schedule indexes: pending timers by (session, id), as sessions hold them."""

    def __init__(self) -> None:
        self.timers: dict[tuple[str, str], Timer] = {}
        self.schedule = Schedule(self.live)

    def live(self, session_id: str, timer_id: str, due: int) -> bool:
        timer = self.timers.get((session_id, timer_id))
        return timer is not None and timer.due_ms == due

    def add(self, t: Timer) -> None:
        self.timers[t.session, t.id] = t
        self.schedule.add(t)

    def cancel(self, session_id: str, timer_id: str) -> None:
        self.timers.pop((session_id, timer_id), None)


def at(due: int, name: str, session: str = "s", every: int | None = None) -> Timer:
    return Timer(id=name, session=session, due_ms=due, every_ms=every, handler="on-tick", text="")


def test_the_schedule_hands_out_due_timers_earliest_first_by_session() -> None:
    pending = Pending()
    schedule = pending.schedule
    assert schedule.next_due() is None and schedule.take_due(10**12) == {}
    for name, due, session in (("c", 300, "s"), ("a", 100, "s"), ("b", 200, "r")):
        pending.add(at(due, name, session))
    assert schedule.next_due() == 100
    assert schedule.take_due(250) == {"s": ["a"], "r": ["b"]}
    pending.cancel("s", "c")  # costs the schedule nothing: its entry is dropped on sight
    assert len(schedule) == 1
    assert schedule.next_due() is None and len(schedule) == 0


def test_a_cancelled_timer_due_now_is_not_handed_out() -> None:
    pending = Pending()
    pending.add(at(100, "gone"))
    pending.add(at(100, "kept"))
    pending.cancel("s", "gone")
    assert pending.schedule.take_due(100) == {"s": ["kept"]}


def test_a_timer_moved_is_due_only_at_its_new_time() -> None:
    pending = Pending()
    pending.add(at(100, "tick", every=1000))
    pending.add(at(50, "x"))
    pending.add(at(500, "x"))  # moved: its old entry is left behind, and skipped
    assert pending.schedule.next_due() == 100
    assert pending.schedule.take_due(1100) == {"s": ["tick", "x"]}


def test_rebuild_drops_what_was_left_behind() -> None:
    pending = Pending()
    for i in range(10):
        pending.add(at(1000 + i, f"t{i}"))
    for i in range(9):
        pending.cancel("s", f"t{i}")
    assert len(pending.schedule) == 10
    pending.schedule.rebuild(pending.timers.values())
    assert len(pending.schedule) == 1 and pending.schedule.next_due() == 1009


actions = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from("abcde"), st.integers(0, 100)),
        st.tuples(st.just("cancel"), st.sampled_from("abcde"), st.just(0)),
        st.tuples(st.just("take"), st.just(""), st.integers(0, 100)),
        st.tuples(st.just("rebuild"), st.just(""), st.just(0)),
    ),
    max_size=40,
)


@given(actions)
def test_the_schedule_agrees_with_a_dict_of_pending_timers(
    steps: list[tuple[str, str, int]],
) -> None:
    pending, model = Pending(), {}
    for action, name, when in steps:
        session = "r" if name in "ab" else "s"
        if action == "add":
            pending.add(at(when, name, session))
            model[name] = when
        elif action == "cancel":
            pending.cancel(session, name)
            model.pop(name, None)
        elif action == "rebuild":
            pending.schedule.rebuild(pending.timers.values())
        else:
            taken = pending.schedule.take_due(when)
            due = sorted((d, n) for n, d in model.items() if d <= when)
            expected: dict[str, list[str]] = {}
            for _, n in due:
                expected.setdefault("r" if n in "ab" else "s", []).append(n)
                del model[n]
                del pending.timers["r" if n in "ab" else "s", n]
            assert taken == expected
        assert pending.schedule.next_due() == (min(model.values()) if model else None)
