"""``done --next`` (``FinishNext``) is exactly ``done`` then ``claim`` (docs/semantics.md G11).

A state machine drives two twin sessions through the same sends, claims, dones,
releases, extends, expiries, limits, clock steps, deltas and round trips; its one
rule that differs runs ``FinishNext`` on the first and ``Finish`` then ``ClaimFiring``
(of the token's group, with the same lease and clock) on the second. After every step
the twins answered the same (the same ``Taken``, or the same refusal: a done refused
claims nothing) and hold the same: the same snapshot (ring, cursors, groups), the same
dead letters waiting, the same count of firings made claimable again, the same deltas.
The clock is a number passed in: no sleeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from session.errors import LeaseLost, ReplError
from session.firing import ms_to_ts
from session.group import parse_token
from session.ops import (
    GROUP_STEPS,
    ClaimFiring,
    ConfigureGroup,
    ExpireGroups,
    Extend,
    Finish,
    FinishNext,
    Record,
    Release,
    SetLimit,
)
from session.rules import DEFAULT_GROUP, MIN_LEASE_MS
from session.session import Session
from tests.core.test_session_claims import round_trip
from tests.helpers import examples

NOW = 1_700_000_000_000
GROUPS = [DEFAULT_GROUP, "other"]
LEASES = [MIN_LEASE_MS, 5_000, 60_000]
STEPS = [0, 500, 1_000, 5_000, 61_000]
DELAYS = [0, 0, 2_000]

Answer = tuple[str, Any]


def answer_of(call: Callable[[], Any]) -> Answer:
    """What a step answered: its value, or its refusal's class and words."""
    try:
        return ("ok", call())
    except ReplError as exc:
        return (type(exc).__name__, exc.message)


def done_then_claim(session: Session, op: FinishNext) -> Any:
    """The twin's way: ``done``, then ``claim`` of the token's group (nothing when the
    done is refused: it raises first)."""
    Finish(op.claim, op.now_ms).run(session, None)
    group = parse_token(op.claim)[0]
    return ClaimFiring(group, op.now_ms, op.lease_ms).run(session, None)


class Twins(RuleBasedStateMachine):
    """Two sessions that must stay the same: one does ``done --next``, the other ``done``
    then ``claim``."""

    @initialize(limit=st.sampled_from([2, 3, 5, 8]), max_attempts=st.sampled_from([1, 2, None]))
    def start(self, limit: int, max_attempts: int | None) -> None:
        self.one, self.two = Session("jobs", limit), Session("jobs", limit)
        self.now = NOW
        self.tokens: list[str] = ["ghost:1:1", f"{DEFAULT_GROUP}:1:1"]
        if max_attempts is not None:
            self.both(lambda s: ConfigureGroup(DEFAULT_GROUP, self.now, max_attempts).run(s, None))

    def both(self, step: Callable[[Session], Any]) -> Answer:
        first, second = answer_of(lambda: step(self.one)), answer_of(lambda: step(self.two))
        assert first == second
        return first

    def token(self, data: st.DataObject) -> str:
        """One of the tokens claims handed out (or of no claim), the newest half the time."""
        if data.draw(st.booleans()):
            return self.tokens[-1]
        back = data.draw(st.integers(0, len(self.tokens) - 1))
        return self.tokens[-1 - back]

    def taken(self, answer: Answer) -> None:
        kind, value = answer
        if kind == "ok" and value is not None:
            self.tokens.append(value.claim.token)

    # -- the steps both take ---------------------------------------------------------

    @rule(count=st.integers(1, 3))
    def send(self, count: int) -> None:
        for _ in range(count):
            record = Record("on-message", f"job at {self.now}", ms_to_ts(self.now))
            self.both(lambda s, r=record: r.run(s, None).seq)  # type: ignore[misc]

    @rule(limit=st.sampled_from([2, 3, 5, 8]))
    def set_limit(self, limit: int) -> None:
        self.both(lambda s: SetLimit(limit).run(s, None))

    @rule(name=st.sampled_from(GROUPS), lease=st.sampled_from(LEASES))
    def claim(self, name: str, lease: int) -> None:
        self.taken(self.both(lambda s: ClaimFiring(name, self.now, lease).run(s, None)))

    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        token = self.token(data)
        self.both(lambda s: Finish(token, self.now).run(s, None))

    @rule(data=st.data(), delay=st.sampled_from(DELAYS))
    def release(self, data: st.DataObject, delay: int) -> None:
        token = self.token(data)
        self.both(lambda s: Release(token, self.now, delay).run(s, None))

    @rule(data=st.data(), lease=st.sampled_from(LEASES))
    def extend(self, data: st.DataObject, lease: int) -> None:
        token = self.token(data)
        self.both(lambda s: Extend(token, self.now, lease).run(s, None))

    @rule()
    def expire(self) -> None:
        self.both(lambda s: ExpireGroups(self.now).run(s, None))

    @rule(step=st.sampled_from(STEPS))
    def advance(self, step: int) -> None:
        self.now += step

    @rule()
    def take_delta(self) -> None:
        assert self.one.take_delta() == self.two.take_delta()

    @rule()
    def round_trip(self) -> None:
        self.one, self.two = round_trip(self.one), round_trip(self.two)

    # -- the one that differs --------------------------------------------------------

    @rule(data=st.data(), lease=st.sampled_from(LEASES))
    def done_next(self, data: st.DataObject, lease: int) -> None:
        op = FinishNext(self.token(data), self.now, lease)
        op.check()
        one = answer_of(lambda: op.run(self.one, None))
        two = answer_of(lambda: done_then_claim(self.two, op))
        assert one == two
        self.taken(one)

    # -- the invariant -----------------------------------------------------------------

    @invariant()
    def the_twins_are_the_same(self) -> None:
        if not hasattr(self, "one"):
            return
        assert self.one.snapshot() == self.two.snapshot()
        assert self.one.groups.outbox == self.two.groups.outbox
        assert self.one.groups.freed == self.two.groups.freed
        assert self.one.groups.moved == self.two.groups.moved
        assert self.one.changes == self.two.changes


Twins.TestCase.settings = settings(
    max_examples=examples(200, "STATEFUL_EXAMPLES"),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_done_next_is_done_then_claim_under_random_steps = Twins.TestCase


def test_a_refused_done_claims_nothing_and_changes_nothing() -> None:
    session = Session("jobs", 8)
    for n in range(3):
        Record("on-message", f"job {n}", ms_to_ts(NOW)).run(session, None)
    taken = ClaimFiring(DEFAULT_GROUP, NOW, 60_000).run(session, None)
    assert taken is not None
    FinishNext(taken.claim.token, NOW, 60_000).run(session, None)
    before = session.snapshot()
    with pytest.raises(LeaseLost):  # done already: the token is no longer the live lease
        FinishNext(taken.claim.token, NOW, 60_000).run(session, None)
    assert session.snapshot() == before


def test_done_next_takes_the_oldest_firing_left_then_none() -> None:
    session = Session("jobs", 8)
    for n in range(2):
        Record("on-message", f"job {n}", ms_to_ts(NOW)).run(session, None)
    first = ClaimFiring(DEFAULT_GROUP, NOW, 60_000).run(session, None)
    assert first is not None
    second = FinishNext(first.claim.token, NOW, 60_000).run(session, None)
    assert second is not None and second.claim.seq == 2 and second.firing.result == "job 1"
    assert FinishNext(second.claim.token, NOW, 60_000).run(session, None) is None
    assert session.groups.by_name[DEFAULT_GROUP].snapshot().done_through == 2


def test_done_next_is_a_step_of_groups() -> None:
    assert isinstance(FinishNext("work:1:1", NOW, 60_000), GROUP_STEPS)
