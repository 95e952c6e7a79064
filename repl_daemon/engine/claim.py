"""A claim (SPEC §16): a wait whose look is a claim, woken as a wait is.

A claim blocks as a wait does (``repl_daemon.engine.wait``): subscribed to its
session before its first look, an entry in the waiters' table while blocked,
no task and no work until the committer says the session changed (a new
firing) or that a firing of it is claimable again (``Listener.claimable``: a
release, a lease that ran out, a delay that ended). Each look is one step of
the core (``ClaimFiring``) at the engine's clock: it takes a firing, or nothing.
Blocked claimers are woken oldest first, one at a time, so the first to come is
the first to look (first come, first served) and a firing costs one look, not one
a claimer: the engine wakes a group's first blocked claimer (every claimer with a
match looks, as a matching reader does), and one that took a firing, or went
away while it looked, hands the wake on to the next (``pass_on``); one that found
nothing ends it, as there is nothing left to take.

A claim that times out, is cancelled, or whose client is gone took nothing: a
look that took a firing answers at once, or (on a durable store) once the
claim is durable; a claim cancelled in between gives the firing straight
back (``Release``), so a claimer that went away holds nothing.

``done --next`` (``p.FinishNext``) is a claim whose first look is the done and the
claim in one step of the core (``FinishNext``), so one commit: a done refused
answers its refusal, having taken nothing; a done that leaves nothing to take
blocks as a claim does, its later looks plain claims.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from repl_daemon import protocol as p
from repl_daemon.engine.committer import Sessions
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.steps import step
from repl_daemon.engine.wait import Wait, Waiters, WaitState
from session.errors import NoSuchSession, ReplError
from session.firing import Firing, ms_to_ts
from session.group import Lease, default_dead_letter
from session.groups import Taken
from session.ops import (
    ClaimFiring,
    ClaimTable,
    ConfigureGroup,
    Extend,
    Finish,
    FinishNext,
    GroupTable,
    Release,
)
from session.scopes import TokenRecord

log = logging.getLogger("repl.daemon")


class ClaimWait(Wait):
    """One claim's life: looks (each a ``ClaimFiring``) until it takes a firing or times out."""

    __slots__ = ("claim", "finishing", "now", "pass_on", "sees_dead_letter", "taken")

    def __init__(
        self,
        waiters: Waiters,
        req: p.Claim,
        now: Callable[[], int],
        pass_on: Callable[[str, str], None] | None = None,
        sees_dead_letter: bool = True,
        finishing: str | None = None,
    ) -> None:
        as_wait = p.Wait(
            id=req.id,
            sessions=[req.session],
            cursor=None,
            timeout_ms=req.timeout_ms,
            match=req.match,
        )
        super().__init__(waiters, as_wait, [req.session], [])
        self.claim = req
        #: the engine's clock, in ms: each look claims at the time it runs
        self.now = now
        #: what the look on its way took, until it is answered (given back if cancelled)
        self.taken: Taken | None = None
        #: wakes the next blocked claimer of the group (the engine's): a claimer that took
        #: a firing, or went away while looking, hands the wake on (``Engine.changed``)
        self.pass_on = pass_on
        #: whether the claimer sees the default dead-letter session: if not, its look makes
        #: no group (``ClaimFiring.sees_default_dead_letter``)
        self.sees_dead_letter = sees_dead_letter
        #: ``done --next``: the claim token its first look finishes, in the same step as
        #: it claims (``FinishNext``); None once that look ran, and for a claim
        self.finishing = finishing

    @property
    def blocked(self) -> bool:
        """Whether it waits for a wake, no look on its way."""
        return self.state is WaitState.BLOCKED

    def cancel(self) -> None:
        taken, self.taken = self.taken, None
        looking = self.state is WaitState.LOOKING
        super().cancel()
        if taken is not None:  # the client is gone before it was told: it takes nothing
            self._give_back(taken)
        if looking:  # a wake it was handed goes to the next claimer
            self._pass_on()

    def _pass_on(self) -> None:
        if self.pass_on is not None and self.claim.match is None:
            self.pass_on(self.claim.session, self.claim.group)

    def wake(self, heard: Firing | None = None) -> None:
        super().wake(None)  # a claim looks by claiming: a firing heard is no answer

    def _woken(self, heard: Firing | None = None) -> None:
        self._read()  # no settle time: a claim takes one firing, whatever comes after it

    def _read(self) -> None:
        self._check_open()
        self._move(WaitState.LOOKING)
        req, session_id = self.claim, self.claim.session
        op: ClaimFiring | FinishNext
        if self.finishing is not None:  # done --next: the done, then the claim, one step
            op, self.finishing = FinishNext(self.finishing, self.now(), req.lease_ms), None
        else:
            op = ClaimFiring(
                req.group, self.now(), req.lease_ms, req.match, req.from_now, self.sees_dead_letter
            )
        try:
            outcome = self.waiters.committer.execute(session_id, op)
        except NoSuchSession:
            if self._first_look(session_id):
                raise
            raise self.waiters.committer.vanished(session_id) from None
        self.seen[session_id] = 0  # it has looked: the session existed
        if outcome.job is None:  # known now, perhaps durable only later
            self.taken = outcome.value
        self.again = False
        self._after(outcome, self._looked_claim)

    def _looked_claim(self, taken: Taken | None) -> None:
        self.taken = None
        if taken is None:
            self._have_read([])
            return
        self._pass_on()  # there may be more to take: the next claimer looks
        claim, firing = taken.claim, taken.firing
        answer = p.Claimed(
            id=self.claim.id,
            claim=claim.token,
            seq=claim.seq,
            attempt=claim.attempt,
            lease_until=ms_to_ts(claim.lease_until_ms),
            lease_until_ms=claim.lease_until_ms,
            lost=claim.lost,
            firing=firing,
        )
        self._finish(answer, None)

    def _nothing(self) -> p.Response:
        return p.Claimed(id=self.claim.id, timed_out=True)

    def _give_back(self, taken: Taken) -> None:
        release = Release(taken.claim.token, self.now())
        try:
            given: Outcome[bool] = self.waiters.committer.execute(self.claim.session, release)
        except ReplError as exc:  # it ran out, or the session is gone: nothing is held
            log.info("a claim whose client went away was not given back: %s", exc.message)
            return
        given.settle(lambda _, __: None)


def sees_dead_letter(token: TokenRecord | None, session_id: str) -> bool:
    """Whether ``token`` (None: the root) sees the dead-letter session a new group of
    ``session_id`` would have (``SESSION.dead``): if not, it makes no group (SPEC §11, §16:
    a token never has a session it does not see started or written through a group)."""
    return token is None or token.scope.covers(default_dead_letter(session_id))


# -- the steps of groups that are no claim (repl_daemon.engine.steps): each one step of
# the core at the engine's ``now`` (done, release, extend, a group's settings), or a look


@step(p.Finish)
def _done(engine: Any, req: p.Finish, c: Sessions, token: TokenRecord | None) -> Any:
    done = c.execute(req.session, Finish(req.claim, engine.clock.now_ms()))
    return done.then(lambda seq: p.Finished(id=req.id, seq=seq))


@step(p.Release)
def _release(engine: Any, req: p.Release, c: Sessions, token: TokenRecord | None) -> Any:
    released = c.execute(req.session, Release(req.claim, engine.clock.now_ms(), req.delay_ms))
    return released.then(lambda dead: p.Released(id=req.id, dead=dead))


@step(p.Extend)
def _extend(engine: Any, req: p.Extend, c: Sessions, token: TokenRecord | None) -> Any:
    extended = c.execute(req.session, Extend(req.claim, engine.clock.now_ms(), req.lease_ms))
    return extended.then(
        lambda ms: p.Extended(id=req.id, lease_until=ms_to_ts(ms), lease_until_ms=ms)
    )


@step(p.Group)
def _group(engine: Any, req: p.Group, c: Sessions, token: TokenRecord | None) -> Any:
    sees = sees_dead_letter(token, req.session)  # for a group this makes
    now = engine.clock.now_ms()
    op = ConfigureGroup(req.group, now, req.max_attempts, req.dead_letter, req.from_now, sees)
    return c.execute(req.session, op).then(lambda info: p.GroupRow(id=req.id, group=info))


@step(p.Groups)
def _groups(engine: Any, req: p.Groups, c: Sessions, token: TokenRecord | None) -> Any:
    table = c.execute(req.session, GroupTable(engine.clock.now_ms()))
    return table.then(lambda rows: p.GroupList(id=req.id, groups=rows))


@step(p.Claims)
def _claims(engine: Any, req: p.Claims, c: Sessions, token: TokenRecord | None) -> Any:
    held = c.execute(req.session, ClaimTable(req.group))
    return held.then(lambda rows: p.ClaimList(id=req.id, claims=[_lease(r) for r in rows]))


def give_back(engine: Any, session_id: str, claim: str, token: TokenRecord | None) -> None:
    """A claim whose client is gone before it had its answer (HTTP's long poll, written
    into a connection already lost): released, as its client would release it (its
    refusal, a lease that ran out meanwhile, changes nothing)."""
    try:
        given = engine.handle(p.Release(session=session_id, claim=claim), token)
    except ReplError:
        return
    given.settle(lambda _, __: None)


def _lease(lease: Lease) -> p.LeaseInfo:
    return p.LeaseInfo(
        group=lease.group,
        seq=lease.seq,
        attempt=lease.attempt,
        lease_until=ms_to_ts(lease.lease_until_ms),
        lease_until_ms=lease.lease_until_ms,
    )
