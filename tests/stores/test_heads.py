"""The heads a daemon learned from Redis (``repl_daemon.backends.redis.heads``): no Redis, no loop.

A head is compared only with what was known when the operation was sent,
within one incarnation of the session, so answers that cross each other, a
session started again and a session with no incarnation are never taken
for a head going back; one that did go back is told once a session and
counted each time it is seen anew.
"""

from __future__ import annotations

from repl_daemon.backends.redis.heads import Heads, Known, WentBack

A, B = b"a1", b"b2"


def sent(heads: Heads, found: int, head: int, before: Known | None = None) -> WentBack | None:
    """A send (found ``found``, left ``head``) or a read (both the same) in incarnation A."""
    return heads.learned("s", before, A, found, head)


def test_a_head_that_only_grows_never_went_back() -> None:
    heads = Heads()
    for seq in range(1, 50):
        assert sent(heads, seq - 1, seq, heads.before("s")) is None
        assert sent(heads, seq, seq, heads.before("s")) is None  # a read, or a duplicate
    assert heads.before("s") == (A, 49, 0) and heads.went_back == 0


def test_answers_that_cross_each_other_are_no_head_going_back() -> None:
    """Sent at once, answered in any order: each is compared with what was known when sent."""
    heads = Heads()
    sent(heads, 4, 5)
    both = heads.before("s")
    assert sent(heads, 6, 7, both) is None  # the second send's answer came first
    assert sent(heads, 5, 6, both) is None  # then the first's
    assert sent(heads, 5, 5, both) is None  # a read sent with them that ran before both
    assert heads.before("s") == (A, 7, 0) and heads.went_back == 0


def test_a_head_below_one_known_when_sent_went_back_and_is_told_once_a_session() -> None:
    heads = Heads()
    sent(heads, 7, 8)
    went = sent(heads, 3, 4, heads.before("s"))  # a send given seq 4 after 8 was answered
    assert went == WentBack("s", highest=8, head=3, first=True)
    assert heads.before("s") == (A, 4, 1)  # what Redis holds now is the head to keep
    assert sent(heads, 4, 5, heads.before("s")) is None
    sent(heads, 9, 10, heads.before("s"))
    again = sent(heads, 2, 2, heads.before("s"))  # a read: it went back once more
    assert again == WentBack("s", highest=10, head=2, first=False)
    assert heads.went_back == 2


def test_what_was_on_its_way_when_the_head_went_back_is_not_counted_again() -> None:
    heads = Heads()
    sent(heads, 7, 8)
    on_their_way = heads.before("s")
    assert sent(heads, 3, 4, on_their_way) is not None
    assert sent(heads, 4, 5, on_their_way) is None  # sent before the loss was seen
    assert sent(heads, 2, 2, on_their_way) is None
    assert heads.went_back == 1


def test_a_session_started_again_starts_at_one_without_going_back() -> None:
    """Stopped and started again (here or on another daemon): another incarnation."""
    heads = Heads()
    sent(heads, 7, 8)
    before = heads.before("s")
    assert heads.learned("s", before, B, 0, 1) is None
    assert heads.before("s") == (B, 1, 0)
    # an answer of the old incarnation that was on its way: no alarm either
    assert heads.learned("s", before, A, 8, 9) is None
    heads.forget("s")
    assert heads.before("s") is None and heads.went_back == 0


def test_a_session_without_an_incarnation_is_never_compared() -> None:
    """Made by a daemon too old to write one."""
    heads = Heads()
    assert heads.learned("s", None, b"", 7, 8) is None
    assert heads.learned("s", heads.before("s"), b"", 0, 1) is None
    assert heads.before("s") is None and heads.went_back == 0


def test_the_sessions_kept_are_bounded_and_a_miss_is_no_alarm() -> None:
    heads = Heads(bound=2)
    for name in ("s", "t", "u"):
        heads.learned(name, None, A, 7, 8)
    assert heads.before("s") is None and heads.before("u") == (A, 8, 0)
    assert heads.learned("s", None, A, 0, 1) is None
    assert heads.went_back == 0


def test_the_sessions_told_are_bounded_too() -> None:
    heads = Heads(bound=1)
    for name in ("s", "t", "s"):
        heads.learned(name, None, A, 7, 8)
        went = heads.learned(name, heads.before(name), A, 0, 1)
        assert went is not None and went.first  # "s" was forgotten to make room for "t"
    assert heads.went_back == 3
