"""What a store is handed: the change to one session since the last one it was handed.

A session tracks its own changes (``Session.take_delta``), so the daemon
never works out what to write: it takes the delta and hands it over. A store
persists a delta and decides no rule of its own: the bound on dedup keys is
in the delta (``max_keys``), and ``gap`` is the one check of whether new
firings continue the stored ones, for stores that keep firings one by one.
"""

from __future__ import annotations

import msgspec

from session.firing import Firing
from session.group import GroupSnapshot
from session.rules import MAX_KEYS, WEBHOOK_HANDLER
from session.schedule import Timer


class CursorState(msgspec.Struct, frozen=True):
    """A cursor as a store keeps it: ``last_use`` orders the LRU eviction."""

    name: str
    seq: int
    last_use: int


class Webhook(msgspec.Struct, frozen=True):
    """A session's webhook (rules H1-H7): the secret its deliveries are signed with, and the
    handler their firings are recorded as."""

    secret: str
    handler: str = WEBHOOK_HANDLER


class Delta(msgspec.Struct, frozen=True):
    """What changed in one session since the previous delta.

    ``gone``: the session was stopped; delete all of it. ``reset``: delete
    whatever is stored under this id first (a new session, or a rewrite
    after a failure), then write the rest. ``firings`` are the new ones
    (seq above what was handed over before); the store also drops every
    stored firing with seq <= ``head - retained``, where ``retained`` is how
    many firings the ring holds now (None: as many as ``limit`` allows; it is
    fewer when the limit was lowered and raised again since). The new
    firings continue the stored ones with no hole (``gap`` says when they do
    not); a store refuses a delta that does not. ``cursors`` replaces the
    whole cursor table when not None. ``keys`` are new dedup keys, oldest
    first; the store keeps the newest ``max_keys``. ``timers`` are the
    timers added or moved (all of them after a reset), ``timers_gone`` the
    ids of those that fired for the last time or were cancelled. ``groups``
    replaces the session's groups (SPEC §16) when not None.
    """

    id: str
    gone: bool = False
    reset: bool = False
    limit: int = 0
    head: int = 0
    uses: int = 0
    retained: int | None = None
    firings: list[Firing] = []
    cursors: list[CursorState] | None = None
    keys: list[tuple[str, int]] = []
    max_keys: int = MAX_KEYS
    timers: list[Timer] = []
    timers_gone: list[str] = []
    #: whether the session's webhook changed (then ``webhook`` is what it is now: None for none)
    webhook_changed: bool = False
    webhook: Webhook | None = None
    #: the session's groups, all of them, when one changed (None: as they were)
    groups: list[GroupSnapshot] | None = None

    @property
    def oldest(self) -> int:
        """The seq of the oldest firing the ring holds after this delta."""
        retained = self.limit if self.retained is None else self.retained
        return self.head - min(retained, self.head) + 1


def gap(delta: Delta, stored_head: int) -> str | None:
    """Why ``delta``'s firings do not continue a ring stored up to ``stored_head``; None if they do.

    After a reset the stored ring is gone, so the firings must be exactly
    the retained ones; otherwise they must be every seq after the stored
    head that the ring still holds, up to the delta's head.
    """
    base = 0 if delta.reset else stored_head
    expected = range(max(base + 1, delta.oldest), delta.head + 1)
    seqs = [firing.seq for firing in delta.firings]
    if delta.head >= base and seqs == list(expected):
        return None
    got = f"{seqs[0]} to {seqs[-1]}" if seqs else "none"
    return (
        f"session {delta.id!r}: new firings ({got}) do not continue the stored head "
        f"{base} up to head {delta.head}"
    )
