"""Tags on firings and matching readers, in the core (docs/semantics.md R1-R3).

The bounds of tags and matches, one by one; then a Hypothesis state machine
that drives a real ``Session`` and a plain model (a list of firings with
their tags) through tagged sends, matching reads (through a cursor, after a
seq, over the whole ring; with and without ``max``), acks and new limits.
After every read it checks that the session returned exactly the model's
matching firings, that ``next`` is the last seq looked at and ``lost`` is
rule 3's, and that no cursor moved or appeared that the read was not given.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from session import tags as tags_module
from session.errors import BadKey, BadTag, CursorAfterHead
from session.firing import Batch, Firing
from session.ops import ReadAfter, ReadCursor, Record, check_match
from session.ring import Ring
from session.schedule import Timer
from session.session import Session, check_timer
from session.tags import (
    MAX_TAG_VALUE,
    MAX_TAGS,
    Match,
    check_tags,
    correlation_id,
    parse_match,
    parse_tag,
    parse_tags,
)
from tests.helpers import examples

TS = "2026-12-01T00:00:00.000Z"


# -- the bounds -------------------------------------------------------------------------


def test_tags_within_their_bounds_are_taken() -> None:
    tags = {f"k{n}": "v" * MAX_TAG_VALUE for n in range(MAX_TAGS)}
    assert check_tags(tags) is tags
    assert check_tags({"a.b-c_9": ""}) == {"a.b-c_9": ""}


@pytest.mark.parametrize(
    ("tags", "says"),
    [
        ({f"k{n}": "v" for n in range(MAX_TAGS + 1)}, "17 tags: a firing carries at most 16"),
        ({"Key": "v"}, "tag key 'Key' is not 1-64 of a-z 0-9"),
        ({"-k": "v"}, "tag key '-k'"),
        ({"": "v"}, "tag key ''"),
        ({"k" * 65: "v"}, "is not 1-64"),
        ({"k": "v" * (MAX_TAG_VALUE + 1)}, "its value is 1,025 characters, over 1,024"),
        ({"k": 7}, "its value must be text"),
    ],
)
def test_tags_out_of_bounds_are_refused_naming_what(tags: dict[str, str], says: str) -> None:
    with pytest.raises(BadTag, match=says.replace("(", r"\(")):
        check_tags(tags)


@pytest.mark.parametrize(
    ("tags", "says"),
    [
        ({f"k{n}": "v" for n in range(MAX_TAGS + 1)}, "17 tags: a firing carries at most 16"),
        ({"k": "v" * (MAX_TAG_VALUE + 1)}, "its value is 1,025 characters, over 1,024"),
        ({"k": 7}, "its value must be text"),
    ],
)
def test_keys_taken_before_do_not_let_a_bad_value_or_count_by(
    tags: dict[str, str], says: str
) -> None:
    check_tags({f"k{n}": "v" for n in range(MAX_TAGS)})
    check_tags({"k": "v", f"k{MAX_TAGS}": "v"})
    with pytest.raises(BadTag, match=says):
        check_tags(tags)


def test_keys_remembered_are_forgotten_at_the_bound_and_still_checked() -> None:
    for n in range(tags_module.KNOWN_KEYS // MAX_TAGS + 2):
        many = {f"x{n}-{m}": "v" for m in range(MAX_TAGS)}
        assert check_tags(many) is many
    assert len(tags_module._known_keys) <= tags_module.KNOWN_KEYS
    with pytest.raises(BadTag, match="tag key 'Key'"):
        check_tags({"Key": "v"})


def test_a_session_refuses_bad_tags_and_records_nothing() -> None:
    session = Session("s")
    with pytest.raises(BadTag):
        session.record("on-message", "x", TS, tags={"Bad": "v"})
    assert session.head == 0 and session.evaluations == 0
    with pytest.raises(BadTag):
        Record("on-message", "x", TS, tags={"k" * 65: "v"}).check()
    with pytest.raises(BadTag):
        check_timer(
            Timer(id="t", session="s", due_ms=1, handler="on-tick", text="", tags={"A": "b"})
        )


def test_a_key_and_a_tag_both_bad_are_refused_as_the_op_refuses_them() -> None:
    """A webhook's delivery id is its key and its ``delivery`` tag: one too long for both
    (over 256 and 1,024) is ``bad_key`` whichever path checks it first (found by the HTTP
    fuzz: the session said ``bad_tag`` where the op, and so Redis, said ``bad_key``)."""
    delivery = "k" * 5000
    with pytest.raises(BadKey):
        Record("on-message", "x", TS, delivery, tags={"delivery": delivery}).check()
    session = Session("s")
    with pytest.raises(BadKey):
        session.record("on-message", "x", TS, key=delivery, tags={"delivery": delivery})
    assert session.head == 0 and session.evaluations == 0


def test_the_cli_words_of_tags_and_matches() -> None:
    assert parse_tag("corr=a=b") == ("corr", "a=b")  # the first = splits
    assert parse_tags(["a=1", "b="]) == {"a": "1", "b": ""}
    with pytest.raises(BadTag, match="is not KEY=VALUE"):
        parse_tag("novalue")
    with pytest.raises(BadTag, match="given twice"):
        parse_tags(["a=1", "a=2"])
    assert parse_match([]) is None
    assert parse_match(["corr=x", "urgent"]) == Match({"corr": "x", "urgent": None})
    assert parse_match([], "on-tick") == Match({}, "on-tick")
    with pytest.raises(BadTag, match="given twice"):
        parse_match(["a", "a=1"])
    with pytest.raises(BadTag):
        parse_match(["A=1"])


def test_a_match_names_something_within_bounds() -> None:
    with pytest.raises(BadTag, match="at least one tag or a handler"):
        Match().check()
    with pytest.raises(BadTag, match="17 tags"):
        Match({f"k{n}": None for n in range(MAX_TAGS + 1)}).check()
    with pytest.raises(BadTag, match="over 1,024"):
        Match({"k": "v" * (MAX_TAG_VALUE + 1)}).check()
    with pytest.raises(BadTag, match="tag key"):
        Match({"K": None}).check()
    with pytest.raises(Exception, match="handler name"):
        check_match(Match({}, "bad handler"))
    check_match(None)
    assert Match({"k": None}).check().plan("on-tick", ()) is None  # no firing without k
    assert Match({}, "on-tick").plan("on-tick", ()) == []  # every firing of on-tick


def test_what_a_match_holds_for() -> None:
    both = Match({"corr": "x", "urgent": None}, "on-message")
    assert both.holds("on-message", {"corr": "x", "urgent": "", "more": "y"})
    assert not both.holds("on-tick", {"corr": "x", "urgent": ""})
    assert not both.holds("on-message", {"corr": "y", "urgent": ""})
    assert not both.holds("on-message", {"corr": "x"})


def test_correlation_ids_are_fresh() -> None:
    ids = {correlation_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("c-") and len(i) == 26 for i in ids)


# -- the ring ---------------------------------------------------------------------------


def test_the_ring_keeps_tags_and_a_matching_read_skips_the_rest() -> None:
    ring = Ring(limit=8)
    ring.record("on-message", "a", None, TS)  # packed: no tags
    ring.record("on-message", "b", None, TS, tags={"corr": "1"})
    ring.record("on-tick", "c", None, TS)
    ring.record("on-message", None, "d", "not a ts", tags={"corr": "2"})  # unpacked anyway
    assert [f.tags for f in ring.firings()] == [{}, {"corr": "1"}, {}, {"corr": "2"}]
    batch = ring.events_after(0, match=Match({"corr": None}))
    assert [f.seq for f in batch.firings] == [2, 4] and batch.next == 4
    first = ring.events_after(0, max=1, match=Match({"corr": None}))
    assert [f.seq for f in first.firings] == [2] and first.next == 2  # max stopped the look
    ticks = ring.events_after(None, match=Match({}, "on-tick"))  # packed ones, by handler
    assert [f.result for f in ticks.firings] == ["c"] and ticks.next == 4
    assert ring.events_after(4, match=Match({"corr": None})) == Batch(4, 0, [])
    with pytest.raises(CursorAfterHead):
        ring.events_after(5, match=Match({"corr": None}))
    rebuilt = Ring(8, 4, ring.firings())
    assert rebuilt.firings() == ring.firings()


def test_the_whole_ring_loses_nothing_and_after_a_seq_loses_as_ever() -> None:
    ring = Ring(limit=2)
    for n in range(5):
        ring.record("on-message", str(n), None, TS, tags={"n": str(n)})
    whole = ring.events_after(None, match=Match({"n": None}))
    assert whole.lost == 0 and [f.seq for f in whole.firings] == [4, 5]
    assert ring.events_after(0, match=Match({"n": "4"})) == Batch(
        5, 3, [Firing(5, "on-message", "4", None, TS, {"n": "4"})]
    )
    nothing = Ring(limit=0)
    nothing.record("on-message", "x", None, TS, tags={"n": "1"})
    assert nothing.events_after(None, match=Match({"n": None})) == Batch(1, 0, [])
    assert nothing.events_after(0, match=Match({"n": None})) == Batch(1, 1, [])


# -- random operations against a model ------------------------------------------------

KEYS_ = ["corr", "kind", "to"]
VALUES = ["1", "2", ""]
CURSORS = ["read", "mine"]


def stamp(n: int) -> str:
    when = datetime(2026, 12, 1, tzinfo=UTC) + timedelta(milliseconds=401 * n)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


tag_sets = st.dictionaries(st.sampled_from(KEYS_), st.sampled_from(VALUES), max_size=3)
matches = st.builds(
    Match,
    st.dictionaries(st.sampled_from(KEYS_), st.sampled_from([*VALUES, None]), max_size=2),
    st.sampled_from([None, None, "on-message", "on-tick"]),
).filter(lambda m: bool(m.tags) or m.handler is not None)


class TaggedSession(RuleBasedStateMachine):
    """A real session beside a model: the firings with their tags, the cursors, the limit."""

    @initialize(limit=st.sampled_from([0, 1, 3, 8, 256]))
    def start(self, limit: int) -> None:
        self.session = Session("s", limit)
        self.limit = limit
        self.firings: list[Firing] = []  # every firing ever, oldest first
        self.ring: list[Firing] = []  # those the bound kept, oldest first
        self.cursors: dict[str, int] = {}
        self.sent = 0

    def retained(self) -> list[Firing]:
        del self.ring[: max_(0, len(self.ring) - self.limit)]
        return self.ring

    def expected(self, after: int | None, max: int | None, match: Match) -> Batch:
        retained = self.retained()
        head = len(self.firings)
        first = retained[0].seq if retained else head + 1
        if after is None:
            after = first - 1
        lost = max_(0, first - after - 1)
        looked = [f for f in retained if f.seq > after]
        found: list[Firing] = []
        last = after + lost
        for f in looked:
            last = f.seq
            if match.holds(f.handler, f.tags):
                found.append(f)
                if max is not None and len(found) == max:
                    break
        return Batch(last, lost, found)

    @rule(handler=st.sampled_from(["on-message", "on-message", "on-tick"]), tags=tag_sets)
    def send(self, handler: str, tags: dict[str, str]) -> None:
        self.sent += 1
        ts = stamp(self.sent)
        recorded = self.session.record(handler, f"t{self.sent}", ts, tags=tags)
        firing = Firing(recorded.seq, handler, f"t{self.sent}", None, ts, tags)
        self.firings.append(firing)
        self.ring.append(firing)
        self.retained()
        event("a tagged send" if tags else "a plain send")

    @rule(match=matches, max=st.sampled_from([None, 1, 2]))
    def read_the_whole_ring(self, match: Match, max: int | None) -> None:
        before = self.session.cursor_table()
        got = ReadAfter(None, max, match).run(self.session, None)
        assert got == self.expected(None, max, match)
        assert self.session.cursor_table() == before  # no cursor moved or appeared
        event("a whole-ring look found some" if got.firings else "a whole-ring look found none")

    @rule(match=matches, max=st.sampled_from([None, 1]), data=st.data())
    def read_after_a_seq(self, match: Match, max: int | None, data: st.DataObject) -> None:
        after = data.draw(st.integers(0, len(self.firings)))
        before = self.session.cursor_table()
        got = ReadAfter(after, max, match).run(self.session, None)
        assert got == self.expected(after, max, match)
        assert self.session.cursor_table() == before

    @rule(cursor=st.sampled_from(CURSORS), match=matches, max=st.sampled_from([None, 1]))
    def read_through_a_cursor(self, cursor: str, match: Match, max: int | None) -> None:
        position = self.cursors.get(cursor, 0)
        got = ReadCursor(cursor, max, touch=True, match=match).run(self.session, None)
        assert got == self.expected(position, max, match)
        self.cursors.setdefault(cursor, 0)  # a read is a use: the cursor exists, unmoved
        table = {row.name: row.seq for row in self.session.cursor_table()}
        assert table == self.cursors

    @rule(cursor=st.sampled_from(CURSORS), data=st.data())
    def ack(self, cursor: str, data: st.DataObject) -> None:
        seq = data.draw(st.integers(0, len(self.firings)))
        self.session.ack(cursor, seq)
        self.cursors[cursor] = max_(self.cursors.get(cursor, 0), seq)

    @rule(limit=st.sampled_from([0, 1, 2, 5, 256]))
    def set_limit(self, limit: int) -> None:
        self.session.set_limit(limit)
        self.limit = limit
        self.retained()

    @rule()
    def restore(self) -> None:
        """A store's round trip keeps every tag."""
        self.session = Session.restore(self.session.snapshot())
        assert self.session.ring.firings() == self.retained()


max_ = max

# 40 examples are some 3 s of the suite (TAGS_EXAMPLES=N for more); the slow variant runs 300
TaggedSession.TestCase.settings = settings(
    max_examples=examples(40, "TAGS_EXAMPLES"),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_matching_readers_return_the_models_firings_and_move_no_cursor = TaggedSession.TestCase


class LongTaggedSession(TaggedSession):
    """The same machine, searched longer: ``pytest -m slow``."""


LongTaggedSession.TestCase.settings = settings(
    TaggedSession.TestCase.settings, max_examples=examples(300, "TAGS_EXAMPLES")
)
test_matching_readers_keep_every_rule_under_a_long_search = pytest.mark.timeout(900)(
    pytest.mark.slow(LongTaggedSession.TestCase)
)
