"""Groups and claims (SPEC §16): one group's state in one session, and every rule of it.

A group is a named consumer that hands each firing of its session to exactly one
claimer at a time, under a lease. This module is pure and synchronous, like the rest
of the core: the clock (``now_ms``) and the ring's bounds (``first``, the oldest seq it
holds, and ``head``) are passed in, and it never reads a firing. It knows nothing of
the session that holds the group, the store that keeps it, or the dead-letter
session it names: an operation that makes a firing dead returns a ``Dead`` for the
caller to record there, in the same atomic step as the change here.

Each seq of the session is, for the group, in exactly one state:

- **done**: at or below ``done_through``, or in ``done_above`` (done out of order);
  ``done_through`` moves up over ``done_above`` as it fills, so that holds only
  seqs above a hole. A dead or lost seq is done as well.
- **held**: in ``leases`` (its attempt and its lease's deadline). A lease whose
  deadline has passed is still held, by nobody live, until ``expire`` runs (the
  daemon's durable timer, at ``next_deadline``): it is neither claimable nor live.
- **delayed**: in ``delays`` with a ready-at time after now (and the attempts so far).
- **ready**: anything else, with the attempts so far in ``tries`` (or in ``delays``,
  once its delay has ended), none for a seq never claimed.
- **lost**: below the ring's ``first`` and not done: ``trim`` (which ``claim``
  runs) counts it into ``lost``, the next claim reports it once, and it is done.

The transitions (``a``: the attempts so far; ``m``: ``max_attempts``)::

    from             step                                to                    answer
    ready (a)        claim: the oldest that matches      held (a+1, now+lease) Claim, token G:S:a+1
    held, live       done(token)                         done                  the seq
    held, live       release(token), a < m, no delay     ready (a)             None
    held, live       release(token, delay), a < m        delayed (now+delay)   None
    held, live       release(token), a == m              done (dead)           Dead(seq, a)
    held, live       extend(token, lease)                held (a, now+lease)   the new deadline
    held, ran out    expire(now), a < m                  ready (a)             in Expired.again
    held, ran out    expire(now), a == m                 done (dead)           in Expired.dead
    delayed, ended   expire(now)                         ready (a)             in Expired.again
    delayed, ended   claim                               held (a+1)            Claim
    not done, < first  trim(first) (and claim)           done (lost)           the next Claim.lost
    anything         done/release/extend, stale token    unchanged             LeaseLost

A token is live when it names this group, a held seq and the attempt that holds it,
and its deadline is after now; anything else is ``LeaseLost`` (``lease_lost``), and
changes nothing: a stale worker can never finish or give back what another holds. A
malformed token is ``BadClaim``; a lease outside ``MIN_LEASE_MS``-``MAX_LEASE_MS``
or a delay outside 0-``MAX_DELAY_MS`` is ``BadTime``. Every operation checks all of
its arguments before it changes anything.

What must not live here: waiting for a claimable firing (the engine does that, rule 8),
the limit of 16 groups a session (the session), the dead-letter firing itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

import msgspec

from session.errors import (
    BadClaim,
    BadMax,
    BadSeq,
    BadSessionId,
    BadTime,
    Forbidden,
    LeaseLost,
    TooMany,
)
from session.firing import GroupInfo, ms_to_ts
from session.names import check_group_name, check_session_id
from session.rules import (
    DEAD_SUFFIX,
    DEFAULT_MAX_ATTEMPTS,
    MAX_DELAY_MS,
    MAX_GROUPS,
    MAX_LEASE_MS,
    MAX_MAX_ATTEMPTS,
    MIN_LEASE_MS,
)

#: the longest token there is: a 64-character name and two 19-digit numbers
MAX_TOKEN_LENGTH = 64 + 2 * 20

_TOKEN = re.compile(r"(?P<group>.+):(?P<seq>[1-9][0-9]{0,18}):(?P<attempt>[1-9][0-9]{0,18})")

State = Literal["done", "held", "delayed", "ready"]


def claim_token(group: str, seq: int, attempt: int) -> str:
    """The token of ``group``'s lease on ``seq`` at ``attempt``: opaque to a client."""
    return f"{group}:{seq}:{attempt}"


def parse_token(token: str) -> tuple[str, int, int]:
    """The group, seq and attempt a claim token names; ``BadClaim`` when it is not one."""
    match = _TOKEN.fullmatch(token) if len(token) <= MAX_TOKEN_LENGTH else None
    if match is None or " " in match["group"] or not match["group"].isprintable():
        raise BadClaim(
            f"claim {token[:MAX_TOKEN_LENGTH]!r} is not a claim token: "
            "use the claim a claim printed, as it printed it"
        )
    return match["group"], int(match["seq"]), int(match["attempt"])


def lease_lost(token: str, why: str, session: str = "") -> LeaseLost:
    """The refusal of a stale ``token`` (rule: it changes nothing), worded once for the core
    and for a store that applies the rules itself (the Redis scripts answer ``why``):
    ``not_held``, ``attempt N`` (attempt N holds its firing now), ``ran_out MS`` or
    ``no_group`` (``session`` has no group of the token's name)."""
    group, seq, _ = parse_token(token)
    stale = f"claim {token!r} is no longer the live lease"
    what, _, value = why.partition(" ")
    if what == "attempt":
        return LeaseLost(f"{stale}: attempt {value} holds firing {seq} now")
    if what == "ran_out":
        return LeaseLost(f"{stale}: it ran out at {ms_to_ts(int(value))}")
    if what == "no_group":
        return LeaseLost(f"{stale}: session {session!r} has no group {group!r}")
    return LeaseLost(f"{stale}: firing {seq} is not held (done, given back or dropped)")


def too_many_groups(session: str) -> TooMany:
    """A 17th group refused, for the core and the Redis scripts alike."""
    return TooMany(
        f"session {session!r} has {MAX_GROUPS} groups, its limit: "
        "claim from one of them (`repl groups` lists them)"
    )


def unseen_dead_letter(session: str, name: str) -> Forbidden:
    """A new group refused because whoever asked for it (a scoped token) does not see the
    dead-letter session it would have, ``SESSION.dead`` (SPEC §11, §16): a token never
    has a session it does not see started or written through a group it made. Worded
    once, for the core and the Redis scripts alike."""
    dead = default_dead_letter(session)
    return Forbidden(
        f"session {session!r} has no group {name!r}, and a new group would send its dead "
        f"letters to {dead!r}, which this token does not see: make the group first with a "
        f"dead-letter session the token sees (`repl group {session} {name} --dead-letter "
        f"SESSION`), or with a token that sees {dead!r}"
    )


def seconds(ms: int) -> str:
    """``ms`` as seconds, exactly (``100,000``, ``0.5``, ``86,400.001``): what a refusal of
    a lease or a delay says, in the unit its bounds are told in and most clients give it
    in (``--lease 90s``, ``?lease=90``, ``lease_s``); ``lease_ms`` is the wire's alone."""
    whole, part = divmod(abs(ms), 1000)
    sign = "-" if ms < 0 else ""
    return f"{sign}{whole:,}" + (f".{part:03d}".rstrip("0") if part else "")


def check_lease(lease_ms: int) -> int:
    if not MIN_LEASE_MS <= lease_ms <= MAX_LEASE_MS:
        raise BadTime(
            f"lease {seconds(lease_ms)} s is not between {MIN_LEASE_MS // 1000} s "
            f"and {MAX_LEASE_MS // 3_600_000} h"
        )
    return lease_ms


def check_delay(delay_ms: int) -> int:
    if not 0 <= delay_ms <= MAX_DELAY_MS:
        raise BadTime(
            f"delay {seconds(delay_ms)} s is not between 0 and {MAX_DELAY_MS // 3_600_000} h"
        )
    return delay_ms


def check_max_attempts(max_attempts: int) -> int:
    if not 1 <= max_attempts <= MAX_MAX_ATTEMPTS:
        raise BadMax(f"max attempts {max_attempts} is not between 1 and {MAX_MAX_ATTEMPTS:,}")
    return max_attempts


def check_dead_letter(session: str, dead_letter: str) -> str:
    check_session_id(dead_letter)
    if dead_letter == session:
        raise BadSessionId(
            f"session {session!r} cannot be its own groups' dead-letter session: name another"
        )
    return dead_letter


def default_dead_letter(session: str) -> str:
    """``SESSION.dead``; of an id too long for that, its first 59 characters and ``.dead``
    (58 when that would be the id itself: an id of 64 ending in ``.dead``)."""
    keep = 64 - len(DEAD_SUFFIX)
    chosen = session[:keep] + DEAD_SUFFIX
    return session[: keep - 1] + DEAD_SUFFIX if chosen == session else chosen


def _check_ring(first: int, head: int) -> None:
    if not 1 <= first <= head + 1:
        raise BadSeq(f"a ring holding {first} to {head} is not one (first must be 1 to head + 1)")


class Claim(msgspec.Struct, frozen=True):
    """What a claim took: the seq under a lease until ``lease_until_ms``, at ``attempt``
    (1 the first time), and ``lost``, the firings the ring dropped before the group
    was done with them, told once."""

    token: str
    seq: int
    attempt: int
    lease_until_ms: int
    lost: int


class Lease(msgspec.Struct, frozen=True):
    """A held firing, as ``repl claims`` lists it."""

    group: str
    seq: int
    attempt: int
    lease_until_ms: int


class Dead(msgspec.Struct, frozen=True):
    """A firing whose last attempt ran out or was given back: the caller records it in
    the dead-letter session; it is done for the group."""

    seq: int
    attempts: int


class Expired(msgspec.Struct, frozen=True):
    """What ``expire`` did: the seqs claimable again (leases that ran out, delays that
    ended), and the firings that went dead."""

    again: list[int]
    dead: list[Dead]


class GroupSnapshot(msgspec.Struct, frozen=True):
    """A group as a store keeps it; ``Group.restore`` makes the very same group again."""

    session: str
    name: str
    done_through: int
    done_above: list[int] = []
    leases: list[tuple[int, int, int]] = []  # (seq, attempt, lease until)
    delays: list[tuple[int, int, int]] = []  # (seq, ready at, attempts so far)
    tries: list[tuple[int, int]] = []  # (seq, attempts so far)
    dead: int = 0
    lost: int = 0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    dead_letter: str | None = None  # None: the default, SESSION.dead
    #: the seqs that went dead, of those the ring holds (a join counts them)
    dead_seqs: list[int] = []


class Progress(msgspec.Struct, frozen=True):
    """How far a group is with the firings up to ``upto`` (SPEC §18's join): ``done`` of
    them finished (done, dead, or dropped by the ring before they were), ``dead`` of them
    went to the dead-letter session (of those the ring still holds), and the others are
    ``ready``, ``held`` or ``delayed``."""

    upto: int
    done: int
    dead: int
    ready: int
    held: int
    delayed: int

    @property
    def finished(self) -> bool:
        """Every firing up to ``upto`` is done or dead: nothing is left to do."""
        return not (self.ready or self.held or self.delayed)


class Group:
    """One group of one session: which firings are done, held, delayed or ready."""

    def __init__(
        self,
        session: str,
        name: str,
        done_through: int = 0,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        dead_letter: str | None = None,
    ) -> None:
        check_session_id(session)
        check_group_name(name)
        if done_through < 0:
            raise BadSeq(f"seq {done_through} is negative")
        check_max_attempts(max_attempts)
        if dead_letter is not None:
            check_dead_letter(session, dead_letter)
        self.session = session
        self.name = name
        self.done_through = done_through
        self.done_above: set[int] = set()
        self.leases: dict[int, tuple[int, int]] = {}  # seq: (attempt, lease until)
        self.delays: dict[int, tuple[int, int]] = {}  # seq: (ready at, attempts so far)
        self.tries: dict[int, int] = {}  # seq: attempts so far, of a ready seq
        self.dead = 0
        self.dead_seqs: set[int] = set()  # of the seqs the ring holds
        self.lost = 0  # lost and not told yet
        self.max_attempts = max_attempts
        self._dead_letter = dead_letter

    @classmethod
    def create(
        cls,
        session: str,
        name: str,
        first: int,
        head: int,
        *,
        from_now: bool = False,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        dead_letter: str | None = None,
    ) -> Group:
        """A new group: from the oldest firing the ring holds, or after ``head``."""
        _check_ring(first, head)
        start = head if from_now else first - 1
        return cls(session, name, start, max_attempts=max_attempts, dead_letter=dead_letter)

    @property
    def dead_letter(self) -> str:
        """The session a dead firing is recorded in."""
        return default_dead_letter(self.session) if self._dead_letter is None else self._dead_letter

    def configure(self, max_attempts: int | None = None, dead_letter: str | None = None) -> None:
        """Set what is given (``repl group``); what is not given stays."""
        if max_attempts is not None:
            check_max_attempts(max_attempts)
        if dead_letter is not None:
            check_dead_letter(self.session, dead_letter)
            self._dead_letter = dead_letter
        if max_attempts is not None:
            self.max_attempts = max_attempts

    # -- the operations ---------------------------------------------------------

    def claim(
        self,
        now_ms: int,
        lease_ms: int,
        first: int,
        head: int,
        holds: Callable[[int], bool] | None = None,
    ) -> Claim | None:
        """Take the oldest claimable seq that ``holds`` (a reader's match; None: any)
        under a lease of ``lease_ms``; None when there is none (what was lost is then
        told by the next claim that takes one)."""
        check_lease(lease_ms)
        _check_ring(first, head)
        self.trim(first)
        seq = self._oldest_claimable(now_ms, head, holds)
        if seq is None:
            return None
        delay = self.delays.pop(seq, None)
        attempt = (self.tries.pop(seq, 0) if delay is None else delay[1]) + 1
        until = now_ms + lease_ms
        self.leases[seq] = (attempt, until)
        lost, self.lost = self.lost, 0
        return Claim(claim_token(self.name, seq, attempt), seq, attempt, until, lost)

    def _oldest_claimable(
        self, now_ms: int, head: int, holds: Callable[[int], bool] | None
    ) -> int | None:
        done, leases, delays = self.done_above, self.leases, self.delays
        for seq in range(self.done_through + 1, head + 1):
            if seq in done or seq in leases:
                continue
            delay = delays.get(seq)
            if delay is not None and delay[0] > now_ms:
                continue
            if holds is None or holds(seq):
                return seq
        return None

    def done(self, token: str, now_ms: int) -> int:
        """The holder finished: the seq is never offered to this group again."""
        seq, _attempt = self.live(token, now_ms)
        del self.leases[seq]
        self._mark_done(seq)
        return seq

    def release(self, token: str, now_ms: int, delay_ms: int = 0) -> Dead | None:
        """The holder gives the seq back, claimable at once or after ``delay_ms``; its
        last attempt given back is dead."""
        check_delay(delay_ms)
        seq, attempt = self.live(token, now_ms)
        del self.leases[seq]
        if attempt >= self.max_attempts:
            return self._die(seq, attempt)
        if delay_ms:
            self.delays[seq] = (now_ms + delay_ms, attempt)
        else:
            self.tries[seq] = attempt
        return None

    def extend(self, token: str, now_ms: int, lease_ms: int) -> int:
        """The holder keeps the seq until ``now_ms + lease_ms`` (a heartbeat); returns that."""
        check_lease(lease_ms)
        seq, attempt = self.live(token, now_ms)
        until = now_ms + lease_ms
        self.leases[seq] = (attempt, until)
        return until

    def expire(self, now_ms: int) -> Expired:
        """Every lease that ran out by ``now_ms`` is claimable again, or dead at its last
        attempt; every delay that ended makes its seq claimable."""
        again: list[int] = []
        dead: list[Dead] = []
        for seq in sorted(s for s, (_, until) in self.leases.items() if until <= now_ms):
            attempt = self.leases.pop(seq)[0]
            if attempt >= self.max_attempts:
                dead.append(self._die(seq, attempt))
            else:
                self.tries[seq] = attempt
                again.append(seq)
        for seq in sorted(s for s, (ready, _) in self.delays.items() if ready <= now_ms):
            self.tries[seq] = self.delays.pop(seq)[1]
            again.append(seq)
        again.sort()
        return Expired(again, dead)

    def trim(self, first: int) -> int:
        """The ring holds nothing below ``first`` now: every seq below it not done is lost
        (told by the next claim) and done; returns how many were lost this time."""
        self.dead_seqs.difference_update([seq for seq in self.dead_seqs if seq < first])
        if first - 1 <= self.done_through:
            return 0
        below = [seq for seq in self.done_above if seq < first]
        lost = first - 1 - self.done_through - len(below)
        self.done_above.difference_update(below)
        for table in (self.leases, self.delays, self.tries):
            for seq in [seq for seq in table if seq < first]:
                del table[seq]
        self.done_through = first - 1
        self._compact()
        self.lost += lost
        return lost

    def live(self, token: str, now_ms: int) -> tuple[int, int]:
        """The seq and attempt of ``token``, the live lease at ``now_ms``; else ``LeaseLost``."""
        group, seq, attempt = parse_token(token)
        if group != self.name:
            raise LeaseLost(f"claim {token!r} is of group {group!r}, not {self.name!r}")
        lease = self.leases.get(seq)
        if lease is None:
            raise lease_lost(token, "not_held")
        held, until = lease
        if held != attempt:
            raise lease_lost(token, f"attempt {held}")
        if until <= now_ms:
            raise lease_lost(token, f"ran_out {until}")
        return seq, attempt

    def _die(self, seq: int, attempts: int) -> Dead:
        self._mark_done(seq)
        self.dead += 1
        self.dead_seqs.add(seq)
        return Dead(seq, attempts)

    def _mark_done(self, seq: int) -> None:
        if seq == self.done_through + 1:
            self.done_through = seq
            self._compact()
        else:
            self.done_above.add(seq)

    def _compact(self) -> None:
        done = self.done_above
        while self.done_through + 1 in done:
            self.done_through += 1
            done.remove(self.done_through)

    # -- what it shows ----------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest lease deadline or delay end: when ``expire`` has work; None: never."""
        times = [until for _, until in self.leases.values()]
        times.extend(ready for ready, _ in self.delays.values())
        return min(times, default=None)

    def state_of(self, seq: int, now_ms: int) -> State:
        """Which of done, held, delayed or ready ``seq`` is at ``now_ms`` (a seq the ring
        holds; one below it is lost unless done, once trimmed)."""
        if seq <= self.done_through or seq in self.done_above:
            return "done"
        if seq in self.leases:
            return "held"
        delay = self.delays.get(seq)
        return "delayed" if delay is not None and delay[0] > now_ms else "ready"

    def counts(self, first: int, head: int, now_ms: int) -> GroupInfo:
        """The group's counts over the ring ``first`` to ``head``; changes nothing."""
        _check_ring(first, head)
        through = max(self.done_through, first - 1)
        while through + 1 in self.done_above:
            through += 1

        def in_ring(seq: int) -> bool:
            return first <= seq <= head

        done = max(0, min(through, head) - first + 1)
        done += sum(1 for seq in self.done_above if seq > through and in_ring(seq))
        held = sum(1 for seq in self.leases if in_ring(seq))
        delayed = sum(
            1 for seq, (ready, _) in self.delays.items() if in_ring(seq) and ready > now_ms
        )
        ready = head - first + 1 - done - held - delayed
        return GroupInfo(
            self.name, through, ready, held, delayed, self.dead, self.max_attempts, self.dead_letter
        )

    def progress(self, first: int, head: int, upto: int, now_ms: int) -> Progress:
        """How far the group is with the firings up to ``upto`` over the ring ``first`` to
        ``head``; changes nothing. ``upto`` after the head is ``bad_seq``: those firings
        are not there yet."""
        _check_ring(first, head)
        if upto < 0 or upto > head:
            raise BadSeq(f"upto {upto} is not between 0 and the head, {head}")
        through = max(self.done_through, first - 1)
        while through + 1 in self.done_above:
            through += 1

        def left(seq: int) -> bool:  # not done below ``through``, and asked for
            return through < seq <= upto

        done_above = sum(1 for seq in self.done_above if left(seq))
        held = sum(1 for seq in self.leases if left(seq))
        delayed = sum(1 for seq, (ready, _) in self.delays.items() if left(seq) and ready > now_ms)
        ready = max(0, upto - through) - done_above - held - delayed
        dead = sum(1 for seq in self.dead_seqs if first <= seq <= upto)
        done = upto - ready - held - delayed
        return Progress(upto, done, dead, ready, held, delayed)

    def claims(self) -> list[Lease]:
        """The held seqs, oldest first (a lease that ran out stays until ``expire``)."""
        return [
            Lease(self.name, seq, attempt, until)
            for seq, (attempt, until) in sorted(self.leases.items())
        ]

    # -- kept by a store ----------------------------------------------------------

    def snapshot(self) -> GroupSnapshot:
        return GroupSnapshot(
            session=self.session,
            name=self.name,
            done_through=self.done_through,
            done_above=sorted(self.done_above),
            leases=[(seq, a, until) for seq, (a, until) in sorted(self.leases.items())],
            delays=[(seq, ready, a) for seq, (ready, a) in sorted(self.delays.items())],
            tries=sorted(self.tries.items()),
            dead=self.dead,
            lost=self.lost,
            max_attempts=self.max_attempts,
            dead_letter=self._dead_letter,
            dead_seqs=sorted(self.dead_seqs),
        )

    @classmethod
    def restore(cls, snapshot: GroupSnapshot) -> Group:
        group = cls(
            snapshot.session,
            snapshot.name,
            snapshot.done_through,
            max_attempts=snapshot.max_attempts,
            dead_letter=snapshot.dead_letter,
        )
        group.done_above = set(snapshot.done_above)
        group.leases = {seq: (a, until) for seq, a, until in snapshot.leases}
        group.delays = {seq: (ready, a) for seq, ready, a in snapshot.delays}
        group.tries = dict(snapshot.tries)
        group.dead = snapshot.dead
        group.dead_seqs = set(snapshot.dead_seqs)
        group.lost = snapshot.lost
        return group
