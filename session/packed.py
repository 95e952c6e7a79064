"""How the ring keeps a firing: one immutable ``bytes`` a firing, tags and all.

A ring holds up to 65,536 firings a session, so what one costs decides the
daemon's memory. As a ``Firing`` with its own seq, text and ts strings it
cost about 300 bytes (with 4 tags, a dict and their values: about 750);
packed it costs a 33-byte ``bytes`` header, 11 bytes of ours, the text and
the tags' values (a byte more each):

    bytes 0-7   ts as milliseconds since the Unix epoch, signed, little-endian
    bytes 8-10  the firing's slot in its ring's table: which handler, whether
                the text is the result or the (unhandled) event, who sent it
                (its ``by``) and the keys of its tags; the low 16 bits, then
                the high 8
    bytes 11-   the text, UTF-8; when the slot names tag keys, its tags'
                values before it, in the order of the keys, UTF-8, each
                followed by a NUL (no value holds one; the text may)

The seq is not stored: a ring holds consecutive seqs, so a firing's seq is
the ring's first plus its position. Nor is the sender, nor a tag's key: a
ring's firings come from a few senders and carry the same few keys (an
agent's ``reply-to``, ``corr``, ``kind``), so ``by`` and the keys, in their
order, are more parts of the slot, and cost a firing nothing. The table of
slots lives in the ring (``session.ring``); this module packs and unpacks
against it. A match reads a tagged firing's values as bytes (``holds``),
by the position its keys have in the slot, without building the firing or
its dict.

Only a ``ts`` in exactly the form the daemon writes, ``YYYY-MM-DDTHH:MM:SS.mmmZ``
(``datetime.isoformat(timespec="milliseconds")`` in UTC with a ``Z``), packs,
and it is parsed so that formatting the milliseconds back gives the same
string, character for character. Anything else (another ts, a text or a tag's
value with a lone surrogate, which UTF-8 cannot carry, a tag's value with a
NUL, which would split it, both or neither of result and event) is kept as
its ``Firing``, unchanged: exact first, compact when possible. A firing packed
before tags were (a ``bytes`` whose slot names no keys) reads as it did.

Consecutive firings share their second, so the text of a second
(``"2026-11-30T07:00:00."``) is cached both ways and a ts costs a dict lookup
and a concatenation.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from datetime import date, datetime

from session.firing import NO_TAGS, Firing

#: a ring's slot: a handler, whether its text is the event (unhandled), its sender, and
#: the keys of its tags, in their order (none: a firing without tags)
Slot = tuple[str, bool, str | None, tuple[str, ...]]

HEADER = struct.Struct("<qHB")
HEADER_SIZE = HEADER.size
PREFIX_CACHE = 1024  # seconds remembered, both ways: about 200 KiB at most

_EPOCH_DAY = date(1970, 1, 1).toordinal()
# "123Z" ends every ts the daemon writes; one lookup checks and parses it.
_MILLIS = {f"{n:03d}Z": n for n in range(1000)}
_SUFFIXES = [f"{n:03d}Z" for n in range(1000)]
_PREFIX = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.", re.ASCII)

_bases: dict[str, int] = {}  # "2026-11-30T07:00:00." -> its first millisecond since the epoch
_prefixes: dict[int, str] = {}  # and back


def ts_to_ms(ts: str) -> int | None:
    """The milliseconds since the epoch that ``ts`` spells, or None when it is not in our form.

    A firing packed with the answer reads back with ``ts`` again, exactly.
    """
    millis = _MILLIS.get(ts[20:])
    if millis is None:
        return None
    base = _bases.get(ts[:20])
    if base is None:
        base = _parse_prefix(ts[:20])
        if base is None:
            return None
    return base + millis


def _parse_prefix(prefix: str) -> int | None:
    # The pattern admits only ASCII digits in fixed widths, and fromisoformat
    # refuses a day or a time of day that does not exist (a leap second, :60,
    # included), so formatting the fields back in the same widths gives
    # ``prefix`` again: that is what makes the round trip exact.
    if _PREFIX.fullmatch(prefix) is None:
        return None
    try:
        when = datetime.fromisoformat(prefix[:19])
    except ValueError:
        return None
    seconds = (when.toordinal() - _EPOCH_DAY) * 86_400
    seconds += when.hour * 3600 + when.minute * 60 + when.second
    _remember(seconds * 1000, prefix)
    return seconds * 1000


def _format_prefix(base: int) -> str:
    days, second = divmod(base // 1000, 86_400)
    hour, second = divmod(second, 3600)
    minute, second = divmod(second, 60)
    day = date.fromordinal(_EPOCH_DAY + days).isoformat()
    prefix = f"{day}T{hour:02d}:{minute:02d}:{second:02d}."
    _remember(base, prefix)
    return prefix


def _remember(base: int, prefix: str) -> None:
    # Forgetting everything at once keeps the bound without an LRU's cost on
    # every hit; the daemon's own firings refill it one second at a time.
    if len(_prefixes) >= PREFIX_CACHE:
        _prefixes.clear()
        _bases.clear()
    _prefixes[base] = prefix
    _bases[prefix] = base


def pack(ts: str, slot: int, data: bytes) -> bytes | None:
    """One firing's bytes: its ts, its slot and ``data`` (its UTF-8 text, after its tags'
    values when its slot names tag keys); None when ``ts`` does not pack."""
    millis = _MILLIS.get(ts[20:])
    base = _bases.get(ts[:20])
    if base is None or millis is None:
        # A second not seen lately, or no ts of ours: ts_to_ms parses it or refuses it.
        ms = ts_to_ms(ts)
        if ms is None:
            return None
        return HEADER.pack(ms, slot & 0xFFFF, slot >> 16) + data
    return HEADER.pack(base + millis, slot & 0xFFFF, slot >> 16) + data


def unpack(seq: int, items: Iterable[bytes | Firing], slots: list[Slot]) -> list[Firing]:
    """The firings ``items`` hold, the first of them ``seq``; ``slots`` is their ring's table."""
    firings: list[Firing] = []
    add = firings.append
    header = HEADER.unpack_from
    # Consecutive firings mostly share their second: keep its text at hand.
    base = end = 0
    prefix = ""
    for item in items:
        if isinstance(item, bytes):
            ms, low, high = header(item)
            if not base <= ms < end:
                base = ms - ms % 1000
                end = base + 1000
                prefix = _prefixes.get(base) or _format_prefix(base)
            handler, unhandled, by, keys = slots[low | high << 16]
            if keys:
                # the values, then the text (which may hold a NUL: the split stops before it)
                parts = item[HEADER_SIZE:].decode().split("\x00", len(keys))
                tags = dict(zip(keys, parts))  # noqa: B905 (all but the last part: the text)
                text = parts[-1]
            else:
                tags = NO_TAGS
                text = item[HEADER_SIZE:].decode()
            ts = prefix + _SUFFIXES[ms - base]
            if unhandled:
                add(Firing(seq, handler, None, text, ts, tags, by))
            else:
                add(Firing(seq, handler, text, None, ts, tags, by))
        else:
            add(item)
        seq += 1
    return firings


def holds(item: bytes, plan: list[tuple[int, bytes]]) -> bool:
    """Whether the tags' values a packed firing holds (its slot names tag keys) are each
    what ``plan`` wants at its position, compared as UTF-8 without building the firing
    (``session.tags.Match.plan``)."""
    values = item[HEADER_SIZE:].split(b"\x00")  # a NUL in the text splits past the values
    return all(values[at] == want for at, want in plan)


def repack(item: bytes, slot: int) -> bytes:
    """``item`` with its slot number changed (the table was compacted)."""
    ms = HEADER.unpack_from(item)[0]
    return HEADER.pack(ms, slot & 0xFFFF, slot >> 16) + item[HEADER_SIZE:]


def slot_of(item: bytes) -> int:
    _, low, high = HEADER.unpack_from(item)
    return int(low | high << 16)
