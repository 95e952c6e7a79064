"""What a daemon hears on a session's wake channel (``wakes.heard``), as ``scripts.RECORD``,
``FIRE`` and ``STOP`` publish it, and as a repl of another version did.

A firing published whole comes back field for field, its sender too; a bare wake (a
timer's, a stop) names its seq and the daemon that published it; a firing in the form of
the repl before senders (seven words) is heard as a bare wake of that daemon, so its
waiters read the ring instead of taking a firing without its ``by`` (a rolling upgrade
is slower for a moment, never wrong).
"""

from __future__ import annotations

from repl_daemon.backends.redis.wakes import Heard, heard
from session.firing import Firing

TS = "2026-12-04T07:00:00.000Z"


def test_a_firing_published_whole_is_heard_with_its_sender_and_tags() -> None:
    tags = '{"k":"v"}'
    head = f"7 d-1 r {len('on-message')} {len(TS)} {len(tags)} {len('alice')} inc-1\n"
    payload = (head + "on-message" + TS + tags + "alice" + "hi there").encode()
    assert heard(payload) == Heard(
        "7", "d-1", Firing(7, "on-message", "hi there", None, TS, {"k": "v"}, "alice"), "inc-1"
    )
    unsigned = f"8 d-1 e 2 {len(TS)} 0 0 -\n".encode() + b"h1" + TS.encode() + b"ev"
    assert heard(unsigned).firing == Firing(8, "h1", None, "ev", TS, {}, None)


def test_a_bare_wake_and_a_stop_name_their_seq_and_origin() -> None:
    assert heard(b"9 d-2") == Heard("9", "d-2")
    assert heard(b"stop d-2") == Heard("stop", "d-2")
    assert heard(b"stop") == Heard("stop", "")


def test_a_firing_in_the_form_before_senders_is_heard_as_a_bare_wake() -> None:
    old = f"7 d-old r 10 {len(TS)} 0 inc-1\n".encode() + b"on-message" + TS.encode() + b"hi"
    assert heard(old) == Heard("7", "d-old")
