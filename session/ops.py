"""The operations on a session, as values: what the daemon asks of a session.

The daemon turns each request into one of these and hands it to whatever
keeps the session (its own memory, or a shared store); ``run`` applies it
to a ``Session`` with the core's rules. Keeping the operations as data means
that one engine serves every store, and that a store which applies an
operation itself (a script inside Redis, say) can be checked against
``run`` on the same values.

``visible`` caps what a reader may see at a seq below the head (the daemon
shows only what its store has made durable). ``check`` raises what ``run``
would raise for the operation's own values, before any session is looked
at: a store that applies the operation itself checks it with ``check``
first, and is left only the checks that need the session's state. ``durable`` says whether the
answer to an operation that changed the session must wait until the change
is durable: true for everything a client is told it did (a send, an ack, a
poll's ack, a new limit), false for a read's touch of its cursor, which is
written with the next batch but promises nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, TypeVar

import msgspec

from session.delta import Webhook
from session.errors import BadMax, BadSeq
from session.firing import NO_TAGS, Batch, CursorInfo, GroupInfo
from session.group import (
    Lease,
    Progress,
    check_delay,
    check_lease,
    check_max_attempts,
    parse_token,
)
from session.groups import Taken
from session.names import check_cursor_name, check_group_name, check_handler, check_session_id
from session.ring import check_last, check_limit
from session.schedule import Timer
from session.session import (
    Fired,
    Recorded,
    Scheduled,
    Session,
    Summary,
    check_key,
    check_timer,
    check_webhook,
)
from session.tags import Match, check_tags

R_co = TypeVar("R_co", covariant=True)


class Op(Protocol[R_co]):
    """An operation on one session that answers an ``R_co``."""

    durable: ClassVar[bool]

    def check(self) -> None: ...

    def run(self, session: Session, visible: int | None) -> R_co: ...


def check_seq(seq: int) -> int:
    if seq < 0:
        raise BadSeq(f"seq {seq} is negative")
    return seq


class Record(msgspec.Struct, frozen=True):
    """Record a firing (rules 1, 2, 13)."""

    durable: ClassVar[bool] = True
    handler: str
    text: str
    ts: str
    key: str | None = None
    #: whether the text is the result (None: whether the session has the handler)
    handled: bool | None = None
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    #: who sent it, as the daemon knows (``session.tags.BY``); never a client's word
    by: str | None = None

    def check(self) -> None:
        check_handler(self.handler)
        if self.key is not None:
            check_key(self.key)
        if self.tags:
            check_tags(self.tags)

    def run(self, session: Session, visible: int | None) -> Recorded:
        return session.record(
            self.handler,
            self.text,
            self.ts,
            key=self.key,
            handled=self.handled,
            tags=self.tags or NO_TAGS,
            by=self.by,
        )


def check_match(match: Match | None) -> None:
    if match is not None:
        match.check()
        if match.handler is not None:
            check_handler(match.handler)


class ReadAfter(msgspec.Struct, frozen=True):
    """Read after a seq, through no cursor (rule 3); ``after`` None: the whole ring, as a
    matching reader with no position of its own looks (rule R2)."""

    durable: ClassVar[bool] = False
    after: int | None
    max: int | None = None
    match: Match | None = None

    def check(self) -> None:
        if self.after is not None:
            check_seq(self.after)  # the head and ``max`` are checked against the session
        check_match(self.match)

    def run(self, session: Session, visible: int | None) -> Batch:
        return session.read_after(self.after, self.max, visible, self.match)


class ReadRecent(msgspec.Struct, frozen=True):
    """The newest ``last`` firings, and/or those recorded ``since`` a time, through no
    cursor, in one look (``Session.read_recent``)."""

    durable: ClassVar[bool] = False
    last: int | None
    since: str | None = None
    max: int | None = None
    match: Match | None = None

    def check(self) -> None:
        if self.last is not None:
            check_last(self.last)
        if self.max is not None and self.max < 1:
            raise BadMax(f"max {self.max} is below 1")
        check_match(self.match)

    def run(self, session: Session, visible: int | None) -> Batch:
        return session.read_recent(self.last, self.since, self.max, visible, self.match)


class ReadSeq(msgspec.Struct, frozen=True):
    """Firing ``seq`` alone, through no cursor (``Session.read_seq``)."""

    durable: ClassVar[bool] = False
    seq: int

    def check(self) -> None:
        if self.seq < 1:
            raise BadSeq(f"seq {self.seq} names no firing: seqs start at 1")

    def run(self, session: Session, visible: int | None) -> Batch:
        return session.read_seq(self.seq, visible)


class ReadCursor(msgspec.Struct, frozen=True):
    """Read after a cursor; ``touch`` false (a peek, a wait's look) leaves its LRU place."""

    durable: ClassVar[bool] = False
    cursor: str
    max: int | None = None
    touch: bool = True
    match: Match | None = None

    def check(self) -> None:
        check_cursor_name(self.cursor)
        check_match(self.match)

    def run(self, session: Session, visible: int | None) -> Batch:
        return session.read(self.cursor, self.max, visible, self.touch, self.match)


class AckRead(msgspec.Struct, frozen=True):
    """Ack ``cursor`` to ``seq`` (rule 5), then look after it as a wait does (no touch): a
    wait on one session with its ``ack``, in one step. Two evaluations; a refused ack
    changes nothing and reads nothing."""

    durable: ClassVar[bool] = True
    cursor: str
    seq: int
    max: int | None = None
    match: Match | None = None

    def check(self) -> None:
        check_cursor_name(self.cursor)
        check_seq(self.seq)
        check_match(self.match)
        if self.max is not None and self.max < 1:  # before the ack, which it would not undo
            raise BadMax(f"max {self.max} is below 1")

    def run(self, session: Session, visible: int | None) -> Batch:
        session.ack(self.cursor, self.seq, visible)
        return session.read(self.cursor, self.max, visible, touch=False, match=self.match)


class Ack(msgspec.Struct, frozen=True):
    """Move a cursor to ``max(current, seq)`` (rule 5)."""

    durable: ClassVar[bool] = True
    cursor: str
    seq: int

    def check(self) -> None:
        check_cursor_name(self.cursor)
        check_seq(self.seq)

    def run(self, session: Session, visible: int | None) -> int:
        return session.ack(self.cursor, self.seq, visible)


class Poll(msgspec.Struct, frozen=True):
    """Read after cursor ``poll`` and ack it in one step (rule 7)."""

    durable: ClassVar[bool] = True
    max: int | None = None

    def check(self) -> None:
        pass  # ``max`` is checked after the head, as the core does

    def run(self, session: Session, visible: int | None) -> Batch:
        return session.poll(self.max, visible)


class SetLimit(msgspec.Struct, frozen=True):
    """Change the ring bound; answers how many firings it trimmed."""

    durable: ClassVar[bool] = True
    limit: int

    def check(self) -> None:
        check_limit(self.limit)

    def run(self, session: Session, visible: int | None) -> int:
        return session.set_limit(self.limit)


class CursorTable(msgspec.Struct, frozen=True):
    """The cursors with their lag, most recently used first."""

    durable: ClassVar[bool] = False

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> list[CursorInfo]:
        return session.cursor_table(visible)


class Describe(msgspec.Struct, frozen=True):
    """The figures ``sessions`` and ``stats`` list; not an evaluation."""

    durable: ClassVar[bool] = False

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> Summary:
        return session.summary(visible)


class SetWebhook(msgspec.Struct, frozen=True):
    """Give the session a webhook (or, with None, take it away)."""

    durable: ClassVar[bool] = True
    webhook: Webhook | None

    def check(self) -> None:
        if self.webhook is not None:
            check_webhook(self.webhook)

    def run(self, session: Session, visible: int | None) -> None:
        session.set_webhook(self.webhook)


class GetWebhook(msgspec.Struct, frozen=True):
    """The session's webhook, or None: what a delivery is checked against; not an evaluation."""

    durable: ClassVar[bool] = False

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> Webhook | None:
        return session.webhook


class AddTimer(msgspec.Struct, frozen=True):
    """Schedule a timer (rules T1-T6); with a key, a retry finds what the first one made."""

    durable: ClassVar[bool] = True
    timer: Timer

    def check(self) -> None:
        check_timer(self.timer)

    def run(self, session: Session, visible: int | None) -> Scheduled:
        return session.schedule(self.timer)


class CancelTimer(msgspec.Struct, frozen=True):
    """Cancel a pending timer; ``NoSuchTimer`` when there is none."""

    durable: ClassVar[bool] = True
    timer: str

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> Timer:
        return session.cancel_timer(self.timer)


class FireTimers(msgspec.Struct, frozen=True):
    """Fire those of ``timers`` that are due at ``now_ms``: the firing and the timer's
    move or deletion are one step (rules T1-T6)."""

    durable: ClassVar[bool] = True
    timers: list[str]
    now_ms: int
    ts: str

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> list[Fired]:
        return session.fire_timers(self.timers, self.now_ms, self.ts)


class TimerList(msgspec.Struct, frozen=True):
    """The pending timers, soonest first; not an evaluation."""

    durable: ClassVar[bool] = False

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> list[Timer]:
        return session.timer_list()


def ack_all(acks: Sequence[tuple[Session, int, int | None]], cursor: str) -> list[int]:
    """Ack ``cursor`` on several sessions: all of them, or none when any ack is refused.

    Each entry is a session, the seq to ack and its ``visible`` cap. Every
    ack is checked before the first is applied, so a refused one (a negative
    seq, a seq after its session's head) leaves every session as it was.
    """
    check_cursor_name(cursor)
    for session, seq, visible in acks:
        session.check_ack(seq, visible)
    return [session.ack(cursor, seq, visible) for session, seq, visible in acks]


# -- groups and claims (SPEC §16): each a step of ``Session.groups`` --------------------
#
# ``now_ms`` is the engine's clock, passed in as a timer's firing is. A step that makes a
# firing dead leaves its dead letter in the session's outbox (``session.groups``): the
# committer records it in the dead-letter session in the same write.


class ClaimFiring(msgspec.Struct, frozen=True):
    """Take the oldest claimable firing of a group under a lease (None: there is none)."""

    durable: ClassVar[bool] = True
    group: str
    now_ms: int
    lease_ms: int
    match: Match | None = None
    from_now: bool = False
    #: False when the claimer (a scoped token) does not see ``SESSION.dead``: a group this
    #: claim would make is refused (``forbidden``), never made (SPEC §11, §16)
    sees_default_dead_letter: bool = True

    def check(self) -> None:
        check_group_name(self.group)
        check_lease(self.lease_ms)
        check_match(self.match)

    def run(self, session: Session, visible: int | None) -> Taken | None:
        groups = session.groups
        earlier, groups.changed = groups.changed, False  # what this look changes, alone
        try:
            taken = groups.claim(
                session.ring,
                visible,
                self.group,
                self.now_ms,
                lease_ms=self.lease_ms,
                match=self.match,
                from_now=self.from_now,
                sees_default_dead_letter=self.sees_default_dead_letter,
            )
        finally:
            changed, groups.changed = groups.changed, earlier or groups.changed
        # a look that took nothing and changed nothing is no change: a blocked claimer's
        # look costs no commit; a refused one (a 17th group) counts nothing at all
        session.stepped(changed)
        return taken


class ClaimStep(msgspec.Struct, frozen=True):
    """A step of the live lease a claim token names (``done``, ``release``, ``extend``):
    refused with ``lease_lost``, changing nothing, when the token is no longer it.

    ``step`` is its name, as the protocol and a store that runs it itself (Redis's
    ``STEP_GROUP``) call it; ``param`` its one length (a delay, a lease; 0: none); the
    rest is what such a store needs to tell from its answer: the step's own answer from
    the script's number (``answered``), whether it frees the firing for a claimer now
    (``frees``), and until when its group must be looked at again (``due``)."""

    durable: ClassVar[bool] = True
    step: ClassVar[str]
    claim: str
    now_ms: int

    @property
    def param(self) -> int:
        return 0

    def check(self) -> None:
        parse_token(self.claim)

    def answered(self, value: int) -> int | bool:
        return value

    def frees(self, answer: int | bool) -> bool:
        return False

    def due(self) -> int | None:
        return None


class Finish(ClaimStep, frozen=True):
    """``done``: the claim's firing is never offered to its group again; answers its seq."""

    step: ClassVar[str] = "done"

    def run(self, session: Session, visible: int | None) -> int:
        seq = session.groups.held(self.claim, session.ring).done(self.claim, self.now_ms)
        session.groups.moved_by_step()
        session.stepped(True)
        return seq


class Release(ClaimStep, frozen=True):
    """Give the claim's firing back, at once or after ``delay_ms``; answers whether that
    was its last attempt (it is then dead, its dead letter in the outbox)."""

    step: ClassVar[str] = "release"
    delay_ms: int = 0

    @property
    def param(self) -> int:
        return self.delay_ms

    def check(self) -> None:
        parse_token(self.claim)
        check_delay(self.delay_ms)

    def run(self, session: Session, visible: int | None) -> bool:
        groups, ring = session.groups, session.ring
        group = groups.held(self.claim, ring)
        firing = groups.held_firing(group, ring, self.claim, self.now_ms)
        dead = group.release(self.claim, self.now_ms, self.delay_ms)
        groups.given_back(group, firing, dead, self.delay_ms)
        session.stepped(True)
        return dead is not None

    def answered(self, value: int) -> bool:
        return bool(value)

    def frees(self, answer: int | bool) -> bool:
        return not answer and not self.delay_ms

    def due(self) -> int | None:
        return self.now_ms + self.delay_ms if self.delay_ms else None


class Extend(ClaimStep, frozen=True):
    """The holder keeps the claim's firing until ``now_ms + lease_ms``; answers that."""

    step: ClassVar[str] = "extend"
    lease_ms: int

    @property
    def param(self) -> int:
        return self.lease_ms

    def check(self) -> None:
        parse_token(self.claim)
        check_lease(self.lease_ms)

    def run(self, session: Session, visible: int | None) -> int:
        group = session.groups.held(self.claim, session.ring)
        until = group.extend(self.claim, self.now_ms, self.lease_ms)
        session.groups.moved_by_step()
        session.stepped(True)
        return until


class FinishNext(msgspec.Struct, frozen=True):
    """``done --next``: the claim's firing is done (``Finish``), then the oldest claimable
    firing of the same group is taken under a lease of ``lease_ms`` (``ClaimFiring``), in
    one step, so one write. A refused done (``lease_lost``) raises before the claim runs:
    nothing is taken and nothing changes. Answers the claim's: a ``Taken``, or None."""

    durable: ClassVar[bool] = True
    claim: str
    now_ms: int
    lease_ms: int

    @property
    def done(self) -> Finish:
        return Finish(self.claim, self.now_ms)

    @property
    def next(self) -> ClaimFiring:
        """The claim that follows the done: of the token's group, which the done proved is
        there (so it makes no group)."""
        return ClaimFiring(parse_token(self.claim)[0], self.now_ms, self.lease_ms)

    def check(self) -> None:
        self.done.check()
        self.next.check()

    def run(self, session: Session, visible: int | None) -> Taken | None:
        self.done.run(session, visible)
        return self.next.run(session, visible)


class ExpireGroups(msgspec.Struct, frozen=True):
    """Every lease that ran out and delay that ended by ``now_ms``, in every group: the
    durable timer's step. Answers the seqs claimable again."""

    durable: ClassVar[bool] = True
    now_ms: int

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> list[int]:
        groups = session.groups
        again = groups.expire(session.ring, self.now_ms)
        session.stepped(groups.changed)
        return again


class ConfigureGroup(msgspec.Struct, frozen=True):
    """``repl group``: create a group, or set its attempts and dead-letter session."""

    durable: ClassVar[bool] = True
    group: str
    now_ms: int
    max_attempts: int | None = None
    dead_letter: str | None = None
    from_now: bool = False
    #: as ``ClaimFiring``'s: a group made without ``dead_letter`` by whoever does not see
    #: ``SESSION.dead`` is refused
    sees_default_dead_letter: bool = True

    def check(self) -> None:
        check_group_name(self.group)
        if self.max_attempts is not None:
            check_max_attempts(self.max_attempts)
        if self.dead_letter is not None:
            check_session_id(self.dead_letter)

    def run(self, session: Session, visible: int | None) -> GroupInfo:
        info = session.groups.configure(
            session.ring,
            visible,
            self.group,
            self.now_ms,
            max_attempts=self.max_attempts,
            dead_letter=self.dead_letter,
            from_now=self.from_now,
            sees_default_dead_letter=self.sees_default_dead_letter,
        )
        session.stepped(True)
        return info


class GroupTable(msgspec.Struct, frozen=True):
    """The session's groups with their counts at ``now_ms``, by name; not an evaluation."""

    durable: ClassVar[bool] = False
    now_ms: int

    def check(self) -> None:
        pass

    def run(self, session: Session, visible: int | None) -> list[GroupInfo]:
        return session.groups.infos(session.ring, visible, self.now_ms)


class GroupProgress(msgspec.Struct, frozen=True):
    """A join's look (SPEC §18): how far ``group`` is with the firings up to ``upto`` (None:
    the head) at ``now_ms``; a group not made yet as its first claim would make it. Not an
    evaluation, as ``GroupTable`` is none: a blocked join costs nothing while nothing moves,
    and its look when something did is a listing's."""

    durable: ClassVar[bool] = False
    group: str
    now_ms: int
    upto: int | None = None

    def check(self) -> None:
        check_group_name(self.group)
        if self.upto is not None:
            check_seq(self.upto)

    def run(self, session: Session, visible: int | None) -> Progress:
        return session.groups.progress(session.ring, visible, self.group, self.upto, self.now_ms)


#: the steps that move a group (what a blocked join looks again after, SPEC §18)
GROUP_STEPS = (ClaimFiring, ClaimStep, FinishNext, ExpireGroups, ConfigureGroup)


class ClaimTable(msgspec.Struct, frozen=True):
    """The held firings of one group (None: every group); not an evaluation."""

    durable: ClassVar[bool] = False
    group: str | None = None

    def check(self) -> None:
        if self.group is not None:
            check_group_name(self.group)

    def run(self, session: Session, visible: int | None) -> list[Lease]:
        return session.groups.leases(self.group)
