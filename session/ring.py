"""The ring: the newest ``limit`` firings of a session, and its head.

Seqs are consecutive: the ring always holds the seqs ``head - len + 1`` to
``head``, so a firing's position follows from its seq and no search is
needed. Only the bound removes firings; reading never does.

``visible`` lets a caller hide the newest firings from readers (the daemon
shows only what its store has made durable); it defaults to the head, and a
value outside 0 to the head is clamped into it, so no cap can show a reader
a seq that was never recorded.

The deque holds each firing packed into one ``bytes`` (``session.packed``),
tags and all, and a ``Firing`` is built only for the firings a read returns,
and for those a store has yet to take: once one takes a ring's new firings
(``recorded_after``, a durable commit) the ring keeps each firing recorded
since as the ``Firing`` its send built, up to a ring's length, and hands
those over, so a commit never unpacks what a send has just packed.

The ring keeps the table that a packed firing's slot names: each distinct
handler, with whether its text is the result or the event, who sent it and
the keys of its tags, once (and interned, so every ring shares one
``"on-message"``, one ``"root"`` and one ``"corr"``). The
table only grows when a firing brings a slot it has not seen; when it has
grown to twice the ring's length (plus some room) it is rebuilt from the
firings still held, so a stream of ever-new handler names costs O(1) a firing
and memory in proportion to the ring.

``Ring.image`` is the ring as it keeps itself (its head, its table and its
items, still packed), and ``Ring.from_image`` takes one back with the
firings recorded after it: a store that keeps the image brings a ring back
without building a ``Firing`` for each of its firings and packing it again,
which is what a restart of many full rings spends its time on. The image's
bytes (``encode_image``, ``decode_image``) are msgpack: each packed firing one
``bin``, a ``Firing`` (a ts of another form; or one with tags, in an image
written before tags were packed) a map.

``Ring.folded`` is a ring whose firings are still in its store: its head, its
limit and its counts answer without them, and whatever needs a firing first
brings them in (``unfold``, which calls the store back) and from then on is
a plain ``Ring``. A restart of many full rings so serves at once, and a ring
costs its memory only once something looks into it.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Any, NamedTuple

import msgspec

from session import packed
from session.errors import BadLimit, BadMax, BadSeq, CursorAfterHead
from session.firing import NO_TAGS, Batch, Firing
from session.packed import Slot
from session.rules import DEFAULT_LIMIT, MAX_LIMIT
from session.tags import Match

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "Fold", "Image", "Ring", "check_limit"]


def check_limit(limit: int) -> int:
    if not 0 <= limit <= MAX_LIMIT:
        raise BadLimit(f"limit {limit} is outside 0 to {MAX_LIMIT:,}")
    return limit


class Image(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A ring as it keeps itself: its head, its table of slots and its items (oldest first,
    the newest ``head``), packed or as themselves; ``Ring.image`` and ``Ring.from_image``.

    ``slots`` holds each slot's handler and whether it is unhandled, ``by`` each slot's
    sender and ``keys`` each slot's tag keys, lists of their own after them: an image
    written before firings had senders has neither, and its slots read back with ``by``
    None; one written before tagged firings were packed has no ``keys``, and its slots
    read back with none (its tagged firings are in it as themselves).
    """

    head: int
    slots: list[tuple[str, bool]]
    items: list[bytes | Firing]
    by: list[str | None] = []
    keys: list[tuple[str, ...]] = []

    @classmethod
    def of(cls, head: int, slots: list[Slot], items: list[bytes | Firing]) -> Image:
        """The image of a ring; of one whose slots name no tag keys, with an empty ``keys``."""
        keys = [keys for _, _, _, keys in slots]
        return cls(
            head,
            [(h, u) for h, u, _, _ in slots],
            items,
            [by for _, _, by, _ in slots],
            keys if any(keys) else [],
        )

    def slot_table(self) -> list[Slot]:
        """Its slots as a ring keeps them, each name interned."""
        count = len(self.slots)
        by = self.by + [None] * (count - len(self.by))
        keys = [_interned(k) for k in self.keys] + [()] * (count - len(self.keys))
        return [
            (sys.intern(handler), unhandled, None if sender is None else sys.intern(sender), tk)
            for (handler, unhandled), sender, tk in zip(self.slots, by, keys, strict=False)
        ]

    @property
    def first(self) -> int:
        """The seq of its oldest item; ``head + 1`` when it holds none."""
        return self.head - len(self.items) + 1

    def since(self, first: int) -> Image:
        """The image without its items older than ``first`` (a trim made after it was taken)."""
        if first <= self.first:
            return self
        if first > self.head + 1:  # trimmed past its newest: none of it is left
            return Image(first - 1, [], [])
        return Image(self.head, self.slots, self.items[first - self.first :], self.by, self.keys)


def _interned(keys: tuple[str, ...]) -> tuple[str, ...]:
    """A slot's tag keys, each the one string every ring shares."""
    return tuple(map(sys.intern, keys)) if keys else keys


_image_encoder = msgspec.msgpack.Encoder()
_image_decoder = msgspec.msgpack.Decoder(Image)


def encode_image(image: Image) -> bytes:
    return _image_encoder.encode(image)


def decode_image(data: bytes) -> Image:
    """The image ``data`` holds; ``msgspec.DecodeError`` when it holds none."""
    return _image_decoder.decode(data)


class Fold(NamedTuple):
    """Where a folded ring's firings are (``Ring.folded``): how many it retains, and what
    brings them in, a ring of the same limit and head (a store's read of its image)."""

    retained: int
    unfold: Callable[[], Ring]


#: what a ring no store has taken from keeps (``--memory``): one empty list for them all,
#: never appended to (``record`` appends only once ``recorded_after`` has replaced it)
_NONE_KEPT: list[Firing] = []


class Ring:
    """The newest ``limit`` firings, the head, and reads after a seq."""

    __slots__ = ("_firings", "_fold", "_head", "_keep", "_recent", "_slot_of", "_slots")

    def __init__(
        self, limit: int = DEFAULT_LIMIT, head: int = 0, firings: Iterable[Firing] = ()
    ) -> None:
        if head < 0:
            raise BadSeq(f"head {head} is negative")
        kept = deque(firings, maxlen=check_limit(limit))
        # Every read finds a firing by its seq's offset from ``first``, and a
        # packed firing has no seq of its own, so a ring rebuilt from a store
        # must hold exactly the seqs up to its head, each one.
        first = head - len(kept) + 1
        if any(firing.seq != seq for seq, firing in enumerate(kept, first)):
            raise BadSeq(
                f"firings {kept[0].seq} to {kept[-1].seq} "
                f"are not the newest {len(kept)} up to head {head}"
            )
        self._head = head
        self._fold: Fold | None = None
        # Once a store takes this ring's new firings (``recorded_after``), each one
        # recorded is kept as its ``Firing`` too until the store takes it: the firings
        # it is handed are the ones the sends built, not unpacked from the bytes just
        # packed. At most a ring's length of them: a store that takes none for longer
        # is handed the older ones unpacked.
        self._keep = False
        self._recent = _NONE_KEPT  # a list of its own at the first take: none a ring before
        self._slots: list[Slot] = []
        self._slot_of: dict[Slot, int] = {}
        self._firings: deque[bytes | Firing] = deque(maxlen=limit)
        for f in kept:
            # Packing may rebuild the deque (``_compact_slots``): take it afresh.
            item = self._pack(f.seq, f.handler, f.result, f.event, f.ts, tags=f.tags, by=f.by)
            self._firings.append(item)

    @property
    def head(self) -> int:
        """The seq of the newest firing ever recorded (0 when none)."""
        return self._head

    @property
    def limit(self) -> int:
        limit = self._firings.maxlen
        assert limit is not None
        return limit

    @property
    def retained(self) -> int:
        return len(self._firings)

    @property
    def first(self) -> int:
        """The seq of the oldest retained firing; ``head + 1`` when none is."""
        return self._head - len(self._firings) + 1

    @property
    def dropped(self) -> int:
        """How many firings the bound has removed so far."""
        return self._head - len(self._firings)

    @property
    def is_folded(self) -> bool:
        """Whether its firings are still where ``Ring.folded`` left them."""
        return False

    def unfold(self) -> None:
        """Bring a folded ring's firings in; nothing for a ring that holds them."""

    @classmethod
    def folded(cls, limit: int, head: int, fold: Fold) -> Ring:
        """A ring of ``limit`` and ``head`` whose ``fold.retained`` firings are brought in by
        ``fold.unfold`` the first time something needs one (and then never again)."""
        if not 0 <= fold.retained <= min(limit, head):
            raise BadSeq(f"a ring of head {head} and limit {limit} cannot hold {fold.retained}")
        ring = _Folded(limit, head)
        ring._fold = fold
        return ring

    def visible_head(self, visible: int | None = None) -> int:
        """The newest seq a reader capped at ``visible`` may see: within 0 to the head."""
        return self._head if visible is None else min(max(visible, 0), self._head)

    def firings(self) -> list[Firing]:
        return packed.unpack(self.first, self._firings, self._slots)

    def at(self, seq: int) -> Firing:
        """Firing ``seq``, which the ring holds: one item found by its index, not a slice of
        the ring walked to it (what a claim hands out, ``session.groups``)."""
        first = self.first
        if not first <= seq <= self._head:
            raise BadSeq(f"the ring holds firings {first} to {self._head}, not {seq}")
        return packed.unpack(seq, (self._firings[seq - first],), self._slots)[0]

    def recorded_after(self, seq: int) -> list[Firing]:
        """The retained firings after ``seq`` (a seq it has recorded), oldest first: what a
        store is handed of a ring since it last was. ``events_after`` without a read's
        checks, its cap and its batch: a durable send's commit takes this of every ring
        it touched, most often its one newest firing."""
        self._keep = True
        # the newest firings as recorded, up to the head: record appends each, nothing else
        recent, self._recent = self._recent, []
        held = len(self._firings)
        count = min(self._head - seq, held)
        if count <= 0:
            return []
        if len(recent) >= count:
            return recent if len(recent) == count else recent[-count:]
        items = [self._firings[-1]] if count == 1 else self._slice(held - count, held)
        return packed.unpack(self._head - count + 1, items, self._slots)

    def record(
        self,
        handler: str,
        result: str | None,
        event: str | None,
        ts: str,
        *,
        tags: dict[str, str] = NO_TAGS,
        by: str | None = None,
    ) -> int:
        """Record the next firing and return its seq; when the ring is full the oldest goes.

        ``append`` without building the ``Firing``: all that a send needs.
        """
        seq = self._head + 1
        item = self._pack(
            seq, handler, result, event, ts, tags=tags, by=by
        )  # may rebuild the deque
        self._firings.append(item)
        self._head = seq
        if self._keep:
            if isinstance(item, bytes):
                item = Firing(seq, handler, result, event, ts, tags or NO_TAGS, by)
            recent = self._recent
            if len(recent) >= len(self._firings):  # none taken for a ring's length
                recent.clear()
            recent.append(item)
        return seq

    def _pack(
        self,
        seq: int,
        handler: str,
        result: str | None,
        event: str | None,
        ts: str,
        *,
        tags: dict[str, str] = NO_TAGS,
        by: str | None = None,
    ) -> bytes | Firing:
        """The firing as the deque keeps it: packed when it fits, else as itself."""
        text = event if result is None else result
        if text is not None and (result is None or event is None):
            if tags:
                keys = tuple(tags)
                joined = "\x00".join((*tags.values(), text))
                # A value with a NUL would read back as two: such a firing is kept as itself.
                fits = joined.count("\x00", 0, len(joined) - len(text)) == len(keys)
            else:
                keys, joined, fits = (), text, True
            try:
                data = joined.encode() if fits else None
            except UnicodeEncodeError:
                data = None  # a lone surrogate: UTF-8 has no bytes for it
            if data is not None:
                key = (handler, result is None, by, keys)
                slot = self._slot_of.get(key)
                if slot is None:
                    slot = self._add_slot(key)
                # A ts that does not pack leaves that slot unused; the next
                # rebuild of the table drops it.
                item = packed.pack(ts, slot, data)
                if item is not None:
                    return item
        return Firing(seq, handler, result, event, ts, tags or NO_TAGS, by)

    def _add_slot(self, key: Slot) -> int:
        # Rebuilding only once the table is twice the ring's length (and some)
        # keeps it O(1) a firing and bounds the table at 2 × 65,536 + 64 slots,
        # well within the 24 bits a packed firing has for one.
        if len(self._slots) >= 2 * len(self._firings) + 64:
            self._compact_slots()
        handler, unhandled, by, keys = key
        key = (
            sys.intern(handler),
            unhandled,
            None if by is None else sys.intern(by),
            _interned(keys),
        )
        self._slot_of[key] = len(self._slots)
        self._slots.append(key)
        return len(self._slots) - 1

    def _compact_slots(self) -> None:
        """Rebuild the table from the slots the held firings use, renumbering them."""
        slots: list[Slot] = []
        slot_of: dict[Slot, int] = {}
        items: deque[bytes | Firing] = deque(maxlen=self._firings.maxlen)
        for item in self._firings:
            if isinstance(item, bytes):
                key = self._slots[packed.slot_of(item)]
                slot = slot_of.get(key)
                if slot is None:
                    slot = slot_of[key] = len(slots)
                    slots.append(key)
                item = packed.repack(item, slot)
            items.append(item)
        self._firings, self._slots, self._slot_of = items, slots, slot_of

    def image(self) -> Image:
        """The ring as it keeps itself, for :meth:`from_image` (its items are shared: they
        are immutable)."""
        return Image.of(self._head, self._slots, list(self._firings))

    @classmethod
    def from_image(
        cls, limit: int, head: int, image: Image, firings: Iterable[Firing] = ()
    ) -> Ring:
        """The ring ``image`` holds, bound to ``limit`` (its newest kept), with ``firings``
        recorded after it; they must continue it seq by seq up to ``head``.

        The image's items are taken as they are: an image is only ever made by
        :meth:`image`, and a store that keeps one checks its bytes (SQLite's: a
        CRC) before it hands it here.
        """
        if image.first < 1:  # a head below 0 has a first below 1 too
            raise BadSeq(f"an image of head {image.head} holds {len(image.items)} firings")
        ring = cls(limit, image.head)
        ring._slots = image.slot_table()
        ring._slot_of = {key: slot for slot, key in enumerate(ring._slots)}
        ring._firings = deque(image.items, maxlen=limit)
        for f in firings:
            if f.seq != ring._head + 1:
                raise BadSeq(f"firing {f.seq} does not follow the image's seq {ring._head}")
            ring.record(f.handler, f.result, f.event, f.ts, tags=f.tags, by=f.by)
        if ring._head != head:
            raise BadSeq(f"the image and its firings end at {ring._head}, not at head {head}")
        return ring

    def set_limit(self, limit: int) -> int:
        """Change the bound, keeping the newest; returns how many firings it trimmed."""
        check_limit(limit)
        before = len(self._firings)
        self._firings = deque(self._firings, maxlen=limit)
        return before - len(self._firings)

    def events_after(
        self,
        after: int | None,
        max: int | None = None,
        visible: int | None = None,
        what: str = "cursor",
        match: Match | None = None,
    ) -> Batch:
        """The firings with seq > ``after``, oldest first, at most ``max`` (rule S3).

        ``what`` names ``after`` in the error when it is after the head: a
        cursor's position, or the seq a read without a cursor gave (``after``).
        ``after`` None is just before the oldest firing the ring holds: the whole
        ring, nothing lost. With ``match`` only the firings that match are
        returned, at most ``max`` of them; ``next`` is the last seq looked at.
        """
        head = self.visible_head(visible)
        if after is None:
            after = min(self.first, head + 1) - 1
        if after < 0:
            raise BadSeq(f"seq {after} is negative")
        if after > head:
            raise CursorAfterHead(f"{what} {after} is after head {head}")
        if max is not None and max < 1:
            raise BadMax(f"max {max} is below 1")
        first = self.first
        lost = max_(0, min(first, head + 1) - after - 1)
        start = max_(after + 1, first)
        if match is not None:
            return self._matching(start, head, lost, after, max, match)
        stop = head + 1 if max is None else min(head + 1, start + max)
        if stop <= start:
            return Batch(after + lost, lost, [])
        items = self._slice(start - first, stop - first)
        return Batch(stop - 1, lost, packed.unpack(start, items, self._slots))

    def _matching(
        self, start: int, head: int, lost: int, after: int, max: int | None, match: Match
    ) -> Batch:
        """The firings from ``start`` to ``head`` that ``match`` holds for, at most ``max``;
        ``next`` is the last seq looked at: the last match when ``max`` stopped the look,
        else ``head``. A packed firing is looked at by its slot first (``Match.plan``, once a
        slot): one whose handler, sender or keys cannot match is skipped unread, and of the
        rest only the values the match names are compared, as bytes; only a match is
        unpacked."""
        if start > head:
            return Batch(after + lost, lost, [])
        found: list[Firing] = []
        items = self._slice(start - self.first, head - self.first + 1)
        slots = self._slots  # after the slice: it may unfold
        plans: dict[int, list[tuple[int, bytes]] | None] = {}
        seq = start
        for item in items:
            if isinstance(item, bytes):
                slot = packed.slot_of(item)
                if slot in plans:
                    plan = plans[slot]
                else:
                    handler, _, by, keys = slots[slot]
                    plan = plans[slot] = match.plan(handler, keys, by)
                if plan is not None and (not plan or packed.holds(item, plan)):
                    found += packed.unpack(seq, (item,), slots)
            elif match.holds(item.handler, item.tags, item.by):
                found.append(item)
            if max is not None and len(found) == max:
                return Batch(seq, lost, found)
            seq += 1
        return Batch(head, lost, found)

    def _slice(self, start: int, stop: int) -> list[bytes | Firing]:
        # A deque is cheap to walk from either end, so walk from the nearer one.
        size = len(self._firings)
        if start <= size - stop:
            return list(islice(self._firings, start, stop))
        tail = list(islice(reversed(self._firings), size - stop, size - start))
        tail.reverse()
        return tail


class _Folded(Ring):
    """A ring whose firings are still in its store (``Ring.folded``): an empty deque of its
    limit, its head and its fold. What needs a firing unfolds it first, after which it is a
    ``Ring`` (its class is swapped: no check is left on a send's path)."""

    __slots__ = ()

    @property
    def is_folded(self) -> bool:
        return True

    @property
    def retained(self) -> int:
        assert self._fold is not None
        return self._fold.retained

    @property
    def first(self) -> int:
        return self._head - self.retained + 1

    @property
    def dropped(self) -> int:
        return self._head - self.retained

    def unfold(self) -> None:
        """Take the firings from the fold; what ``fold.unfold`` raises leaves it folded."""
        assert self._fold is not None
        retained, unfold = self._fold
        ring = unfold()
        if (ring.limit, ring.head, ring.retained) != (self.limit, self._head, retained):
            raise BadSeq(
                f"a ring of limit {self.limit}, head {self._head} and {retained} firings "
                f"unfolded as one of limit {ring.limit}, head {ring.head} and {ring.retained}"
            )
        self._firings, self._slots, self._slot_of = ring._firings, ring._slots, ring._slot_of
        self._fold = None
        self.__class__ = Ring  # type: ignore[assignment]

    def firings(self) -> list[Firing]:
        self.unfold()
        return self.firings()

    def at(self, seq: int) -> Firing:
        self.unfold()
        return self.at(seq)

    def record(self, *args: Any, **kwargs: Any) -> int:  # Ring.record's, as they come
        self.unfold()
        return self.record(*args, **kwargs)

    def recorded_after(self, seq: int) -> list[Firing]:
        if seq >= self._head:  # nothing after it: a ring changed only in its cursors
            return []
        self.unfold()
        return self.recorded_after(seq)

    def set_limit(self, limit: int) -> int:
        check_limit(limit)  # a bad limit changes nothing, folded or not
        self.unfold()
        return self.set_limit(limit)

    def image(self) -> Image:
        self.unfold()
        return self.image()

    def _slice(self, start: int, stop: int) -> list[bytes | Firing]:
        self.unfold()
        return self._slice(start, stop)


def since_of(
    whole: Batch, since: str, last: int | None, max: int | None, match: Match | None = None
) -> Batch:
    """What a read of the whole ring (``whole``, read after 0 with no match) keeps for
    ``since``: the firings whose ``ts`` is ``since`` or later (and that ``match`` holds
    for), the newest ``last`` of them (all with None), the oldest ``max`` of those (all
    with None). The firings the ring dropped are reported only when some of them may have
    been recorded since (the oldest retained one was, or none is retained: the oldest of
    the whole ring, matching or not); a batch cut by ``last`` reports none, and one cut by
    ``max`` ends at its last firing, so that reading on after it pages through the rest.

    ``ts`` is UTC to the millisecond in one format (``session.firing.ms_to_ts``), so it
    compares as text. One formula for every store: the local ones read the ring in memory,
    the Redis one in one script, and both keep what this keeps.
    """
    firings = [f for f in whole.firings if f.ts >= since]
    if match is not None:
        firings = [f for f in firings if match.holds(f.handler, f.tags, f.by)]
    lost = whole.lost if not whole.firings or whole.firings[0].ts >= since else 0
    if last is not None and len(firings) > last:
        firings, lost = firings[-last:], 0
    if max is not None and len(firings) > max:
        return Batch(firings[max - 1].seq, lost, firings[:max])
    return Batch(whole.next, lost, firings)


def only(batch: Batch, seq: int) -> Batch:
    """What a read of one ``seq`` keeps of the read after it less 1, at most 1: that firing,
    or none with ``lost`` 1 when the ring dropped it (not the next one it still holds)."""
    if batch.firings and batch.firings[0].seq == seq:
        return batch
    return Batch(seq, 1, [])


def check_last(last: int) -> int:
    if last < 1:
        raise BadMax(f"last {last} is below 1")
    return last


max_ = max


def look_heard(
    after: int, heard: Sequence[Firing], max: int | None = None, match: Match | None = None
) -> Batch | None:
    """What a look after ``after`` finds when ``heard`` are the firings recorded after it,
    in order, and the newest of them is the head as far as the looker knows: the batch
    ``Ring.events_after`` would give on a ring that retains them (rules S3, R3). None when
    they do not follow ``after`` one by one (one was missed, or is older): the looker must
    read the ring instead.
    """
    if not heard:
        return None
    for offset, firing in enumerate(heard, start=after + 1):
        if firing.seq != offset:
            return None
    found: list[Firing] = []
    for firing in heard:
        if match is None or match.holds(firing.handler, firing.tags, firing.by):
            found.append(firing)
            if max is not None and len(found) == max:
                return Batch(firing.seq, 0, found)
    return Batch(heard[-1].seq, 0, found)
