"""The sessions as a scoped token sees them (rules K1-K5): the others do not exist.

``Scoped`` stands between the engine and its committer for every request
made with a scoped token, and it is the only place that hides sessions:
an op on a session outside the token's patterns is answered exactly as the
committer answers it for a session that does not exist (the op's own
values checked first, then ``no_such_session``), and listings, timers and
totals hold the token's sessions only. The answer for a hidden session is
made without asking the store whether the session exists, so nothing in it,
its time included, depends on whether it does. A request that names
several sessions (a wait) is answered as the committer answers for the
first one that is hidden or missing, in the request's order.

The rights a request needs are checked before this (``Engine.handle``):
they depend on the op and the token alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from repl_daemon.engine.committer import Committer, Totals
from repl_daemon.engine.outcome import Outcome
from session.names import check_cursor_name, check_session_id
from session.ops import Op, check_seq
from session.schedule import Timer
from session.scopes import Scope
from session.session import Summary, no_session

R = TypeVar("R")


class Scoped:
    """A committer's sessions, less those outside ``scope``'s patterns."""

    def __init__(self, committer: Committer, scope: Scope) -> None:
        self.committer = committer
        self.scope = scope

    def _hidden(self, session_id: str) -> bool:
        return not self.scope.covers(session_id)

    def hides(self, session_id: str) -> bool:
        """Whether the token cannot see ``session_id``: the engine refuses a wait on it as
        on a missing one, before the wait subscribes to anything."""
        return self._hidden(session_id)

    def _first_hidden(self, session_ids: list[str]) -> Outcome[Any] | None:
        """None when the token sees every one; else the answer for the first hidden one,
        after the sessions before it are found (one of them may be missing first)."""
        for index, session_id in enumerate(session_ids):
            if self._hidden(session_id):
                before = session_ids[:index]
                if not before:
                    raise no_session(session_id)

                return self.committer.require(before).then(_missing(session_id))
        return None

    # -- the Sessions interface -------------------------------------------------

    def execute(self, session_id: str, op: Op[R]) -> Outcome[R]:
        if self._hidden(session_id):
            check_session_id(session_id)
            op.check()
            raise no_session(session_id)
        return self.committer.execute(session_id, op)

    def ack_all(self, cursor: str, acks: list[tuple[str, int]]) -> Outcome[list[int]]:
        ids = [session_id for session_id, _ in acks]
        if any(self._hidden(session_id) for session_id in ids):
            check_cursor_name(cursor)
            for session_id, seq in acks:
                check_session_id(session_id)
                check_seq(seq)
            hidden = self._first_hidden(ids)
            assert hidden is not None
            return hidden
        return self.committer.ack_all(cursor, acks)

    def require(self, session_ids: list[str]) -> Outcome[None]:
        for session_id in session_ids:
            check_session_id(session_id)
        hidden = self._first_hidden(session_ids)
        return self.committer.require(session_ids) if hidden is None else hidden

    def start(
        self, session_id: str | None, limit: int, exist_ok: bool
    ) -> Outcome[tuple[str, bool]]:
        # the engine refuses a start outside the patterns (or with no id) before this
        assert session_id is not None and not self._hidden(session_id)
        return self.committer.start(session_id, limit, exist_ok)

    def stop(self, session_id: str) -> Outcome[None]:
        if self._hidden(session_id):
            raise no_session(session_id)
        return self.committer.stop(session_id)

    def timers(self, session_id: str | None) -> Outcome[list[Timer]]:
        if session_id is not None:
            if self._hidden(session_id):
                raise no_session(session_id)
            return self.committer.timers(session_id)
        covers = self.scope.covers
        return self.committer.timers(None).then(lambda ts: [t for t in ts if covers(t.session)])

    def summaries(self, session_id: str | None) -> Outcome[list[Summary]]:
        if session_id is not None:
            if self._hidden(session_id):
                raise no_session(session_id)
            return self.committer.summaries(session_id)
        covers = self.scope.covers
        return self.committer.summaries(None).then(lambda rs: [r for r in rs if covers(r.id)])

    def totals(self) -> Outcome[Totals]:
        """The token's sessions' figures: the daemon's would tell of the others."""
        return self.summaries(None).then(Totals.of)


def _missing(session_id: str) -> Callable[[None], NoReturn]:
    def missing(_: None) -> NoReturn:
        raise no_session(session_id)

    return missing
