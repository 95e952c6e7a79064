"""A wait answered from the firing its wake carried (``session.ring.look_heard``) gets what
a read of the ring would give, and a wait's ack with its first look (``AckRead``) is the
ack then the look, in one step: all or nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from session.errors import AckAfterHead, BadMax, BadSeq
from session.firing import Batch, Firing
from session.ops import AckRead, ReadCursor, Record
from session.ring import Ring, look_heard
from session.session import Recorded, Session
from session.tags import Match

TS = "2026-12-02T04:00:00.000Z"


def firing(seq: int, handler: str = "on-message", tags: dict[str, str] | None = None) -> Firing:
    return Firing(seq, handler, f"r{seq}", None, TS, tags or {})


def test_firings_that_follow_the_position_one_by_one_are_what_a_read_gives() -> None:
    assert look_heard(4, [firing(5)]) == Batch(5, 0, [firing(5)])
    assert look_heard(4, [firing(5), firing(6)], max=1) == Batch(5, 0, [firing(5)])


def test_a_gap_an_older_firing_or_nothing_heard_means_read_the_ring() -> None:
    assert look_heard(4, []) is None
    assert look_heard(4, [firing(6)]) is None  # 5 was missed
    assert look_heard(4, [firing(4)]) is None  # older than the position
    assert look_heard(4, [firing(5), firing(7)]) is None


def test_a_matching_look_returns_the_matches_and_next_is_the_last_looked_at() -> None:
    match = Match({"corr": "c-1"})
    heard = [firing(5), firing(6, tags={"corr": "c-1"}), firing(7, tags={"corr": "c-1"})]
    assert look_heard(4, heard[:1], match=match) == Batch(5, 0, [])
    assert look_heard(4, heard, match=match) == Batch(7, 0, heard[1:])
    assert look_heard(4, heard, max=1, match=match) == Batch(6, 0, [heard[1]])


@given(
    st.integers(0, 12),
    st.lists(st.sampled_from([{}, {"corr": "x"}, {"n": "1"}]), min_size=1, max_size=8),
    st.none() | st.integers(1, 4),
    st.none() | st.sampled_from([Match({"corr": "x"}), Match({}, "on-tick"), Match({"n": None})]),
    st.integers(0, 6),
)
def test_a_look_at_heard_firings_is_the_rings_own(
    limit_extra: int,
    tags: list[dict[str, str]],
    most: int | None,
    match: Match | None,
    before: int,
) -> None:
    """The same firings recorded in a ring large enough to keep them: a read after the
    position gives exactly the batch ``look_heard`` gives."""
    ring = Ring(limit=len(tags) + before + limit_extra + 1)
    for n in range(before):
        ring.record("on-message", f"b{n}", None, TS)
    heard = []
    for n, tag in enumerate(tags):
        handler = "on-tick" if n % 3 == 2 else "on-message"
        seq = ring.record(handler, f"h{n}", None, TS, tags=tag)
        heard.append(Firing(seq, handler, f"h{n}", None, TS, tag))
    assert look_heard(before, heard, most, match) == ring.events_after(before, most, match=match)


def test_a_firing_the_ring_does_not_keep_says_so() -> None:
    session = Session("a", limit=0)
    assert session.record("on-message", "x", TS) == Recorded(1, retained=False)
    session.set_limit(2)
    assert session.record("on-message", "y", TS) == Recorded(2, retained=True)
    assert session.record("on-message", "y", TS, key="k") == Recorded(3)
    assert session.record("on-message", "z", TS, key="k") == Recorded(3, duplicate=True)


def test_an_ack_with_the_first_look_acks_then_reads_through_the_cursor() -> None:
    session = Session("a")
    for n in range(3):
        Record("on-message", f"m{n}", TS).run(session, None)
    before = session.evaluations
    batch = AckRead("c", 1, max=1).run(session, None)
    assert [f.seq for f in batch.firings] == [2] and batch.next == 2
    assert session.evaluations == before + 2  # the ack and the look
    acked = session.snapshot().cursors
    assert [(c.name, c.seq) for c in acked] == [("c", 1)]
    # the ack is a use of the cursor, the look is not: a look after it leaves the LRU alone
    assert ReadCursor("c", touch=False).run(session, None).next == 3
    assert session.snapshot().cursors == acked
    AckRead("c", 1).run(session, None)
    assert session.snapshot().cursors[0].last_use == acked[0].last_use + 1


def test_a_refused_ack_with_the_first_look_changes_and_reads_nothing() -> None:
    session = Session("a")
    Record("on-message", "m", TS).run(session, None)
    before = session.snapshot(), session.evaluations
    with pytest.raises(AckAfterHead, match="cannot ack 5: head is 1"):
        AckRead("c", 5).run(session, None)
    for bad, error in ((AckRead("c", -1), BadSeq), (AckRead("c", 0, max=0), BadMax)):
        with pytest.raises(error):
            bad.check()
    assert (session.snapshot(), session.evaluations) == before
