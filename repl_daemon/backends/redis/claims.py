"""Groups and claims on the Redis store (SPEC §16): the group scripts' calls and answers.

Each call runs one script of ``group_scripts`` on the session's keys through the
store's pipeline (``RedisStore.script``) and answers what the core's operation
answers (``session.ops``: a ``Taken`` or None, a seq, whether it died, a lease's
end, a group's counts), with what the committer must do next beside it
(``Stepped``): record the dead letters the step left in the session's outbox,
tell this daemon's claimers a firing is claimable again, and keep the timer
index's entry for the groups' next deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec

from repl_daemon.backends.redis.entries import firing_of
from repl_daemon.backends.redis.store import RedisStore
from session.errors import ReplError
from session.firing import Firing, GroupInfo
from session.group import (
    Claim,
    Group,
    GroupSnapshot,
    Lease,
    Progress,
    check_dead_letter,
    claim_token,
    default_dead_letter,
    lease_lost,
    parse_token,
    too_many_groups,
    unseen_dead_letter,
)
from session.groups import DeadLetter, Taken, dead_letter
from session.ops import ClaimFiring, ClaimStep, ConfigureGroup, FinishNext, GroupProgress
from session.rules import DEFAULT_MAX_ATTEMPTS, MAX_GROUPS

_unpack = msgspec.msgpack.Decoder().decode


class Stepped(NamedTuple):
    """What a step of the groups leaves the committer: dead letters waiting in the
    session's ``outbox``, the session's next group deadline (None: none), and whether a
    firing is claimable again."""

    outbox: int
    deadline: int | None
    freed: bool = False


class Letter(NamedTuple):
    """An entry of a session's outbox: the dead letter, and the dedup key it is recorded
    with (so a retry, after a crash between the record and the entry's removal, records
    nothing twice), and the entry as the outbox holds it."""

    letter: DeadLetter
    key: str
    raw: bytes


def _deadline(value: Any) -> int | None:
    return None if int(value) < 0 else int(value)


def _refusal(session_id: str, token: str) -> Callable[[str, str], ReplError | None]:
    def worded(code: str, why: str) -> ReplError | None:
        if code == "lease_lost":
            return lease_lost(token, why, session_id)
        if code == "too_many":
            return too_many_groups(session_id)
        if code == "forbidden":
            return unseen_dead_letter(session_id, parse_token(token)[0])
        return None

    return worded


def _info(session_id: str, row: list[Any]) -> GroupInfo:
    name, done, ready, held, delayed, dead, max_attempts, dead_letter_id = row
    chosen = dead_letter_id.decode() or default_dead_letter(session_id)
    return GroupInfo(
        name.decode(),
        int(done),
        int(ready),
        int(held),
        int(delayed),
        int(dead),
        int(max_attempts),
        chosen,
    )


def letter_of(session_id: str, raw: bytes) -> Letter:
    """The dead letter an outbox entry stands for (``session.groups.dead_letter``)."""
    dead_letter_id, group, seq, attempts, fields = _unpack(raw)
    flat = [f.encode() if isinstance(f, str) else f for f in fields]  # as XRANGE gives them
    firing: Firing = firing_of((f"{seq}-0".encode(), flat))
    owner = Group(session_id, group, dead_letter=dead_letter_id or None)
    key = f"dead:{session_id}:{group}:{seq}:{attempts}"
    return Letter(dead_letter(owner, firing, attempts), key, raw)


class GroupCalls:
    """The group scripts, called through one store."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def claim(
        self, session_id: str, op: ClaimFiring
    ) -> asyncio.Future[tuple[Taken | None, Stepped]]:
        return self._claim("CLAIM_GROUP", session_id, op, (), claim_token(op.group, 1, 1))

    def done_next(
        self, session_id: str, op: FinishNext
    ) -> asyncio.Future[tuple[Taken | None, Stepped]]:
        """``done --next``: ``DONE_NEXT``, the done and the claim in one script; a stale
        claim refused as ``step`` refuses it."""
        _, seq, attempt = parse_token(op.claim)
        return self._claim("DONE_NEXT", session_id, op.next, (seq, attempt), op.claim)

    def _claim(
        self,
        script: str,
        session_id: str,
        op: ClaimFiring,
        more: tuple[int, ...],
        token: str,
    ) -> asyncio.Future[tuple[Taken | None, Stepped]]:
        """A claim's script (``CLAIM_GROUP``, or ``DONE_NEXT`` with the done's ``more``
        arguments), its answer read as a ``Taken``; ``token`` words a refusal."""
        args = (
            op.group,
            op.now_ms,
            op.lease_ms,
            "" if op.match is None else msgspec.json.encode(op.match).decode(),
            "1" if op.from_now else "0",
            MAX_GROUPS,
            DEFAULT_MAX_ATTEMPTS,
            self.store.origin,
            "1" if op.sees_default_dead_letter else "0",
            *more,
        )

        def claimed(answer: list[Any]) -> tuple[Taken | None, Stepped]:
            seq, attempt, until, lost, entry, outbox, deadline, freed = answer
            stepped = Stepped(int(outbox), _deadline(deadline), bool(freed))
            if not int(seq):
                return None, stepped
            token = claim_token(op.group, int(seq), int(attempt))
            claim = Claim(token, int(seq), int(attempt), int(until), int(lost))
            return Taken(claim, firing_of(entry)), stepped

        return self.store.script(
            script, session_id, args, change=True, then=claimed, refusal=_refusal(session_id, token)
        )

    def step(self, session_id: str, op: ClaimStep) -> asyncio.Future[tuple[int | bool, Stepped]]:
        """A step of a lease (done, release, extend), by its name: ``STEP_GROUP`` takes the
        step's one length and this daemon's origin (for the wake a freed firing sends),
        whichever it is, and the step reads its own answer."""
        group, seq, attempt = parse_token(op.claim)

        def stepped(answer: list[Any]) -> tuple[int | bool, Stepped]:
            value, outbox, deadline = answer
            result = op.answered(int(value))
            return result, Stepped(int(outbox), _deadline(deadline), op.frees(result))

        return self.store.script(
            "STEP_GROUP",
            session_id,
            (op.step, group, seq, attempt, op.now_ms, op.param, self.store.origin),
            change=True,
            then=stepped,
            refusal=_refusal(session_id, op.claim),
        )

    def expire(self, session_id: str, now_ms: int) -> asyncio.Future[tuple[list[int], Stepped]]:
        def expired(answer: list[Any]) -> tuple[list[int], Stepped]:
            again, outbox, deadline = answer
            seqs = sorted({int(seq) for seq in again})
            return seqs, Stepped(int(outbox), _deadline(deadline), bool(seqs))

        args = (now_ms, self.store.origin)
        return self.store.script("EXPIRE_GROUPS", session_id, args, change=True, then=expired)

    def configure(self, session_id: str, op: ConfigureGroup) -> asyncio.Future[GroupInfo]:
        if op.dead_letter is not None:
            check_dead_letter(session_id, op.dead_letter)
        args = (
            op.group,
            op.now_ms,
            "" if op.max_attempts is None else op.max_attempts,
            op.dead_letter or "",
            "1" if op.from_now else "0",
            MAX_GROUPS,
            DEFAULT_MAX_ATTEMPTS,
            "1" if op.sees_default_dead_letter else "0",
        )
        return self.store.script(
            "CONFIGURE_GROUP",
            session_id,
            args,
            change=True,
            then=lambda answer: _info(session_id, answer[0]),
            refusal=_refusal(session_id, claim_token(op.group, 1, 1)),
        )

    def table(self, session_id: str, now_ms: int) -> asyncio.Future[list[GroupInfo]]:
        def rows(answer: list[Any]) -> list[GroupInfo]:
            return [_info(session_id, row) for row in answer[0]]

        args = (now_ms, "groups", "")
        return self.store.script("GROUP_TABLE", session_id, args, change=False, then=rows)

    def progress(self, session_id: str, op: GroupProgress) -> asyncio.Future[Progress]:
        """A join's look: the group as Redis keeps it, counted by the core (one rule, not
        restated in Lua: the count changes nothing)."""

        def counted(answer: list[Any]) -> Progress:
            head, first, raw = int(answer[0]), int(answer[1]), answer[2]
            if raw:
                group = Group.restore(group_of(session_id, op.group, raw))
            else:  # not made yet: as its first claim would make it
                group = Group.create(session_id, op.group, first, head)
            upto = head if op.upto is None else op.upto
            return group.progress(first, head, upto, op.now_ms)

        return self.store.script("GROUP_STATE", session_id, (op.group,), change=False, then=counted)

    def leases(self, session_id: str, group: str | None) -> asyncio.Future[list[Lease]]:
        def rows(answer: list[Any]) -> list[Lease]:
            return [
                Lease(name.decode(), int(seq), int(attempt), int(until))
                for name, seq, attempt, until in answer[0]
            ]

        args = (0, "claims", group or "")
        return self.store.script("GROUP_TABLE", session_id, args, change=False, then=rows)

    def outbox(self, session_id: str) -> asyncio.Future[list[Letter]]:
        def letters(answer: list[Any]) -> list[Letter]:
            return [letter_of(session_id, raw) for raw in answer[0]]

        return self.store.script("OUTBOX", session_id, (), change=False, then=letters)

    def outbox_done(self, session_id: str, raw: bytes) -> asyncio.Future[int]:
        return self.store.script(
            "OUTBOX_DONE", session_id, (raw,), change=True, then=lambda answer: int(answer[0])
        )


def group_of(session_id: str, name: str, raw: bytes) -> GroupSnapshot:
    """A group as the ``groups`` hash keeps it, in the core's form (``Group.restore``)."""
    unpacked = _unpack(raw)
    t, dead, lost, max_attempts, dead_letter_id, done_above, leases, delays, tries = unpacked[:9]
    dead_seqs = unpacked[9] if len(unpacked) > 9 else []  # none, in a group written before

    def triples(flat: list[int]) -> list[tuple[int, int, int]]:
        return [(flat[i], flat[i + 1], flat[i + 2]) for i in range(0, len(flat), 3)]

    return GroupSnapshot(
        session=session_id,
        name=name,
        done_through=t,
        done_above=list(done_above),
        leases=triples(leases),
        delays=triples(delays),
        tries=[(tries[i], tries[i + 1]) for i in range(0, len(tries), 2)],
        dead=dead,
        lost=lost,
        max_attempts=max_attempts,
        dead_letter=dead_letter_id or None,
        dead_seqs=list(dead_seqs),
    )
