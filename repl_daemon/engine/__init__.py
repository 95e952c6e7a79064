"""The engine: requests in, the core's operations run, answers out (see ``engine.engine``).

``open_engine`` is the one place that chooses a committer for a store: a
store that other daemons share needs the committer that refreshes before
every operation; any other store is this daemon's alone.
"""

from __future__ import annotations

from repl_daemon.engine.clock import REAL, Clock, utc_now
from repl_daemon.engine.committer import Committer
from repl_daemon.engine.engine import Engine
from repl_daemon.engine.outcome import Outcome, Ticket
from repl_daemon.stores.base import Store
from repl_daemon.stores.redis import RedisStore

__all__ = ["Clock", "Committer", "Engine", "Outcome", "Ticket", "open_engine", "utc_now"]


def open_engine(
    store: Store | RedisStore,
    *,
    settle: float = 0.1,
    max_sessions: int = 10_000,
    clock: Clock = REAL,
) -> Engine:
    """An engine over ``store``, with the committer that the store calls for.

    ``max_sessions`` bounds what this daemon holds in memory; with Redis it
    holds no session, so the bound is Redis's own (its ``maxmemory``).
    ``clock`` is what the engine, the committer and its timers read the time
    from (the real one unless a test hands its own).
    """
    if isinstance(store, RedisStore):
        from repl_daemon.engine.shared import SharedCommitter

        shared = store

        def make(engine: Engine) -> Committer:
            return SharedCommitter(shared, engine, clock=clock)
    else:
        from repl_daemon.engine.local import LocalCommitter

        local = store

        def make(engine: Engine) -> Committer:
            return LocalCommitter(local, engine, max_sessions=max_sessions, clock=clock)

    return Engine(make, settle=settle, clock=clock)
