"""Timers on a shared store (rules T1-T6): every daemon may fire any, each due time once.

A timer lives with its session in Redis, and the script that fires it
(``FIRE``) records the firing and moves or deletes the timer in one atomic
step, firing only what is still due: that is the whole of "exactly once",
with no leader and no lock. What this module adds is finding due timers
without polling:

- the index: a sorted set a partition (``repl:{~tN}:due``), members
  ``SESSION TIMER`` scored by due time. It is a hint, kept so that it is
  never *later* than the truth: scheduling lowers the entry *before* the
  timer is written (a schedule that then fails leaves an early entry,
  which costs one ``FIRE`` that fires nothing) and again *after* (another
  daemon may have claimed the entry in between, found no timer yet and
  taken it out); firing sets the entry to what the script answered, and
  cancelling or stopping removes it, each only while the entry is still
  what that writer last saw (the claim's lease, the timer's due time), so
  a late writer never undoes a newer entry;
- claims: a daemon whose partition came due takes the due entries with
  ``CLAIM``, which moves each a lease ahead (``LEASE_MS``). Only a claimer
  that dies before it fires leaves them there; another daemon takes them
  when the lease is over: late, not lost, and still once;
- sleeping: each daemon keeps the earliest due time of every partition
  and sleeps until the soonest. ``INDEX`` publishes on the partition's
  channel whenever the earliest moved sooner, and every daemon subscribes
  to the partitions' channels (``Wakes``, as for waits), so a timer
  scheduled anywhere wakes every daemon in time; a daemon that wakes for a
  due time another claimed first finds nothing and sleeps again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

import anyio

from repl_daemon.backends.redis.keys import PARTITION_IDS, partition_of
from repl_daemon.backends.redis.pipeline import let_go
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.backends.redis.wakes import Wakes
from repl_daemon.engine.clock import REAL, Clock
from repl_daemon.engine.committer import Listener
from session.errors import NoSuchSession, StoreFailed, TooMany
from session.rules import GROUPS_TIMER
from session.schedule import Timer
from session.session import Fired, Scheduled

log = logging.getLogger("repl.daemon")

#: how long a claimed timer is left to its claimer before another daemon may take it
LEASE_MS = 30_000
#: the most entries one claim takes from a partition (more are taken at once after)
CLAIM_MAX = 256
#: how long before trying again after the store failed (doubling up to the second)
RETRY = (0.1, 5.0)


class SharedTimers:
    """This daemon's part in firing a shared store's timers; ``run`` it for as long as it serves."""

    def __init__(
        self, store: RedisStore, wakes: Wakes, listener: Listener, *, clock: Clock = REAL
    ) -> None:
        self.store = store
        self.wakes = wakes
        self.listener = listener
        #: what this daemon sleeps by and claims and fires at
        self.clock = clock
        #: the earliest due time known of each partition (ms; None: no timer)
        self.earliest: dict[str, int | None] = dict.fromkeys(PARTITION_IDS)
        self._sleeping_until: int | None = None
        self._wake = anyio.Event()
        self._reread = True
        #: set once the partitions' channels are subscribed and their due times read
        self.ready = anyio.Event()
        #: how often the timer task woke (a test sees it stand still while none is due)
        self.turns = 0
        # the soonest due time heard of each partition since a request about it was sent:
        # its answer may have been read after a sooner one was published, so the two merge
        self._heard: dict[str, int] = {}
        #: what fires an entry of a session's groups (``GROUPS_TIMER``, SPEC §16): their
        #: expiry, answering the next deadline (None: none); the committer's
        self.expire_groups: Callable[[str, int], Awaitable[int | None]] | None = None

    # -- what the wakes tell ----------------------------------------------------

    def heard(self, partition: str, payload: bytes) -> None:
        """A message on a partition's channel: its earliest due time moved sooner."""
        words = payload.split()
        if len(words) >= 2 and words[0] == b"due" and words[1].isdigit():
            self._sooner(partition, int(words[1]))

    def restored(self) -> None:
        """The wake link is back: what it carried meanwhile is lost, so read again."""
        self._reread = True
        self._wake.set()

    def _sooner(self, partition: str, due: int) -> None:
        known = self.earliest.get(partition, due)
        if known is None or due < known:
            self.earliest[partition] = due
        heard = self._heard.get(partition)
        self._heard[partition] = due if heard is None else min(heard, due)
        if self._sleeping_until is None or due < self._sleeping_until:
            self._wake.set()

    def _asking(self, partitions: Iterable[str]) -> None:
        """Requests about ``partitions`` are about to go: hear afresh from now on."""
        for partition in partitions:
            self._heard.pop(partition, None)

    def _answered(self, partition: str, earliest: int | None) -> None:
        """A partition's earliest due time as Redis answered it, merged with what was
        heard while the answer was on its way (never later than either)."""
        heard = self._heard.pop(partition, None)
        if heard is not None and (earliest is None or heard < earliest):
            earliest = heard
        self.earliest[partition] = earliest

    # -- the operations ---------------------------------------------------------

    async def schedule(self, timer: Timer) -> Scheduled:
        """Index first (never later than the truth), then the timer itself."""
        partition = partition_of(timer.session)
        entry = (timer.session, timer.id, timer.due_ms)
        await self.store.index(partition, lower=[entry])
        try:
            scheduled = await self.store.schedule(timer)
        except (NoSuchSession, TooMany):  # refused: no timer has this entry, take it back
            with contextlib.suppress(StoreFailed):
                gone = (timer.session, timer.id, timer.due_ms)  # unless a newer one moved it
                await self.store.index(partition, gone=[gone])
            raise
        made = scheduled.timer
        if made is not None:
            # once more, now that the timer is there: a daemon may have claimed the entry
            # in between, found no timer yet and taken the entry out
            await self.store.index(partition, lower=[(made.session, made.id, made.due_ms)])
        return scheduled

    async def stopped(self, session_id: str, timers: list[tuple[str, int]]) -> None:
        """A stopped session's timers went with it: their entries go too (best effort),
        each only while it is still at the timer's due time."""
        if timers:
            gone = [(session_id, timer_id, due) for timer_id, due in timers]
            with contextlib.suppress(StoreFailed):
                await self.store.index(partition_of(session_id), gone=gone)

    async def cancel(self, session_id: str, timer_id: str) -> Timer:
        cancelled = await self.store.cancel_timer(session_id, timer_id)
        # should this fail, the entry stays: it costs one FIRE that fires nothing
        with contextlib.suppress(StoreFailed):
            gone = (session_id, timer_id, cancelled.due_ms)  # unless a newer one moved it
            await self.store.index(partition_of(session_id), gone=[gone])
        return cancelled

    # -- firing -----------------------------------------------------------------

    async def run(self) -> None:
        """Sleep until the soonest due time, claim and fire what is due, and again."""
        await self.wakes.ready.wait()
        retry = RETRY[0]
        while True:
            try:
                if self._reread:
                    await self._read_earliest()
                await self._turn()
                retry = RETRY[0]
            except StoreFailed as exc:
                log.warning("timers: %s; trying again in %.1f s", exc.message, retry)
                self._reread = True
                await anyio.sleep(retry)
                retry = min(retry * 2, RETRY[1])

    async def _read_earliest(self) -> None:
        """Subscribe to every partition's channel, then read each one's earliest due time."""
        self._reread = False
        for partition in PARTITION_IDS:
            if not self.wakes.holds(partition):
                await self.wakes.subscribe(partition)
        self._asking(PARTITION_IDS)
        asked = [self.store.index(partition) for partition in PARTITION_IDS]
        with let_go(asked):  # one failed (its node is away): read again, the rest unwanted
            for partition, earliest in zip(PARTITION_IDS, asked, strict=True):
                self._answered(partition, await earliest)
        self.ready.set()

    async def _turn(self) -> None:
        self.turns += 1
        self._wake = anyio.Event()
        due = self._sleeping_until = min(
            (d for d in self.earliest.values() if d is not None), default=None
        )
        now = self.clock.now_ms()
        if due is None or due > now:
            await self.clock.sleep_until(due, self._wake)
            return
        partitions = [p for p, d in self.earliest.items() if d is not None and d <= now]
        await self.fire(partitions, now)

    def _expiring(
        self, by_session: dict[str, list[str]], now: int
    ) -> dict[str, asyncio.Task[int | None]]:
        """Take the groups' entries out of ``by_session`` and start their expiries."""
        expiring: dict[str, asyncio.Task[int | None]] = {}
        for session_id in [s for s, ids in by_session.items() if GROUPS_TIMER in ids]:
            ids = [i for i in by_session[session_id] if i != GROUPS_TIMER]
            if ids:
                by_session[session_id] = ids
            else:
                del by_session[session_id]
            if self.expire_groups is not None:
                expiry = self.expire_groups(session_id, now)
                expiring[session_id] = asyncio.ensure_future(expiry)
        return expiring

    async def fire(self, partitions: list[str], now: int) -> int:
        """Claim the due entries of ``partitions``, fire them, update the index; the count fired.

        Each step is one pipeline for every partition and session at once.
        """
        ts = self.clock.utc_now()
        lease = now + LEASE_MS
        self._asking(partitions)
        claims = [self.store.claim(p, now, lease, CLAIM_MAX) for p in partitions]
        by_session: dict[str, list[str]] = {}
        failure: StoreFailed | None = None  # one partition's failure does not stop the others
        with let_go(claims):
            for partition, claim in zip(partitions, claims, strict=True):
                try:
                    pairs, earliest = await claim
                except StoreFailed as exc:
                    failure = exc
                    continue
                self._answered(partition, now if len(pairs) == CLAIM_MAX else earliest)
                for session_id, timer_id in pairs:
                    by_session.setdefault(session_id, []).append(timer_id)
        expiring = self._expiring(by_session, now)
        fires = {
            session_id: self.store.fire_timers(session_id, ids, now, ts)
            for session_id, ids in by_session.items()
        }
        with let_go([*fires.values(), *expiring.values()]):  # an error not foreseen below
            count, failure = await self._fired(by_session, fires, expiring, now, lease, failure)
        if count:
            self.listener.fired(count)
        if failure is not None:
            raise failure
        return count

    async def _fired(
        self,
        by_session: dict[str, list[str]],
        fires: dict[str, asyncio.Future[list[Fired]]],
        expiring: dict[str, asyncio.Task[int | None]],
        now: int,
        lease: int,
        failure: StoreFailed | None,
    ) -> tuple[int, StoreFailed | None]:
        """What the fires and the expiries answered, into the index: the count fired, and
        the last failure (None: none)."""
        # every entry claimed is at ``lease`` now: it is set or taken out only while it
        # still is, so an entry a schedule lowered meanwhile (a timer just made) stays
        due: dict[str, list[tuple[str, str, int | None, int]]] = {}
        gone: dict[str, list[tuple[str, str, int | None]]] = {}
        count = 0
        for session_id, future in fires.items():
            partition = partition_of(session_id)
            try:
                fired: list[Fired] = await future
            except NoSuchSession:  # stopped: its timers went with it
                fired = [Fired(i, None, None) for i in by_session[session_id]]
            except StoreFailed as exc:  # perhaps fired, perhaps not: due again, FIRE decides
                failure = exc  # and the task backs off before it tries again
                fired = [Fired(i, None, now) for i in by_session[session_id]]
            recorded = 0
            for one in fired:
                if one.due_ms is None:
                    gone.setdefault(partition, []).append((session_id, one.timer, lease))
                else:
                    entry = (session_id, one.timer, lease, one.due_ms)
                    due.setdefault(partition, []).append(entry)
                recorded += one.seq is not None
            if recorded:
                count += recorded
                self.listener.changed(session_id)  # this daemon's waiters; others hear Redis
        for session_id, expired in expiring.items():
            partition = partition_of(session_id)
            try:
                deadline = await expired
            except NoSuchSession:  # stopped: its groups went with it
                deadline = None
            except StoreFailed as exc:  # perhaps expired, perhaps not: due again
                failure, deadline = exc, now
            if deadline is None:
                gone.setdefault(partition, []).append((session_id, GROUPS_TIMER, lease))
            else:
                due.setdefault(partition, []).append((session_id, GROUPS_TIMER, lease, deadline))
        touched = {*due, *gone}
        self._asking(touched)
        updates = {
            p: self.store.index(p, due=due.get(p, ()), gone=gone.get(p, ())) for p in touched
        }
        with let_go(updates.values()):
            for partition, update in updates.items():
                try:
                    self._answered(partition, await update)
                except StoreFailed as exc:  # its claimed entries come due again after the lease
                    failure = exc
        return count, failure
