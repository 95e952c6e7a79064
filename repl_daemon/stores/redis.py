"""The Redis store: several daemons share sessions through one Redis.

Each session lives under keys with the hash tag ``{ID}`` (so one session's
keys share a hash slot and the design runs on Redis Cluster):

- ``repl:{ID}:meta``     hash: version, limit, head, uses
- ``repl:{ID}:ring``     list: the retained firings, oldest first (JSON)
- ``repl:{ID}:cursors``  hash: name -> "seq:last_use"
- ``repl:{ID}:keys``     hash: dedup key -> seq
- ``repl:{ID}:keyorder`` list: dedup keys, oldest first (the newest 1,024)

plus one set ``repl:sessions`` that lists the ids. The scripts keep it in
the same atomic step as the session's own keys, so a change that Redis
took is never answered ``store_failed`` for the set's sake. (That set lies
outside every session's hash slot, so this layout needs one Redis, not a
Cluster.)

Every change of a session is one Lua script (``COMMIT``): it checks the
session's ``version`` against the one the daemon's copy came from, writes
the whole delta, bumps the version and publishes ``ID HEAD`` on the channel
``repl:wake``; if another daemon changed the session first it writes nothing
and answers with the current version, and the daemon reloads and runs the
operation again. So no interleaving of daemons can break a rule of SPEC §3:
each rule is checked by the core on a copy that is exactly the stored state.

The client is redis-py's blocking one; the daemon calls it from worker
threads, as it does the SQLite store. Durability is Redis's own: see GUIDE.md.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from session.delta import CursorState, Delta
from session.errors import StoreFailed
from session.firing import Firing
from session.session import Snapshot

log = logging.getLogger("repl.daemon")

CHANNEL = "repl:wake"
SESSIONS = "repl:sessions"

_COMMIT = """
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= version then
  return {0, version}
end
local reset = ARGV[2] == '1'
if not reset and version == 0 then
  return {-1, 'the session is not stored (it was stopped, or never started)'}
end
-- first the listing, so a refusal here leaves nothing half written
if reset then
  redis.call('SADD', KEYS[6], ARGV[9])
end
local limit, head, uses, retained = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local first, count = tonumber(ARGV[7]), tonumber(ARGV[8])
local stored = tonumber(redis.call('HGET', KEYS[1], 'head') or '0')
-- new firings continue the stored ones, or start where the ring now starts
if count > 0 and not reset and first ~= stored + 1 and first > tonumber(head) - retained + 1 then
  return {-1, 'the new firings do not continue the stored ring (stored head '
    .. stored .. ', first new ' .. first .. ')'}
end
if reset then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
end
local i = 11
for _ = 1, count do
  redis.call('RPUSH', KEYS[2], ARGV[i])
  i = i + 1
end
if retained == 0 then
  redis.call('DEL', KEYS[2])
else
  redis.call('LTRIM', KEYS[2], -retained, -1)
end
count = tonumber(ARGV[i])
i = i + 1
if count >= 0 then
  redis.call('DEL', KEYS[3])
  for _ = 1, count do
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
    i = i + 2
  end
end
count = tonumber(ARGV[i])
i = i + 1
for _ = 1, count do
  -- a key can come back once the core forgot it: keep one place in the order
  if redis.call('HEXISTS', KEYS[4], ARGV[i]) == 1 then
    redis.call('LREM', KEYS[5], 1, ARGV[i])
  end
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  redis.call('RPUSH', KEYS[5], ARGV[i])
  i = i + 2
end
local max_keys = tonumber(ARGV[10])
while redis.call('LLEN', KEYS[5]) > max_keys do
  redis.call('HDEL', KEYS[4], redis.call('LPOP', KEYS[5]))
end
version = version + 1
redis.call('HSET', KEYS[1], 'version', version, 'limit', limit, 'head', head, 'uses', uses)
redis.call('PUBLISH', ARGV[i], ARGV[i + 1] .. ' ' .. head .. ' ' .. ARGV[i + 2])
return {1, version}
"""

_STOP = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('SREM', KEYS[6], ARGV[2])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('PUBLISH', ARGV[1], ARGV[2] .. ' stop ' .. ARGV[3])
return 1
"""


class Conflict(Exception):
    """Another daemon changed the session since this daemon's copy was loaded."""

    def __init__(self, version: int) -> None:
        super().__init__(f"session changed elsewhere (now version {version})")
        self.version = version


def session_keys(session_id: str) -> list[str]:
    """A session's keys, and last the set of every session's id."""
    tag = f"repl:{{{session_id}}}"
    keys = [f"{tag}:meta", f"{tag}:ring", f"{tag}:cursors", f"{tag}:keys", f"{tag}:keyorder"]
    return [*keys, SESSIONS]


_encode_firing = msgspec.json.Encoder().encode
_decode_firing = msgspec.json.Decoder(Firing).decode


class RedisStore:
    """Sessions shared by every daemon that points at the same Redis."""

    durable = True
    shared = True

    def __init__(self, url: str) -> None:
        import redis

        self._redis_module = redis
        self.url = url
        self.name = f"redis:{url}"
        try:
            self.client = redis.Redis.from_url(
                url, socket_timeout=5, socket_connect_timeout=2, decode_responses=False
            )
            self.client.ping()
        except redis.RedisError as exc:
            raise StoreFailed(f"cannot reach Redis at {url}: {exc}") from None
        except ValueError as exc:
            raise StoreFailed(f"bad Redis URL {url!r}: {exc}") from None
        self._commit = self.client.register_script(_COMMIT)
        self._stop = self.client.register_script(_STOP)
        self._pubsub: Any = None
        # names this daemon in what it publishes, so it can skip its own changes
        self.origin = secrets.token_hex(8)
        self._closing = threading.Event()

    def _failed(self, exc: Exception) -> StoreFailed:
        return StoreFailed(f"redis at {self.url} failed: {exc}")

    # -- the Store interface ----------------------------------------------

    def load(self) -> list[Snapshot]:
        snapshots = []
        for session_id in self.ids():
            loaded = self.load_versioned(session_id)
            if loaded is not None:
                snapshots.append(loaded[0])
        return snapshots

    def load_session(self, session_id: str) -> Snapshot | None:
        loaded = self.load_versioned(session_id)
        return None if loaded is None else loaded[0]

    def write(self, batch: list[Delta]) -> None:
        """Write each session's delta atomically (not the batch as a whole: see store.py)."""
        for delta in batch:
            if delta.gone:
                self.stop(delta.id)
            else:
                self.commit(delta, None)

    def close(self) -> None:
        self._closing.set()
        if self._pubsub is not None:
            # closing a broken connection may fail; it is closed anyway
            with contextlib.suppress(Exception):
                self._pubsub.close()
        self.client.close()

    # -- what sharing needs -------------------------------------------------

    def ids(self) -> list[str]:
        try:
            members = self.client.smembers(SESSIONS)
        except self._redis_module.RedisError as exc:
            raise self._failed(exc) from None
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    def version(self, session_id: str) -> int:
        """The stored version of a session; 0 when it does not exist."""
        try:
            value = self.client.hget(session_keys(session_id)[0], "version")
        except self._redis_module.RedisError as exc:
            raise self._failed(exc) from None
        return int(value or 0)

    def load_versioned(self, session_id: str) -> tuple[Snapshot, int] | None:
        meta_key, ring_key, cursors_key, keys_key, order_key, _ = session_keys(session_id)
        try:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hgetall(meta_key)
                pipe.lrange(ring_key, 0, -1)
                pipe.hgetall(cursors_key)
                pipe.lrange(order_key, 0, -1)
                pipe.hgetall(keys_key)
                meta, ring, cursors, order, keys = pipe.execute()
        except self._redis_module.RedisError as exc:
            raise self._failed(exc) from None
        if not meta:
            return None
        cursor_states = []
        for name, value in cursors.items():
            seq, _, use = value.decode().partition(":")
            cursor_states.append(CursorState(name.decode(), int(seq), int(use)))
        snapshot = Snapshot(
            id=session_id,
            limit=int(meta[b"limit"]),
            head=int(meta[b"head"]),
            firings=[_decode_firing(raw) for raw in ring],
            cursors=cursor_states,
            uses=int(meta[b"uses"]),
            keys=[(k.decode(), int(keys[k])) for k in order if k in keys],
        )
        return snapshot, int(meta[b"version"])

    def commit(self, delta: Delta, expected: int | None) -> int:
        """Write ``delta`` if the stored version is ``expected``; the new version.

        ``expected`` None writes whatever is stored. Raises ``Conflict`` when
        another daemon got there first, ``StoreFailed`` when Redis fails.
        """
        retained = delta.limit if delta.retained is None else delta.retained
        args: list[Any] = ["" if expected is None else expected, "1" if delta.reset else "0"]
        first = delta.firings[0].seq if delta.firings else 0
        args += [delta.limit, delta.head, delta.uses, retained, first, len(delta.firings)]
        args += [delta.id, delta.max_keys]
        args += [_encode_firing(f) for f in delta.firings]
        if delta.cursors is None:
            args.append(-1)
        else:
            args.append(len(delta.cursors))
            for cursor in delta.cursors:
                args += [cursor.name, f"{cursor.seq}:{cursor.last_use}"]
        args.append(len(delta.keys))
        for key, seq in delta.keys:
            args += [key, seq]
        args += [CHANNEL, delta.id, self.origin]
        try:
            done, version = self._commit(keys=session_keys(delta.id), args=args)
        except self._redis_module.RedisError as exc:
            raise self._failed(exc) from None
        if done == -1:
            reason = version.decode() if isinstance(version, bytes) else str(version)
            raise StoreFailed(f"redis refused the change to {delta.id!r}: {reason}")
        if not done:
            raise Conflict(int(version))
        return int(version)

    def stop(self, session_id: str) -> bool:
        """Delete a session everywhere; False when it did not exist."""
        try:
            done = self._stop(
                keys=session_keys(session_id), args=[CHANNEL, session_id, self.origin]
            )
        except self._redis_module.RedisError as exc:
            raise self._failed(exc) from None
        return bool(done)

    def listen(
        self, on_change: Callable[[str, int | None], None], on_link: Callable[[bool], None]
    ) -> None:
        """Deliver every change any daemon publishes, until ``close``; runs in a thread.

        ``on_change(id, head)`` (head None: stopped) for each change;
        ``on_link(False)`` when the subscription breaks, ``on_link(True)``
        once it is back (after which every waiter must read again, since
        changes made meanwhile were not delivered).
        """
        backoff = 0.05
        while not self._closing.is_set():
            try:
                self._pubsub = self.client.pubsub(  # type: ignore[no-untyped-call]
                    ignore_subscribe_messages=True
                )
                self._pubsub.subscribe(CHANNEL)
                on_link(True)
                backoff = 0.05
                for message in self._pubsub.listen():
                    if message["type"] != "message":
                        continue
                    session_id, what, origin = message["data"].decode().split(" ")
                    if origin != self.origin:  # this daemon woke its own waiters already
                        on_change(session_id, None if what == "stop" else int(what))
            except Exception as exc:  # the link broke; tell the waiters and retry
                if self._closing.is_set():
                    return
                log.warning("redis subscription lost: %s", exc)
                on_link(False)
                self._closing.wait(backoff)
                backoff = min(backoff * 2, 2.0)
