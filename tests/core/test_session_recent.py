"""Compound reads, each one look of the core's: the newest N, those since a time, one seq.

``Session.read_recent`` and ``Session.read_seq`` (the wire's ``read`` with
``last``, ``since``, ``seq``) answer what a client used to ask for in two
requests, a ``stats`` for the head and then a read, with a race between them.
Like every read they acknowledge nothing and count one evaluation; an illegal
one raises and changes nothing.
"""

from __future__ import annotations

import pytest

from session.errors import BadMax, BadRequest, BadSeq, CursorAfterHead
from session.firing import Batch
from session.ops import ReadRecent, ReadSeq
from session.ring import since_of
from session.session import Session
from session.tags import Match


def ts(second: int) -> str:
    return f"2026-12-04T10:00:{second:02d}.000Z"


def session(limit: int = 8, count: int = 6) -> Session:
    """``count`` firings ``f1``... at seconds 1, 2, ... (tag n=odd on the odd ones)."""
    s = Session("s", limit)
    for n in range(1, count + 1):
        s.record("on-message", f"f{n}", ts(n), tags={"n": "odd"} if n % 2 else {})
    return s


def seqs(batch: Batch) -> list[int]:
    return [f.seq for f in batch.firings]


def test_last_n_is_the_newest_n_in_one_look() -> None:
    s = session()
    before = s.evaluations
    got = s.read_recent(3, None)
    assert (seqs(got), got.next, got.lost) == ([4, 5, 6], 6, 0)
    assert s.evaluations == before + 1
    assert seqs(s.read_recent(3, None, max=2)) == [4, 5]  # paged: the oldest of them
    assert seqs(s.read_recent(10, None)) == [1, 2, 3, 4, 5, 6]
    assert seqs(s.read_recent(4, None, match=Match({"n": "odd"}))) == [3, 5]


def test_last_n_past_the_ring_says_what_was_dropped() -> None:
    s = session(limit=3)  # holds 4, 5, 6
    got = s.read_recent(5, None)
    assert (seqs(got), got.lost) == ([4, 5, 6], 2)


def test_since_keeps_the_firings_recorded_since_and_the_newest_n_of_them() -> None:
    s = session()
    assert seqs(s.read_recent(None, ts(4))) == [4, 5, 6]
    assert seqs(s.read_recent(2, ts(2))) == [5, 6]
    got = s.read_recent(None, ts(2), max=2)  # paged: it ends at its last firing
    assert (seqs(got), got.next) == ([2, 3], 3)
    assert seqs(s.read_recent(None, ts(9))) == []


def test_since_reports_dropped_firings_only_when_they_may_be_in_range() -> None:
    s = session(limit=3)  # 1-3 dropped; the oldest held is at second 4
    assert s.read_recent(None, ts(2)).lost == 3  # the dropped ones may be since second 2
    assert s.read_recent(None, ts(5)).lost == 0  # the oldest held is before: they are too
    assert s.read_recent(1, ts(2)).lost == 0  # cut to the newest: nothing before it told
    empty = Session("e", 0)
    empty.record("on-message", "gone", ts(1))
    assert empty.read_recent(None, ts(0)).lost == 1  # nothing held: it may be in range


def test_since_with_a_match_tells_dropped_firings_by_the_whole_rings_oldest() -> None:
    """Whether the dropped firings may be in range goes by the oldest firing the ring holds,
    matching or not: not by the oldest that matches."""
    s = Session("m", 2)
    s.record("on-message", "dropped", ts(0), tags={"k": "1"})
    s.record("on-message", "kept, not matching", ts(1))
    s.record("on-message", "kept, matching", ts(5), tags={"k": "1"})
    got = s.read_recent(None, ts(3), match=Match({"k": None}))
    assert ([f.result for f in got.firings], got.lost) == (["kept, matching"], 0)
    assert s.read_recent(None, ts(0), match=Match({"k": None})).lost == 1  # may be in range


def test_bad_recent_reads_raise_and_change_nothing() -> None:
    s = session()
    before = s.snapshot(), s.evaluations
    with pytest.raises(BadMax, match="last 0 is below 1"):
        s.read_recent(0, None)
    with pytest.raises(BadMax, match="max 0 is below 1"):
        s.read_recent(2, None, max=0)
    with pytest.raises(BadRequest):
        s.read_recent(None, None)
    assert (s.snapshot(), s.evaluations) == before


def test_one_seq_is_that_firing_or_its_loss_or_refused_after_the_head() -> None:
    s = session(limit=3)
    got = s.read_seq(5)
    assert (seqs(got), got.next, got.lost) == ([5], 5, 0)
    dropped = s.read_seq(2)
    assert (seqs(dropped), dropped.lost) == ([], 1)
    before = s.snapshot(), s.evaluations
    with pytest.raises(CursorAfterHead, match="no firing 7: its head is 6"):
        s.read_seq(7)
    with pytest.raises(BadSeq, match="seqs start at 1"):
        s.read_seq(0)
    assert (s.snapshot(), s.evaluations) == before


def test_the_ops_check_their_own_values_before_any_session() -> None:
    ReadRecent(3, None).check()
    ReadRecent(None, ts(1), max=2).check()
    with pytest.raises(BadMax):
        ReadRecent(0, None).check()
    with pytest.raises(BadMax):
        ReadRecent(1, None, max=0).check()
    with pytest.raises(BadSeq):
        ReadSeq(0).check()
    ReadSeq(1).check()
    s = session()
    assert seqs(ReadRecent(2, None).run(s, None)) == [5, 6]
    assert seqs(ReadSeq(3).run(s, None)) == [3]
    assert seqs(ReadRecent(None, ts(6)).run(s, visible=5)) == []  # what is not durable yet


def test_since_of_is_one_formula_for_every_store() -> None:
    whole = session(limit=3).read_after(0)
    assert since_of(whole, ts(5), None, None) == Batch(6, 0, whole.firings[1:])
    assert since_of(whole, ts(1), 2, 1) == Batch(5, 0, whole.firings[1:2])
