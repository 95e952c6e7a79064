"""The committer interface: what keeps the sessions, and how the engine is told of changes.

A committer runs the core's operations (``session.ops``) on the sessions it
keeps and makes their effects durable before an answer is given. There are
two: ``LocalCommitter`` (this daemon's memory is the truth, written to a
store by group commit: memory or SQLite) and ``SharedCommitter`` (a store
that several daemons write, Redis). The engine talks to either through this
interface alone and never asks which one it has.

The committer tells the engine what it must pass on to waiters through a
``Listener``: new firings became visible in a session, a session is gone,
or the committer's link to its store (and so its wake signals) broke or
came back. Each committer fires its sessions' timers itself (rules T1-T6),
from its ``run``: the firing is a change like a send.
"""

from __future__ import annotations

import secrets
from collections.abc import Container
from typing import Protocol, TypeVar

import msgspec

from repl_daemon.engine.clock import Clock
from repl_daemon.engine.outcome import Outcome
from repl_daemon.metrics import Counts
from session.errors import ReplError, StoreFailed
from session.firing import Firing
from session.ops import Op
from session.schedule import Timer
from session.scopes import TokenRecord
from session.session import Summary

R = TypeVar("R")


def made_up_id(taken: Container[str]) -> str:
    """A fresh session id, ``s-`` and 8 hex digits, not ``in taken`` (for a ``start`` with
    no id)."""
    while True:
        session_id = "s-" + secrets.token_hex(4)
        if session_id not in taken:
            return session_id


class Totals(msgspec.Struct, frozen=True):
    """The daemon-wide figures of ``stats``, over the sessions a committer holds."""

    sessions: int
    lost: int
    #: with those of sessions that are gone, so the total never drops
    evaluations: int

    @classmethod
    def of(cls, rows: list[Summary]) -> Totals:
        """The figures of the sessions ``rows`` are the summaries of (a token's, or every
        session of a store that keeps no count of its own)."""
        return cls(
            sessions=len(rows),
            lost=sum(row.lost for row in rows),
            evaluations=sum(row.evaluations for row in rows),
        )


class Listener(Protocol):
    #: where a committer counts its writes' latency and failures (``/metrics``)
    counts: Counts

    def changed(self, session_id: str, heard: Firing | None = None) -> None:
        """New firings in ``session_id`` are visible: its waiters must read again.

        ``heard`` is the newest of them when the committer knows it whole (a shared
        store publishes each new firing with its wake): a waiter that looked last at
        the seq just before it is answered from it, with no read, and tells the
        committer so (``Committer.looked``)."""

    def claimable(self, session_id: str) -> None:
        """A firing of ``session_id`` is claimable again (a release, a lease that ran out,
        a delay that ended): its blocked claimers look (SPEC §16)."""

    def grouped(self, session_id: str) -> None:
        """A group of ``session_id`` moved (a done, a release, an expiry, a dead letter, a
        claim): its blocked joins look (SPEC §18)."""

    def stopped(self, session_id: str) -> None:
        """``session_id`` is gone (stopped here, elsewhere, or rolled back)."""

    def link(self, error: StoreFailed | None) -> None:
        """Wake signals broke (an error) or came back (None): every waiter reads again."""

    def fired(self, count: int) -> None:
        """This daemon's timers recorded ``count`` firings (``stats`` counts them)."""

    def revoked(self, digest: str) -> None:
        """The token with this digest was revoked (here, or by another daemon of the store)."""


class Sessions(Protocol):
    """What a request may do to the sessions: the committer, or a scoped token's view of it
    (``repl_daemon.engine.scoped``)."""

    def execute(self, session_id: str, op: Op[R]) -> Outcome[R]:
        """Apply ``op`` to the session; ``NoSuchSession`` when there is none."""

    def ack_all(self, cursor: str, acks: list[tuple[str, int]]) -> Outcome[list[int]]:
        """Ack ``cursor`` on several sessions: all of them, or none (``session.ops.ack_all``)."""

    def require(self, session_ids: list[str]) -> Outcome[None]:
        """``NoSuchSession`` for the first of ``session_ids`` that does not exist; else None."""

    def start(
        self, session_id: str | None, limit: int, exist_ok: bool
    ) -> Outcome[tuple[str, bool]]:
        """Create a session (an id is made up when None); answers its id and whether it is new."""

    def stop(self, session_id: str) -> Outcome[None]:
        """Remove a session and all of it; its waiters are told through the listener."""

    def timers(self, session_id: str | None) -> Outcome[list[Timer]]:
        """One session's pending timers (``NoSuchSession`` when there is none), or every
        session's: soonest first."""

    def summaries(self, session_id: str | None) -> Outcome[list[Summary]]:
        """One session's figures, or every session's, sorted by id."""

    def totals(self) -> Outcome[Totals]:
        """The daemon-wide figures of ``stats``."""


class Committer(Sessions, Protocol):
    async def load(self) -> int:
        """Take over (or connect to) what the store holds; returns how many sessions it has."""

    async def run(self) -> None:
        """The committer's own work, until cancelled (group commit, or a wake listener)."""

    async def close(self) -> None:
        """Make everything that was answered durable; called once, at shutdown."""

    def watch(self, session_id: str) -> Outcome[None]:
        """A waiter here is about to read the session: be told of its new firings.

        Called by every waiter before its first read; done once the outcome
        is, and from then on a firing recorded in the session wakes it.
        """

    def unwatch(self, session_id: str) -> None:
        """The session's last waiter on this daemon is gone."""

    def looked(self, session_id: str) -> None:
        """A waiter here answered a look at the session from the firing its wake carried
        (``Listener.changed``'s ``heard``): count the look's evaluation (rule S17)."""

    async def health(self) -> str | None:
        """What is wrong with the store, or None when it works."""

    def vanished(self, session_id: str) -> ReplError:
        """What a wait is answered when a session it holds is found gone."""

    # -- scoped tokens (rules K1-K5): kept in the store, so every daemon sharing it knows them

    def find_token(self, digest: str) -> Outcome[TokenRecord | None]:
        """The token whose secret has this SHA-256, or None."""

    def tokens(self) -> Outcome[list[TokenRecord]]:
        """Every scoped token, by name."""

    def add_token(self, record: TokenRecord) -> Outcome[None]:
        """Keep a new token; ``TokenExists`` when its name is taken, ``TooMany`` past the limit."""

    def revoke_token(self, name: str) -> Outcome[TokenRecord]:
        """Forget a token (``NoSuchToken`` when there is none) and tell the listener, here and
        on every daemon of the store."""


class Backend(Protocol):
    """A kind of store and the committer that keeps sessions in it: ``repl_daemon.backends``
    has one subpackage a kind (``local``: memory or SQLite, this daemon's own; ``redis``:
    shared by several daemons). The engine is handed one and never asks which it is."""

    @property
    def name(self) -> str:
        """The store as ``ping``, ``stats`` and the log name it (never with a password)."""

    def committer(self, listener: Listener, *, max_sessions: int, clock: Clock) -> Committer:
        """The committer over this store. ``max_sessions`` bounds the sessions a daemon
        holds in memory (one that holds none, such as Redis's, has its store's bound)."""

    def notes(self) -> list[tuple[int, str]]:
        """What the daemon logs (a level, a line) once the committer has loaded the store."""

    async def close(self) -> None:
        """Let go of the store, once its committer is closed (or never loaded)."""
