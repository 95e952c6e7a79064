"""Groups and claims (SPEC §16) in a session: its table of groups over a real ring.

``session.group`` keeps one group's rules over bare seqs (tests/core/test_session_group.py);
here they run as a ``Session`` runs them, through the ops (``ClaimFiring``, ``Finish``,
``Release``, ``Extend``, ``ExpireGroups``, ``ConfigureGroup``, ``GroupTable``,
``ClaimTable``), over a ring small enough to drop firings. The examples name one
property each; the state machine drives a session and a naive model (one status a seq
a group) through sends, claims by several claimers, dones, releases, extends, expiries,
clock steps, deltas and snapshot round trips, and after every step checks that no seq is
held by two live leases, that a seq answered done is never handed out again, that every
seq the ring holds is in exactly one state for each group, and that each firing that
died left exactly one dead letter. The clock is a number passed in: no sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from session.errors import (
    BadClaim,
    BadGroupName,
    BadMax,
    BadSessionId,
    BadTag,
    BadTime,
    Forbidden,
    LeaseLost,
    TooMany,
)
from session.firing import Firing, GroupInfo, ms_to_ts
from session.group import (
    Claim,
    Group,
    Lease,
    default_dead_letter,
    parse_token,
)
from session.groups import DEAD_TAGS, DeadLetter, Taken
from session.ops import (
    ClaimFiring,
    ClaimTable,
    ConfigureGroup,
    ExpireGroups,
    Extend,
    Finish,
    GroupTable,
    Record,
    Release,
    SetLimit,
)
from session.rules import (
    DEFAULT_GROUP,
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_ATTEMPTS,
    MAX_DELAY_MS,
    MAX_GROUPS,
    MAX_LEASE_MS,
    MIN_LEASE_MS,
)
from session.session import Session, Snapshot
from session.tags import MAX_TAGS, Match
from tests.helpers import examples

NOW = 1_700_000_000_000
LEASE = DEFAULT_LEASE_MS
TS = ms_to_ts(NOW)


def send(
    session: Session,
    text: str = "job",
    tags: dict[str, str] | None = None,
    handled: bool | None = False,
    by: str | None = None,
) -> int:
    op = Record("on-message", text, TS, handled=handled, tags=tags or {}, by=by)
    op.check()
    return op.run(session, None).seq


def claim(
    session: Session,
    group: str = DEFAULT_GROUP,
    now: int = NOW,
    lease: int = LEASE,
    match: Match | None = None,
    from_now: bool = False,
    visible: int | None = None,
) -> Taken | None:
    op = ClaimFiring(group, now, lease, match, from_now)
    op.check()
    return op.run(session, visible)


def took(taken: Taken | None) -> Taken:
    assert taken is not None
    return taken


def finish(session: Session, token: str, now: int = NOW) -> int:
    op = Finish(token, now)
    op.check()
    return op.run(session, None)


def release(session: Session, token: str, now: int = NOW, delay: int = 0) -> bool:
    op = Release(token, now, delay)
    op.check()
    return op.run(session, None)


def extend(session: Session, token: str, now: int, lease: int) -> int:
    op = Extend(token, now, lease)
    op.check()
    return op.run(session, None)


def expire(session: Session, now: int) -> list[int]:
    op = ExpireGroups(now)
    op.check()
    return op.run(session, None)


def configure(
    session: Session,
    group: str = DEFAULT_GROUP,
    max_attempts: int | None = None,
    dead_letter: str | None = None,
    from_now: bool = False,
    visible: int | None = None,
    now: int = NOW,
) -> GroupInfo:
    op = ConfigureGroup(group, now, max_attempts, dead_letter, from_now)
    op.check()
    return op.run(session, visible)


def infos(session: Session, now: int = NOW, visible: int | None = None) -> list[GroupInfo]:
    op = GroupTable(now)
    op.check()
    return op.run(session, visible)


def info(session: Session, name: str = DEFAULT_GROUP, now: int = NOW) -> GroupInfo:
    return next(i for i in infos(session, now) if i.name == name)


def leases(session: Session, group: str | None = None) -> list[Lease]:
    op = ClaimTable(group)
    op.check()
    return op.run(session, None)


def round_trip(session: Session) -> Session:
    """``session`` as a store brings it back: its snapshot encoded, decoded, restored."""
    encoded = msgspec.msgpack.encode(session.snapshot())
    return Session.restore(msgspec.msgpack.decode(encoded, type=Snapshot))


# -- by example ---------------------------------------------------------------------


def test_a_claim_takes_the_oldest_firing_and_two_claims_take_different_ones() -> None:
    s = Session("jobs", 8)
    for n in range(3):
        send(s, f"job {n}")
    first, second = took(claim(s)), took(claim(s, lease=MIN_LEASE_MS))
    assert first.claim == Claim("work:1:1", 1, 1, NOW + LEASE, 0)
    assert first.firing == Firing(1, "on-message", None, "job 0", TS)
    assert second.claim == Claim("work:2:1", 2, 1, NOW + MIN_LEASE_MS, 0)
    assert second.firing.event == "job 1"
    assert (
        leases(s)
        == leases(s, "work")
        == [
            Lease("work", 1, 1, NOW + LEASE),
            Lease("work", 2, 1, NOW + MIN_LEASE_MS),
        ]
    )
    assert leases(s, "other") == []
    assert s.cursor_states() == []  # a claim moves no cursor
    # another group is another lane: it gets every firing once as well
    assert took(claim(s, "other")).claim.seq == 1
    assert took(claim(s)).claim.seq == 3
    assert claim(s) is None  # every one is held
    assert len(s.groups) == 2


def test_a_match_claims_only_the_firings_that_match() -> None:
    s = Session("jobs", 8)
    for kind in ("a", "b", "a", "b"):
        send(s, kind, {"kind": kind})
    send(s, "untagged")
    b = Match({"kind": "b"})
    assert [took(claim(s, match=b)).claim.seq for _ in range(2)] == [2, 4]
    assert claim(s, match=b) is None
    assert claim(s, match=Match(handler="on-tick")) is None
    assert [took(claim(s)).firing.event for _ in range(3)] == ["a", "a", "untagged"]


def test_a_claim_with_nothing_to_take_answers_none_and_creates_the_group() -> None:
    empty = Session("jobs", 8)
    assert claim(empty) is None
    assert infos(empty) == [GroupInfo("work", 0, 0, 0, 0, 0, 5, "jobs.dead")]
    send(empty)
    assert took(claim(empty)).claim == Claim("work:1:1", 1, 1, NOW + LEASE, 0)

    # from the oldest firing the ring holds: what it dropped before is not lost to it
    dropped = Session("jobs", 3)
    for n in range(5):
        send(dropped, f"job {n + 1}", {"kind": "a"})
    assert claim(dropped, match=Match({"kind": "z"})) is None
    assert dropped.groups.by_name["work"].done_through == 2
    assert took(claim(dropped)).claim == Claim("work:3:1", 3, 1, NOW + LEASE, 0)

    # from_now: after the head; a later from_now changes nothing of a group that is
    now = Session("jobs", 8)
    for _ in range(3):
        send(now)
    assert claim(now, from_now=True) is None
    assert info(now).done == 3
    send(now)
    assert took(claim(now, from_now=True)).claim.seq == 4
    assert claim(now, "later") is not None  # not from now: the oldest, seq 1
    assert info(now, "later").held == 1


def test_the_seventeenth_group_is_refused_and_changes_nothing() -> None:
    s = Session("jobs", 8)
    send(s)
    for n in range(MAX_GROUPS):
        assert took(claim(s, f"g{n}")).claim.seq == 1
    s.take_delta()
    before, changes = s.snapshot(), s.changes
    with pytest.raises(TooMany, match="16 groups"):
        claim(s, "g16")
    with pytest.raises(TooMany):
        configure(s, "g16", max_attempts=2)
    assert s.snapshot() == before
    assert s.changes == changes
    assert len(s.groups) == MAX_GROUPS and "g16" not in s.groups.by_name
    assert s.take_delta().groups is None
    assert took(claim(s, "g15", now=NOW + LEASE)).claim.attempt == 2  # the 16 still work


def test_visible_caps_what_a_claim_may_take() -> None:
    s = Session("jobs", 8)
    for n in range(3):
        send(s, f"job {n + 1}", {"kind": "a"})
    assert took(claim(s, visible=1)).claim.seq == 1
    assert claim(s, visible=1) is None  # 2 is above what readers may see
    assert claim(s, match=Match({"kind": "a"}), visible=1) is None
    assert took(claim(s, visible=2, match=Match({"kind": "a"}))).claim.seq == 2
    assert took(claim(s)).claim.seq == 3
    # a group made while nothing is visible starts at the oldest firing all the same
    assert claim(s, "early", visible=0) is None
    assert infos(s, visible=0)[0] == GroupInfo("early", 0, 0, 0, 0, 0, 5, "jobs.dead")
    assert took(claim(s, "early")).claim.seq == 1


def test_a_matching_claim_of_a_group_trimmed_past_the_visible_head_takes_nothing() -> None:
    # the ring dropped firings the store has not made durable yet (visible 2, ring 4-5):
    # a step trims the group past what readers may see, and a matching claim then finds
    # nothing to match (it was refused with cursor_after_head)
    s = Session("jobs", 2)
    assert claim(s) is None
    for n in range(5):
        send(s, f"job {n + 1}", {"kind": "a"})
    with pytest.raises(LeaseLost):
        finish(s, "work:5:1")
    assert s.groups.by_name["work"].done_through == 3
    a = Match({"kind": "a"})
    assert claim(s, match=a, visible=2) is None
    assert claim(s, visible=2) is None
    assert took(claim(s, match=a)).claim == Claim("work:4:1", 4, 1, NOW + LEASE, 3)


def test_stale_or_foreign_tokens_are_refused_and_change_nothing() -> None:
    s = Session("jobs", 8)
    send(s)
    send(s)
    stale = took(claim(s, lease=MIN_LEASE_MS)).claim.token  # work:1:1, runs out
    later = NOW + MIN_LEASE_MS
    live = took(claim(s, now=later)).claim.token  # the same firing again: work:1:2
    assert live == "work:1:2"
    done = took(claim(s, now=later)).claim.token
    assert finish(s, done, later) == 2
    s.take_delta()
    tokens = [
        (stale, later),  # another attempt holds it now
        ("work:1:3", later),  # an attempt that never was
        (done, later),  # done
        ("work:3:1", later),  # not held (not even recorded)
        ("other:1:1", later),  # a group the session does not have
        (live, later + LEASE),  # ran out, not expired yet
    ]
    for token, now in tokens:
        steps: list[Finish | Release | Extend] = [
            Finish(token, now),
            Release(token, now),
            Release(token, now, 1_000),
            Extend(token, now, LEASE),
        ]
        for step in steps:
            before, freed, changes = s.snapshot(), s.groups.freed, s.changes
            with pytest.raises(LeaseLost):
                step.check()
                step.run(s, None)
            assert s.snapshot() == before, (token, step)
            assert (s.groups.freed, s.changes, s.groups.outbox) == (freed, changes, [])
    assert s.take_delta().groups is None
    with pytest.raises(BadClaim):
        Finish("not a token", NOW).check()
    with pytest.raises(BadClaim):
        finish(s, "work:0:1")
    assert extend(s, live, later, LEASE) == later + LEASE  # it was live all along


def test_done_means_never_offered_again() -> None:
    s = Session("jobs", 8)
    send(s)
    send(s)
    token = took(claim(s, lease=MIN_LEASE_MS)).claim.token
    assert finish(s, token) == 1
    with pytest.raises(LeaseLost):
        finish(s, token)  # done is answered once
    assert expire(s, NOW + MIN_LEASE_MS) == []
    assert took(claim(s, now=NOW + MIN_LEASE_MS)).claim.seq == 2
    assert claim(s, now=NOW + 2 * LEASE) is not None  # 2 again (its lease ran out), not 1
    assert leases(s) == [Lease("work", 2, 2, NOW + 3 * LEASE)]
    assert info(s, now=NOW + 2 * LEASE) == GroupInfo("work", 1, 0, 1, 0, 0, 5, "jobs.dead")


def test_release_gives_the_firing_back_at_once_or_after_a_delay() -> None:
    s = Session("jobs", 8)
    send(s)
    send(s)
    groups = s.groups
    token = took(claim(s)).claim.token
    assert release(s, token) is False
    assert groups.freed == 1  # at once: blocked claimers may take it
    again = took(claim(s)).claim
    assert again == Claim("work:1:2", 1, 2, NOW + LEASE, 0)
    assert release(s, again.token, delay=5_000) is False
    assert groups.freed == 1  # not claimable yet: no claimer to wake
    assert info(s) == GroupInfo("work", 0, 1, 0, 1, 0, 5, "jobs.dead")
    assert groups.deadline() == NOW + 5_000
    assert took(claim(s)).claim.seq == 2  # 1 is delayed
    assert claim(s, now=NOW + 4_999) is None
    assert expire(s, NOW + 4_999) == []
    assert groups.freed == 1
    assert expire(s, NOW + 5_000) == [1]
    assert groups.freed == 2
    assert took(claim(s, now=NOW + 5_000)).claim == Claim("work:1:3", 1, 3, NOW + 5_000 + LEASE, 0)
    # a delay that ended is claimable without an expiry first
    third = took(claim(s, "other")).claim
    assert release(s, third.token, delay=1_000) is False
    assert took(claim(s, "other", now=NOW + 1_000)).claim.attempt == 2
    with pytest.raises(BadTime):
        Release(third.token, NOW, MAX_DELAY_MS + 1).check()


def test_extend_keeps_the_lease_longer() -> None:
    s = Session("jobs", 8)
    send(s)
    token = took(claim(s, lease=MIN_LEASE_MS)).claim.token
    assert extend(s, token, NOW + 500, 5_000) == NOW + 5_500
    assert s.groups.deadline() == NOW + 5_500
    assert expire(s, NOW + MIN_LEASE_MS) == []
    assert leases(s) == [Lease("work", 1, 1, NOW + 5_500)]
    assert claim(s, now=NOW + 5_499) is None
    assert expire(s, NOW + 5_500) == [1]
    with pytest.raises(LeaseLost):
        extend(s, token, NOW + 5_500, LEASE)
    with pytest.raises(BadTime):
        Extend(token, NOW, MAX_LEASE_MS + 1).check()


def test_the_last_attempt_given_back_leaves_one_dead_letter() -> None:
    s = Session("jobs", 8)
    configure(s, max_attempts=2)
    send(s, "build it", {"job": "7"}, handled=False, by="alice")
    freed = s.groups.freed
    assert release(s, took(claim(s)).claim.token) is False
    assert s.groups.outbox == []
    last = took(claim(s)).claim
    assert last.attempt == 2
    assert release(s, last.token) is True
    assert s.groups.freed == freed + 1  # the first release freed it, the dead one did not
    letter = DeadLetter(
        "jobs.dead",
        "on-message",
        "build it",
        False,
        {
            "job": "7",
            "dead.session": "jobs",
            "dead.seq": "1",
            "dead.group": "work",
            "dead.attempts": "2",
        },
        "alice",
    )
    assert s.groups.outbox == [letter]
    assert s.groups.take_dead_letters() == [letter]
    assert s.groups.outbox == []
    assert s.groups.take_dead_letters() == []
    assert claim(s) is None  # dead is done: neither lost nor offered again
    assert info(s) == GroupInfo("work", 1, 0, 0, 0, 1, 2, "jobs.dead")


def test_the_last_attempt_running_out_leaves_one_dead_letter() -> None:
    s = Session("jobs", 8)
    configure(s, max_attempts=1, dead_letter="graveyard")
    send(s, "the result", handled=True)
    send(s, "second")
    claim(s, lease=MIN_LEASE_MS)
    freed = s.groups.freed
    assert expire(s, NOW + MIN_LEASE_MS - 1) == []
    assert s.groups.outbox == []
    assert expire(s, NOW + MIN_LEASE_MS) == []  # dead: not claimable again
    assert s.groups.freed == freed
    tags = {"dead.session": "jobs", "dead.seq": "1", "dead.group": "work", "dead.attempts": "1"}
    assert s.groups.take_dead_letters() == [
        DeadLetter("graveyard", "on-message", "the result", True, tags)
    ]
    assert expire(s, NOW + 10 * LEASE) == []
    assert s.groups.outbox == []  # once
    # the next claim expires what ran out first: its dead letter too
    claim(s, lease=MIN_LEASE_MS)
    assert took(claim(s, "other")).claim.seq == 1
    assert claim(s, now=NOW + MIN_LEASE_MS) is None
    assert [letter.tags["dead.seq"] for letter in s.groups.take_dead_letters()] == ["2"]
    assert info(s, now=NOW + MIN_LEASE_MS).dead == 2


def test_a_dead_letter_keeps_twelve_of_a_firings_own_tags() -> None:
    s = Session("jobs", 8)
    configure(s, max_attempts=1)
    own = {f"t{n:02d}": str(n) for n in range(MAX_TAGS)}
    send(s, "many", own)
    # a dead letter's own dead letter: its dead.* tags are the new ones
    send(s, "again", {"dead.seq": "9", "dead.group": "x", "keep": "yes"}, by="dlq")
    release(s, took(claim(s)).claim.token)
    release(s, took(claim(s)).claim.token)
    many, again = s.groups.take_dead_letters()
    assert len(many.tags) == MAX_TAGS
    assert list(many.tags) == [f"t{n:02d}" for n in range(12)] + list(DEAD_TAGS)
    assert again.tags == {
        "keep": "yes",
        "dead.session": "jobs",
        "dead.seq": "2",
        "dead.group": "work",
        "dead.attempts": "1",
    }
    assert (again.text, again.handled, again.by) == ("again", False, "dlq")


def test_a_firing_the_ring_dropped_while_held_is_lost() -> None:
    s = Session("jobs", 3)
    for _ in range(3):
        send(s)
    held, b, c = (took(claim(s)).claim.token for _ in range(3))
    finish(s, b)
    finish(s, c)
    for _ in range(3):
        send(s)  # the ring holds 4-6 now
    with pytest.raises(LeaseLost):
        finish(s, held)
    assert s.groups.outbox == []  # lost, not dead
    assert took(claim(s)).claim == Claim("work:4:1", 4, 1, NOW + LEASE, 1)
    assert took(claim(s)).claim.lost == 0  # told once
    # lost while delayed, or ready, is lost as well; a claim that takes nothing tells nothing
    release(s, took(claim(s)).claim.token, delay=1_000)
    for _ in range(3):
        send(s)
    assert claim(s, match=Match({"kind": "z"})) is None
    assert took(claim(s)).claim == Claim("work:7:1", 7, 1, NOW + LEASE, 3)
    assert info(s).done == 6


def test_the_deadline_is_the_earliest_lease_or_delay_of_any_group() -> None:
    s = Session("jobs", 8)
    assert s.groups.deadline() is None
    send(s)
    configure(s, "idle")
    assert s.groups.deadline() is None
    claim(s, "a", lease=5_000)
    token = took(claim(s, "b", lease=2_000)).claim.token
    assert s.groups.deadline() == NOW + 2_000
    release(s, token, delay=10_000)
    assert s.groups.deadline() == NOW + 5_000
    expire(s, NOW + 5_000)
    assert s.groups.deadline() == NOW + 10_000
    expire(s, NOW + 10_000)
    assert s.groups.deadline() is None


def test_infos_and_leases_list_every_group_by_name() -> None:
    s = Session("jobs", 8)
    for _ in range(4):
        send(s)
    claim(s, "zeta")
    token = took(claim(s, "alpha", lease=MIN_LEASE_MS)).claim.token
    claim(s, "alpha")
    release(s, took(claim(s, "alpha")).claim.token, delay=1_000)
    finish(s, token)
    assert infos(s) == [
        GroupInfo("alpha", 1, 1, 1, 1, 0, 5, "jobs.dead"),
        GroupInfo("zeta", 0, 3, 1, 0, 0, 5, "jobs.dead"),
    ]
    assert leases(s) == [Lease("alpha", 2, 1, NOW + LEASE), Lease("zeta", 1, 1, NOW + LEASE)]
    assert leases(s, "zeta") == [Lease("zeta", 1, 1, NOW + LEASE)]
    with pytest.raises(BadGroupName, match=r"^group name 'bad name' is not 1-64 printable"):
        ClaimTable("bad name").check()
    with pytest.raises(BadGroupName):
        s.groups.leases("bad name")
    assert ClaimTable.durable is False
    assert [op.durable for op in (ClaimFiring, Finish, Release, Extend, ExpireGroups)] == [True] * 5


def test_configure_creates_or_sets_and_refuses_without_creating() -> None:
    s = Session("jobs", 8)
    send(s)
    refusals: list[tuple[type[Exception], ConfigureGroup]] = [
        (BadMax, ConfigureGroup("work", NOW, max_attempts=0)),
        (BadMax, ConfigureGroup("work", NOW, max_attempts=1_001)),
        (BadSessionId, ConfigureGroup("work", NOW, dead_letter="bad id")),
        (BadGroupName, ConfigureGroup("bad name", NOW)),
    ]
    for error, op in refusals:
        with pytest.raises(error):
            op.check()
        with pytest.raises(error):
            op.run(s, None)
    with pytest.raises(BadSessionId, match="its own"):
        configure(s, dead_letter="jobs")  # passes the check: the session is needed
    assert len(s.groups) == 0
    assert configure(s, max_attempts=3, dead_letter="elsewhere") == GroupInfo(
        "work", 0, 1, 0, 0, 0, 3, "elsewhere"
    )
    with pytest.raises(BadMax):
        ConfigureGroup("work", NOW, max_attempts=0).run(s, None)
    with pytest.raises(BadSessionId):
        configure(s, dead_letter="jobs")
    assert configure(s, dead_letter="other") == GroupInfo("work", 0, 1, 0, 0, 0, 3, "other")
    assert configure(s, max_attempts=DEFAULT_MAX_ATTEMPTS).dead_letter == "other"
    assert configure(s, "late", from_now=True) == GroupInfo("late", 1, 0, 0, 0, 0, 5, "jobs.dead")
    assert configure(s, "early", visible=0).done == 0
    assert [i.name for i in infos(s)] == ["early", "late", "work"]


def test_whoever_does_not_see_the_default_dead_letter_makes_no_group() -> None:
    """A scoped token that does not see ``ID.dead`` (``sees_default_dead_letter`` False)
    makes no group by its claim, nor by ``group`` without a dead-letter session of its own:
    forbidden, nothing changed. A group that exists (made by whoever sees its dead
    letters) is claimed and configured as ever, and one made naming its own dead-letter
    session is made."""
    s = Session("jobs", 8)
    send(s)
    before, changes = s.snapshot(), s.changes
    refused = [
        ClaimFiring("work", NOW, LEASE, sees_default_dead_letter=False),
        ConfigureGroup("work", NOW, max_attempts=2, sees_default_dead_letter=False),
    ]
    for op in refused:
        op.check()
        with pytest.raises(Forbidden) as caught:
            op.run(s, None)
        assert caught.value.message == (
            "session 'jobs' has no group 'work', and a new group would send its dead letters "
            "to 'jobs.dead', which this token does not see: make the group first with a "
            "dead-letter session the token sees (`repl group jobs work --dead-letter "
            "SESSION`), or with a token that sees 'jobs.dead'"
        )
        assert (s.snapshot(), s.changes) == (before, changes)
    own = ConfigureGroup("mine", NOW, dead_letter="jobs.mine", sees_default_dead_letter=False)
    assert own.run(s, None).dead_letter == "jobs.mine"
    configure(s)  # made by whoever sees jobs.dead
    for op in refused:
        op.run(s, None)  # the group is there: claimed, configured
    assert leases(s) == [Lease("work", 1, 1, NOW + LEASE)]
    assert info(s).max_attempts == 2


def test_a_group_is_made_once_and_found_after() -> None:
    s = Session("jobs", 8)
    with pytest.raises(BadGroupName):
        s.groups.group("", s.ring, None)
    made = s.groups.group("work", s.ring, None)
    assert s.groups.group("work", s.ring, None) is made


def test_the_default_dead_letter_of_a_long_id_is_64_characters() -> None:
    long_id = "s" * 64
    assert default_dead_letter(long_id) == "s" * 59 + ".dead"
    assert default_dead_letter("jobs") == "jobs.dead"
    # an id of 64 that ends in .dead is never its own dead-letter session
    own = "s" * 59 + ".dead"
    assert default_dead_letter(own) == "s" * 58 + ".dead" != own
    s = Session(long_id, 8)
    send(s)
    dead_letter = configure(s, max_attempts=1).dead_letter
    assert len(dead_letter) == 64 and dead_letter.endswith(".dead")
    release(s, took(claim(s)).claim.token)
    (letter,) = s.groups.take_dead_letters()
    assert letter.session == dead_letter
    assert letter.tags["dead.session"] == long_id


def test_a_delta_carries_the_groups_only_when_one_changed() -> None:
    s = Session("jobs", 8)
    first = s.take_delta()
    assert first.reset and first.groups == []  # all of them after a reset: none yet
    send(s)
    assert s.take_delta().groups is None
    claim(s, lease=MIN_LEASE_MS)
    assert s.take_delta().groups == s.groups.snapshot()
    changes = s.changes
    assert claim(s) is None  # a look that took nothing and trimmed nothing changed nothing
    assert s.take_delta().groups is None and s.changes == changes
    configure(s, "other")
    delta = s.take_delta()
    assert delta.groups is not None and [g.name for g in delta.groups] == ["other", "work"]
    infos(s)
    leases(s)
    changes = s.changes
    assert expire(s, NOW) == []  # nothing ran out
    assert s.changes == changes
    delta = s.take_delta()
    assert delta.groups is None and not delta.reset
    assert expire(s, NOW + MIN_LEASE_MS) == [1]
    assert s.changes == changes + 1
    assert s.take_delta().groups == s.groups.snapshot()
    token = took(claim(s, now=NOW + MIN_LEASE_MS)).claim.token
    s.take_delta()
    extend(s, token, NOW + MIN_LEASE_MS, LEASE)
    assert s.take_delta().groups == s.groups.snapshot()
    finish(s, token, NOW + MIN_LEASE_MS)
    assert s.take_delta().groups == s.groups.snapshot()
    s.mark_reset()
    reset = s.take_delta()
    assert reset.reset and reset.groups == s.groups.snapshot() and len(reset.groups) == 2


def test_restore_gives_back_the_very_same_groups() -> None:
    s = Session("jobs", 4)
    configure(s, "tight", max_attempts=2, dead_letter="graves")
    for n in range(6):
        send(s, f"job {n + 1}", {"kind": "a" if n % 2 else "b"})
    a = Match({"kind": "a"})
    done_token = took(claim(s, "tight", match=a)).claim.token  # 4: done above a hole
    finish(s, done_token)
    release(s, took(claim(s, "tight")).claim.token, delay=30_000)  # 3: delayed
    release(s, took(claim(s, "tight")).claim.token)  # 5: tried once, ready
    claim(s, "tight", lease=MIN_LEASE_MS)  # 5 again: held at its last attempt
    claim(s)  # the default group, from 3
    for _ in range(2):
        send(s)  # the ring drops 3 and 4: lost for work, told by its next claim
    expire(s, NOW + MIN_LEASE_MS)  # 5 dies
    assert len(s.groups.take_dead_letters()) == 1
    snapshot = s.snapshot()
    assert [g.name for g in snapshot.groups] == ["tight", "work"]
    restored = round_trip(s)
    assert restored.snapshot() == snapshot
    assert restored.groups.moved and not restored.groups.changed
    assert restored.take_delta().groups is None  # as stored
    later = NOW + MIN_LEASE_MS
    for group in ("work", "tight", "work", "tight"):
        assert claim(restored, group, later) == claim(s, group, later)
    assert restored.snapshot() == s.snapshot()
    assert Session.restore(Session("empty").snapshot()).groups.moved is False


def test_the_group_ops_check_their_own_values() -> None:
    with pytest.raises(BadTime):
        ClaimFiring("work", NOW, MIN_LEASE_MS - 1).check()
    with pytest.raises(BadGroupName):
        ClaimFiring("bad name", NOW, LEASE).check()
    with pytest.raises(BadTag):
        ClaimFiring("work", NOW, LEASE, Match()).check()
    with pytest.raises(BadClaim):
        Release("x", NOW).check()
    with pytest.raises(BadClaim):
        Extend("x", NOW, LEASE).check()
    s = Session("jobs", 8)
    before = s.snapshot()
    with pytest.raises(BadTime):
        ClaimFiring("work", NOW, MAX_LEASE_MS + 1).run(s, None)
    assert len(s.groups) == 0 and s.snapshot() == before


def test_a_lowered_limit_drops_firings_a_group_then_counts_lost() -> None:
    s = Session("jobs", 8)
    for _ in range(5):
        send(s)
    claim(s)
    SetLimit(2).run(s, None)
    assert took(claim(s)).claim == Claim("work:4:1", 4, 1, NOW + LEASE, 3)


# -- random steps against a model -----------------------------------------------------

GROUPS = ["work", "other", "third"]
LEASES = [MIN_LEASE_MS, 5_000, 60_000]
DELAYS = [0, 0, 1_000, 30_000]
STEPS = [0, 1, 999, 1_000, 5_000, 60_000]
KINDS: list[str | None] = ["a", "b", None]
MATCHES: list[Match | None] = [None, None, Match({"kind": "a"}), Match({"kind": "b"})]
SENDERS: list[str | None] = [None, "alice"]
DONE_LIKE = ("done", "dead", "lost")


@dataclass
class Status:
    """One seq for one group: ready (``attempt`` so far), held (``attempt`` until
    ``until``), delayed (``attempt`` so far, ready at ``until``), done, dead or lost."""

    kind: str
    attempt: int = 0
    until: int = 0


@dataclass
class GroupModel:
    start: int  # every seq up to it is done from the start
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    dead_letter: str = "jobs.dead"
    status: dict[int, Status] = field(default_factory=dict)
    pending_lost: int = 0
    answered: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)

    def of(self, seq: int) -> Status:
        if seq <= self.start:
            return Status("done")
        return self.status.get(seq, Status("ready"))


class ClaimsMachine(RuleBasedStateMachine):
    """A session's groups against a naive model, one status per seq per group."""

    @initialize(
        limit=st.sampled_from([2, 3, 5, 8]),
        sends=st.integers(0, 4),
        max_attempts=st.sampled_from([1, 2, 3, None]),
    )
    def start(self, limit: int, sends: int, max_attempts: int | None) -> None:
        self.session = Session("jobs", limit)
        self.now = NOW
        self.model: dict[str, GroupModel] = {}
        self.kinds: dict[int, str | None] = {}
        self.senders: dict[int, str | None] = {}
        self.tokens: list[str] = ["ghost:1:1"]
        self.letters: list[DeadLetter] = []
        self.freed = 0
        self.must_carry = True  # the first delta is a reset
        self.may_carry = True
        for n in range(sends):
            self.send(KINDS[n % len(KINDS)], None, 1)
        if max_attempts is not None:
            self.configure(DEFAULT_GROUP, max_attempts, None)

    # -- the model's view ----------------------------------------------------------

    def in_ring(self, model: GroupModel) -> range:
        ring = self.session.ring
        return range(max(model.start + 1, ring.first), ring.head + 1)

    def create(self, name: str, from_now: bool) -> GroupModel:
        if name not in self.model:
            ring = self.session.ring
            self.model[name] = GroupModel(ring.head if from_now else ring.first - 1)
        return self.model[name]

    def dropped(self, old_first: int) -> None:
        """The ring no longer holds ``old_first`` up to its first: lost for every group
        not done with them."""
        for seq in range(old_first, self.session.ring.first):
            for model in self.model.values():
                if seq > model.start and model.of(seq).kind not in DONE_LIKE:
                    model.status[seq] = Status("lost")
                    model.pending_lost += 1

    def letter(self, name: str, seq: int, attempts: int) -> DeadLetter:
        kind, by = self.kinds[seq], self.senders[seq]
        tags = {} if kind is None else {"kind": kind}
        tags |= {
            "dead.session": "jobs",
            "dead.seq": str(seq),
            "dead.group": name,
            "dead.attempts": str(attempts),
        }
        return DeadLetter(self.model[name].dead_letter, "on-message", f"job {seq}", False, tags, by)

    def die(self, name: str, seq: int, attempts: int) -> DeadLetter:
        model = self.model[name]
        assert seq not in model.dead, "a firing died twice"
        model.status[seq] = Status("dead", attempts)
        model.dead.add(seq)
        return self.letter(name, seq, attempts)

    def expire_model(self, name: str) -> tuple[list[int], list[DeadLetter]]:
        model = self.model[name]
        again: list[int] = []
        dead: list[DeadLetter] = []
        for seq in self.in_ring(model):
            status = model.of(seq)
            if status.kind == "held" and status.until <= self.now:
                if status.attempt >= model.max_attempts:
                    dead.append(self.die(name, seq, status.attempt))
                else:
                    model.status[seq] = Status("ready", status.attempt)
                    again.append(seq)
            elif status.kind == "delayed" and status.until <= self.now:
                model.status[seq] = Status("ready", status.attempt)
                again.append(seq)
        return again, dead

    def live(self, token: str) -> tuple[str, int, int] | None:
        name, seq, attempt = parse_token(token)
        model = self.model.get(name)
        if model is None or seq < self.session.ring.first:
            return None
        status = model.of(seq)
        if status.kind != "held" or status.attempt != attempt or status.until <= self.now:
            return None
        return name, seq, attempt

    def take_letters(self, expected: list[DeadLetter]) -> None:
        def key(letter: DeadLetter) -> tuple[str, int]:
            return letter.tags["dead.group"], int(letter.tags["dead.seq"])

        letters = self.session.groups.take_dead_letters()
        assert sorted(letters, key=key) == sorted(expected, key=key)
        self.letters += letters

    def token(self, data: st.DataObject) -> str:
        """One of the tokens claims handed out (or one of a group there is not): half the
        time one that is live, if any is (several claimers, each with what it holds),
        else any, the newest the likeliest."""
        live = [token for token in self.tokens if self.live(token) is not None]
        if live:
            either: bool = data.draw(st.booleans())
            if either:
                return data.draw(st.sampled_from(live))
        back = data.draw(st.integers(0, len(self.tokens) - 1))
        return self.tokens[-1 - back]

    def refused(self, token: str, step: Finish | Release | Extend) -> None:
        """``step`` with a token that is not live: ``LeaseLost``, and nothing changed but
        the trim of its group to the ring (what the ring dropped is lost, whatever)."""
        session = self.session
        before = session.snapshot()
        name = parse_token(token)[0]
        expected = before.groups
        group = session.groups.by_name.get(name)
        if group is not None:
            trimmed = Group.restore(group.snapshot())
            trimmed.trim(session.ring.first)
            expected = [trimmed.snapshot() if g.name == name else g for g in before.groups]
        freed = session.groups.freed
        with pytest.raises(LeaseLost):
            step.run(session, None)
        assert session.snapshot() == msgspec.structs.replace(before, groups=expected)
        assert session.groups.freed == freed
        self.take_letters([])
        self.may_carry = True

    # -- the rules -------------------------------------------------------------------

    @rule(kind=st.sampled_from(KINDS), by=st.sampled_from(SENDERS), count=st.integers(1, 3))
    def send(self, kind: str | None, by: str | None, count: int) -> None:
        for _ in range(count):
            old_first = self.session.ring.first
            seq = self.session.head + 1
            tags = {} if kind is None else {"kind": kind}
            assert send(self.session, f"job {seq}", tags, by=by) == seq
            self.kinds[seq], self.senders[seq] = kind, by
            self.dropped(old_first)

    @rule(limit=st.sampled_from([2, 3, 5, 8]))
    def set_limit(self, limit: int) -> None:
        old_first = self.session.ring.first
        SetLimit(limit).run(self.session, None)
        self.dropped(old_first)

    @rule(
        name=st.sampled_from(GROUPS),
        match=st.sampled_from(MATCHES),
        lease=st.sampled_from(LEASES),
        from_now=st.sampled_from([False, False, False, True]),
    )
    def claim(self, name: str, match: Match | None, lease: int, from_now: bool) -> None:
        existed = name in self.model
        model = self.create(name, from_now)
        again, dead = self.expire_model(name) if existed else ([], [])
        if again:
            self.freed += 1
        expected = next(
            (
                seq
                for seq in self.in_ring(model)
                if (status := model.of(seq)).kind == "ready"
                or (status.kind == "delayed" and status.until <= self.now)
                if match is None or self.kinds[seq] == match.tags["kind"]
            ),
            None,
        )
        taken = claim(self.session, name, self.now, lease, match, from_now)
        self.take_letters(dead)
        if not existed or again or dead or taken is not None:
            self.must_carry = True
        else:  # a look that took nothing changes the groups only by what the ring dropped
            self.may_carry = True
        if expected is None:
            assert taken is None
            return
        assert taken is not None
        attempt = model.of(expected).attempt + 1
        assert taken.claim == Claim(
            f"{name}:{expected}:{attempt}", expected, attempt, self.now + lease, model.pending_lost
        )
        assert expected not in model.answered, "a seq answered done was handed out again"
        assert expected not in model.dead, "a dead seq was handed out again"
        assert taken.firing.seq == expected and taken.firing.event == f"job {expected}"
        model.pending_lost = 0
        model.status[expected] = Status("held", attempt, self.now + lease)
        self.tokens.append(taken.claim.token)

    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        token = self.token(data)
        live = self.live(token)
        if live is None:
            self.refused(token, Finish(token, self.now))
            return
        name, seq, _ = live
        assert finish(self.session, token, self.now) == seq
        model = self.model[name]
        assert seq not in model.answered, "a done answered twice for one seq"
        model.answered.add(seq)
        model.status[seq] = Status("done")
        self.take_letters([])
        self.must_carry = True

    @rule(data=st.data(), delay=st.sampled_from(DELAYS))
    def release(self, data: st.DataObject, delay: int) -> None:
        token = self.token(data)
        live = self.live(token)
        if live is None:
            self.refused(token, Release(token, self.now, delay))
            return
        name, seq, attempt = live
        model = self.model[name]
        dead = release(self.session, token, self.now, delay)
        if attempt >= model.max_attempts:
            assert dead is True
            self.take_letters([self.die(name, seq, attempt)])
        else:
            assert dead is False
            if delay:
                model.status[seq] = Status("delayed", attempt, self.now + delay)
            else:
                model.status[seq] = Status("ready", attempt)
                self.freed += 1
            self.take_letters([])
        self.must_carry = True

    @rule(data=st.data(), lease=st.sampled_from(LEASES))
    def extend(self, data: st.DataObject, lease: int) -> None:
        token = self.token(data)
        live = self.live(token)
        if live is None:
            self.refused(token, Extend(token, self.now, lease))
            return
        name, seq, attempt = live
        assert extend(self.session, token, self.now, lease) == self.now + lease
        self.model[name].status[seq] = Status("held", attempt, self.now + lease)
        self.take_letters([])
        self.must_carry = True

    @rule(step=st.sampled_from(STEPS))
    def expire(self, step: int) -> None:
        self.now += step  # the durable timer fires at a deadline, later than the last step
        again: set[int] = set()
        dead: list[DeadLetter] = []
        for name in self.model:
            group_again, group_dead = self.expire_model(name)
            again.update(group_again)
            dead += group_dead
            if group_again:
                self.freed += 1
        assert expire(self.session, self.now) == sorted(again)
        self.take_letters(dead)
        self.may_carry = True
        if again or dead:
            self.must_carry = True

    @rule(
        name=st.sampled_from(GROUPS),
        max_attempts=st.sampled_from([None, 1, 2, 3]),
        dead_letter=st.sampled_from([None, None, "graveyard"]),
    )
    def configure(self, name: str, max_attempts: int | None, dead_letter: str | None) -> None:
        got = configure(self.session, name, max_attempts, dead_letter, now=self.now)
        model = self.create(name, False)
        if max_attempts is not None:
            model.max_attempts = max_attempts
        if dead_letter is not None:
            model.dead_letter = dead_letter
        assert got == self.info_of(name)
        self.must_carry = True

    @rule(step=st.sampled_from(STEPS))
    def advance(self, step: int) -> None:
        self.now += step

    @rule()
    def take_delta(self) -> None:
        delta = self.session.take_delta()
        if self.must_carry:
            assert delta.groups == self.session.groups.snapshot()
        elif not self.may_carry:
            assert delta.groups is None
        if delta.groups is not None:
            assert delta.groups == self.session.groups.snapshot()
        self.must_carry = self.may_carry = False

    @rule()
    def round_trip(self) -> None:
        snapshot = self.session.snapshot()
        restored = round_trip(self.session)
        assert restored.snapshot() == snapshot
        self.session = restored
        self.freed = 0  # a count of this process's, not kept
        self.must_carry = self.may_carry = False

    # -- the invariants ----------------------------------------------------------------

    def info_of(self, name: str) -> GroupInfo:
        model, ring = self.model[name], self.session.ring
        counts = {"ready": 0, "held": 0, "delayed": 0, "done": 0}
        for seq in range(ring.first, ring.head + 1):
            counts[self.state(model.of(seq))] += 1
        through = max(model.start, ring.first - 1)
        while through < ring.head and model.of(through + 1).kind in DONE_LIKE:
            through += 1
        return GroupInfo(
            name,
            through,
            counts["ready"],
            counts["held"],
            counts["delayed"],
            len(model.dead),
            model.max_attempts,
            model.dead_letter,
        )

    def state(self, status: Status) -> str:
        if status.kind in DONE_LIKE:
            return "done"
        if status.kind == "delayed" and status.until <= self.now:
            return "ready"
        return status.kind

    @invariant()
    def no_seq_is_held_by_two_live_leases(self) -> None:
        if not hasattr(self, "session"):
            return
        groups = self.session.groups.by_name
        live: dict[str, list[int]] = {name: [] for name in groups}
        for token in set(self.tokens):
            name, seq, _ = parse_token(token)
            if name not in groups:
                continue
            try:
                live[name].append(groups[name].live(token, self.now)[0])
            except LeaseLost:
                assert seq < self.session.ring.first or self.live(token) is None
            else:
                assert seq < self.session.ring.first or self.live(token) is not None
        for seqs in live.values():
            assert len(seqs) == len(set(seqs)), "a seq held by two live leases"

    @invariant()
    def every_seq_the_ring_holds_is_in_exactly_one_state_for_each_group(self) -> None:
        if not hasattr(self, "session"):
            return
        ring, groups = self.session.ring, self.session.groups
        assert sorted(groups.by_name) == sorted(self.model)
        for name, group in groups.by_name.items():
            model = self.model[name]
            for seq in range(ring.first, ring.head + 1):
                assert group.state_of(seq, self.now) == self.state(model.of(seq)), (name, seq)
                tables = [
                    seq in group.leases,
                    seq in group.delays,
                    seq in group.tries,
                    seq <= group.done_through or seq in group.done_above,
                ]
                assert sum(tables) <= 1, (name, seq, tables)
        assert infos(self.session, self.now) == [self.info_of(n) for n in sorted(self.model)]

    @invariant()
    def each_firing_that_died_left_exactly_one_dead_letter(self) -> None:
        if not hasattr(self, "session"):
            return
        assert self.session.groups.outbox == []
        died = [
            (letter.tags["dead.group"], int(letter.tags["dead.seq"])) for letter in self.letters
        ]
        assert len(died) == len(set(died)), "a dead letter twice"
        assert set(died) == {(name, seq) for name, m in self.model.items() for seq in m.dead}

    @invariant()
    def freed_moves_with_each_step_that_makes_a_firing_claimable(self) -> None:
        if hasattr(self, "session"):
            assert self.session.groups.freed == self.freed


# each example is up to 50 steps over a ring of at most 8 firings: 200 examples are a
# few seconds of the suite (STATEFUL_EXAMPLES=N for more); the slow variant runs 1,000
ClaimsMachine.TestCase.settings = settings(
    max_examples=examples(200, "STATEFUL_EXAMPLES"),
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_a_sessions_groups_keep_every_rule_under_random_steps = ClaimsMachine.TestCase


class LongClaimsMachine(ClaimsMachine):
    """The same machine, searched longer: ``pytest -m slow``."""


LongClaimsMachine.TestCase.settings = settings(
    ClaimsMachine.TestCase.settings,
    max_examples=examples(1_000, "STATEFUL_EXAMPLES"),
    stateful_step_count=100,
)
test_a_sessions_groups_keep_every_rule_under_a_long_search = pytest.mark.timeout(900)(
    pytest.mark.slow(LongClaimsMachine.TestCase)
)


def test_each_step_of_a_lease_says_what_a_store_running_it_itself_needs() -> None:
    """``ClaimStep``: a store that runs a step in a script of its own (Redis) calls it by
    its name with its one length, reads its answer from the script's number, and learns
    whether the firing is claimable at once and when the group must be looked at again."""
    done, extend = Finish("g:1:1", NOW), Extend("g:1:1", NOW, 5_000)
    at_once, later = Release("g:1:1", NOW), Release("g:1:1", NOW, 2_000)
    assert [op.step for op in (done, at_once, extend)] == ["done", "release", "extend"]
    assert [op.param for op in (done, at_once, later, extend)] == [0, 0, 2_000, 5_000]
    assert done.answered(7) == 7 and extend.answered(NOW + 5_000) == NOW + 5_000
    assert at_once.answered(1) is True and at_once.answered(0) is False
    assert at_once.frees(False) and not at_once.frees(True) and not later.frees(False)
    assert not done.frees(7) and not extend.frees(NOW)
    assert later.due() == NOW + 2_000 and at_once.due() is None
    assert done.due() is None and extend.due() is None
