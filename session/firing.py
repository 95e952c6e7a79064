"""What readers are given: a firing, a batch of them as a read returns it, a cursor's row,
a group's row.

These are msgspec Structs so that the daemon can encode them straight onto
the wire and the store can persist them without a translation layer. The CLI
loads this module on every run (``repl read``): it imports no other module of the
core but ``session.rules``, and a row of the wire (``GroupInfo``, whose group is
``session.group``'s) is written here rather than beside what makes it.
"""

from __future__ import annotations

import time

import msgspec

from session.rules import DEFAULT_MAX_ATTEMPTS

#: a firing's ``ts`` up to its seconds, as ``time.strftime`` writes it; then ``.mmmZ``
TS_SECONDS = "%Y-%m-%dT%H:%M:%S"


def ms_to_ts(ms: int) -> str:
    """``ms`` since the epoch as a firing's ``ts``: ISO 8601 UTC with milliseconds and a
    ``Z``, e.g. ``2026-11-30T07:00:00.123Z`` (the one format of every time repl writes)."""
    second, milli = divmod(ms, 1000)
    return f"{time.strftime(TS_SECONDS, time.gmtime(second))}.{milli:03d}Z"


class Firing(msgspec.Struct, frozen=True, gc=False):
    """One recorded happening.

    A handled firing has a ``result`` and no ``event``; an unhandled one
    (the session has no handler of that name) keeps the raw ``event`` and
    has no ``result``. ``ts`` is an ISO 8601 UTC time given by the caller.
    ``tags`` are what it was sent with (``session.tags``); never changed
    once recorded, so firings without any may share ``NO_TAGS``. ``by`` names what sent
    it, as the daemon recorded it (``session.tags.BY``): a token's name, ``root``,
    ``timer`` or ``webhook``; None for a firing stored before repl recorded senders.
    """

    seq: int
    handler: str
    result: str | None
    event: str | None
    ts: str
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    by: str | None = None


#: the tags of a firing that has none, shared (a firing's tags are never changed)
NO_TAGS: dict[str, str] = {}


class Batch(msgspec.Struct, frozen=True):
    """What a read after N returns (rule S3).

    ``next`` is the seq to acknowledge once the firings are handled;
    ``lost`` counts the firings after N that the ring no longer holds.
    """

    next: int
    lost: int
    firings: list[Firing]


class CursorInfo(msgspec.Struct, frozen=True):
    """A cursor as ``repl cursors`` shows it: its position and its lag behind the head."""

    name: str
    seq: int
    lag: int


class GroupInfo(msgspec.Struct, frozen=True):
    """A group as ``repl groups`` shows it: ``done`` is the seq up to which every firing
    is done, dead or lost; the rest count the firings the ring holds."""

    name: str
    done: int
    ready: int
    held: int
    delayed: int
    dead: int
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    dead_letter: str = ""
