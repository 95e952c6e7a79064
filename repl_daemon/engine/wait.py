"""One wait, driven by callbacks: no task of its own, not even while it blocks.

A wait (rules S8, S10, S11, S14) is a ``Job``: the connection starts it
with a callback and cancels it when its client goes away. It subscribes to
its sessions before its first read and stays subscribed until it ends, so
a firing recorded between a read and the block still wakes it. Blocked, it
is an entry in the engine's table of waiters and, with a timeout, one
timer: no task, no event, no work. ``wake`` (the committer told the engine
that one of its sessions changed) reads again, at once when the settle time
is 0, so the waiter's answer is written in the same pass of the event loop
as the send that made it.

A step that must wait on something (the acks' commit, or a shared store's
round trip for a read) goes on from that step's callback: a wait's reads
of several sessions on a shared store all join the next pipeline, and
none of it is a task.

A wait on one session makes its ack and its first look one step
(``AckRead``), which also finds the session missing. When a wake carries
the new firing whole (a shared store publishes it with the wake) and the
wait looked last at the seq just before it, the wait answers from it with
no read, as Centrifugo's subscribers do from a publication; any other wake
(a gap, an older firing, a wake with no firing, a repaired link) reads.
With a settle time, a firing heard while settling is answered from the same
way when it is the only one (of a burst the ring may keep only the newest).

The settle (rule S8) is the longest a woken wait lingers: it reads as soon
as its sessions have been quiet, with no new firing heard, for the quiet
gap (``Waiters.quiet``), and at the latest the settle time after the wake.
A firing heard while settling moves the end of the gap on, a figure and no
call; the one timer, when it comes, sets itself again for that end if it
moved. So a lone firing is answered after the gap, and a burst of any
length costs one timer per gap, not one per firing. Both are timed on the
engine's clock (``Clock.call_at``), which a test moves by hand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar, cast

import anyio

from repl_daemon import protocol as p
from repl_daemon.engine.clock import Clock, Timer
from repl_daemon.engine.committer import Committer
from repl_daemon.engine.outcome import Done, Job, Outcome, Settled
from session.errors import BadRequest, NoSuchSession, SessionStopped, ShuttingDown, StoreFailed
from session.firing import Batch, Firing
from session.names import check_session_id
from session.ops import AckRead, ReadAfter, ReadCursor
from session.ring import look_heard
from session.rules import MAX_WAIT_SESSIONS

log = logging.getLogger("repl.daemon")

T = TypeVar("T")


def wait_ids(sessions: list[str]) -> list[str]:
    """The sessions a wait names, each once, in the order each was first named (rule 14);
    ``bad_request`` for none, or for more names than ``MAX_WAIT_SESSIONS`` (counted as
    given: one session named 100,000 times is no wait on one), ``bad_session_id`` for a
    name no session could have."""
    if not sessions:
        raise BadRequest("wait needs at least one session")
    if len(sessions) > MAX_WAIT_SESSIONS:
        raise BadRequest(
            f"wait names {len(sessions):,} sessions, more than the {MAX_WAIT_SESSIONS:,} one "
            "wait may name (a session named twice counts twice): wait on fewer"
        )
    ids = list(dict.fromkeys(sessions))
    for session_id in ids:
        check_session_id(session_id)
    return ids


class Waiters:
    """The waits blocked in one engine, by session: what a ``Wait`` joins and leaves, and
    what it checks before each read (the daemon closing, the store's link). A wait is
    handed this and never the engine, which tells the waits through it
    (``Engine.changed`` and the rest of the ``Listener``)."""

    __slots__ = (
        "by_session",
        "clock",
        "closing",
        "committer",
        "count",
        "link_error",
        "none_left",
        "quiet",
        "settle",
    )

    def __init__(self, committer: Committer, settle: float, quiet: float, clock: Clock) -> None:
        self.committer = committer
        #: the longest a woken wait lets more firings come before it reads (0: it reads at once)
        self.settle = settle
        #: how long a settling wait's sessions must be quiet, no new firing, before it reads
        self.quiet = quiet
        #: what the settle is timed on
        self.clock = clock
        #: the waits on each session, oldest first (an ordered set: claimers are woken in
        #: the order they came, first come first served); an entry lives while it has waits
        self.by_session: dict[str, dict[Wait, None]] = {}
        self.count = 0  # the waits subscribed now
        self.closing = False
        #: set once the daemon is closing and the last wait has been answered
        self.none_left = anyio.Event()
        #: what every wait is answered while the store's wake signals are broken
        self.link_error: StoreFailed | None = None

    def join(self, wait: Wait) -> None:
        for session_id in wait.ids:
            self.by_session.setdefault(session_id, {})[wait] = None
        self.count += 1

    def leave(self, wait: Wait) -> None:
        self.count -= 1
        for session_id in wait.ids:
            waits = self.by_session.get(session_id)
            if waits is not None:
                waits.pop(wait, None)
                if not waits:
                    del self.by_session[session_id]
                    self.committer.unwatch(session_id)
        if self.closing and not self.count:
            self.none_left.set()

    def on(self, session_id: str) -> list[Wait]:
        """The waits on ``session_id``: a copy, as a woken wait may leave at once."""
        waits = self.by_session.get(session_id)
        return list(waits) if waits else []

    def every(self) -> set[Wait]:
        return {wait for waits in self.by_session.values() for wait in waits}

    def close(self) -> None:
        """The daemon is closing: every wait's next read answers ``shutting_down``."""
        self.closing = True
        if not self.count:
            self.none_left.set()


class WaitState(Enum):
    """Where a wait is in its life (a claim, ``engine.claim``, is a wait and moves the same)."""

    # a member is itself alone: hashed as an object, in C, not by its name in Python (a
    # woken wait's moves look their states up four times)
    __hash__ = object.__hash__

    STARTING = "starting"  # the sessions are checked and the acks applied; not yet subscribed
    LOOKING = "looking"  # reading (a shared store's read is a round trip)
    BLOCKED = "blocked"  # nothing to return: waiting for a wake or the timeout
    SETTLING = "settling"  # woken: waiting for a quiet gap (at most the settle time) to read
    OVER = "over"  # answered, or cancelled


_S = WaitState
#: the states a wait may go to from each: any other move is a bug, and raises
_MOVES: dict[WaitState, frozenset[WaitState]] = {
    _S.STARTING: frozenset({_S.LOOKING, _S.OVER}),  # subscribed; or refused, or cancelled
    _S.LOOKING: frozenset({_S.LOOKING, _S.BLOCKED, _S.SETTLING, _S.OVER}),
    _S.BLOCKED: frozenset({_S.LOOKING, _S.SETTLING, _S.OVER}),  # woken (settle 0 or not)
    _S.SETTLING: frozenset({_S.LOOKING, _S.OVER}),  # quiet, or the settle time is over: read
    _S.OVER: frozenset(),
}


class Wait(Job[p.Response]):
    """A wait's whole life: its checks and acks first, then reads until it has an answer."""

    __slots__ = (
        "again",
        "armed",
        "deadline",
        "done",
        "first",
        "heard",
        "ids",
        "look",
        "looks",
        "loop",
        "quiet_end",
        "req",
        "seen",
        "settle_end",
        "state",
        "step",
        "stopped",
        "timer",
        "waiters",
    )

    def __init__(
        self,
        waiters: Waiters,
        req: p.Wait,
        ids: list[str],
        first: list[Outcome[Any]],
        *,
        ack: int | None = None,
    ) -> None:
        self.waiters = waiters
        self.req = req
        self.ids = ids
        #: what must be done before the first read: every session required, then the acks
        self.first = first
        look: ReadCursor | ReadAfter = (
            ReadCursor(req.cursor, req.max, touch=False, match=req.match)
            if req.after is None and req.cursor is not None
            else ReadAfter(req.after, req.max, req.match)  # after None: the whole ring
        )
        self.look = look
        #: each session's next look: a matching wait goes on after the last seq it looked
        #: at, so a firing that does not match is looked at once (rule R3). A wait on one
        #: session with an ack makes it with its first look, in one step.
        self.looks: dict[str, ReadCursor | ReadAfter | AckRead] = dict.fromkeys(ids, look)
        if ack is not None:
            assert len(ids) == 1 and req.cursor is not None
            self.looks[ids[0]] = AckRead(req.cursor, ack, req.max, req.match)
        #: the one firing heard whole while settling; None: none, or a second wake came
        #: (the ring may keep only the newest of a burst), so the wait reads
        self.heard: Firing | None = None
        #: each session's ``next`` of the wait's last look: where a wait that timed out
        #: stands (its cursor's seq; for a matching one, the last seq it looked at)
        self.seen: dict[str, int] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.state = WaitState.STARTING
        self.done: Done[p.Response] | None = None
        #: loop time past which the wait no longer blocks (None: no timeout)
        self.deadline: float | None = None
        self.timer: Timer | None = None  # the timeout's, or the settle's
        #: while settling, on the clock's ``monotonic``: when the quiet gap ends (the last
        #: firing heard, and the gap), when the settle time does, and what the timer is set for
        self.quiet_end = self.settle_end = self.armed = 0.0
        self.step: Job[Any] | None = None  # a round trip on its way, to cancel with the wait
        self.again = False  # woken while a read was on its way: read once more
        #: the id of a session of this wait that was stopped, once one is
        self.stopped: str | None = None

    # -- the Job interface ----------------------------------------------------

    def start(self, done: Done[p.Response]) -> None:
        self.done = done
        self.loop = asyncio.get_running_loop()
        self._guarded(self._next_first)

    def cancel(self) -> None:
        """The client went away: end without an answer, having moved no cursor."""
        if self.state is not WaitState.OVER:
            self._end()

    def position(self, session_id: str) -> int | None:
        """Where the wait stands in ``session_id`` after its last look (None before the
        first): what an HTTP long poll that timed out answers as its ``next``."""
        return self.seen.get(session_id)

    # -- what the engine tells ------------------------------------------------

    def wake(self, heard: Firing | None = None) -> None:
        """One of the wait's sessions changed (or stopped, or the daemon is closing);
        ``heard``: the new firing, when the committer knows it whole."""
        state = self.state
        if state is WaitState.BLOCKED:
            try:
                self._woken(heard)
            except Exception as exc:
                self._finish(None, exc)
        elif state is WaitState.SETTLING:  # its read, once quiet, sees the firing
            self.heard = None  # a burst: the ring says which of it is still there
            waiters = self.waiters
            self.quiet_end = waiters.clock.monotonic() + waiters.quiet  # the gap starts again
        elif state is WaitState.LOOKING:  # a round trip's read may have missed it: once more
            self.again = True
        elif state is WaitState.STARTING:  # not subscribed yet: nobody can know of it
            raise RuntimeError("a wait was woken before it subscribed")
        # OVER: it was answered in this same pass of the loop, by a wake that came first

    # -- the steps --------------------------------------------------------------
    #
    # The common turn, a wake with settle 0 on this daemon's own sessions, is
    # wake -> _woken -> _read -> _have_read -> _finish, all in the pass of the
    # event loop that recorded the firing: the waiter's answer is written
    # before the sender's, and before the daemon does anything else.

    def _next_first(self) -> None:
        if self.first:
            self._after(self.first.pop(0), lambda _: self._next_first())
            return
        self._subscribe()
        self._watch(0)

    def _watch(self, index: int) -> None:
        """Have the committer tell of new firings in every session, then read them.

        On this daemon's own store that is at once; on a shared one it is a
        subscription that Redis must confirm before the first read, or a
        firing recorded between the two would wake nobody.
        """
        committer, ids = self.waiters.committer, self.ids
        while index < len(ids):
            watched = committer.watch(ids[index])
            index += 1
            if watched.job is not None:
                self._after(watched, lambda _, after=index: self._watch(after))  # type: ignore[misc]
                return
        self._read()

    def _subscribe(self) -> None:
        self._move(WaitState.LOOKING)  # from here on, its end unsubscribes it
        self.waiters.join(self)
        # the timeout bounds the blocking, not the reads: a wait whose firings
        # are there returns them even with timeout 0, even when reading them
        # takes a round trip to a shared store
        if self.req.timeout_ms is not None:
            assert self.loop is not None
            self.deadline = self.loop.time() + self.req.timeout_ms / 1000

    def _woken(self, heard: Firing | None = None) -> None:
        settle = self.waiters.settle
        if not settle:  # at once: the answer goes out in this same pass of the loop
            if heard is None or not self._answer_heard(heard):
                self._read()
            return
        self._check_open()
        self._move(WaitState.SETTLING)
        self.heard = heard
        if self.timer is not None:
            self.timer.cancel()  # the timeout bounds only the blocking; it is checked after
        now = self.waiters.clock.monotonic()
        self.settle_end = now + settle
        self.quiet_end = now + self.waiters.quiet
        self._settle_until()

    def _settle_until(self) -> None:
        """Set the timer for the end of the quiet gap, or of the settle time if sooner."""
        self.armed = min(self.quiet_end, self.settle_end)
        self.timer = self.waiters.clock.call_at(self.armed, self._settled)

    def _settled(self) -> None:
        self.timer = None
        if min(self.quiet_end, self.settle_end) > self.armed:  # a firing came meanwhile
            self._settle_until()
            return
        self._guarded(self._after_settling)

    def _after_settling(self) -> None:
        heard, self.heard = self.heard, None
        if heard is None or not self._answer_heard(heard):
            self._read()

    def _answer_heard(self, heard: Firing) -> bool:
        """Look at the firing the wake carried, with no read, when the wait is on one
        session and it follows the wait's last look; False when it must read.

        One firing only: the ring keeps it (the committer hands only those), but of a
        burst heard while settling it may keep only the newest few, as its limit says,
        and a read tells which were lost."""
        if len(self.ids) != 1:
            return False
        session_id = self.ids[0]
        after = self.seen.get(session_id)
        if after is None:
            return False
        batch = look_heard(after, [heard], self.req.max, self.req.match)
        if batch is None:  # a gap, or an older firing: the ring knows better
            return False
        self._check_open()
        self._move(WaitState.LOOKING)
        self.waiters.committer.looked(session_id)
        batches: list[p.SessionBatch] = []
        self._looked(session_id, batch, batches)
        self._have_read(batches)
        return True

    def _read(self) -> None:
        """Read every session of the wait (a look moves no cursor); answer, or block again."""
        self._check_open()
        self._move(WaitState.LOOKING)
        committer, looks = self.waiters.committer, self.looks
        batches: list[p.SessionBatch] = []
        for index, session_id in enumerate(self.ids):
            try:
                read = committer.execute(session_id, looks[session_id])
            except NoSuchSession:  # it existed when the wait began, unless this is the first
                if self._first_look(session_id):  # look of a wait on one session
                    raise
                raise committer.vanished(session_id) from None
            if read.job is not None or read.ticket is not None:
                self._read_later(index, read, batches)  # a shared store's round trip
                return
            self._looked(session_id, read.value, batches)
        self._have_read(batches)

    def _looked(self, session_id: str, batch: Batch, batches: list[p.SessionBatch]) -> None:
        """A look's batch: an answer when it has firings or a loss; else, for a matching
        wait, the next look starts after the last seq this one looked at."""
        self.seen[session_id] = batch.next
        self.looks[session_id] = self.look  # the ack, if it came with the first, is made
        if batch.firings or batch.lost:
            batches.append(p.SessionBatch(session_id, batch.next, batch.lost, batch.firings))
        elif self.req.match is not None:
            self.looks[session_id] = ReadAfter(batch.next, self.req.max, self.req.match)

    def _read_later(self, index: int, read: Outcome[Batch], batches: list[p.SessionBatch]) -> None:
        """The reads from the session at ``index`` on, all at once (a wake meanwhile counts)."""
        committer, looks, ids = self.waiters.committer, self.looks, self.ids[index:]
        reads = [read]
        for session_id in ids[1:]:
            try:
                reads.append(committer.execute(session_id, looks[session_id]))
            except NoSuchSession:  # it existed when the wait began (it has one look)
                raise committer.vanished(session_id) from None

        def have_read(answers: list[Settled[Batch]]) -> None:
            for session_id, (batch, error) in zip(ids, answers, strict=True):
                if isinstance(error, NoSuchSession):  # it existed when the wait began,
                    if self._first_look(session_id):  # unless this is the first look of
                        raise error  # a wait on one session
                    raise committer.vanished(session_id)
                if error is not None:
                    raise error
                assert batch is not None
                self._looked(session_id, batch, batches)
            self._have_read(batches)

        self.again = False
        self._after(Outcome.settle_all(reads), have_read)

    def _first_look(self, session_id: str) -> bool:
        """Whether a look at ``session_id`` is the one that finds it exists: a wait on one
        session checks it with its first look; on several, before it starts (``first``)."""
        return len(self.ids) == 1 and session_id not in self.seen

    def _have_read(self, batches: list[p.SessionBatch]) -> None:
        if self._complete(batches):
            self._finish(self._answer(batches), None)
            return
        if self.again:  # a firing came while the read was on its way
            self.again = False
            self._woken()
            return
        deadline = self.deadline
        assert self.loop is not None
        if deadline is not None and self.loop.time() >= deadline:
            self._finish(self._nothing(), None)
            return
        self._move(WaitState.BLOCKED)
        if deadline is not None and self.timer is None:
            self.timer = self.loop.call_at(deadline, self._timed_out)

    def _complete(self, batches: list[p.SessionBatch]) -> bool:
        """Whether the looks just made answer the wait: a batch of one session (rule 14's
        select); with ``all``, a batch of every session (SPEC §18's join, each session
        looked at again from its position until then, so early arrivals count)."""
        if self.req.all:
            return len(batches) == len(self.ids)
        return bool(batches)

    def _answer(self, batches: list[p.SessionBatch]) -> p.Response:
        return p.Woken(id=self.req.id, batches=batches)

    def _timed_out(self) -> None:
        self.timer = None
        if self.state is WaitState.BLOCKED:
            self._finish(self._nothing(), None)

    def _nothing(self) -> p.Response:
        """The answer at the timeout: nothing came."""
        return p.Woken(id=self.req.id, batches=[], timed_out=True)

    def _check_open(self) -> None:
        waiters = self.waiters
        if waiters.closing:
            raise ShuttingDown("the daemon is shutting down: run the command again once it is back")
        if self.stopped is not None:
            raise SessionStopped(f"session {self.stopped!r} stopped")
        if waiters.link_error is not None:
            raise waiters.link_error

    # -- going from one step to the next ------------------------------------------

    def _after(self, outcome: Outcome[T], then: Callable[[T], None]) -> None:
        """Go on with ``outcome``'s value: now, once its commit is durable, or once it is read."""
        if outcome.job is None and outcome.ticket is None:
            then(outcome.value)  # known now: no callback to make
            return

        def answered(value: T | None, error: Exception | None) -> None:
            self.step = None
            self._resume(then, value, error)

        self.step = outcome.job  # first: a job may answer as it starts
        outcome.settle(answered)

    def _resume(self, then: Callable[[T], None], value: T | None, error: Exception | None) -> None:
        if self.state is WaitState.OVER:
            return  # cancelled while the step was on its way
        if error is not None:
            self._finish(None, error)
            return
        self._guarded(lambda: then(cast(T, value)))

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run a step; whatever it raises is the wait's answer."""
        try:
            step()
        except Exception as exc:
            self._finish(None, exc)

    def _finish(self, value: p.Response | None, error: Exception | None) -> None:
        if self.state is WaitState.OVER:
            return
        self._end()
        assert self.done is not None
        try:
            self.done(value, error)
        except Exception:  # the waiter's connection must not fail whoever woke it
            log.exception("a wait's answer could not be given")

    def _end(self) -> None:
        subscribed = self.state is not WaitState.STARTING
        self._move(WaitState.OVER)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.step is not None:
            step, self.step = self.step, None
            step.cancel()
        if not subscribed:
            return
        self.waiters.leave(self)

    def _move(self, to: WaitState) -> None:
        """Go to state ``to``, one of the moves ``_MOVES`` allows from the state it is in."""
        if to not in _MOVES[self.state]:
            raise RuntimeError(f"a wait cannot go from {self.state.value} to {to.value}")
        self.state = to
