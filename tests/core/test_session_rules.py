"""A session's rules, one test each: SPEC §2 names and §3 rules 1-7, 13 and 15.

Plain synchronous tests with no fixtures. Wherever an operation must fail,
the test also checks that it changed nothing: the snapshot and the
evaluation count are the same before and after.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import msgspec
import pytest

from session.errors import (
    AckAfterHead,
    BadCursorName,
    BadHandler,
    BadKey,
    BadLimit,
    BadMax,
    BadSeq,
    BadSessionId,
    Code,
    CursorAfterHead,
    ReplError,
)
from session.firing import Batch, Firing
from session.names import check_cursor_name, check_session_id
from session.rules import MAX_CURSORS, MAX_KEYS
from session.session import CursorInfo, CursorState, Recorded, Session, Snapshot


def position(session: Session, cursor: str) -> int | None:
    """Where ``cursor`` stands in ``session``, as a store keeps it; None when it has none."""
    return next((c.seq for c in session.cursor_states() if c.name == cursor), None)


def filled(count: int, limit: int = 256) -> Session:
    session = Session("s", limit)
    for _ in range(count):
        send(session)
    return session


def send(session: Session, text: str = "", key: str | None = None) -> Recorded:
    return session.record("on-message", text or f"m{session.head + 1}", "t", key=key)


def seqs(batch: Batch) -> list[int]:
    return [f.seq for f in batch.firings]


def positions(session: Session) -> dict[str, int]:
    return {c.name: c.seq for c in session.cursor_states()}


def names(session: Session) -> list[str]:
    """Cursor names, least recently used first."""
    return [c.name for c in session.cursor_states()]


def unchanged_after_failure(
    session: Session, error: type[ReplError], call: Callable[[Session], object]
) -> ReplError:
    before = session.snapshot()
    evaluations = session.evaluations
    with pytest.raises(error) as info:
        call(session)
    assert session.snapshot() == before
    assert session.evaluations == evaluations
    return info.value


# -- names (SPEC §2, rule 4) -----------------------------------------------------------


@pytest.mark.parametrize("good", ["a", "0", "a" * 64, "A.b_c-9", "9-lives", "x..", "x__--"])
def test_session_ids_of_1_to_64_allowed_characters_starting_with_a_letter_or_digit(
    good: str,
) -> None:
    assert check_session_id(good) == good
    assert Session(good).id == good


@pytest.mark.parametrize(
    "bad",
    ["", "a" * 65, ".a", "-a", "_a", "a b", "a/b", "a\n", "\na", "é", "a:b", "a\x00", " "],
)
def test_any_other_session_id_is_bad_session_id(bad: str) -> None:
    with pytest.raises(BadSessionId, match="is not 1-64 of") as info:
        Session(bad)
    assert info.value.code == Code.BAD_SESSION_ID


@pytest.mark.parametrize(
    "good", ["a", "x" * 64, "read", "é", "日本", "!#$%&'()*+,./:;<=>?@[]^`{|}~"]
)
def test_cursor_names_of_1_to_64_printable_characters_without_whitespace(good: str) -> None:
    assert check_cursor_name(good) == good
    session = filled(2)
    assert session.ack(good, 1) == 1
    assert positions(session) == {good: 1}


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "x" * 65,
        "a b",
        " a",
        "a\t",
        "a\nb",
        "\r",
        "\x00",
        "a\x7f",
        "\u00a0",
        "a\u2003b",
        "\u200b",
    ],
)
def test_any_other_cursor_name_is_bad_cursor_name_on_every_cursor_operation(bad: str) -> None:
    session = filled(2)
    error = unchanged_after_failure(session, BadCursorName, lambda s: s.read(bad))
    assert error.code == Code.BAD_CURSOR_NAME
    assert "is not 1-64 printable characters without whitespace" in error.message
    unchanged_after_failure(session, BadCursorName, lambda s: s.read(bad, touch=False))
    unchanged_after_failure(session, BadCursorName, lambda s: s.ack(bad, 1))


@pytest.mark.parametrize("bad", ["", "on message", "h" * 65, "on-\tmessage", "on\x00"])
def test_a_handler_name_with_whitespace_or_of_bad_length_is_bad_handler(bad: str) -> None:
    session = filled(1)
    error = unchanged_after_failure(session, BadHandler, lambda s: s.record(bad, "x", "t"))
    assert error.code == Code.BAD_HANDLER


@pytest.mark.parametrize("bad", ["", "k" * 257])
def test_a_dedup_key_that_is_empty_or_over_256_characters_is_bad_key(bad: str) -> None:
    session = filled(1)
    error = unchanged_after_failure(session, BadKey, lambda s: send(s, key=bad))
    assert error.code == Code.BAD_KEY


def test_a_dedup_key_of_256_characters_is_accepted() -> None:
    session = Session("s")
    assert send(session, key="k" * 256) == Recorded(1)
    assert send(session, key="k" * 256) == Recorded(1, duplicate=True)


# -- recording (rules 1, 2) ------------------------------------------------------------


def test_five_firings_get_seqs_1_to_5_and_head_5() -> None:
    session = Session("s")
    assert [send(session).seq for _ in range(5)] == [1, 2, 3, 4, 5]
    assert session.head == 5
    assert seqs(session.read_after(0)) == [1, 2, 3, 4, 5]


def test_an_on_message_firing_keeps_its_text_as_the_result() -> None:
    session = Session("s")
    session.record("on-message", "hello", "2024-05-01T12:00:00.000Z")
    assert session.read_after(0).firings == [
        Firing(1, "on-message", "hello", None, "2024-05-01T12:00:00.000Z")
    ]


@pytest.mark.parametrize("handler", ["on-build", "on-webhook", "On-Message", "On-Tick", "x"])
def test_an_unhandled_firing_keeps_the_event_and_has_no_result(handler: str) -> None:
    session = Session("s")
    assert session.record(handler, '{"raw": 1}', "t") == Recorded(1)
    assert session.read_after(0).firings == [Firing(1, handler, None, '{"raw": 1}', "t")]


def test_the_default_limit_is_256() -> None:
    session = filled(300)
    assert (session.ring.limit, session.ring.retained, session.ring.first) == (256, 256, 45)


def test_limit_0_keeps_nothing_and_every_reader_is_told_of_the_loss() -> None:
    session = filled(5, limit=0)
    assert session.ring.retained == 0
    assert session.read_after(0) == Batch(5, 5, [])
    assert session.read_after(3) == Batch(5, 2, [])
    assert session.read("a") == Batch(5, 5, [])
    assert session.poll() == Batch(5, 5, [])


def test_with_limit_0_acking_next_acknowledges_the_loss_once() -> None:
    session = filled(5, limit=0)
    batch = session.read("a")
    assert (batch.next, batch.lost) == (5, 5)
    session.ack("a", batch.next)
    assert session.read("a") == Batch(5, 0, [])
    send(session)
    assert session.read("a") == Batch(6, 1, [])


def test_lowering_the_limit_on_a_full_ring_trims_and_reports_the_loss() -> None:
    session = filled(10, limit=10)
    session.ack("a", 4)
    assert session.set_limit(3) == 7
    assert (session.ring.limit, session.ring.retained) == (3, 3)
    batch = session.read("a")
    assert (batch.next, batch.lost, seqs(batch)) == (10, 3, [8, 9, 10])  # 5, 6, 7
    assert session.read("b").lost == 7


@pytest.mark.parametrize("limit", [-1, 65_537, 1_000_000])
def test_a_limit_outside_0_to_65536_is_bad_limit_and_changes_nothing(limit: int) -> None:
    session = filled(4, limit=4)
    error = unchanged_after_failure(session, BadLimit, lambda s: s.set_limit(limit))
    assert error.code == Code.BAD_LIMIT
    with pytest.raises(BadLimit):
        Session("s", limit)


@pytest.mark.parametrize("limit", [0, 65_536])
def test_limits_0_and_65536_are_accepted(limit: int) -> None:
    assert Session("s", limit).ring.limit == limit
    assert filled(1).set_limit(limit) == (1 if limit == 0 else 0)


# -- reading after N (rule 3) ----------------------------------------------------------


def test_reading_after_n_twice_gives_the_same_answer() -> None:
    session = filled(6)
    first = session.read_after(2)
    assert session.read_after(2) == first
    assert seqs(first) == [3, 4, 5, 6]


def test_reading_removes_nothing_from_the_ring() -> None:
    session = filled(6)
    session.read_after(0)
    session.read("a")
    session.poll()
    assert session.ring.retained == 6


def test_reading_after_n_beyond_the_head_is_cursor_after_head_and_changes_nothing() -> None:
    session = filled(3)
    error = unchanged_after_failure(session, CursorAfterHead, lambda s: s.read_after(4))
    assert error.message == "after 4 is after head 3"
    assert error.code == Code.CURSOR_AFTER_HEAD


def test_limit_4_with_10_firings_after_0_gives_next_10_lost_6_and_seqs_7_to_10() -> None:
    batch = filled(10, limit=4).read_after(0)
    assert (batch.next, batch.lost, seqs(batch)) == (10, 6, [7, 8, 9, 10])


def test_limit_4_with_10_firings_a_cursor_at_8_has_lost_nothing() -> None:
    session = filled(10, limit=4)
    session.ack("c", 8)
    batch = session.read("c")
    assert (batch.next, batch.lost, seqs(batch)) == (10, 0, [9, 10])


def test_paging_a_full_ring_with_max_100_through_a_cursor_returns_every_firing_once() -> None:
    session = filled(700)
    seen: list[int] = []
    while True:
        batch = session.read("pager", 100)
        if not batch.firings and not batch.lost:
            break
        seen += seqs(batch)
        session.ack("pager", batch.next)
    assert seen == list(range(445, 701))
    assert position(session, "pager") == 700


@pytest.mark.parametrize("most", [0, -1])
def test_a_max_below_1_is_bad_max_on_every_read_and_changes_nothing(most: int) -> None:
    session = filled(3)
    unchanged_after_failure(session, BadMax, lambda s: s.read_after(0, most))
    unchanged_after_failure(session, BadMax, lambda s: s.read("new", most))
    unchanged_after_failure(session, BadMax, lambda s: s.poll(most))


def test_a_negative_after_is_bad_seq_and_changes_nothing() -> None:
    unchanged_after_failure(filled(3), BadSeq, lambda s: s.read_after(-1))


# -- cursors (rules 4, 5) --------------------------------------------------------------


def test_a_cursor_that_does_not_exist_reads_the_whole_ring() -> None:
    session = filled(3)
    assert session.read("never-seen") == session.read_after(0)


def test_reading_through_a_cursor_does_not_move_it() -> None:
    session = filled(3)
    assert seqs(session.read("a")) == [1, 2, 3]
    assert seqs(session.read("a")) == [1, 2, 3]
    assert position(session, "a") == 0


def test_moving_cursor_a_does_not_change_what_cursor_b_reads() -> None:
    session = filled(5)
    session.ack("b", 1)
    session.ack("a", 4)
    assert seqs(session.read("a")) == [5]
    assert seqs(session.read("b")) == [2, 3, 4, 5]
    assert positions(session) == {"a": 4, "b": 1}


def test_ack_5_then_ack_3_leaves_the_cursor_at_5() -> None:
    session = filled(6)
    assert session.ack("a", 5) == 5
    assert session.ack("a", 3) == 5
    assert position(session, "a") == 5
    assert seqs(session.read("a")) == [6]


def test_acking_the_head_is_allowed_and_acking_0_creates_the_cursor_at_0() -> None:
    session = filled(3)
    assert session.ack("a", 3) == 3
    assert session.ack("b", 0) == 0
    assert positions(session) == {"a": 3, "b": 0}
    assert Session("empty").ack("a", 0) == 0


def test_acking_beyond_the_head_is_ack_after_head_and_changes_nothing() -> None:
    session = filled(5)
    session.ack("a", 2)
    error = unchanged_after_failure(session, AckAfterHead, lambda s: s.ack("a", 6))
    assert error.code == Code.ACK_AFTER_HEAD
    assert error.message == "cannot ack 6: head is 5"
    # a cursor that does not exist is not created by a failed ack either
    unchanged_after_failure(session, AckAfterHead, lambda s: s.ack("new", 6))
    assert position(session, "new") is None


def test_acking_a_negative_seq_is_bad_seq_and_changes_nothing() -> None:
    error = unchanged_after_failure(filled(2), BadSeq, lambda s: s.ack("a", -1))
    assert error.message == "seq -1 is negative"


def test_two_readers_sharing_a_cursor_share_a_resume_point_and_each_sees_everything() -> None:
    session = filled(4)
    one = session.read("shared")
    two = session.read("shared")
    assert seqs(one) == seqs(two) == [1, 2, 3, 4]
    session.ack("shared", 4)
    session.ack("shared", 2)  # the slower reader cannot move it back
    assert position(session, "shared") == 4


def test_16_cursors_live_side_by_side() -> None:
    session = filled(20)
    for n in range(MAX_CURSORS):
        session.ack(f"c{n}", n)
    assert positions(session) == {f"c{n}": n for n in range(MAX_CURSORS)}


def test_the_17th_cursor_removes_the_least_recently_created_one() -> None:
    session = filled(20)
    for n in range(MAX_CURSORS):
        session.ack(f"c{n}", n + 1)
    session.read("c16")
    assert len(session.cursor_states()) == MAX_CURSORS
    assert position(session, "c0") is None
    assert names(session) == [f"c{n}" for n in range(1, MAX_CURSORS + 1)]


@pytest.mark.parametrize("use", ["read", "ack"])
def test_a_read_or_an_ack_counts_as_a_use_for_eviction(use: str) -> None:
    session = filled(20)
    for n in range(MAX_CURSORS):
        session.ack(f"c{n}", n + 1)
    if use == "read":
        session.read("c0")
    else:
        session.ack("c0", 0)
    session.ack("new", 0)
    assert position(session, "c0") == 1
    assert position(session, "c1") is None


def test_a_peek_is_not_a_use_and_does_not_create_a_cursor() -> None:
    session = filled(20)
    for n in range(MAX_CURSORS):
        session.ack(f"c{n}", n + 1)
    assert seqs(session.read("c0", touch=False)) == list(range(2, 21))
    assert seqs(session.read("ghost", touch=False)) == list(range(1, 21))
    assert position(session, "ghost") is None
    session.ack("new", 0)
    assert position(session, "c0") is None


def test_an_evicted_cursor_used_again_starts_from_0() -> None:
    session = filled(20)
    session.ack("old", 20)
    for n in range(MAX_CURSORS):
        session.read(f"c{n}")
    assert position(session, "old") is None
    assert seqs(session.read("old")) == list(range(1, 21))  # duplicates, never loss
    assert position(session, "old") == 0


def test_a_failed_read_through_a_new_cursor_evicts_nothing() -> None:
    session = filled(2)
    for n in range(MAX_CURSORS):
        session.ack(f"c{n}", 0)
    unchanged_after_failure(session, BadMax, lambda s: s.read("c99", 0))
    assert len(session.cursor_states()) == MAX_CURSORS


# -- poll (rule 7) ---------------------------------------------------------------------


def test_poll_reads_after_its_own_cursor_and_acknowledges_it() -> None:
    session = filled(3)
    assert seqs(session.poll()) == [1, 2, 3]
    assert position(session, "poll") == 3
    assert session.poll() == Batch(3, 0, [])
    send(session)
    assert seqs(session.poll()) == [4]


def test_poll_moves_no_other_cursor() -> None:
    session = filled(5)
    session.ack("read", 1)
    session.ack("wait", 2)
    session.poll()
    assert positions(session) == {"read": 1, "wait": 2, "poll": 5}
    assert seqs(session.read("follow")) == [1, 2, 3, 4, 5]


def test_poll_with_max_drains_page_by_page() -> None:
    session = filled(5)
    assert seqs(session.poll(2)) == [1, 2]
    assert seqs(session.poll(2)) == [3, 4]
    assert seqs(session.poll(2)) == [5]
    assert session.poll(2) == Batch(5, 0, [])


def test_poll_reports_a_loss_once() -> None:
    session = filled(10, limit=4)
    assert session.poll() == Batch(10, 6, session.ring.firings())
    for _ in range(3):
        send(session)
    session.set_limit(0)
    assert session.poll() == Batch(13, 3, [])
    assert session.poll() == Batch(13, 0, [])


def test_poll_is_a_use_of_the_poll_cursor() -> None:
    session = filled(1)
    session.poll()
    for n in range(MAX_CURSORS - 1):
        session.ack(f"c{n}", 0)
    session.poll()
    session.ack("last", 0)
    assert position(session, "poll") == 1
    assert position(session, "c0") is None


# -- dedup (rule 13) -------------------------------------------------------------------


def test_a_repeated_key_records_nothing_and_answers_the_first_seq_marked_duplicate() -> None:
    session = filled(2)
    assert send(session, "a", key="k") == Recorded(3)
    send(session)
    before = session.snapshot()
    assert send(session, "b", key="k") == Recorded(3, duplicate=True)
    assert session.record("on-tick", "c", "t", key="k") == Recorded(3, duplicate=True)
    assert session.snapshot() == before
    assert session.head == 4


def test_sends_without_a_key_are_never_deduplicated() -> None:
    session = Session("s")
    assert [send(session, "same").seq for _ in range(3)] == [1, 2, 3]


def test_keys_are_per_session() -> None:
    one, two = Session("one"), Session("two")
    send(one, key="k")
    send(two)
    assert send(two, key="k") == Recorded(2)


def test_a_key_is_remembered_while_among_the_last_1024_and_the_1025th_oldest_is_forgotten() -> None:
    session = Session("s")
    for n in range(MAX_KEYS + 1):
        send(session, key=f"k{n}")
    assert session.head == 1025
    assert send(session, key="k1") == Recorded(2, duplicate=True)  # the 1,024th oldest
    assert send(session, key="k0") == Recorded(1026)  # the 1,025th oldest: forgotten
    assert len(session.snapshot().keys) == MAX_KEYS


def test_a_duplicate_send_does_not_make_its_key_younger() -> None:
    session = Session("s")
    send(session, key="first")
    for n in range(MAX_KEYS - 1):
        send(session, key=f"k{n}")
    send(session, key="first")  # a hit: the window still counts it from its first send
    send(session, key="one-more")
    assert send(session, key="first") == Recorded(MAX_KEYS + 2)


def test_a_dedup_key_outlives_its_firing_in_the_ring() -> None:
    session = Session("s", limit=1)
    send(session, key="k")
    send(session)
    assert send(session, key="k") == Recorded(1, duplicate=True)


# -- the visible cap -------------------------------------------------------------------


def test_a_cursor_read_capped_by_visible_sees_nothing_above_it() -> None:
    session = filled(8)
    session.ack("a", 2)
    batch = session.read("a", visible=5)
    assert (batch.next, batch.lost, seqs(batch)) == (5, 0, [3, 4, 5])
    assert seqs(session.read_after(0, visible=1)) == [1]


def test_acking_above_visible_is_ack_after_head_even_below_the_real_head() -> None:
    session = filled(8)
    error = unchanged_after_failure(session, AckAfterHead, lambda s: s.ack("a", 6, visible=5))
    assert error.message == "cannot ack 6: head is 5"
    assert session.ack("a", 5, visible=5) == 5


def test_acking_with_visible_above_the_head_still_stops_at_the_head() -> None:
    session = filled(3)
    unchanged_after_failure(session, AckAfterHead, lambda s: s.ack("a", 4, visible=9))


def test_poll_capped_by_visible_acknowledges_only_what_it_could_see() -> None:
    session = filled(8)
    assert seqs(session.poll(visible=3)) == [1, 2, 3]
    assert position(session, "poll") == 3
    assert seqs(session.poll()) == [4, 5, 6, 7, 8]


def test_a_read_after_visible_is_cursor_after_head_naming_visible() -> None:
    session = filled(8)
    error = unchanged_after_failure(session, CursorAfterHead, lambda s: s.read_after(6, visible=5))
    assert error.message == "after 6 is after head 5"


def test_a_cursor_past_a_lowered_visible_cannot_read_and_is_not_used() -> None:
    # a cursor acked at 6, then readers capped at 4 (as after a store rolled back)
    session = filled(8)
    session.ack("a", 6)
    unchanged_after_failure(session, CursorAfterHead, lambda s: s.read("a", visible=4))
    unchanged_after_failure(session, CursorAfterHead, lambda s: s.read("a", visible=4, touch=False))


def test_with_limit_0_and_visible_a_reader_is_told_only_of_visible_losses() -> None:
    session = filled(6, limit=0)
    assert session.read("a", visible=4) == Batch(4, 4, [])
    session.ack("a", 4, visible=4)
    assert session.read("a") == Batch(6, 2, [])


# -- inspection ------------------------------------------------------------------------


def test_the_cursor_table_lists_most_recently_used_first_with_lag_behind_the_head() -> None:
    session = filled(10)
    session.ack("a", 3)
    session.ack("b", 10)
    session.read("c")
    session.read("a")
    assert session.cursor_table() == [
        CursorInfo("a", 3, 7),
        CursorInfo("c", 0, 10),
        CursorInfo("b", 10, 0),
    ]


def test_the_cursor_table_measures_lag_behind_visible() -> None:
    session = filled(10)
    session.ack("a", 3)
    assert session.cursor_table(visible=5) == [CursorInfo("a", 3, 2)]
    assert session.cursor_table(visible=2) == [CursorInfo("a", 3, 0)]


def test_cursor_states_list_least_recently_used_first_with_their_last_use() -> None:
    session = filled(3)
    session.ack("a", 1)  # use 1
    session.read("b")  # use 2
    session.ack("a", 2)  # use 3
    assert session.cursor_states() == [CursorState("b", 0, 2), CursorState("a", 2, 3)]
    assert session.uses == 3


def test_cursor_position_is_none_for_a_cursor_that_does_not_exist() -> None:
    session = filled(3)
    session.ack("a", 2)
    assert position(session, "a") == 2
    assert position(session, "b") is None


# -- evaluations (rule 8's counter) ----------------------------------------------------


def test_each_successful_operation_counts_one_evaluation() -> None:
    session = Session("s")
    operations: list[Callable[[Session], object]] = [
        lambda s: send(s),
        lambda s: send(s, key="k"),
        lambda s: send(s, key="k"),  # a duplicate is still an operation on the session
        lambda s: s.read_after(0),
        lambda s: s.read("a"),
        lambda s: s.read("a", touch=False),
        lambda s: s.ack("a", 1),
        lambda s: s.poll(),
        lambda s: s.set_limit(10),
    ]
    for n, operation in enumerate(operations, start=1):
        operation(session)
        assert session.evaluations == n


def test_inspecting_a_session_counts_no_evaluation() -> None:
    session = filled(3)
    session.ack("a", 1)
    evaluations = session.evaluations
    session.cursor_table()
    session.cursor_states()
    position(session, "a")
    session.snapshot()
    assert (session.head, session.uses) == (3, 1)
    assert session.evaluations == evaluations


def test_every_failing_operation_changes_nothing_and_counts_no_evaluation() -> None:
    session = filled(5, limit=3)
    session.ack("a", 2)
    send(session, key="k")
    failures: list[tuple[type[ReplError], Callable[[Session], object]]] = [
        (BadHandler, lambda s: s.record("", "x", "t")),
        (BadKey, lambda s: s.record("on-message", "x", "t", key="")),
        (BadLimit, lambda s: s.set_limit(-1)),
        (BadSeq, lambda s: s.read_after(-1)),
        (CursorAfterHead, lambda s: s.read_after(7)),
        (BadMax, lambda s: s.read_after(0, 0)),
        (BadCursorName, lambda s: s.read("a b")),
        (BadMax, lambda s: s.read("a", 0)),
        (BadMax, lambda s: s.read("new", 0, touch=False)),
        (BadCursorName, lambda s: s.ack("", 1)),
        (BadSeq, lambda s: s.ack("a", -1)),
        (AckAfterHead, lambda s: s.ack("a", 7)),
        (BadMax, lambda s: s.poll(0)),
        (CursorAfterHead, lambda s: s.read_after(3, visible=2)),
    ]
    for error, call in failures:
        unchanged_after_failure(session, error, call)


# -- snapshot and restore (rule 12's contract with the store) --------------------------


def busy_session() -> Session:
    """A session with a trimmed ring, a full LRU table out of creation order, and keys."""
    session = Session("busy", limit=5)
    for n in range(12):
        send(session, key=f"k{n}" if n % 3 else None)
    send(session, key="k1")  # a duplicate
    for n in range(MAX_CURSORS + 2):
        session.ack(f"c{n}", n % 12)
    session.read("c5")
    session.ack("c3", 11)
    session.poll(2)
    session.read("c9", touch=False)
    return session


def test_snapshot_then_restore_is_exact() -> None:
    session = busy_session()
    snapshot = session.snapshot()
    restored = Session.restore(snapshot)
    assert restored.snapshot() == snapshot
    assert restored.cursor_table() == session.cursor_table()
    assert restored.read_after(0) == session.read_after(0)


def test_a_snapshot_survives_a_round_trip_through_json() -> None:
    snapshot = busy_session().snapshot()
    wire = msgspec.json.encode(snapshot)
    assert msgspec.json.decode(wire, type=Snapshot) == snapshot


def test_a_restored_session_evicts_the_same_cursor_and_continues_the_uses_clock() -> None:
    session = busy_session()
    restored = Session.restore(session.snapshot())
    for one in (session, restored):
        one.ack("fresh", 1)
        one.read("another")
    assert restored.snapshot() == session.snapshot()
    assert restored.uses == session.uses


def test_a_restored_session_forgets_the_same_dedup_key_next() -> None:
    session = Session("s")
    for n in range(MAX_KEYS):
        send(session, key=f"k{n}")
    restored = Session.restore(session.snapshot())
    for one in (session, restored):
        assert send(one, key="new") == Recorded(MAX_KEYS + 1)
        assert send(one, key="k0") == Recorded(MAX_KEYS + 2)
        assert send(one, key="k2") == Recorded(3, duplicate=True)
    assert restored.snapshot() == session.snapshot()


def test_a_restored_session_starts_with_no_evaluations() -> None:
    assert Session.restore(busy_session().snapshot()).evaluations == 0


def test_restore_keeps_the_16_most_recently_used_cursors_in_use_order() -> None:
    cursors = [CursorState(f"c{n}", 0, use) for n, use in enumerate([9, 3, *range(20, 38)])]
    snapshot = Snapshot("s", 4, 0, [], cursors, uses=5, keys=[])
    restored = Session.restore(snapshot)
    assert names(restored) == [f"c{n}" for n in range(4, 20)]
    assert restored.uses == 37  # never behind a last use it holds


def test_restore_keeps_the_newest_1024_keys() -> None:
    keys = [(f"k{n}", n + 1) for n in range(MAX_KEYS + 3)]
    snapshot = Snapshot("s", 4, MAX_KEYS + 3, [], [], uses=0, keys=keys)
    restored = Session.restore(snapshot)
    assert restored.snapshot().keys == keys[3:]
    assert send(restored, key="k3") == Recorded(4, duplicate=True)
    assert send(restored, key="k2") == Recorded(MAX_KEYS + 4)


@pytest.mark.parametrize(
    ("snapshot", "error"),
    [
        (Snapshot("s", 4, -1, [], [], 0, []), BadSeq),
        (Snapshot("s", 4, 3, [Firing(1, "on-message", "x", None, "t")], [], 0, []), BadSeq),
        (Snapshot("bad id", 4, 0, [], [], 0, []), BadSessionId),
        (Snapshot("s", -4, 0, [], [], 0, []), BadLimit),
    ],
)
def test_restoring_an_impossible_snapshot_raises(
    snapshot: Snapshot, error: type[ReplError]
) -> None:
    with pytest.raises(error):
        Session.restore(snapshot)


def every_character() -> list[str]:
    return [chr(point) for point in range(sys.maxunicode + 1)]


def test_every_whitespace_character_is_refused_in_a_cursor_name() -> None:
    spaces = [c for c in every_character() if c.isspace()]
    assert len(spaces) > 20
    for space in spaces:
        with pytest.raises(BadCursorName):
            check_cursor_name(f"a{space}b")


def test_every_printable_character_but_whitespace_is_allowed_in_a_cursor_name() -> None:
    for char in every_character():
        if char.isprintable() and not char.isspace():
            assert check_cursor_name(char) == char
