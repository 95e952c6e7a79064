"""The ring alone: seqs, the bound, reads after N and the ``visible`` cap (SPEC §3 rules 1-3, 15).

Plain synchronous tests, no event loop and no fixtures: each builds a ring,
does one thing to it and checks the exact answer.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from session.errors import BadLimit, BadMax, BadSeq, Code, CursorAfterHead
from session.firing import Batch, Firing
from session.ring import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    Fold,
    Image,
    Ring,
    decode_image,
    encode_image,
)
from session.tags import Match


def append(ring: Ring, handler: str, result: str | None, event: str | None, ts: str) -> Firing:
    """Record the next firing, as a send does, and the firing it is."""
    return Firing(ring.record(handler, result, event, ts), handler, result, event, ts)


def filled(count: int, limit: int = DEFAULT_LIMIT) -> Ring:
    ring = Ring(limit)
    for n in range(1, count + 1):
        append(ring, "on-message", f"m{n}", None, f"t{n}")
    return ring


def seqs(batch: Batch) -> list[int]:
    return [f.seq for f in batch.firings]


def state(ring: Ring) -> tuple[int, int, list[Firing]]:
    return ring.head, ring.limit, ring.firings()


# -- seqs and the bound (rules 1, 2) ---------------------------------------------------


def test_a_new_ring_is_empty_with_head_0_and_the_default_limit_256() -> None:
    ring = Ring()
    assert (ring.head, ring.limit, ring.retained, ring.first, ring.dropped) == (0, 256, 0, 1, 0)
    assert ring.firings() == []


def test_five_firings_get_seqs_1_to_5_and_head_5() -> None:
    ring = filled(5)
    assert [f.seq for f in ring.firings()] == [1, 2, 3, 4, 5]
    assert ring.head == 5


def test_append_returns_the_firing_it_recorded_with_every_field() -> None:
    ring = Ring()
    firing = append(ring, "on-tick", None, "raw", "2024-01-01T00:00:00.000Z")
    assert firing == Firing(1, "on-tick", None, "raw", "2024-01-01T00:00:00.000Z")
    assert ring.firings() == [firing]


def test_with_limit_0_every_firing_still_takes_the_next_seq() -> None:
    ring = filled(3, limit=0)
    assert append(ring, "on-message", "x", None, "t").seq == 4
    assert (ring.head, ring.retained, ring.first, ring.dropped) == (4, 0, 5, 4)


def test_the_ring_keeps_only_the_newest_limit_firings() -> None:
    ring = filled(10, limit=4)
    assert [f.seq for f in ring.firings()] == [7, 8, 9, 10]
    assert (ring.retained, ring.first, ring.dropped) == (4, 7, 6)


def test_lowering_the_limit_on_a_full_ring_trims_the_oldest_and_reports_the_loss() -> None:
    ring = filled(8, limit=8)
    assert ring.set_limit(3) == 5
    assert [f.seq for f in ring.firings()] == [6, 7, 8]
    batch = ring.events_after(0)
    assert (batch.next, batch.lost, seqs(batch)) == (8, 5, [6, 7, 8])


def test_raising_the_limit_trims_nothing_and_brings_nothing_back() -> None:
    ring = filled(6, limit=2)
    assert ring.set_limit(10) == 0
    assert (ring.limit, [f.seq for f in ring.firings()]) == (10, [5, 6])
    append(ring, "on-message", "7", None, "t")
    assert [f.seq for f in ring.firings()] == [5, 6, 7]


@pytest.mark.parametrize("limit", [0, 1, MAX_LIMIT])
def test_limits_0_to_65536_are_accepted(limit: int) -> None:
    assert Ring(limit).limit == limit
    ring = Ring()
    ring.set_limit(limit)
    assert ring.limit == limit


@pytest.mark.parametrize("limit", [-1, MAX_LIMIT + 1])
def test_a_limit_outside_0_to_65536_is_bad_limit_and_changes_nothing(limit: int) -> None:
    with pytest.raises(BadLimit, match=f"limit {limit} is outside 0 to 65,536") as info:
        Ring(limit)
    assert info.value.code == Code.BAD_LIMIT
    ring = filled(5, limit=5)
    before = state(ring)
    with pytest.raises(BadLimit):
        ring.set_limit(limit)
    assert state(ring) == before


# -- read after N (rule 3) -------------------------------------------------------------


def test_reading_after_n_twice_gives_the_same_answer() -> None:
    ring = filled(5)
    assert ring.events_after(2) == ring.events_after(2)
    assert seqs(ring.events_after(2)) == [3, 4, 5]
    assert ring.retained == 5


def test_reading_after_0_returns_the_whole_ring_oldest_first() -> None:
    ring = filled(3)
    batch = ring.events_after(0)
    assert batch == Batch(3, 0, ring.firings())


def test_limit_4_with_10_firings_after_0_gives_next_10_lost_6_and_seqs_7_to_10() -> None:
    batch = filled(10, limit=4).events_after(0)
    assert (batch.next, batch.lost, seqs(batch)) == (10, 6, [7, 8, 9, 10])


def test_limit_4_with_10_firings_a_reader_at_8_has_lost_nothing() -> None:
    batch = filled(10, limit=4).events_after(8)
    assert (batch.next, batch.lost, seqs(batch)) == (10, 0, [9, 10])


def test_lost_counts_only_the_dropped_firings_after_the_reader() -> None:
    # first retained is 7: a reader at 3 missed 4, 5 and 6
    batch = filled(10, limit=4).events_after(3)
    assert (batch.next, batch.lost, seqs(batch)) == (10, 3, [7, 8, 9, 10])


def test_a_reader_just_before_the_first_retained_firing_has_lost_nothing() -> None:
    batch = filled(10, limit=4).events_after(6)
    assert (batch.lost, seqs(batch)) == (0, [7, 8, 9, 10])


def test_on_an_empty_ring_lost_is_head_minus_n_and_next_is_n_plus_lost() -> None:
    ring = filled(5, limit=0)
    assert ring.events_after(0) == Batch(5, 5, [])
    assert ring.events_after(2) == Batch(5, 3, [])
    assert ring.events_after(5) == Batch(5, 0, [])


def test_at_the_head_a_read_returns_nothing_and_next_is_the_head() -> None:
    assert filled(4).events_after(4) == Batch(4, 0, [])
    assert Ring().events_after(0) == Batch(0, 0, [])


def test_reading_after_a_seq_beyond_the_head_is_cursor_after_head() -> None:
    ring = filled(3)
    with pytest.raises(CursorAfterHead) as info:
        ring.events_after(4)
    assert info.value.message == "cursor 4 is after head 3"
    assert str(info.value) == "cursor 4 is after head 3"
    assert info.value.code == Code.CURSOR_AFTER_HEAD


def test_reading_after_a_negative_seq_is_bad_seq() -> None:
    with pytest.raises(BadSeq, match="seq -1 is negative"):
        filled(3).events_after(-1)


@pytest.mark.parametrize("most", [0, -5])
def test_a_max_below_1_is_bad_max(most: int) -> None:
    with pytest.raises(BadMax, match=f"max {most} is below 1"):
        filled(3).events_after(0, most)


def test_max_caps_the_batch_and_next_is_the_last_seq_returned() -> None:
    batch = filled(10).events_after(2, 3)
    assert (batch.next, batch.lost, seqs(batch)) == (5, 0, [3, 4, 5])


def test_max_with_a_loss_still_reports_the_loss_and_starts_at_the_first_retained() -> None:
    batch = filled(10, limit=4).events_after(0, 1)
    assert (batch.next, batch.lost, seqs(batch)) == (7, 6, [7])


def test_paging_a_full_ring_with_max_100_returns_every_firing_exactly_once() -> None:
    ring = filled(1000, limit=DEFAULT_LIMIT)
    seen: list[int] = []
    lost = 0
    after = 0
    while after < ring.head:
        batch = ring.events_after(after, 100)
        assert len(batch.firings) <= 100
        seen += seqs(batch)
        lost += batch.lost
        after = batch.next
    assert seen == list(range(745, 1001))
    assert lost == 744
    assert after == ring.head


def test_a_tail_read_of_one_firing_returns_the_newest() -> None:
    ring = filled(300)
    assert seqs(ring.events_after(299)) == [300]
    assert seqs(ring.events_after(298, 1)) == [299]


def test_every_read_after_n_with_every_max_matches_a_plain_list() -> None:
    # walks the slice from the front and from the back: both must agree
    ring = filled(20, limit=9)
    retained = ring.firings()
    for after in range(ring.head + 1):
        for most in [None, *range(1, 12)]:
            want = [f for f in retained if f.seq > after][:most]
            batch = ring.events_after(after, most)
            assert batch.firings == want, (after, most)
            assert batch.lost == max(0, ring.first - after - 1)


# -- the visible cap -------------------------------------------------------------------


def test_visible_hides_firings_above_it() -> None:
    batch = filled(10).events_after(2, visible=6)
    assert (batch.next, batch.lost, seqs(batch)) == (6, 0, [3, 4, 5, 6])


def test_visible_is_the_head_in_the_after_head_message() -> None:
    with pytest.raises(CursorAfterHead, match="cursor 7 is after head 6"):
        filled(10).events_after(7, visible=6)


def test_visible_loss_counts_only_firings_up_to_visible() -> None:
    # the ring holds 7-10, readers may see up to 5: 1-5 are lost, nothing is returned
    ring = filled(10, limit=4)
    assert ring.events_after(0, visible=5) == Batch(5, 5, [])
    assert ring.events_after(3, visible=8) == Batch(8, 3, ring.firings()[:2])


def test_visible_with_limit_0_tells_of_the_loss_up_to_visible() -> None:
    assert filled(9, limit=0).events_after(1, visible=4) == Batch(4, 3, [])


def test_visible_above_the_head_is_capped_at_the_head() -> None:
    ring = filled(3)
    assert ring.visible_head(10) == 3
    assert ring.events_after(0, visible=10) == ring.events_after(0)
    assert ring.events_after(1, 1, visible=10) == ring.events_after(1, 1)
    with pytest.raises(CursorAfterHead, match="cursor 4 is after head 3"):
        ring.events_after(4, visible=10)


def test_a_negative_visible_shows_nothing() -> None:
    ring = filled(3)
    assert ring.visible_head(-2) == 0
    assert ring.events_after(0, visible=-2) == Batch(0, 0, [])


def test_visible_none_is_the_head() -> None:
    ring = filled(3)
    assert ring.visible_head() == ring.visible_head(None) == 3


# -- rebuilding a ring (what a store hands back) ---------------------------------------


def test_a_ring_rebuilt_from_its_firings_reads_the_same() -> None:
    ring = filled(10, limit=4)
    again = Ring(ring.limit, ring.head, ring.firings())
    assert state(again) == state(ring)
    assert again.events_after(0) == ring.events_after(0)


def test_a_ring_rebuilt_with_more_firings_than_its_limit_keeps_the_newest() -> None:
    again = Ring(2, 10, filled(10).firings())
    assert [f.seq for f in again.firings()] == [9, 10]


def test_a_ring_rebuilt_with_a_negative_head_is_bad_seq() -> None:
    with pytest.raises(BadSeq, match="head -1 is negative"):
        Ring(4, -1)


@pytest.mark.parametrize(
    ("head", "kept"),
    [
        (11, slice(None)),  # firings end below the head
        (9, slice(None)),  # firings end above the head
        (10, slice(0, 2)),  # a gap: 7, 8 claimed as the newest of 10
        (2, slice(None)),  # more firings than seqs up to the head
    ],
)
def test_a_ring_rebuilt_from_firings_that_are_not_the_seqs_up_to_its_head_is_bad_seq(
    head: int, kept: slice
) -> None:
    firings = filled(10, limit=4).firings()[kept]
    with pytest.raises(BadSeq, match="are not the newest"):
        Ring(4, head, firings)


# -- a ring's image (what SQLite keeps at a clean stop) ---------------------------------

TS = "2026-12-02T09:00:00.250Z"

TEXTS = ["text", "", "é ∑ 🦀", "x" * 300]


def sending(texts: list[str]) -> st.SearchStrategy[tuple[str, bool, str, str, dict[str, str]]]:
    """What a send can record: handled or not, with tags, with a ts that does not pack, and
    enough handler names to rebuild the ring's table of them."""
    return st.tuples(
        st.sampled_from(["on-message", "on-tick", *(f"h{n}" for n in range(40))]),
        st.booleans(),
        st.sampled_from(texts),
        st.sampled_from([TS, "2026-12-02T09:00:01.999Z", "not a ts", "1999-01-01T00:00:00.000Z"]),
        st.sampled_from([{}, {"corr": "c-1"}]),
    )


sends = sending(TEXTS)
# text UTF-8 cannot carry, which the ring keeps as a Firing: an image cannot hold it
any_sends = sending([*TEXTS, "\ud800 lone"])


def record(ring: Ring, send: tuple[str, bool, str, str, dict[str, str]]) -> Firing:
    handler, handled, text, ts, tags = send
    result, event = (text, None) if handled else (None, text)
    return Firing(
        ring.record(handler, result, event, ts, tags=tags), handler, result, event, ts, tags
    )


@settings(max_examples=150, deadline=None)
@given(
    limit=st.integers(0, 40),
    before=st.lists(sends, max_size=120),
    after=st.lists(any_sends, max_size=60),
    new_limit=st.none() | st.integers(0, 40),
)
def test_a_ring_from_its_image_and_the_firings_after_it_is_the_ring(
    limit: int,
    before: list[tuple[str, bool, str, str, dict[str, str]]],
    after: list[tuple[str, bool, str, str, dict[str, str]]],
    new_limit: int | None,
) -> None:
    """A ring's image, through its bytes, trimmed to the ring's first seq as it is later,
    with the firings recorded after it: the same ring, firing by firing, and one that goes
    on recording (and rebuilding its table of handlers) as the ring does."""
    ring = Ring(limit)
    for send in before:
        record(ring, send)
    image = decode_image(encode_image(ring.image()))
    assert image == ring.image()
    later = [record(ring, send) for send in after]
    if new_limit is not None:
        ring.set_limit(new_limit)
    tail = [f for f in later if f.seq >= ring.first]
    again = Ring.from_image(ring.limit, ring.head, image.since(ring.first), tail)
    assert state(again) == state(ring)
    assert again.events_after(None) == ring.events_after(None)
    for send in after + before[:50]:
        assert record(again, send) == record(ring, send)
    assert state(again) == state(ring)


def test_an_image_whose_firings_do_not_follow_it_is_bad_seq() -> None:
    ring = filled(10, limit=4)
    image = ring.image()
    eleven, twelve = (Firing(n, "on-message", f"m{n}", None, TS) for n in (11, 12))
    with pytest.raises(BadSeq, match="firing 12 does not follow the image's seq 10"):
        Ring.from_image(4, 12, image, [twelve])
    with pytest.raises(BadSeq, match="end at 11, not at head 12"):
        Ring.from_image(4, 12, image, [eleven])
    with pytest.raises(BadSeq, match="an image of head 2 holds 4 firings"):
        Ring.from_image(4, 2, Image(2, image.slots, image.items))
    assert Ring.from_image(4, 11, image, [eleven]).firings() == [*ring.firings()[1:], eleven]


def test_an_image_trimmed_past_its_newest_firing_holds_none_up_to_the_first() -> None:
    image = filled(10, limit=4).image()
    assert image.since(7) == Image(10, image.slots, image.items[0:], image.by)
    assert image.since(9).items == image.items[2:]
    assert image.since(14) == Image(13, [], [])
    fourteen = Firing(14, "on-message", "m14", None, TS)
    assert Ring.from_image(4, 14, image.since(14), [fourteen]).firings() == [fourteen]


def test_a_ring_holding_text_utf8_cannot_carry_has_no_image_bytes() -> None:
    ring = filled(3)
    record(ring, ("on-message", True, "\ud800 lone", TS, {}))
    with pytest.raises(UnicodeEncodeError):
        encode_image(ring.image())


def test_bytes_that_are_no_image_are_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_image(b"\x93\x01")
    with pytest.raises(msgspec.DecodeError):
        decode_image(encode_image(filled(3).image())[:-2])


# -- a folded ring (a restart's, brought in from its store when first looked into) ------


class Keeper:
    """A store of one ring: unfolding it hands over a copy, through its image's bytes, and
    counts the calls (a folded ring must unfold once, and only when a firing is needed)."""

    def __init__(self, ring: Ring, fail: int = 0) -> None:
        self.data = encode_image(ring.image())
        self.limit, self.head = ring.limit, ring.head
        self.calls, self.fail = 0, fail

    def unfold(self) -> Ring:
        self.calls += 1
        if self.calls <= self.fail:
            raise OSError("the store is away")
        return Ring.from_image(self.limit, self.head, decode_image(self.data))

    def folded(self, retained: int) -> Ring:
        return Ring.folded(self.limit, self.head, Fold(retained, self.unfold))


def counts(ring: Ring) -> tuple[int, int, int, int, int]:
    return ring.head, ring.limit, ring.retained, ring.first, ring.dropped


looks = st.one_of(
    st.tuples(st.just("send"), sends),
    st.tuples(st.just("limit"), st.integers(0, 40)),
    st.tuples(
        st.just("read"),
        st.tuples(
            st.none() | st.integers(0, 130),  # after (past the head: cursor_after_head)
            st.none() | st.integers(0, 12),  # max (0: bad_max)
            st.none() | st.integers(-1, 130),  # visible
            st.sampled_from(
                [None, Match(handler="on-tick"), Match(tags={"corr": None}), Match(handler="h3")]
            ),
        ),
    ),
    st.tuples(st.just("firings"), st.none()),
    st.tuples(st.just("image"), st.none()),
    st.tuples(st.just("since"), st.integers(0, 130)),
)


def look(ring: Ring, what: str, arg: object) -> object:
    """One operation on ``ring``, and what it gave (an error by its code)."""
    try:
        if what == "send":
            return record(ring, arg)  # type: ignore[arg-type]
        if what == "limit":
            return ring.set_limit(arg)  # type: ignore[arg-type]
        if what == "read":
            after, most, visible, match = arg  # type: ignore[misc]
            return ring.events_after(after, most, visible, match=match)
        if what == "firings":
            return ring.firings()
        if what == "since":
            return ring.recorded_after(arg)  # type: ignore[arg-type]
        return ring.image()
    except (BadSeq, BadMax, CursorAfterHead, BadLimit) as exc:
        return exc.code


@settings(max_examples=150, deadline=None)
@given(
    limit=st.integers(0, 40),
    before=st.lists(sends, max_size=80),
    then=st.lists(looks, max_size=30),
)
def test_a_folded_ring_is_the_ring_whatever_is_done_to_it(
    limit: int,
    before: list[tuple[str, bool, str, str, dict[str, str]]],
    then: list[tuple[str, object]],
) -> None:
    """A folded ring and the ring it folds, put through the same operations: the same
    answers and the same counts after each; it unfolds once at most, and only for an
    operation that needs a firing (never for its counts, nor a read that finds none)."""
    ring = Ring(limit)
    for send in before:
        record(ring, send)
    keeper = Keeper(ring)
    folded = keeper.folded(ring.retained)
    for what, arg in then:
        assert counts(folded) == counts(ring)
        assert look(folded, what, arg) == look(ring, what, arg)
        assert keeper.calls == (0 if folded.is_folded else 1)
    assert counts(folded) == counts(ring)
    assert (type(folded) is Ring) == (keeper.calls == 1)
    assert state(folded) == state(ring)
    assert keeper.calls == 1


def test_a_folded_ring_answers_its_counts_and_an_empty_read_without_unfolding() -> None:
    ring = filled(10, limit=4)
    keeper = Keeper(ring)
    folded = keeper.folded(4)
    assert folded.is_folded
    assert counts(folded) == (10, 4, 4, 7, 6)
    assert folded.visible_head(8) == 8
    assert folded.events_after(10) == Batch(10, 0, [])
    assert folded.events_after(6, visible=6) == Batch(6, 0, [])
    with pytest.raises(CursorAfterHead):
        folded.events_after(11)
    with pytest.raises(BadLimit):
        folded.set_limit(MAX_LIMIT + 1)
    assert folded.recorded_after(10) == [] and folded.recorded_after(12) == []
    assert keeper.calls == 0
    assert folded.events_after(8) == ring.events_after(8)
    assert keeper.calls == 1 and type(folded) is Ring and not folded.is_folded
    again = keeper.folded(4)
    assert again.recorded_after(8) == ring.recorded_after(8) and not again.is_folded
    folded.firings(), folded.record("on-message", "m11", None, TS)
    assert keeper.calls == 2


def test_an_unfold_that_fails_leaves_the_ring_folded_and_the_next_look_tries_again() -> None:
    ring = filled(6, limit=4)
    keeper = Keeper(ring, fail=1)
    folded = keeper.folded(4)
    with pytest.raises(OSError, match="the store is away"):
        folded.record("on-message", "m7", None, TS)
    assert folded.is_folded and counts(folded) == counts(ring)
    assert folded.firings() == ring.firings()
    assert keeper.calls == 2


def test_a_fold_that_brings_in_another_ring_is_bad_seq_and_stays_folded() -> None:
    keeper = Keeper(filled(6, limit=4))
    for retained, limit, head in ((3, 4, 6), (4, 5, 6), (4, 4, 7)):
        folded = Ring.folded(limit, head, Fold(retained, keeper.unfold))
        with pytest.raises(BadSeq, match="unfolded as one of limit 4, head 6 and 4"):
            folded.firings()
        assert folded.is_folded
    with pytest.raises(BadSeq, match="cannot hold 5"):
        Ring.folded(4, 6, Fold(5, keeper.unfold))
    with pytest.raises(BadSeq, match="cannot hold 3"):
        Ring.folded(4, 2, Fold(3, keeper.unfold))


@settings(max_examples=150, deadline=None)
@given(
    limit=st.integers(0, 40),
    before=st.lists(any_sends, max_size=120),
    new_limit=st.none() | st.integers(0, 40),
    data=st.data(),
)
def test_what_a_ring_recorded_after_a_seq_is_what_a_read_after_it_returns(
    limit: int,
    before: list[tuple[str, bool, str, str, dict[str, str]]],
    new_limit: int | None,
    data: st.DataObject,
) -> None:
    """``recorded_after`` (a commit's look at a ring) gives the firings a read after the
    same seq does, for every seq up to the head, trimmed or not; none after the head."""
    ring = Ring(limit)
    for send in before:
        record(ring, send)
    if new_limit is not None:
        ring.set_limit(new_limit)
    seq = data.draw(st.integers(0, ring.head))
    assert ring.recorded_after(seq) == ring.events_after(seq).firings
    assert ring.recorded_after(ring.head + data.draw(st.integers(0, 3))) == []


@settings(max_examples=150, deadline=None)
@given(
    limit=st.integers(0, 12),
    chunks=st.lists(st.lists(any_sends, max_size=30), max_size=6),
    new_limit=st.none() | st.integers(0, 12),
    data=st.data(),
)
def test_a_store_taking_a_ring_again_and_again_is_handed_what_a_read_gives(
    limit: int,
    chunks: list[list[tuple[str, bool, str, str, dict[str, str]]]],
    new_limit: int | None,
    data: st.DataObject,
) -> None:
    """Once a store takes a ring's new firings, the ring keeps each one recorded as its
    ``Firing`` until the next take (at most a ring's length of them): every take, after a
    few firings or more than the ring holds, a new limit or a seq of its own, is still
    what a read after the same seq gives."""
    ring = Ring(limit)
    taken = 0
    for n, chunk in enumerate(chunks):
        for send in chunk:
            record(ring, send)
        if n == 2 and new_limit is not None:
            ring.set_limit(new_limit)
        seq = data.draw(st.sampled_from([taken, ring.head, max(taken - 1, 0)]))
        assert ring.recorded_after(seq) == ring.events_after(seq).firings
        taken = ring.head


def test_at_finds_one_firing_by_its_seq_and_refuses_one_the_ring_does_not_hold() -> None:
    """``Ring.at`` (a claim's firing) is the firing a read of it gives, folded or not."""
    ring = Ring(3)
    for n in range(5):
        record(ring, ("on-message", n % 2 == 0, f"f{n}", TS, {"n": str(n)} if n % 2 else {}))
    for seq in (3, 4, 5):
        assert ring.at(seq) == ring.events_after(seq - 1, 1).firings[0]
    for seq in (0, 2, 6):
        with pytest.raises(BadSeq, match=f"holds firings 3 to 5, not {seq}"):
            ring.at(seq)
    keeper = Keeper(ring)
    folded = keeper.folded(ring.retained)
    assert folded.at(4) == ring.at(4) and keeper.calls == 1
