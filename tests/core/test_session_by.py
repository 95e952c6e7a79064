"""Who sent each firing (SPEC §17): ``by``, recorded by the daemon, never by a client.

The core keeps it with the firing: a packed firing carries it in its slot (so
a sender costs a retained firing no bytes), a tagged one as a field. It comes
back from every read, survives a ring's image, reads back None from an image
written before senders were recorded, can be matched as ``by=NAME``, and no
tag may take its name. A timer's firing is ``timer``'s; a token may not be
named as one of the daemon's own senders.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from session.errors import BadRequest, BadTag
from session.firing import Firing
from session.ring import Image, Ring, decode_image, encode_image
from session.schedule import Timer
from session.scopes import check_new_token_name, check_token_name
from session.session import Session
from session.tags import Match, check_tags, parse_match

TS = "2026-12-04T07:00:00.000Z"


def test_each_firing_reads_back_with_its_sender_tagged_or_not() -> None:
    s = Session("s")
    s.record("on-message", "from alice", TS, by="alice")
    s.record("on-message", "from root", TS, by="root", tags={"k": "v"})
    s.record("on-message", "from no one known", TS)
    assert [(f.result, f.by) for f in s.read_after(0).firings] == [
        ("from alice", "alice"),
        ("from root", "root"),
        ("from no one known", None),
    ]


def test_a_sender_is_part_of_the_slot_so_it_costs_a_packed_firing_no_bytes() -> None:
    plain, signed = Ring(10), Ring(10)
    plain.record("on-message", "hello", None, TS)
    signed.record("on-message", "hello", None, TS, by="agent-7")
    assert signed._firings[-1] == plain._firings[-1]  # the same bytes
    for n in range(100):
        signed.record("on-message", f"m{n}", None, TS, by=("alice", "bob")[n % 2])
    assert [by for _, _, by, _ in signed._slots] == ["agent-7", "alice", "bob"]
    names = {id(f.by) for f in signed.firings() if f.by == "alice"}
    assert len(names) == 1  # one string for every firing alice sent


def test_a_match_on_by_finds_what_that_sender_sent_packed_or_tagged() -> None:
    s = Session("s")
    s.record("on-message", "a1", TS, by="alice")
    s.record("on-message", "b1", TS, by="bob", tags={"k": "v"})
    s.record("on-message", "a2", TS, by="alice", tags={"k": "w"})
    s.record("on-message", "old", TS)
    alice = parse_match(["by=alice"])
    assert alice is not None and alice.plan("on-message", (), "alice") == []
    assert [f.result for f in s.read_after(0, match=alice).firings] == ["a1", "a2"]
    known = Match({"by": None})
    assert [f.result for f in s.read_after(0, match=known).firings] == ["a1", "b1", "a2"]
    both = Match({"by": "alice", "k": None})
    assert both.plan("on-message", (), "alice") is None
    assert [f.result for f in s.read_after(0, match=both).firings] == ["a2"]
    assert [f.result for f in s.read_recent(None, TS, match=alice).firings] == ["a1", "a2"]


def test_no_tag_may_be_named_by() -> None:
    with pytest.raises(BadTag, match="tag 'by' is the daemon's"):
        check_tags({"by": "root"})
    s = Session("s")
    with pytest.raises(BadTag):
        s.record("on-message", "forged", TS, tags={"by": "root"})
    assert s.head == 0
    with pytest.raises(BadTag):
        s.schedule(
            Timer(
                id="t", session="s", due_ms=1, every_ms=None, handler="on-message", text="x",
                tags={"by": "alice"},
            )
        )  # fmt: skip
    assert s.timers == {}


def test_a_timers_firing_is_sent_by_timer() -> None:
    s = Session("s")
    s.schedule(Timer(id="t", session="s", due_ms=1, every_ms=None, handler="on-tick", text="x"))
    s.fire_timers(["t"], 5, TS)
    assert s.read_after(0).firings[0].by == "timer"


def test_an_image_keeps_the_senders_and_one_written_before_them_reads_none() -> None:
    ring = Ring(8)
    ring.record("on-message", "a", None, TS, by="alice")
    ring.record("on-message", "t", None, TS, tags={"k": "v"}, by="bob")
    ring.record("on-build", None, "e", TS)
    image = decode_image(encode_image(ring.image()))
    assert Ring.from_image(8, 3, image).firings() == ring.firings()
    # An image of a repl before ``by``: three fields, its slots pairs, a Firing's map
    # without the key.
    old = msgspec.msgpack.encode([1, image.slots, image.items[:1]])
    back = Ring.from_image(8, 1, decode_image(old))
    assert back.firings() == [Firing(1, "on-message", "a", None, TS, by=None)]
    tagged = msgspec.msgpack.encode({"seq": 2, "handler": "h", "result": "r", "event": None,
                                     "ts": TS, "tags": {"k": "v"}})  # fmt: skip
    old_firing = msgspec.msgpack.decode(tagged, type=Firing)
    assert old_firing.by is None


def test_a_new_token_may_not_take_a_name_the_daemon_gives_a_sender() -> None:
    for name in ("root", "timer", "webhook"):
        with pytest.raises(BadRequest, match="the daemon's own word"):
            check_new_token_name(name)
        assert check_token_name(name) == name  # one made before may still be revoked
    assert check_new_token_name("rooted") == "rooted"


@given(st.lists(st.sampled_from(["alice", "bob", None, "timer"]), max_size=40), st.integers(1, 8))
def test_any_senders_read_back_as_recorded_through_trims_and_images(
    senders: list[str | None], limit: int
) -> None:
    ring = Ring(limit)
    for n, by in enumerate(senders):
        tags = {"n": str(n)} if n % 3 == 0 else {}
        ring.record("on-message", f"m{n}", None, TS, tags=tags, by=by)
    kept = senders[-limit:] if senders else []
    assert [f.by for f in ring.firings()] == kept
    again = Ring.from_image(limit, ring.head, decode_image(encode_image(ring.image())))
    assert again.firings() == ring.firings()
    assert Image.of(0, [], []).slot_table() == []
