"""A join (SPEC §18): a wait on one session that answers once every firing up to a seq is
done or dead in a group, woken by the group's own moves, not by polling.

It is a ``Wait`` (subscribed before its first look, no task while blocked, bounded by its
timeout) whose look is ``GroupProgress``: the group's counts over the firings up to
``upto`` (a group not made yet counts as its first claim would make it). Its first look
fixes ``upto`` at the head when none was given, so what it waits for is decided then and
never grows. It looks again when a firing is recorded in the session (as every wait) and
when the committer says a group of it moved (``Listener.grouped``: a done, a release, a
dead letter, an expiry; on a shared store, heard from the daemon that made it); each
look is a count over the group's own tables, never a read of the ring.
"""

from __future__ import annotations

from collections.abc import Callable

from repl_daemon import protocol as p
from repl_daemon.engine.wait import Wait, Waiters
from session.firing import Batch, Firing
from session.group import Progress
from session.ops import GroupProgress


class JoinWait(Wait):
    """One join: a ``Wait`` whose look counts a group's progress."""

    __slots__ = ("join", "now", "progress")

    def __init__(self, waiters: Waiters, req: p.Join, now: Callable[[], int]) -> None:
        as_wait = p.Wait(id=req.id, sessions=[req.session], cursor=None, timeout_ms=req.timeout_ms)
        super().__init__(waiters, as_wait, [req.session], [])
        self.join = req
        #: the engine's clock's ``now_ms`` (a lease or a delay is counted at the time of a look)
        self.now = now
        self.progress: Progress | None = None
        self.looks[req.session] = GroupProgress(req.group, 0, req.upto)  # type: ignore[assignment]

    def _read(self) -> None:
        # each look at the time it is made: a delay that has ended counts as ready
        session_id = self.ids[0]
        upto = self.join.upto if self.progress is None else self.progress.upto
        look = GroupProgress(self.join.group, self.now(), upto)
        self.looks[session_id] = look  # type: ignore[assignment]
        super()._read()

    def _answer_heard(self, heard: Firing) -> bool:
        return False  # a new firing changes what is left only through the group: look

    def _looked(self, session_id: str, batch: Batch, batches: list[p.SessionBatch]) -> None:
        progress = batch
        assert isinstance(progress, Progress)
        self.progress = progress
        self.seen[session_id] = progress.upto

    def _complete(self, batches: list[p.SessionBatch]) -> bool:
        return self.progress is not None and self.progress.finished

    def _answer(self, batches: list[p.SessionBatch]) -> p.Response:
        return self._joined(timed_out=False)

    def _nothing(self) -> p.Response:
        return self._joined(timed_out=True)

    def _joined(self, *, timed_out: bool) -> p.Joined:
        left = self.progress
        assert left is not None  # a join times out only once it has looked
        return p.Joined(
            id=self.join.id,
            upto=left.upto,
            done=left.done,
            dead=left.dead,
            ready=left.ready,
            held=left.held,
            delayed=left.delayed,
            timed_out=timed_out,
        )
