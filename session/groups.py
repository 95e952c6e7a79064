"""A session's groups (SPEC §16): up to 16 of them, and what their steps need of its ring.

``session.group.Group`` keeps one group's rules over bare seqs; this module is
what a ``Session`` holds of them: the table of its groups, the firings a claim
hands out and a match looks at, and the dead letters a group's last attempt
leaves for the caller to record in another session. It is pure, like the rest
of the core: the clock comes in as ``now_ms``, the ring and its ``visible`` cap
as arguments, and nothing here records anything anywhere.

**Dead letters.** A firing whose last attempt runs out or is given back is done
for its group and must be recorded in the group's dead-letter session in the
same atomic step. That session is another session, which this one cannot
touch: the step leaves a ``DeadLetter`` in ``outbox``, and whatever runs the
step (a committer) takes it with ``take_dead_letters`` and records it before
anything else runs, in the same write. A dead letter is the firing's handler
and text, as handled or not as it was, by whoever sent it, with its tags (the
first 12) and four of its own: ``dead.session``, ``dead.seq``, ``dead.group``
and ``dead.attempts``.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from session.firing import Firing, GroupInfo
from session.group import (
    Claim,
    Dead,
    Group,
    GroupSnapshot,
    Lease,
    Progress,
    check_lease,
    lease_lost,
    parse_token,
    too_many_groups,
    unseen_dead_letter,
)
from session.names import check_group_name
from session.ring import Ring
from session.rules import MAX_GROUPS
from session.tags import MAX_TAGS, Match

#: the tags a dead letter adds to the firing's own
DEAD_TAGS = ("dead.session", "dead.seq", "dead.group", "dead.attempts")


class Taken(msgspec.Struct, frozen=True):
    """What a claim took: the claim (its token, seq, attempt, lease and what was lost)
    and the firing itself."""

    claim: Claim
    firing: Firing


class DeadLetter(msgspec.Struct, frozen=True):
    """A firing to record in ``session`` (a group's dead-letter session), as it is."""

    session: str
    handler: str
    text: str
    handled: bool
    tags: dict[str, str]
    by: str | None = None


def dead_letter(group: Group, firing: Firing, attempts: int) -> DeadLetter:
    """``firing`` as ``group``'s dead-letter session records it after ``attempts``."""
    own = {
        "dead.session": group.session,
        "dead.seq": str(firing.seq),
        "dead.group": group.name,
        "dead.attempts": str(attempts),
    }
    kept = [(k, v) for k, v in firing.tags.items() if k not in own][: MAX_TAGS - len(own)]
    handled = firing.result is not None
    text = firing.result if firing.result is not None else firing.event or ""
    return DeadLetter(
        group.dead_letter, firing.handler, text, handled, {**dict(kept), **own}, firing.by
    )


class Groups:
    """The groups of one session, by name, and the dead letters its steps left."""

    __slots__ = ("by_name", "changed", "freed", "moved", "outbox", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.by_name: dict[str, Group] = {}
        #: dead letters to record elsewhere (``take_dead_letters``)
        self.outbox: list[DeadLetter] = []
        #: a group changed since the last delta: the store is handed the table
        self.changed = False
        #: a lease or a delay moved since the committer last looked: the deadline may have
        self.moved = False
        #: how many times a step made a firing claimable again (a release, an expiry):
        #: a committer that sees it move wakes the group's blocked claimers
        self.freed = 0

    def __len__(self) -> int:
        return len(self.by_name)

    # -- the steps -----------------------------------------------------------------

    def group(
        self,
        name: str,
        ring: Ring,
        visible: int | None,
        *,
        from_now: bool = False,
        sees_dead_letter: bool = True,
    ) -> Group:
        """The group ``name``; a new one (from the oldest firing readers may see, or after
        the head with ``from_now``) when there is none, unless whoever asks does not see
        the dead-letter session the new group would have (``sees_dead_letter`` False: a
        scoped token's): then ``Forbidden``, and no group is made."""
        check_group_name(name)
        group = self.by_name.get(name)
        if group is not None:
            return group
        if len(self.by_name) >= MAX_GROUPS:
            raise too_many_groups(self.session_id)
        if not sees_dead_letter:
            raise unseen_dead_letter(self.session_id, name)
        head = ring.visible_head(visible)
        group = Group.create(
            self.session_id, name, min(ring.first, head + 1), head, from_now=from_now
        )
        self.by_name[name] = group
        self.changed = True
        return group

    def claim(
        self,
        ring: Ring,
        visible: int | None,
        name: str,
        now_ms: int,
        *,
        lease_ms: int,
        match: Match | None = None,
        from_now: bool = False,
        sees_default_dead_letter: bool = True,
    ) -> Taken | None:
        """Take the oldest claimable firing of group ``name`` that ``match`` holds for
        (creating the group on its first claim, unless the claimer does not see the
        default dead-letter session: ``group``); None when there is none. Leases that ran
        out are expired first (their dead letters go to the outbox)."""
        check_lease(lease_ms)
        created = name not in self.by_name
        group = self.group(
            name, ring, visible, from_now=from_now, sees_dead_letter=sees_default_dead_letter
        )
        before = (group.done_through, group.lost)
        head = ring.visible_head(visible)
        first = min(ring.first, head + 1)
        self._expire(group, ring, now_ms)
        holds: Callable[[int], bool] | None = None
        if match is not None:
            # the group may be trimmed past the visible head (the ring dropped firings a
            # store has not made durable yet): then nothing readers may see is left to match
            start = min(max(group.done_through, first - 1), head)
            found = ring.events_after(start, None, visible, "after", match).firings
            matching = {firing.seq for firing in found}
            holds = matching.__contains__
        taken = group.claim(now_ms, lease_ms, first, head, holds)
        if created or taken is not None or (group.done_through, group.lost) != before:
            self.changed = True  # a look that took nothing and trimmed nothing changes nothing
        if taken is None:
            return None
        self.moved = True
        firing = ring.at(taken.seq)  # a seq readers may see: claimed at or below the cap
        return Taken(taken, firing)

    def held(self, token: str, ring: Ring) -> Group:
        """The group of the claim ``token`` names, for a step of its lease (done, extend:
        ``moved`` once it ran); refused as ``lease_lost`` when there is no such group."""
        return self._of(token, ring)

    def moved_by_step(self) -> None:
        """A step of a lease ran: the table changed, and a lease or a done moved."""
        self.changed = self.moved = True

    def held_firing(self, group: Group, ring: Ring, token: str, now_ms: int) -> Firing:
        """The firing the claim ``token`` holds in ``group``; ``lease_lost`` when the claim
        is no longer the live lease (what a step that gives it back needs first)."""
        seq, _ = group.live(token, now_ms)
        return _firing_at(ring, seq)

    def given_back(self, group: Group, firing: Firing, dead: Dead | None, delay_ms: int) -> None:
        """A held firing was given back: its dead letter in the outbox when that was its
        last attempt, else claimable again (now, or after ``delay_ms``)."""
        self.changed = self.moved = True
        if dead is not None:
            self.outbox.append(dead_letter(group, firing, dead.attempts))
        elif not delay_ms:
            self.freed += 1

    def expire(self, ring: Ring, now_ms: int) -> list[int]:
        """Expire every group's leases and delays that ended by ``now_ms``; the seqs that
        are claimable again (for any group), and dead letters in the outbox."""
        again: list[int] = []
        for group in self.by_name.values():
            if (deadline := group.next_deadline()) is not None and deadline <= now_ms:
                again.extend(self._expire(group, ring, now_ms))
        return sorted(set(again))

    def _expire(self, group: Group, ring: Ring, now_ms: int) -> list[int]:
        deadline = group.next_deadline()
        if deadline is None or deadline > now_ms:
            return []
        group.trim(ring.first)
        # what will die is read from the ring before the step that makes it done
        dying = {
            seq: _firing_at(ring, seq)
            for seq, (attempt, until) in group.leases.items()
            if until <= now_ms and attempt >= group.max_attempts
        }
        expired = group.expire(now_ms)
        for dead in expired.dead:
            self.outbox.append(dead_letter(group, dying[dead.seq], dead.attempts))
        self.changed = self.moved = True
        if expired.again:
            self.freed += 1
        return expired.again

    def configure(
        self,
        ring: Ring,
        visible: int | None,
        name: str,
        now_ms: int,
        *,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
        from_now: bool = False,
        sees_default_dead_letter: bool = True,
    ) -> GroupInfo:
        """Set a group's attempts and dead-letter session (creating it: with the default
        dead-letter session only for whoever sees it, ``group``); its counts."""
        group = self.by_name.get(name)
        if group is None:
            check_group_name(name)
            # checked before the group is made, so a refusal leaves no group behind
            _check_config(self.session_id, name, max_attempts, dead_letter)
            sees = sees_default_dead_letter or dead_letter is not None
            group = self.group(name, ring, visible, from_now=from_now, sees_dead_letter=sees)
        group.configure(max_attempts, dead_letter)
        self.changed = True
        return self._info(group, ring, visible, now_ms)

    def _of(self, token: str, ring: Ring) -> Group:
        """The group a token names, trimmed to the ring; ``LeaseLost`` when there is none."""
        name, _, _ = parse_token(token)
        group = self.by_name.get(name)
        if group is None:
            raise lease_lost(token, "no_group", self.session_id)
        through = group.done_through
        group.trim(ring.first)  # what the ring dropped is lost, whatever the step does
        if group.done_through != through:
            self.changed = True
        return group

    # -- what they show ------------------------------------------------------------

    def infos(self, ring: Ring, visible: int | None, now_ms: int) -> list[GroupInfo]:
        return [self._info(g, ring, visible, now_ms) for _, g in sorted(self.by_name.items())]

    def progress(
        self, ring: Ring, visible: int | None, name: str, upto: int | None, now_ms: int
    ) -> Progress:
        """How far group ``name`` is with the firings up to ``upto`` (None: the head); a
        group not made yet is as its first claim would make it (from the oldest firing the
        ring holds: every one of them ready)."""
        head = ring.visible_head(visible)
        first = min(ring.first, head + 1)
        group = self.by_name.get(name) or Group.create(self.session_id, name, first, head)
        return group.progress(first, head, head if upto is None else upto, now_ms)

    def _info(self, group: Group, ring: Ring, visible: int | None, now_ms: int) -> GroupInfo:
        head = ring.visible_head(visible)
        return group.counts(min(ring.first, head + 1), head, now_ms)

    def leases(self, name: str | None = None) -> list[Lease]:
        """The held firings of group ``name`` (None: every group), by group then seq."""
        if name is not None:
            check_group_name(name)
        return [
            lease
            for group_name, group in sorted(self.by_name.items())
            if name is None or group_name == name
            for lease in group.claims()
        ]

    def deadline(self) -> int | None:
        """The earliest lease deadline or delay end of any group: when to ``expire``."""
        return min(
            (d for g in self.by_name.values() if (d := g.next_deadline()) is not None),
            default=None,
        )

    def take_dead_letters(self) -> list[DeadLetter]:
        letters, self.outbox = self.outbox, []
        return letters

    # -- kept by a store -------------------------------------------------------------

    def snapshot(self) -> list[GroupSnapshot]:
        return [group.snapshot() for _, group in sorted(self.by_name.items())]

    def restore(self, snapshots: list[GroupSnapshot]) -> None:
        self.by_name = {s.name: Group.restore(s) for s in snapshots[:MAX_GROUPS]}
        self.moved = bool(self.by_name)


def _firing_at(ring: Ring, seq: int) -> Firing:
    """Firing ``seq`` of a group trimmed to the ring: the ring holds every seq it holds."""
    assert ring.first <= seq <= ring.head, f"firing {seq} is held but not in the ring"
    return ring.at(seq)


def _check_config(
    session_id: str, name: str, max_attempts: int | None, dead_letter: str | None
) -> None:
    probe = Group(session_id, name)
    probe.configure(max_attempts, dead_letter)
