"""How the ring keeps a firing: packed into one ``bytes``, and read back exactly.

The ring stores a firing as its ts in milliseconds, a slot in the ring's
table of handlers and its UTF-8 text (``session.packed``). These tests prove
that what a read returns is what was recorded, field for field and character
for character: every ts the daemon can write, any text, handled and
unhandled firings, a table of handlers that grows and is rebuilt, and a ring
rebuilt from a store. What does not pack (another ts, a lone surrogate) is
kept as it came.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from session import packed
from session.errors import BadSeq
from session.firing import Firing, ms_to_ts
from session.ring import Ring, decode_image, encode_image
from session.session import Session
from session.tags import Match


def append(ring: Ring, handler: str, result: str | None, event: str | None, ts: str) -> Firing:
    """Record the next firing, as a send does, and the firing it is."""
    return Firing(ring.record(handler, result, event, ts), handler, result, event, ts)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FIRST_MS = (datetime(1, 1, 1, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)
LAST_MS = (datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC) - EPOCH) // timedelta(
    milliseconds=1
)


def daemon_ts(when: datetime) -> str:
    """A ts exactly as the daemon writes one (repl_daemon.engine.utc_now)."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ts_of_ms(ms: int) -> str:
    return daemon_ts(EPOCH + timedelta(milliseconds=ms))


def held(ring: Ring) -> list[bytes | Firing]:
    """What the ring's deque holds (white box: which firings were packed)."""
    return list(ring._firings)


def slots(ring: Ring) -> list[tuple[str, bool]]:
    """Its table's handlers and whether each is unhandled (all sent by no one known)."""
    assert all(by is None and not keys for _, _, by, keys in ring._slots)
    return [(handler, unhandled) for handler, unhandled, _, _ in ring._slots]


# -- the ts ----------------------------------------------------------------------------

EDGES = [
    "1970-01-01T00:00:00.000Z",
    "1969-12-31T23:59:59.999Z",  # one millisecond before the epoch
    "0001-01-01T00:00:00.000Z",  # the first a datetime can hold
    "9999-12-31T23:59:59.999Z",  # and the last
    "2024-02-29T12:34:56.789Z",  # a leap day
    "2000-02-29T00:00:00.000Z",  # a leap day in a year divisible by 400
    "1900-03-01T00:00:00.000Z",  # 1900 was not a leap year: the day after Feb 28
    "2024-12-31T23:59:59.999Z",  # day 366 of a leap year
    "2026-11-30T07:00:00.123Z",
    "2026-11-30T07:00:00.000Z",
    "2026-11-30T07:00:00.999Z",
]


@pytest.mark.parametrize("ts", EDGES)
def test_an_edge_ts_packs_and_reads_back_the_same_string(ts: str) -> None:
    ring = Ring()
    append(ring, "on-message", "x", None, ts)
    assert all(isinstance(item, bytes) for item in held(ring))
    assert ring.firings()[0].ts == ts
    assert packed.ts_to_ms(ts) == (datetime.fromisoformat(ts) - EPOCH) // timedelta(milliseconds=1)


@given(st.integers(0, LAST_MS))
def test_the_one_format_of_a_ts_is_the_one_packed_firings_read_back_in(ms: int) -> None:
    """``session.firing.ms_to_ts`` (every time repl writes) and the packed ring's own
    formatting (``session.packed``) write the same string for the same millisecond."""
    ts = ms_to_ts(ms)
    assert ts == ts_of_ms(ms)
    ring = Ring()
    append(ring, "on-message", "x", None, ts)
    assert isinstance(held(ring)[0], bytes) and ring.firings()[0].ts == ts


@given(st.lists(st.integers(FIRST_MS, LAST_MS), min_size=1, max_size=50))
def test_any_ts_the_daemon_can_write_reads_back_byte_for_byte(stamps: list[int]) -> None:
    ring = Ring()
    for ms in stamps:
        append(ring, "on-message", "x", None, ts_of_ms(ms))
    assert [f.ts for f in ring.firings()] == [ts_of_ms(ms) for ms in stamps]
    assert [packed.ts_to_ms(ts_of_ms(ms)) for ms in stamps] == stamps
    assert all(isinstance(item, bytes) for item in held(ring))


@given(st.integers(FIRST_MS, LAST_MS), st.integers(0, 2_000))
def test_firings_on_either_side_of_a_second_read_back_their_own_seconds(ms: int, step: int) -> None:
    ring = Ring()
    stamps = [ts_of_ms(min(ms + n * step, LAST_MS)) for n in range(5)]
    for ts in stamps:
        append(ring, "on-message", "x", None, ts)
    assert [f.ts for f in ring.firings()] == stamps


def test_a_ts_reads_back_after_the_cache_of_seconds_was_emptied() -> None:
    stamps = [ts_of_ms(1_800_000_000_000 + n * 1_001) for n in range(packed.PREFIX_CACHE + 10)]
    ring = Ring(len(stamps))
    for ts in stamps:
        append(ring, "on-message", "x", None, ts)
    # The cache of seconds was cleared on the way; the oldest are no longer in it.
    assert [f.ts for f in ring.firings()] == stamps


@pytest.mark.parametrize(
    "ts",
    [
        "t",
        "",
        "t1",
        "2024-02-30T00:00:00.000Z",  # no such day
        "2023-02-29T00:00:00.000Z",  # not a leap year
        "2024-01-01T24:00:00.000Z",  # no such hour
        "2024-01-01T00:60:00.000Z",
        "2016-12-31T23:59:60.000Z",  # a leap second: datetime has none
        "0000-01-01T00:00:00.000Z",  # year 0
        "2024-01-01T00:00:00.000+00:00",  # another spelling of UTC
        "2024-01-01T00:00:00.000z",
        "2024-01-01T00:00:00.0000Z",  # microseconds
        "2024-01-01T00:00:00.00Z",
        "2024-01-01T00:00:00Z",
        "2024-01-01 00:00:00.000Z",  # a space for the T
        "2024-01-01T00:00:00,000Z",
        "20240101T000000.000000Z",
        "+2024-01-01T00:00:00.000Z",
        "2024-1-01T00:00:00.000Z ",
        "２０２４-01-01T00:00:00.000Z",  # full-width digits: int() reads them, we must not
        "٢٠٢٤-01-01T00:00:00.000Z",  # Arabic-Indic digits
        "2024-01-01T00:00:00.١٢٣Z",
        "2024-01-01T00:00:00. 12Z",
    ],
)
def test_a_ts_not_in_the_daemons_form_is_kept_exactly_as_given(ts: str) -> None:
    assert packed.ts_to_ms(ts) is None
    ring = Ring()
    firing = append(ring, "on-build", None, "raw", ts)
    assert ring.firings() == [firing] == [Firing(1, "on-build", None, "raw", ts)]
    assert held(ring) == [firing]


def test_a_kept_ts_reads_back_between_packed_ones_in_seq_order() -> None:
    ring = Ring()
    stamps = ["2026-11-30T07:00:00.001Z", "t", "2026-11-30T07:00:00.002Z", "later", "t"]
    for n, ts in enumerate(stamps):
        append(ring, "on-message", f"m{n}", None, ts)
    assert [(f.seq, f.result, f.ts) for f in ring.firings()] == [
        (n + 1, f"m{n}", ts) for n, ts in enumerate(stamps)
    ]
    assert [type(item) for item in held(ring)] == [bytes, Firing, bytes, Firing, Firing]


# -- the text --------------------------------------------------------------------------

TS = "2026-11-30T07:00:00.123Z"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello",
        "x" * 100,
        "héllo wörld",
        "日本語のテキスト",
        "emoji 🎉 and a ZWJ family 👨‍👩‍👧",
        "a\x00nul, a\nnewline, a\ttab, a \u2028 line separator",
        "\ufeffa byte order mark",
        "\U0010ffff the last code point",
        "x" * 70_000,
    ],
)
def test_any_text_reads_back_exactly_handled_or_unhandled(text: str) -> None:
    ring = Ring()
    append(ring, "on-message", text, None, TS)
    append(ring, "on-build", None, text, TS)
    assert ring.firings() == [
        Firing(1, "on-message", text, None, TS),
        Firing(2, "on-build", None, text, TS),
    ]
    assert all(isinstance(item, bytes) for item in held(ring))


@given(st.text())
def test_any_unicode_text_reads_back_exactly(text: str) -> None:
    ring = Ring()
    append(ring, "on-message", text, None, TS)
    assert ring.firings() == [Firing(1, "on-message", text, None, TS)]


def test_an_empty_text_reads_back_as_empty_not_none() -> None:
    session = Session("s")
    session.record("on-message", "", TS)
    session.record("on-build", "", TS)
    assert session.read_after(0).firings == [
        Firing(1, "on-message", "", None, TS),
        Firing(2, "on-build", None, "", TS),
    ]


@pytest.mark.parametrize("text", ["\ud800", "a lone \udfff low surrogate", "\udcff"])
def test_a_text_utf8_cannot_carry_is_kept_as_given(text: str) -> None:
    ring = Ring()
    firing = append(ring, "on-message", text, None, TS)
    assert ring.firings() == [firing]
    assert held(ring) == [firing]


@pytest.mark.parametrize(
    ("result", "event"), [(None, None), ("both", "set"), ("", "")], ids=["neither", "both", "empty"]
)
def test_a_firing_with_neither_or_both_texts_is_kept_as_given(
    result: str | None, event: str | None
) -> None:
    ring = Ring()
    firing = append(ring, "on-x", result, event, TS)
    assert ring.firings() == [Firing(1, "on-x", result, event, TS)]
    assert held(ring) == [firing]


# -- handlers and their table ------------------------------------------------------------


def test_a_handler_name_is_kept_once_however_many_firings_use_it() -> None:
    ring = Ring(1000)
    for n in range(1000):
        append(ring, "on-message", f"m{n}", None, TS)
        ring.record("on-build", None, f"e{n}", TS)
    assert slots(ring) == [("on-message", False), ("on-build", True)]
    firings = ring.firings()
    assert len({id(f.handler) for f in firings}) == 2


def test_one_handler_both_handled_and_unhandled_keeps_each_firings_kind() -> None:
    ring = Ring()
    append(ring, "on-build", "a result", None, TS)
    append(ring, "on-build", None, "an event", TS)
    append(ring, "on-build", "again", None, TS)
    assert [(f.result, f.event) for f in ring.firings()] == [
        ("a result", None),
        (None, "an event"),
        ("again", None),
    ]


def test_every_ring_shares_one_string_for_a_handler_name() -> None:
    # Names that come from a store or the wire are new objects each time.
    a, b = Ring(), Ring()
    append(a, "".join(["on-", "message"]), "x", None, TS)
    append(b, "".join(["on-", "message"]), "y", None, TS)
    assert a.firings()[0].handler is b.firings()[0].handler


def test_names_restored_from_a_store_are_shared_too() -> None:
    stored = [Firing(n, "".join(["on-", "message"]), f"m{n}", None, TS) for n in range(1, 5)]
    ring = Ring(4, 4, stored)
    assert len({id(f.handler) for f in ring.firings()}) == 1


def test_ever_new_handler_names_keep_the_table_within_twice_the_ring() -> None:
    ring = Ring(4)
    for n in range(1, 1001):
        append(ring, f"h{n}", f"m{n}", None, TS)
        assert len(slots(ring)) <= 2 * ring.retained + 64 + 1
        assert [(f.seq, f.handler, f.result) for f in ring.firings()] == [
            (s, f"h{s}", f"m{s}") for s in range(max(1, n - 3), n + 1)
        ]


def test_a_rebuilt_table_keeps_every_held_firings_handler_and_kind() -> None:
    ring = Ring(8)
    model: list[Firing] = []
    for n in range(1, 501):
        handler = f"h{n // 2}"  # each name twice: once handled, once unhandled
        if n % 2:
            model.append(append(ring, handler, f"r{n}", None, TS))
        else:
            model.append(append(ring, handler, None, f"e{n}", TS))
        assert ring.firings() == model[-8:]
    assert len(slots(ring)) <= 2 * 8 + 64 + 1


def test_held_firings_that_share_a_handler_share_one_slot_once_rebuilt() -> None:
    ring = Ring(8)
    for n in range(79):  # 79 names for a ring of 8: the next new one rebuilds the table
        append(ring, f"h{n}", f"m{n}", None, TS)
    for n in range(3):
        append(ring, "dup", f"d{n}", None, TS)
    append(ring, "new", "x", None, TS)
    # rebuilt from what the ring held: h74 (on its way out) to h78, and one slot for dup
    assert slots(ring) == [
        *((f"h{n}", False) for n in range(74, 79)),
        ("dup", False),
        ("new", False),
    ]
    assert [(f.handler, f.result) for f in ring.firings()] == [
        *((f"h{n}", f"m{n}") for n in range(75, 79)),
        ("dup", "d0"),
        ("dup", "d1"),
        ("dup", "d2"),
        ("new", "x"),
    ]


def test_a_table_rebuilt_while_the_ring_holds_a_firing_kept_as_given_keeps_it() -> None:
    ring = Ring(100)
    for n in range(99):
        append(ring, f"h{n}", f"m{n}", None, TS)
    odd = append(ring, "on-x", None, "kept as given", "t")
    ring.set_limit(2)  # the table still names 100 handlers, for a ring of 2
    new = append(ring, "new", "x", None, TS)  # a new name: time to rebuild the table
    assert ring.firings() == [odd, new]
    # Rebuilt from what the ring held: h98 (on its way out) and the kept firing, which
    # names its handler itself.
    assert slots(ring) == [("h98", False), ("new", False)]
    assert held(ring)[0] == odd


def test_a_ring_of_limit_0_with_ever_new_handlers_stays_empty() -> None:
    ring = Ring(0)
    for n in range(200):
        assert ring.record(f"h{n}", "x", None, TS) == n + 1
    assert ring.firings() == []
    assert len(slots(ring)) <= 65


# -- rebuilding from a store -----------------------------------------------------------


def mixed_firings(count: int) -> list[Firing]:
    """Handled, unhandled, odd ts, odd text, new handlers: everything a store may hold."""
    firings = []
    for seq in range(1, count + 1):
        ts = "t" if seq % 7 == 0 else ts_of_ms(1_700_000_000_000 + seq * 613)
        text = ["plain", "", "ünïcode ✓", "\ud800"][seq % 4] + str(seq)
        handler = f"h{seq % 90}"
        if seq % 3:
            firings.append(Firing(seq, handler, text, None, ts))
        else:
            firings.append(Firing(seq, handler, None, text, ts))
    return firings


@pytest.mark.parametrize("limit", [0, 1, 5, 100, 256, 65_536])
def test_a_ring_rebuilt_from_its_firings_holds_identical_firings(limit: int) -> None:
    firings = mixed_firings(300)
    ring = Ring(limit, 300, firings)
    expected = firings[len(firings) - min(limit, 300) :]
    assert ring.firings() == expected
    again = Ring(limit, ring.head, ring.firings())
    assert again.firings() == expected
    assert again.events_after(0) == ring.events_after(0)


def test_a_session_restored_from_its_snapshot_has_an_identical_snapshot() -> None:
    session = Session("s", 64)
    for f in mixed_firings(200):
        session.record(f.handler, f.result or f.event or "", f.ts, key=f"k{f.seq}")
    session.read("c")
    session.ack("c", 150)
    snap = session.snapshot()
    again = Session.restore(snap)
    assert again.snapshot() == snap
    assert again.read_after(0) == session.read_after(0)


def test_a_ring_rebuilt_with_a_seq_repeated_in_the_middle_is_bad_seq() -> None:
    firings = [Firing(s, "on-message", "x", None, TS) for s in (8, 8, 10)]
    with pytest.raises(BadSeq, match="are not the newest 3 up to head 10"):
        Ring(4, 10, firings)


# -- the bytes ---------------------------------------------------------------------------


def test_a_daemon_firing_is_one_bytes_of_header_and_utf8_text() -> None:
    ring = Ring()
    append(ring, "on-message", "héllo", None, "2026-11-30T07:00:00.123Z")
    (item,) = held(ring)
    assert isinstance(item, bytes)
    ms = (datetime(2026, 11, 30, 7, 0, 0, 123_000, tzinfo=UTC) - EPOCH) // timedelta(milliseconds=1)
    assert item == packed.HEADER.pack(ms, 0, 0) + "héllo".encode()


def test_slot_numbers_past_16_bits_pack_and_read_back() -> None:
    item = packed.pack(TS, 0x12345, b"text")
    assert item is not None
    assert packed.slot_of(item) == 0x12345
    assert packed.slot_of(packed.repack(item, 0xABCDEF)) == 0xABCDEF
    slots: list[packed.Slot] = [("h", False, None, ())] * 0x12345 + [("far", True, "root", ())]
    assert packed.unpack(7, [item], slots) == [Firing(7, "far", None, "text", TS, by="root")]


# -- tags ---------------------------------------------------------------------------------

TAGS4 = {"reply-to": "agent-7", "corr": "c-000000000000000000000001", "kind": "review", "prio": "2"}


def test_a_tagged_firing_is_one_bytes_its_keys_in_its_slot_its_values_before_its_text() -> None:
    ring = Ring()
    ring.record("on-message", "héllo", None, TS, tags=TAGS4, by="agent-7")
    (item,) = held(ring)
    assert isinstance(item, bytes)
    values = b"agent-7\0c-000000000000000000000001\0review\0" + b"2\0"
    ms = packed.ts_to_ms(TS)
    assert item == packed.HEADER.pack(ms, 0, 0) + values + "héllo".encode()
    assert ring._slots == [("on-message", False, "agent-7", ("reply-to", "corr", "kind", "prio"))]
    assert ring.firings() == [Firing(1, "on-message", "héllo", None, TS, TAGS4, "agent-7")]


def test_a_tagged_firing_costs_at_most_twice_a_plain_one() -> None:
    """The issue's bound on memory, as the ring holds a firing (``sys.getsizeof``)."""
    ring = Ring()
    text = "x" * 100
    ring.record("on-message", text, None, TS)
    ring.record("on-message", text, None, TS, tags=TAGS4)
    plain, tagged = (sys.getsizeof(item) for item in held(ring))
    assert isinstance(held(ring)[1], bytes)
    assert tagged <= 2 * plain


def test_tag_keys_are_kept_once_a_ring_and_shared_by_every_ring() -> None:
    a, b = Ring(100), Ring(100)
    for n in range(50):
        a.record("on-message", f"m{n}", None, TS, tags={"".join(["co", "rr"]): f"c{n}"})
        b.record("on-message", f"m{n}", None, TS, tags={"".join(["co", "rr"]): f"c{n}"})
    assert len(a._slots) == 1
    keys = {id(k) for ring in (a, b) for f in ring.firings() for k in f.tags}
    assert len(keys) == 1


def test_the_same_keys_in_another_order_are_another_slot_and_keep_their_order() -> None:
    ring = Ring()
    ring.record("on-message", "ab", None, TS, tags={"a": "1", "b": "2"})
    ring.record("on-message", "ba", None, TS, tags={"b": "2", "a": "1"})
    assert [list(f.tags) for f in ring.firings()] == [["a", "b"], ["b", "a"]]
    assert [keys for *_, keys in ring._slots] == [("a", "b"), ("b", "a")]


@pytest.mark.parametrize(
    ("tags", "ts"),
    [
        ({"k": "a\x00nul"}, TS),  # a NUL would split the value in two
        ({"k": "fine", "j": "\x00"}, TS),
        ({"k": "a lone \ud800"}, TS),  # UTF-8 cannot carry it
        ({"\udfff": "a lone surrogate key is a slot's, and kept"}, "t"),
        ({"k": "v"}, "t"),  # a ts of another form
    ],
)
def test_a_tagged_firing_that_cannot_pack_is_kept_as_given(tags: dict[str, str], ts: str) -> None:
    ring = Ring()
    ring.record("on-message", "x", None, TS, tags={"k": "packed"})
    firing = Firing(2, "on-message", "x", None, ts, tags)
    ring.record("on-message", "x", None, ts, tags=tags)
    assert held(ring)[1] == firing and ring.firings()[1] == firing
    assert isinstance(held(ring)[0], bytes)


def test_a_lone_surrogate_in_a_key_packs_with_a_daemon_ts() -> None:
    """A key is kept in the slot as a string: only the values must be UTF-8."""
    ring = Ring()
    ring.record("on-message", "x", None, TS, tags={"\udfff": "v"})
    assert isinstance(held(ring)[0], bytes)
    assert ring.firings() == [Firing(1, "on-message", "x", None, TS, {"\udfff": "v"})]


def test_ever_new_tag_keys_keep_the_table_within_twice_the_ring() -> None:
    ring = Ring(4)
    for n in range(1, 501):
        ring.record("on-message", f"m{n}", None, TS, tags={f"k{n}": f"v{n}", "corr": "c"})
        assert len(ring._slots) <= 2 * ring.retained + 64 + 1
    assert [f.tags for f in ring.firings()] == [
        {f"k{n}": f"v{n}", "corr": "c"} for n in range(497, 501)
    ]


def test_a_match_plans_once_a_slot_what_a_packed_firing_must_hold() -> None:
    keys = ("reply-to", "corr", "kind")
    assert Match({"corr": "c-1"}).plan("on-message", keys) == [(1, b"c-1")]
    assert Match({"corr": None, "kind": "ü"}).plan("h", keys) == [(2, "ü".encode())]
    assert Match({"corr": None}).plan("h", keys) == []  # any value: every such firing
    assert Match({"absent": None}).plan("h", keys) is None  # no such firing matches
    assert Match({}, "on-build").plan("on-message", keys) is None
    assert Match({"by": "alice"}).plan("h", keys, "bob") is None
    assert Match({"by": "alice"}).plan("h", keys, None) is None
    assert Match({"by": None, "corr": "x"}).plan("h", keys, "bob") == [(1, b"x")]
    assert Match({"corr": "\ud800"}).plan("h", keys) is None  # no packed value has one


def test_a_matching_read_compares_only_the_values_it_names() -> None:
    ring = Ring()
    sends = [
        ({"reply-to": "a", "corr": "c-1"}, "on-message"),
        ({"reply-to": "a", "corr": "c-2"}, "on-message"),
        ({"corr": "c-1", "reply-to": "b"}, "on-message"),  # the keys in another order
        ({"corr": "c-1"}, "on-build"),
        ({}, "on-message"),
        ({"corr": "c-1\x00"}, "on-message"),  # kept as itself: a NUL
    ]
    for n, (tags, handler) in enumerate(sends):
        ring.record(handler, f"m{n}\x00c-1\x00", None, TS, tags=tags)  # NULs in a text pack
    assert [isinstance(item, bytes) for item in held(ring)] == [True] * 5 + [False]
    for match in [
        Match({"corr": "c-1"}),
        Match({"corr": "c-1"}, "on-message"),
        Match({"corr": None, "reply-to": "a"}),
        Match({"corr": "c-1\x00"}),
        Match({}, "on-message"),
        Match({"missing": None}),
    ]:
        expected = [f for f in ring.firings() if match.holds(f.handler, f.tags, f.by)]
        assert ring.events_after(0, match=match).firings == expected, match
        for max in (1, 2):
            batch = ring.events_after(0, max=max, match=match)
            assert batch.firings == expected[:max]


def test_an_image_of_tagged_firings_names_its_keys_and_reads_back() -> None:
    ring = Ring(8)
    for n in range(12):
        tags = {"corr": f"c{n}", "kind": "k"} if n % 2 else {}
        ring.record("on-message", f"m{n}", None, TS, tags=tags, by="agent" if n % 3 else None)
    image = decode_image(encode_image(ring.image()))
    assert sorted(set(image.keys)) == [(), ("corr", "kind")]
    assert Ring.from_image(8, ring.head, image).firings() == ring.firings()
    assert image.since(ring.head).keys == image.keys


def test_an_image_of_a_ring_without_tags_names_no_keys() -> None:
    """Its slots are as an image's were before tagged firings were packed: an empty list
    of keys after them, which the repl of then, reading an array of 4, passes over."""
    ring = Ring(8)
    ring.record("on-message", "m", None, TS, by="root")
    assert ring.image().keys == []
    assert encode_image(ring.image()) == msgspec.msgpack.encode(
        [1, [["on-message", False]], [held(ring)[0]], ["root"], []]
    )


def test_an_image_written_before_tags_were_packed_keeps_its_tagged_firings_as_given() -> None:
    old = [
        Firing(1, "on-message", "t", None, TS, {"corr": "c-1"}, "agent"),
        Firing(2, "on-message", "p", None, TS),
        Firing(3, "on-build", None, "e", TS, {"corr": "c-2", "kind": "k"}),
    ]
    plain = packed.pack(TS, 0, b"p")
    assert plain is not None
    data = msgspec.msgpack.encode([3, [["on-message", False]], [old[0], plain, old[2]], [None]])
    image = decode_image(data)
    assert image.keys == [] and image.slot_table() == [("on-message", False, None, ())]
    ring = Ring.from_image(8, 3, image)
    assert ring.firings() == old
    assert ring.events_after(0, match=Match({"corr": "c-2"})).firings == [old[2]]
    ring.record("on-message", "new", None, TS, tags={"corr": "c-2"})
    assert ring.events_after(0, match=Match({"corr": "c-2"})).firings == [
        old[2],
        Firing(4, "on-message", "new", None, TS, {"corr": "c-2"}),
    ]


# Any keys and values, the key names drawn from a few so that slots repeat; the texts
# (and a ts of another form now and then) as a store or a send may bring them.
any_text = st.text(max_size=12)
encodable = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)
tag_key = st.sampled_from(["corr", "reply-to", "kind", "", "ключ", "🎉"]) | any_text
any_tags = st.dictionaries(tag_key, any_text | st.sampled_from(["", "\x00", "a\x00b"]), max_size=20)
sends = st.lists(
    st.tuples(
        any_tags,
        st.booleans(),  # unhandled
        st.sampled_from([None, "agent", "root"]),
        st.sampled_from([TS, "2026-11-30T07:00:01.000Z", "t"]),
        any_text | st.sampled_from(["\x00", "a\x00b\x00"]),
    ),
    max_size=30,
)
matches = st.builds(
    Match,
    st.dictionaries(tag_key | st.just("by"), st.none() | any_text, max_size=3),
    st.none() | st.sampled_from(["on-message", "on-build"]),
)


@given(sends, st.integers(0, 12), st.lists(matches, max_size=4))
def test_any_tags_read_back_as_recorded_through_trims_and_match_as_before(
    sent: list[tuple[dict[str, str], bool, str | None, str, str]],
    limit: int,
    looks: list[Match],
) -> None:
    """What a ring returns of any tagged firings is the ``Firing`` each was recorded as (as
    the ring of before, which kept each as itself, returned it), through trims and a
    shrunk limit; packing them and reading them back is the identity; a match finds in
    them exactly what ``Match.holds`` finds; and what packs is what UTF-8, NUL-free values
    and a daemon's ts allow."""
    ring = Ring(limit)
    model: list[Firing] = []
    for n, (tags, unhandled, by, ts, text) in enumerate(sent, start=1):
        handler = "on-build" if unhandled else "on-message"
        result, event = (None, text) if unhandled else (text, None)
        ring.record(handler, result, event, ts, tags=tags, by=by)
        model.append(Firing(n, handler, result, event, ts, tags, by))
    kept = model[len(model) - min(limit, len(model)) :]
    assert ring.firings() == kept
    for item, firing in zip(held(ring), kept, strict=True):
        texts = [*firing.tags.values(), firing.result or firing.event or ""]
        nul_free = all("\x00" not in value for value in firing.tags.values())
        packs = firing.ts != "t" and nul_free and all(map(encodable_text, texts))
        assert isinstance(item, bytes) == packs
        assert packed.unpack(firing.seq, [item], ring._slots) == [firing]
    for match in looks:
        expected = [f for f in kept if match.holds(f.handler, f.tags, f.by)]
        assert ring.events_after(None, match=match).firings == expected
    if sent:
        ring.set_limit(max(0, limit // 2))
        assert ring.firings() == kept[len(kept) - min(limit // 2, len(kept)) :]


def encodable_text(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@given(
    st.lists(
        st.tuples(
            st.dictionaries(tag_key.filter(encodable_text), encodable, max_size=6),
            st.sampled_from([None, "agent"]),
        ),
        max_size=20,
    ),
    st.integers(1, 8),
)
def test_any_tagged_ring_reads_back_from_its_image(
    sent: list[tuple[dict[str, str], str | None]], limit: int
) -> None:
    ring = Ring(limit)
    for n, (tags, by) in enumerate(sent):
        ring.record("on-message", f"m{n}", None, TS, tags=tags, by=by)
    again = Ring.from_image(limit, ring.head, decode_image(encode_image(ring.image())))
    assert again.firings() == ring.firings()
    assert again.image() == ring.image()
