"""Groups and claims (SPEC §16) in the core: each rule by example, then random steps.

The examples name one rule each. The state machine drives a ``Group`` and a naive
model (one status per seq) through claims, dones, releases, extends, expiries, clock
steps, ring trims and store round trips, and after every step checks that no seq is
held by two live leases, that no seq's done is answered twice, that every seq the
ring holds is exactly one of ready, held, delayed or done (dead and lost are done),
and that a refused step changed nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from session.errors import (
    BY_CODE,
    BadClaim,
    BadMax,
    BadSeq,
    BadSessionId,
    BadTime,
    Code,
    LeaseLost,
    ReplError,
)
from session.firing import GroupInfo
from session.group import (
    Claim,
    Dead,
    Expired,
    Group,
    GroupSnapshot,
    Lease,
    Progress,
    check_delay,
    check_lease,
    claim_token,
    parse_token,
)
from session.groups import Groups
from session.ring import Ring
from session.rules import (
    DEFAULT_GROUP,
    DEFAULT_LEASE_MS,
    MAX_DELAY_MS,
    MAX_LEASE_MS,
    MIN_LEASE_MS,
)
from tests.helpers import examples

NOW = 1_700_000_000_000


def counts_of(info: GroupInfo) -> GroupInfo:
    """``info``'s counts alone (its attempts and dead-letter session as a new group's)."""
    return msgspec.structs.replace(info, max_attempts=5, dead_letter="")


LEASE = DEFAULT_LEASE_MS


def taken(claim: Claim | None) -> Claim:
    assert claim is not None
    return claim


def test_lease_lost_is_a_core_error_with_its_wire_code() -> None:
    assert LeaseLost.code is Code.LEASE_LOST
    assert str(Code.LEASE_LOST) == "lease_lost"
    assert BY_CODE["lease_lost"] is LeaseLost


def test_concurrent_claimers_each_get_a_different_seq_oldest_first() -> None:
    group = Group.create("jobs", DEFAULT_GROUP, 1, 3)
    claims = [taken(group.claim(NOW, LEASE, 1, 3)) for _ in range(3)]
    assert [c.seq for c in claims] == [1, 2, 3]
    assert [c.attempt for c in claims] == [1, 1, 1]
    assert claims[0] == Claim("work:1:1", 1, 1, NOW + LEASE, 0)
    assert group.claim(NOW, LEASE, 1, 3) is None  # every one is held
    assert group.claims() == [Lease("work", seq, 1, NOW + LEASE) for seq in (1, 2, 3)]


def test_an_early_job_is_found_and_from_now_skips_what_is_there() -> None:
    early = Group.create("jobs", "work", 4, 9)  # the ring holds 4 to 9: 1-3 are not lost
    assert taken(early.claim(NOW, LEASE, 4, 9)) == Claim("work:4:1", 4, 1, NOW + LEASE, 0)
    late = Group.create("jobs", "late", 4, 9, from_now=True)
    assert late.claim(NOW, LEASE, 4, 9) is None
    assert taken(late.claim(NOW, LEASE, 4, 10)).seq == 10


def test_a_match_skips_what_it_does_not_hold_and_leaves_it_ready() -> None:
    group = Group.create("jobs", "work", 1, 4)
    assert taken(group.claim(NOW, LEASE, 1, 4, holds=lambda seq: seq % 2 == 0)).seq == 2
    assert group.claim(NOW, LEASE, 1, 4, holds=lambda seq: seq > 9) is None
    assert taken(group.claim(NOW, LEASE, 1, 4)).seq == 1


def test_a_lease_that_runs_out_is_offered_again_and_the_stale_done_is_refused() -> None:
    group = Group.create("jobs", "work", 1, 1)
    first = taken(group.claim(NOW, MIN_LEASE_MS, 1, 1))
    assert group.next_deadline() == NOW + MIN_LEASE_MS
    # ran out but not yet expired: not claimable, not live
    assert group.claim(NOW + MIN_LEASE_MS, LEASE, 1, 1) is None
    assert group.state_of(1, NOW + MIN_LEASE_MS) == "held"
    assert group.expire(NOW + MIN_LEASE_MS) == Expired([1], [])
    assert group.state_of(1, NOW + MIN_LEASE_MS) == "ready"
    second = taken(group.claim(NOW + MIN_LEASE_MS, LEASE, 1, 1))
    assert (second.seq, second.attempt, second.token) == (1, 2, "work:1:2")
    before = group.snapshot()
    for step in (
        lambda: group.done(first.token, NOW + 2000),
        lambda: group.release(first.token, NOW + 2000),
        lambda: group.extend(first.token, NOW + 2000, LEASE),
    ):
        with pytest.raises(LeaseLost, match="attempt 2 holds firing 1 now"):
            step()
        assert group.snapshot() == before
    assert group.done(second.token, NOW + 2000) == 1
    with pytest.raises(LeaseLost, match="not held"):
        group.done(second.token, NOW + 2000)  # a done is answered once
    assert counts_of(group.counts(1, 1, NOW)) == GroupInfo("work", 1, 0, 0, 0, 0)


def test_a_done_after_the_lease_ran_out_is_refused_even_before_expire() -> None:
    group = Group.create("jobs", "work", 1, 1)
    claim = taken(group.claim(NOW, MIN_LEASE_MS, 1, 1))
    with pytest.raises(LeaseLost, match=r"ran out at 2023-11-14T22:13:21\.000Z"):
        group.done(claim.token, NOW + MIN_LEASE_MS)
    assert group.state_of(1, NOW) == "held"


def test_release_gives_it_back_at_once_or_after_a_delay() -> None:
    group = Group.create("jobs", "work", 1, 2)
    claim = taken(group.claim(NOW, LEASE, 1, 2))
    assert group.release(claim.token, NOW) is None
    again = taken(group.claim(NOW, LEASE, 1, 2))
    assert (again.seq, again.attempt) == (1, 2)
    assert group.release(again.token, NOW, delay_ms=5000) is None
    assert group.state_of(1, NOW) == "delayed"
    assert group.next_deadline() == NOW + 5000
    assert counts_of(group.counts(1, 2, NOW)) == GroupInfo("work", 0, 1, 0, 1, 0)
    assert taken(group.claim(NOW, LEASE, 1, 2)).seq == 2  # 1 waits out its delay
    assert group.claim(NOW + 4999, LEASE, 1, 2) is None
    third = taken(group.claim(NOW + 5000, LEASE, 1, 2))  # ended: claimable before expire
    assert (third.seq, third.attempt) == (1, 3)


def test_expire_ends_delays_so_the_timer_never_wakes_for_a_past_one() -> None:
    group = Group.create("jobs", "work", 1, 1)
    group.release(taken(group.claim(NOW, LEASE, 1, 1)).token, NOW, delay_ms=2000)
    assert group.expire(NOW + 1999) == Expired([], [])
    assert group.expire(NOW + 2000) == Expired([1], [])
    assert group.next_deadline() is None
    assert taken(group.claim(NOW + 2000, LEASE, 1, 1)).attempt == 2


def test_the_last_attempt_goes_dead_on_expiry_and_on_release() -> None:
    group = Group.create("jobs", "work", 1, 2, max_attempts=2)
    assert group.dead_letter == "jobs.dead"
    for attempt in (1, 2):
        claim = taken(group.claim(NOW, MIN_LEASE_MS, 1, 2))
        assert (claim.seq, claim.attempt) == (1, attempt)
        expired = group.expire(NOW + MIN_LEASE_MS)
    assert expired == Expired([], [Dead(1, 2)])
    assert group.state_of(1, NOW) == "done"
    claim = taken(group.claim(NOW, LEASE, 1, 2))
    assert group.release(claim.token, NOW) is None
    claim = taken(group.claim(NOW, LEASE, 1, 2))
    assert group.release(claim.token, NOW, delay_ms=1000) == Dead(2, 2)
    assert counts_of(group.counts(1, 2, NOW)) == GroupInfo("work", 2, 0, 0, 0, 2)
    assert group.claim(NOW, LEASE, 1, 2) is None


def test_a_seq_the_ring_dropped_is_lost_once_and_its_lease_goes_with_it() -> None:
    group = Group.create("jobs", "work", 1, 5)
    held = taken(group.claim(NOW, LEASE, 1, 5))  # 1
    group.release(taken(group.claim(NOW, LEASE, 1, 5)).token, NOW, delay_ms=9000)  # 2
    group.release(taken(group.claim(NOW, LEASE, 1, 5)).token, NOW)  # 3, ready again at once
    group.done(taken(group.claim(NOW, LEASE, 1, 5)).token, NOW)  # 3 again, done out of order
    assert counts_of(group.counts(1, 5, NOW)) == GroupInfo("work", 0, 2, 1, 1, 0)
    # the ring drops 1 to 4; 3 was done, 1, 2 and 4 are lost
    # a listing trims nothing
    assert counts_of(group.counts(5, 5, NOW)) == GroupInfo("work", 4, 1, 0, 0, 0)
    assert counts_of(group.counts(3, 5, NOW)) == GroupInfo("work", 3, 2, 0, 0, 0)  # past the done 3
    assert group.claim(NOW, LEASE, 5, 5, holds=lambda seq: False) is None
    assert group.snapshot().done_through == 4 and group.lost == 3
    assert group.leases == {} and group.delays == {} and group.tries == {}
    claim = taken(group.claim(NOW, LEASE, 5, 6))
    assert (claim.seq, claim.lost) == (5, 3)
    assert taken(group.claim(NOW, LEASE, 5, 6)) == Claim("work:6:1", 6, 1, NOW + LEASE, 0)
    with pytest.raises(LeaseLost, match="not held"):
        group.done(held.token, NOW)
    assert group.trim(5) == 0


def test_done_out_of_order_fills_the_hole_and_moves_done_through() -> None:
    group = Group.create("jobs", "work", 1, 3)
    claims = [taken(group.claim(NOW, LEASE, 1, 3)) for _ in range(3)]
    group.done(claims[2].token, NOW)
    group.done(claims[1].token, NOW)
    assert (group.done_through, group.done_above) == (0, {2, 3})
    assert counts_of(group.counts(1, 3, NOW)) == GroupInfo("work", 0, 0, 1, 0, 0)
    group.done(claims[0].token, NOW)
    assert (group.done_through, group.done_above) == (3, set())


def test_extend_keeps_a_lease_from_running_out() -> None:
    group = Group.create("jobs", "work", 1, 1)
    claim = taken(group.claim(NOW, MIN_LEASE_MS, 1, 1))
    assert group.extend(claim.token, NOW + 900, 5000) == NOW + 5900
    assert group.expire(NOW + 5000) == Expired([], [])
    assert group.claim(NOW + 5000, LEASE, 1, 1) is None
    assert group.done(claim.token, NOW + 5899) == 1


def test_a_token_names_group_seq_and_attempt_and_a_malformed_one_is_refused() -> None:
    assert claim_token("a:b", 12, 3) == "a:b:12:3"
    assert parse_token("a:b:12:3") == ("a:b", 12, 3)
    for bad in (
        "",
        "work",
        "work:1",
        "work:0:1",
        "work:1:0",
        "work:01:1",
        ":1:1",
        "a b:1:1",
        "wo\x00rk:1:1",
        "work:1:1:",
        "work:-1:1",
        "x" * 200 + ":1:1",
        "work:²:1",
    ):
        with pytest.raises(BadClaim, match="is not a claim token"):
            parse_token(bad)
    group = Group.create("jobs", "work", 1, 1)
    claim = taken(group.claim(NOW, LEASE, 1, 1))
    with pytest.raises(LeaseLost, match="is of group 'other', not 'work'"):
        group.done(claim.token.replace("work", "other"), NOW)
    with pytest.raises(LeaseLost, match="attempt 1 holds"):
        group.done("work:1:7", NOW)  # a forged later attempt is no more live than a stale one


@pytest.mark.parametrize(
    ("check", "ms", "says"),
    [
        (check_lease, 100_000_000, "lease 100,000 s is not between 1 s and 24 h"),
        (check_lease, 999, "lease 0.999 s is not between 1 s and 24 h"),
        (check_lease, 500, "lease 0.5 s is not between 1 s and 24 h"),
        (check_lease, MAX_LEASE_MS + 1, "lease 86,400.001 s is not between 1 s and 24 h"),
        (check_lease, -5_000, "lease -5 s is not between 1 s and 24 h"),
        (check_delay, -1, "delay -0.001 s is not between 0 and 24 h"),
        (check_delay, 90_000_000, "delay 90,000 s is not between 0 and 24 h"),
    ],
)
def test_a_lease_or_a_delay_out_of_bounds_is_told_in_seconds(
    check: Callable[[int], int], ms: int, says: str
) -> None:
    """``?lease=100000`` (seconds) was told "lease 100000000 ms": a unit the client never
    used. Every client gives a lease or a delay in seconds or a duration but the line
    protocol, and the bounds are told in seconds and hours: so is the value, exactly."""
    with pytest.raises(BadTime) as refused:
        check(ms)
    assert refused.value.message == says
    assert check(MIN_LEASE_MS) == MIN_LEASE_MS


def test_every_argument_is_checked_before_anything_changes() -> None:
    group = Group.create("jobs", "work", 1, 3)
    claim = taken(group.claim(NOW, LEASE, 1, 3))
    before = group.snapshot()
    refused: list[tuple[type[ReplError], object]] = [
        (BadTime, lambda: group.claim(NOW, MIN_LEASE_MS - 1, 1, 3)),
        (BadTime, lambda: group.claim(NOW, MAX_LEASE_MS + 1, 1, 3)),
        (BadSeq, lambda: group.claim(NOW, LEASE, 0, 3)),
        (BadSeq, lambda: group.claim(NOW, LEASE, 5, 3)),
        (BadSeq, lambda: group.counts(5, 3, NOW)),
        (BadTime, lambda: group.release(claim.token, NOW, delay_ms=-1)),
        (BadTime, lambda: group.release(claim.token, NOW, delay_ms=MAX_DELAY_MS + 1)),
        (BadTime, lambda: group.extend(claim.token, NOW, 0)),
        (BadMax, lambda: group.configure(max_attempts=0, dead_letter="other")),
        (BadSessionId, lambda: group.configure(max_attempts=3, dead_letter="jobs")),
        (BadSessionId, lambda: group.configure(dead_letter="no good")),
    ]
    for error, step in refused:
        with pytest.raises(error):
            step()  # type: ignore[operator]
        assert group.snapshot() == before
    group.configure(max_attempts=9)
    assert (group.max_attempts, group.dead_letter) == (9, "jobs.dead")
    group.configure(dead_letter="graveyard")
    assert (group.max_attempts, group.dead_letter) == (9, "graveyard")


def test_a_group_is_made_only_with_good_names_and_bounds() -> None:
    with pytest.raises(BadSessionId):
        Group("no good", "work")
    with pytest.raises(ReplError, match=r"^group name 'two words'"):
        Group("jobs", "two words")
    with pytest.raises(BadSeq):
        Group("jobs", "work", -1)
    with pytest.raises(BadMax):
        Group("jobs", "work", max_attempts=1001)
    with pytest.raises(BadSessionId, match="its own groups' dead-letter"):
        Group("jobs", "work", dead_letter="jobs")
    with pytest.raises(BadSeq):
        Group.create("jobs", "work", 3, 1)
    assert Group("jobs", "work", dead_letter="dlq").dead_letter == "dlq"


def test_a_snapshot_round_trips_exactly() -> None:
    group = Group.create("jobs", "work", 1, 6, max_attempts=3, dead_letter="dlq")
    claims = [taken(group.claim(NOW, LEASE, 1, 6)) for _ in range(5)]
    group.done(claims[2].token, NOW)
    group.release(claims[1].token, NOW, delay_ms=1000)
    group.release(claims[3].token, NOW)
    group.trim(2)
    snapshot = group.snapshot()
    assert snapshot.done_above == [3] and snapshot.lost == 1
    decoded = msgspec.json.decode(msgspec.json.encode(snapshot), type=GroupSnapshot)
    restored = Group.restore(decoded)
    assert restored.snapshot() == snapshot
    assert vars(restored) == vars(group)
    assert Group.restore(Group("jobs", "work").snapshot()).snapshot() == GroupSnapshot(
        "jobs", "work", 0
    )


def test_progress_counts_the_firings_up_to_upto_and_says_when_they_are_finished() -> None:
    """A join's look (SPEC §18): done (done, dead or lost), dead (of those the ring holds),
    ready, held, delayed, over the firings up to ``upto``; ``finished`` when none is left."""
    group = Group.create("jobs", "work", 1, 6, max_attempts=1)
    one, two, three, four = (taken(group.claim(NOW, LEASE, 1, 6)) for _ in range(4))
    group.done(one.token, NOW)
    assert group.release(two.token, NOW) == Dead(2, 1)  # its last attempt: dead
    group.done(four.token, NOW)  # out of order: 3 is still held
    assert group.progress(1, 6, 6, NOW) == Progress(6, 3, 1, 2, 1, 0)
    assert group.progress(1, 6, 2, NOW) == Progress(2, 2, 1, 0, 0, 0)
    assert group.progress(1, 6, 2, NOW).finished and not group.progress(1, 6, 4, NOW).finished
    assert group.progress(1, 6, 0, NOW) == Progress(0, 0, 0, 0, 0, 0)
    # a delay that has not ended is delayed; one that has is ready
    other = Group.create("jobs", "other", 1, 2)
    other.release(taken(other.claim(NOW, LEASE, 1, 2)).token, NOW, delay_ms=1000)
    assert other.progress(1, 2, 2, NOW) == Progress(2, 0, 0, 1, 0, 1)
    assert other.progress(1, 2, 2, NOW + 1000) == Progress(2, 0, 0, 2, 0, 0)
    # the ring drops 1 to 3: dropped firings are done (lost), and no dead seq of them kept
    group.done(three.token, NOW)
    assert group.progress(4, 6, 6, NOW) == Progress(6, 4, 0, 2, 0, 0)
    group.trim(4)
    assert group.dead_seqs == set() and group.snapshot().dead_seqs == []
    for upto in (-1, 7):
        with pytest.raises(BadSeq, match=f"upto {upto} is not between 0 and the head, 6"):
            group.progress(4, 6, upto, NOW)
    # the ring dropped 1 and 2 while 3 was done out of order: done through 3, before a trim
    early = Group.create("jobs", "early", 1, 4)
    held = [taken(early.claim(NOW, LEASE, 1, 4)) for _ in range(3)]
    early.done(held[2].token, NOW)
    assert early.progress(3, 4, 4, NOW) == Progress(4, 3, 0, 1, 0, 0)


def test_dead_seqs_round_trip_and_a_missing_group_is_as_its_first_claim_makes_it() -> None:
    group = Group.create("jobs", "work", 1, 3, max_attempts=1)
    group.release(taken(group.claim(NOW, LEASE, 1, 3)).token, NOW)
    snapshot = group.snapshot()
    assert snapshot.dead_seqs == [1]
    assert Group.restore(snapshot).progress(1, 3, 3, NOW) == Progress(3, 1, 1, 2, 0, 0)
    groups = Groups("jobs")
    ring = Ring(8)
    for i in range(3):
        ring.record("on-message", f"job {i}", None, "T")
    assert groups.progress(ring, None, "none", None, NOW) == Progress(3, 0, 0, 3, 0, 0)
    assert groups.progress(ring, 2, "none", 1, NOW) == Progress(1, 0, 0, 1, 0, 0)
    assert "none" not in groups.by_name  # a look makes no group


# -- random steps against a model ------------------------------------------------

LEASES = [MIN_LEASE_MS, 2000, 5000]
TICKS = [0, 1, 500, 999, 1000, 2000, 6000]
DELAYS = [0, 0, 1000, 3000]


class GroupMachine(RuleBasedStateMachine):
    """A ``Group`` and a model of one status per seq: ``("ready", attempts)``,
    ``("held", attempt, until)``, ``("delayed", ready at, attempts)``, ``("done",)``,
    ``("dead", attempts)`` or ``("lost",)``."""

    @initialize(
        first=st.integers(1, 4),
        extra=st.integers(0, 4),
        max_attempts=st.integers(1, 3),
        from_now=st.booleans(),
    )
    def start(self, first: int, extra: int, max_attempts: int, from_now: bool) -> None:
        self.first, self.head, self.now = first, first - 1 + extra, NOW
        self.group = Group.create(
            "jobs", "work", self.first, self.head, from_now=from_now, max_attempts=max_attempts
        )
        self.max_attempts = max_attempts
        self.status: dict[int, tuple[object, ...]] = {
            seq: ("done",) if from_now else ("ready", 0) for seq in range(first, self.head + 1)
        }
        self.pending_lost = 0
        self.tokens: list[str] = ["work:1:1", "other:1:1"]
        self.answered: set[int] = set()

    # the ring and the clock

    @rule(n=st.integers(1, 3))
    def record(self, n: int) -> None:
        for seq in range(self.head + 1, self.head + n + 1):
            self.status[seq] = ("ready", 0)
        self.head += n

    @rule(n=st.integers(1, 3))
    def drop(self, n: int) -> None:
        self.first = min(self.first + n, self.head + 1)

    @rule(ms=st.sampled_from(TICKS))
    def tick(self, ms: int) -> None:
        self.now += ms

    def model_trim(self) -> None:
        for seq, status in self.status.items():
            if seq < self.first and status[0] not in ("done", "dead", "lost"):
                self.status[seq] = ("lost",)
                self.pending_lost += 1

    @rule()
    def trim(self) -> None:
        before = self.pending_lost
        self.model_trim()
        assert self.group.trim(self.first) == self.pending_lost - before

    # the operations

    def claimable(self, seq: int) -> int | None:
        """The attempts so far of ``seq`` if it is claimable now."""
        status = self.status[seq]
        if status[0] == "ready":
            return status[1]  # type: ignore[return-value]
        if status[0] == "delayed" and status[1] <= self.now:  # type: ignore[operator]
            return status[2]  # type: ignore[return-value]
        return None

    @rule(lease=st.sampled_from(LEASES), modulo=st.sampled_from([1, 1, 2, 3]))
    def claim(self, lease: int, modulo: int) -> None:
        self.model_trim()
        claim = self.group.claim(
            self.now,
            lease,
            self.first,
            self.head,
            None if modulo == 1 else lambda s: s % modulo == 0,
        )
        expected = next(
            (
                seq
                for seq in range(self.first, self.head + 1)
                if self.claimable(seq) is not None and seq % modulo == 0
            ),
            None,
        )
        if expected is None:
            assert claim is None
            return
        assert claim is not None
        attempt = self.claimable(expected) + 1  # type: ignore[operator]
        until = self.now + lease
        assert claim == Claim(
            claim_token("work", expected, attempt), expected, attempt, until, self.pending_lost
        )
        self.pending_lost = 0
        self.status[expected] = ("held", attempt, until)
        self.tokens.append(claim.token)

    def live(self, token: str) -> int | None:
        """The seq ``token`` holds live, by the model."""
        group, seq, attempt = parse_token(token)
        status = self.status.get(seq)
        if group != "work" or status is None or status[0] != "held":
            return None
        return seq if status[1] == attempt and status[2] > self.now else None  # type: ignore[operator]

    def refused(self, token: str, step: object) -> bool:
        if self.live(token) is not None:
            return False
        before = self.group.snapshot()
        with pytest.raises(LeaseLost):
            step()  # type: ignore[operator]
        assert self.group.snapshot() == before
        return True

    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(self.tokens))
        if self.refused(token, lambda: self.group.done(token, self.now)):
            return
        seq = self.group.done(token, self.now)
        assert seq not in self.answered, "a done answered twice for one seq"
        self.answered.add(seq)
        self.status[seq] = ("done",)

    @rule(data=st.data(), delay=st.sampled_from(DELAYS))
    def release(self, data: st.DataObject, delay: int) -> None:
        token = data.draw(st.sampled_from(self.tokens))
        if self.refused(token, lambda: self.group.release(token, self.now, delay)):
            return
        _, seq, attempt = parse_token(token)
        dead = self.group.release(token, self.now, delay)
        if attempt >= self.max_attempts:
            assert dead == Dead(seq, attempt)
            self.status[seq] = ("dead", attempt)
        else:
            assert dead is None
            self.status[seq] = (
                ("delayed", self.now + delay, attempt) if delay else ("ready", attempt)
            )

    @rule(data=st.data(), lease=st.sampled_from(LEASES))
    def extend(self, data: st.DataObject, lease: int) -> None:
        token = data.draw(st.sampled_from(self.tokens))
        if self.refused(token, lambda: self.group.extend(token, self.now, lease)):
            return
        _, seq, attempt = parse_token(token)
        assert self.group.extend(token, self.now, lease) == self.now + lease
        self.status[seq] = ("held", attempt, self.now + lease)

    @rule()
    def expire(self) -> None:
        again: list[int] = []
        dead: list[Dead] = []
        for seq, status in sorted(self.status.items()):
            if status[0] == "held" and status[2] <= self.now:  # type: ignore[operator]
                if status[1] >= self.max_attempts:  # type: ignore[operator]
                    dead.append(Dead(seq, status[1]))  # type: ignore[arg-type]
                    self.status[seq] = ("dead", status[1])
                else:
                    again.append(seq)
                    self.status[seq] = ("ready", status[1])
            elif status[0] == "delayed" and status[1] <= self.now:  # type: ignore[operator]
                again.append(seq)
                self.status[seq] = ("ready", status[2])
        assert self.group.expire(self.now) == Expired(again, dead)

    @rule()
    def round_trip(self) -> None:
        encoded = msgspec.msgpack.encode(self.group.snapshot())
        restored = Group.restore(msgspec.msgpack.decode(encoded, type=GroupSnapshot))
        assert restored.snapshot() == self.group.snapshot()
        self.group = restored

    # the invariants

    @invariant()
    def no_seq_is_held_by_two_live_leases(self) -> None:
        if not hasattr(self, "group"):
            return
        live: list[int] = []
        for token in set(self.tokens):
            try:
                live.append(self.group.live(token, self.now)[0])
            except LeaseLost:
                assert self.live(token) is None
            else:
                assert self.live(token) == live[-1]
        assert len(live) == len(set(live))

    @invariant()
    def every_seq_the_ring_holds_is_in_exactly_one_state(self) -> None:
        if not hasattr(self, "group"):
            return
        group, counts = self.group, {"ready": 0, "held": 0, "delayed": 0, "done": 0}
        for seq in range(self.first, self.head + 1):
            status = self.status[seq]
            state = group.state_of(seq, self.now)
            expected = {"dead": "done", "lost": "done"}.get(str(status[0]), str(status[0]))
            if status[0] == "delayed" and status[1] <= self.now:  # type: ignore[operator]
                expected = "ready"
            assert state == expected, (seq, status, state)
            counts[state] += 1
            tables = [
                seq in group.leases,
                seq in group.delays,
                seq in group.tries,
                seq <= group.done_through or seq in group.done_above,
            ]
            assert sum(tables) <= 1, (seq, tables)
        info = group.counts(self.first, self.head, self.now)
        assert (info.ready, info.held, info.delayed) == (
            counts["ready"],
            counts["held"],
            counts["delayed"],
        )
        assert info.dead == sum(1 for s in self.status.values() if s[0] == "dead")
        assert all(
            self.status[seq][0] in ("done", "dead", "lost")
            for seq in range(self.first, info.done + 1)
        )

    @invariant()
    def the_next_deadline_is_the_earliest_lease_or_delay(self) -> None:
        if not hasattr(self, "group"):
            return
        times = [until for _, until in self.group.leases.values()]
        times += [ready for ready, _ in self.group.delays.values()]
        assert self.group.next_deadline() == (min(times) if times else None)


GroupMachine.TestCase.settings = settings(
    max_examples=examples(150, "STATEFUL_EXAMPLES"), stateful_step_count=40, deadline=None
)
test_group_machine = GroupMachine.TestCase
