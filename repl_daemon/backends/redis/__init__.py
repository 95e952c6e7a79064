"""The Redis backend: Redis (one server, or a Redis Cluster) is the only copy of every
session, shared by every daemon pointed at it.

``target`` reads the ``--store`` URL; ``keys`` names each session's keys and
channels; ``scripts`` holds the Lua scripts, one per operation; ``store`` sends
them (pipelined, routed to a cluster's nodes by redis-py) and decodes the
answers; ``heads`` notices a head that went back (a failover that lost firings);
``wakes`` subscribes to the wake channels of the sessions with waiters here;
``timers`` claims and fires the due timers of the partitions; ``committer`` is
what the engine calls.
"""

from __future__ import annotations

from repl_daemon.backends.redis.committer import SharedCommitter
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.engine.clock import Clock
from repl_daemon.engine.committer import Committer, Listener

__all__ = ["RedisBackend"]


class RedisBackend:
    """Sessions in Redis, and the committer that asks Redis for each operation."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    @property
    def name(self) -> str:
        return self.store.name

    def committer(self, listener: Listener, *, max_sessions: int, clock: Clock) -> Committer:
        # no session is held here: the bound on sessions is Redis's own (its maxmemory)
        return SharedCommitter(self.store, listener, clock=clock)

    def notes(self) -> list[tuple[int, str]]:
        return [self.store.replication]  # how many replicas each change waits for, and why

    async def close(self) -> None:
        await self.store.close()
