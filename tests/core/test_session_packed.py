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

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from session import packed
from session.errors import BadSeq
from session.firing import Firing, ms_to_ts
from session.ring import Ring
from session.session import Session


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
