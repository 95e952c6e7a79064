"""A gather (SPEC §18): a wait on one session that answers once it holds a reply for
every correlation id asked, decided by the record and not by when it looked.

It is a ``Wait`` (subscribed before its first look, no task while blocked, woken by
the session's new firings, bounded by its timeout) whose looks are a matching read
of the whole ring for the firings that carry a ``corr`` tag, the first one, then after
the last seq looked at. Each look keeps, for each corr asked, the first firing that
carries it (looks go oldest first, so the first seen is the first by seq): a retry's
duplicate, or a firing the ring drops later, never changes the answer. It answers once
every corr has its firing, in the order asked; at its timeout, with the ones that came
and the corrs of the others. It moves no cursor: asked again, it answers the same.
"""

from __future__ import annotations

from repl_daemon import protocol as p
from repl_daemon.engine.wait import Wait, Waiters
from session.errors import BadRequest, BadTag
from session.firing import Batch, Firing
from session.ops import ReadAfter
from session.rules import MAX_CORRS
from session.tags import CORR, MAX_TAG_VALUE, Match

#: what a gather's look asks for: a firing that carries a corr, whatever its value
HAS_CORR = Match({CORR: None})


def gather_corrs(corrs: list[str]) -> list[str]:
    """The corrs a gather asks for, each once, in the order first asked; ``bad_request``
    for none or too many, ``bad_tag`` for a value no tag may have."""
    if not corrs:
        raise BadRequest("gather needs at least one corr")
    if len(corrs) > MAX_CORRS:
        raise BadRequest(
            f"gather names {len(corrs):,} corrs, more than the {MAX_CORRS:,} one gather may "
            "name: gather fewer"
        )
    for corr in corrs:
        if len(corr) > MAX_TAG_VALUE:
            raise BadTag(f"corr {corr[:40]!r}...: over {MAX_TAG_VALUE:,} characters")
    return list(dict.fromkeys(corrs))


class GatherWait(Wait):
    """One gather: a ``Wait`` whose looks keep each corr's first firing."""

    __slots__ = ("corrs", "found", "gather", "wanted")

    def __init__(self, waiters: Waiters, req: p.Gather, corrs: list[str]) -> None:
        as_wait = p.Wait(
            id=req.id,
            sessions=[req.session],
            cursor=None,
            timeout_ms=req.timeout_ms,
            match=HAS_CORR,
        )
        super().__init__(waiters, as_wait, [req.session], [])
        self.gather = req
        self.corrs = corrs
        #: the corrs asked, to look each firing's up in (a gather may ask for 1,024)
        self.wanted = frozenset(corrs)
        #: each corr's first firing, found so far
        self.found: dict[str, Firing] = {}

    def _looked(self, session_id: str, batch: Batch, batches: list[p.SessionBatch]) -> None:
        wanted = self.wanted
        for firing in batch.firings:
            corr = firing.tags.get(CORR)
            if corr is not None and corr not in self.found and corr in wanted:
                self.found[corr] = firing
        self.seen[session_id] = batch.next
        self.looks[session_id] = ReadAfter(batch.next, None, HAS_CORR)

    def _complete(self, batches: list[p.SessionBatch]) -> bool:
        return len(self.found) == len(self.corrs)

    def _answer(self, batches: list[p.SessionBatch]) -> p.Response:
        return self._gathered(timed_out=False)

    def _nothing(self) -> p.Response:
        return self._gathered(timed_out=True)

    def _gathered(self, *, timed_out: bool) -> p.Gathered:
        firings = [self.found[c] for c in self.corrs if c in self.found]
        missing = [c for c in self.corrs if c not in self.found]
        return p.Gathered(id=self.gather.id, firings=firings, missing=missing, timed_out=timed_out)
