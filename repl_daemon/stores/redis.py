"""The Redis store: several daemons share sessions, and Redis is the only copy.

Each session lives under keys with the hash tag ``{ID}`` (one hash slot, so
the same layout runs on one Redis and on a Redis Cluster; the keys are
listed in ``repl_daemon.stores.redis_scripts``), and every operation on a
session is one Lua script on those keys: one round trip, one atomic step,
no version check and no retry. The daemon keeps no copy: every answer is
what Redis holds at that moment.

Wakes go over sharded pub/sub: each new firing is published, inside the
script that records it, on the session's own shard channel
(``repl:{ID}:wake``). A channel a script publishes on must hash to the
script's own slot, so the finest partition, the session, is also the only
one that keeps the publish atomic with the change; a daemon subscribes to
the channels of the sessions it has waiters on, one subscriber connection
per node, and an idle waiter costs it no work and Redis no command.

The client is redis-py's asyncio one (``redis.asyncio``), in the daemon's
event loop. URLs (SPEC §7):

- ``redis://[USER:PASSWORD@]HOST:PORT/DB``, ``rediss://...`` (TLS): one Redis,
  or its primary;
- ``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`` (and
  ``rediss+cluster://``): a Redis Cluster, found from any of its nodes;
- ``?replicas=N`` on either: a change is answered only once N replicas
  have it (Redis ``WAIT``), so a failover loses nothing that was answered.

A password never appears in ``name``, in a log line or in an error.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import anyio

from repl_daemon.stores import redis_scripts as lua
from session.errors import (
    AckAfterHead,
    BadMax,
    CursorAfterHead,
    NoSuchSession,
    ReplError,
    StoreFailed,
)
from session.firing import Batch, CursorInfo, Firing
from session.rules import MAX_CURSORS, MAX_KEYS
from session.session import Recorded, Summary

log = logging.getLogger("repl.daemon")

#: how long a change waits for its replicas (``?replicas=N``) before it fails
REPLICA_TIMEOUT_MS = 2000
#: how long a subscription to a session's wakes may take to be confirmed
SUBSCRIBE_TIMEOUT = 2.0
#: how long a session's wakes stay subscribed after its last waiter left: a
#: monitor runs ``repl wait`` again at once, and then pays no SSUBSCRIBE
LINGER = 5.0

_ERRORS: dict[str, type[ReplError]] = {
    "no_such_session": NoSuchSession,
    "cursor_after_head": CursorAfterHead,
    "ack_after_head": AckAfterHead,
    "bad_max": BadMax,
}


SCRIPTS = ("RECORD", "READ", "ACK", "CHECK_ACK", "SET_LIMIT", "DESCRIBE", "START", "STOP")
#: the most operations one pipeline carries
MAX_BATCH = 512
#: the most changes on their way at once on a cluster with ``?replicas=N``
REPLICATED_IN_FLIGHT = 64


class _Call:
    """One operation on its way to Redis in a pipeline; ``future`` gets its reply.

    The future may instead be given ``LEAD``: its caller then sends the next
    pipeline. (redis.asyncio runs on asyncio, so the store does too: a
    future is the cheapest thing to wait on.)
    """

    __slots__ = ("change", "command", "future")

    def __init__(self, command: tuple[object, ...], change: bool) -> None:
        self.command = command
        self.change = change
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def finish(self, result: Any = None, error: Exception | None = None) -> None:
        if self.future.done():  # its caller went away
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


LEAD = object()


def session_keys(session_id: str) -> list[str]:
    """A session's keys, in the order every script takes them."""
    tag = f"repl:{{{session_id}}}"
    return [f"{tag}:{part}" for part in ("meta", "ring", "cursors", "keys", "keyorder", "wake")]


def wake_channel(session_id: str) -> str:
    return f"repl:{{{session_id}}}:wake"


def channel_session(channel: str) -> str | None:
    """The session id a wake channel belongs to; None for any other channel."""
    if channel.startswith("repl:{") and channel.endswith("}:wake"):
        return channel[len("repl:{") : -len("}:wake")]
    return None


class Target:
    """What a ``--store`` URL names, with the password kept out of ``name``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
            raise StoreFailed(
                f"store URL scheme {scheme!r} is not one of redis://, rediss://, "
                "redis+cluster:// (see `repl daemon --help`)"
            )
        self.cluster = scheme.endswith("+cluster")
        self.tls = scheme.startswith("rediss")
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        query = parse_qs(parts.query)
        replicas = query.pop("replicas", ["0"])[-1]
        if not replicas.isdigit():
            raise StoreFailed(f"?replicas={replicas} in the store URL is not a number")
        self.replicas = int(replicas)
        if query:
            raise StoreFailed(
                f"the store URL has options repl does not know: {', '.join(sorted(query))}"
            )
        hostports = parts.netloc.rpartition("@")[2]
        self.nodes: list[tuple[str, int]] = []
        for hostport in hostports.split(","):
            host, _, port = hostport.rpartition(":")
            if not host or not port.isdigit():
                raise StoreFailed(f"{hostport!r} in the store URL is not HOST:PORT")
            self.nodes.append((host.strip("[]"), int(port)))
        if not self.cluster and len(self.nodes) != 1:
            raise StoreFailed("a redis:// URL names one HOST:PORT; redis+cluster:// takes several")
        path = parts.path.strip("/") or "0"
        if not path.isdigit():
            raise StoreFailed(f"the database {path!r} in the store URL is not a number")
        self.db = int(path)
        if self.cluster and self.db != 0:
            raise StoreFailed("a Redis Cluster has database 0 only: leave /DB out of the URL")
        user = f"{quote(self.username)}:***@" if self.username else ":***@" if self.password else ""
        where = ",".join(f"{h}:{p}" for h, p in self.nodes)
        tail = "" if self.cluster else f"/{self.db}"
        extra = f"?replicas={self.replicas}" if self.replicas else ""
        #: the URL as logs, ``ping`` and ``stats`` show it: never with the password
        self.name = f"{scheme}://{user}{where}{tail}{extra}"

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "username": self.username,
            "password": self.password,
            "socket_keepalive": True,
            "socket_connect_timeout": 2,
            "decode_responses": False,
        }
        if self.tls:
            options["ssl"] = True
        return options


class RedisStore:
    """Sessions in Redis, shared by every daemon pointed at the same Redis or Cluster."""

    durable = True
    shared = True

    def __init__(self, url: str) -> None:
        """Check the URL; ``open`` connects. ``StoreFailed`` for a URL that is not one."""
        try:
            import redis.asyncio  # noqa: F401 - the extra must be there before anything else
        except ImportError:
            raise StoreFailed(
                "--store redis:// needs the redis client: pip install 'repl[redis]'"
            ) from None
        self.target = Target(url)
        self.name = f"redis:{self.target.name}"
        # names this daemon in what it publishes, so it can skip its own wakes
        self.origin = secrets.token_hex(8)
        self.client: Any = None
        self._scripts: dict[str, Any] = {}
        # the operations waiting for the next pipeline, and whether one is on its way
        self._queue: list[_Call] = []
        self._leading = False
        self._replicated: anyio.CapacityLimiter | None = None  # made in the loop, by ``open``

    # -- connecting -------------------------------------------------------------

    async def open(self) -> None:
        """Connect and check that Redis answers; ``StoreFailed`` (one line) when it does not."""
        import redis.asyncio as aioredis
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        target = self.target
        options = target.client_options()
        self._replicated = anyio.CapacityLimiter(REPLICATED_IN_FLIGHT)
        try:
            if target.cluster:
                self.client = RedisCluster(
                    startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
                    socket_timeout=5,
                    **options,
                )
                await self.client.initialize()
            else:
                host, port = target.nodes[0]
                self.client = aioredis.Redis(
                    host=host, port=port, db=target.db, socket_timeout=5, **options
                )
            await self.client.ping()
        except Exception as exc:
            await self.close()
            raise StoreFailed(
                f"cannot reach Redis at {target.name}: {_reason(exc)} "
                "(check that it runs and that --store names it)"
            ) from None
        for name in SCRIPTS:
            self._scripts[name] = self.client.register_script(getattr(lua, name))
        try:
            await self._load_scripts()
        except Exception as exc:
            await self.close()
            raise StoreFailed(
                f"redis at {target.name} refused the scripts: {_reason(exc)}"
            ) from None

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD every script (on every primary of a cluster), so EVALSHA finds them."""
        for script in self._scripts.values():
            await self.client.script_load(script.script)

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception as exc:  # closing a broken connection may fail; it is closed
                log.debug("closing the Redis client: %s", exc)

    def subscriber_options(self) -> tuple[bool, dict[str, Any]]:
        """How a wake subscriber connects: no socket timeout, it waits as long as its waiters."""
        return self.target.cluster, self.target.client_options()

    # -- running one script ---------------------------------------------------------

    async def _run(self, script: str, session_id: str, *args: object, change: bool) -> list[Any]:
        keys = session_keys(session_id)
        try:
            if change and self.target.replicas and self.target.cluster:
                answer = await self._run_replicated(script, keys, args)
            else:
                command = ("EVALSHA", self._scripts[script].sha, len(keys), *keys, *args)
                answer = await self._pipelined(_Call(command, change))
        except ReplError:
            raise
        except Exception as exc:
            raise StoreFailed(f"redis at {self.target.name} failed: {_reason(exc)}") from None
        if answer[0] == b"err":
            code, message = answer[1].decode(), answer[2].decode()
            error = _ERRORS.get(code, StoreFailed)
            if error is NoSuchSession:
                message = f"no session {session_id!r}: start it with `repl start {session_id}`"
            raise error(message)
        return list(answer[1:])

    async def _pipelined(self, call: _Call) -> Any:
        """Run ``call`` in the next pipeline: every operation in flight shares one round trip.

        No task of its own: the first caller leads (sends the pipeline of
        everything queued, up to ``MAX_BATCH``) and hands the lead to the
        first call still queued when it is done. A caller that went away
        before its pipeline left is dropped from it (nothing of it was
        sent); once a pipeline is on its way it completes (shielded), so a
        lead is always handed on.
        """
        queue = self._queue
        queue.append(call)
        if self._leading:
            try:
                answer = await call.future
            except BaseException:
                # cancelled, perhaps just after the lead was handed to it: hand it on
                led = call.future.done() and not call.future.cancelled()
                if led and call.future.exception() is None and call.future.result() is LEAD:
                    self._hand_on()
                raise
            if answer is not LEAD:
                return answer
            call.future = asyncio.get_running_loop().create_future()
        self._leading = True
        try:
            batch = [c for c in queue[:MAX_BATCH] if not c.future.cancelled()]
            del queue[:MAX_BATCH]
            with anyio.CancelScope(shield=True):
                await self._flush(batch)
        finally:
            self._hand_on()
        return call.future.result()

    def _hand_on(self) -> None:
        """Give the lead to the first queued call whose caller still waits, if any."""
        queue = self._queue
        while queue and queue[0].future.done():  # cancelled: its caller went away
            del queue[0]
        if queue:
            queue[0].future.set_result(LEAD)
        else:
            self._leading = False

    async def _flush(self, batch: list[_Call]) -> None:
        """One pipeline for ``batch`` (a cluster client splits it by node, in parallel)."""
        from redis.exceptions import NoScriptError

        waits = bool(self.target.replicas) and any(call.change for call in batch)
        try:
            results = await self._send(batch, waits)
            missing = [
                c for c, r in zip(batch, results, strict=False) if isinstance(r, NoScriptError)
            ]
            if missing:  # Redis lost its scripts (a restart, SCRIPT FLUSH): load them, once
                await self._load_scripts()
                again = await self._send(missing, waits)
                for call, result in zip(missing, again, strict=False):
                    results[batch.index(call)] = result
        except Exception as exc:
            failure = StoreFailed(f"redis at {self.target.name} failed: {_reason(exc)}")
            for call in batch:
                call.finish(error=failure)
            return
        if waits:
            acked = results[len(batch)]
            if isinstance(acked, Exception) or int(acked) < self.target.replicas:
                replicas = self.target.replicas
                failure = StoreFailed(
                    f"only {acked} of {replicas} replicas confirmed the change within "
                    f"{REPLICA_TIMEOUT_MS} ms: it may be lost in a failover (?replicas={replicas})"
                )
                for call in batch:
                    if call.change:
                        call.finish(error=failure)
        for call, result in zip(batch, results, strict=False):
            if call.future.done():
                continue
            if isinstance(result, Exception):
                call.finish(
                    error=StoreFailed(f"redis at {self.target.name} failed: {_reason(result)}")
                )
            else:
                call.finish(result=result)

    async def _send(self, batch: list[_Call], waits: bool) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for call in batch:
            pipe.execute_command(*call.command)
        if waits:  # WAIT counts every write before it on the pipeline's one connection
            pipe.execute_command("WAIT", self.target.replicas, REPLICA_TIMEOUT_MS)
        results: list[Any] = await pipe.execute(raise_on_error=False)
        return results

    async def _run_replicated(self, script: str, keys: list[str], args: tuple[object, ...]) -> Any:
        """On a cluster: the script, then ``WAIT`` for the replicas on the same connection.

        It sends the script's text (``EVAL``): one round trip, and no
        ``NOSCRIPT`` to recover from on a primary that never ran it (a promoted
        replica has no scripts: Redis does not replicate its script cache).
        One Redis takes the pipeline's path instead, with one WAIT a batch.
        """
        replicas = self.target.replicas
        # each change takes a connection of its own here (WAIT counts its writes): at most
        # REPLICATED_IN_FLIGHT at once, so a burst waits for one rather than being refused
        assert self._replicated is not None, "open() makes it"
        async with self._replicated:
            answer, acked = await self._on_primary(self._scripts[script], keys, args)
        if answer[0] == b"ok" and int(acked) < replicas:
            raise StoreFailed(
                f"only {acked} of {replicas} replicas confirmed the change within "
                f"{REPLICA_TIMEOUT_MS} ms: it may be lost in a failover (?replicas={replicas})"
            )
        return answer

    async def _on_primary(
        self, script: Any, keys: list[str], args: tuple[object, ...]
    ) -> tuple[Any, Any]:
        """``_on_node`` on the primary of the session's slot, as the cluster's table says.

        This path goes around the cluster client, so it refreshes the table itself:
        after a broken link, a refused write or a cluster that is down (a failover)
        the table is read again before the error is raised, so the next change goes
        to the new primary; a MOVED, which ran nothing, is tried once more at once.
        """
        from redis.exceptions import (
            AskError,
            ClusterDownError,
            MovedError,
            ReadOnlyError,
            ResponseError,
            TryAgainError,
        )

        for attempt in (1, 2):
            try:
                node = self.client.get_node_from_key(keys[0])
                return await _on_node(node, script, keys, args, self.target.replicas)
            except MovedError:
                await self._refresh()
                if attempt == 2:
                    raise
            except (AskError, ClusterDownError, ReadOnlyError, TryAgainError):
                await self._refresh()
                raise
            except ResponseError:
                raise  # the script's own refusal (a missing permission, out of memory)
            except Exception:
                await self._refresh()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _refresh(self) -> None:
        """Read the cluster's slot table again (best effort: it may be down)."""
        try:
            await self.client.nodes_manager.initialize()
        except Exception as exc:
            log.debug("refreshing the cluster's slots: %s", _reason(exc))

    # -- the operations -------------------------------------------------------------

    async def record(
        self, session_id: str, handler: str, text: str, handled: bool, ts: str, key: str | None
    ) -> Recorded:
        seq, duplicate = await self._run(
            "RECORD",
            session_id,
            handler,
            text,
            "1" if handled else "0",
            ts,
            key or "",
            MAX_KEYS,
            self.origin,
            change=True,
        )
        return Recorded(int(seq), duplicate=bool(duplicate))

    async def read(
        self, session_id: str, mode: str, start: str | int, max: int | None, touch: bool
    ) -> Batch:
        """``mode`` "after" (``start`` a seq), "cursor" or "poll" (``start`` a cursor's name)."""
        change = mode == "poll" or (mode == "cursor" and touch)
        next, lost, entries = await self._run(
            "READ",
            session_id,
            mode,
            start,
            "" if max is None else max,
            "1" if touch else "0",
            MAX_CURSORS,
            change=change,
        )
        return Batch(int(next), int(lost), [_firing(entry) for entry in entries])

    async def ack(self, session_id: str, cursor: str, seq: int) -> int:
        (moved,) = await self._run("ACK", session_id, cursor, seq, MAX_CURSORS, change=True)
        return int(moved)

    async def check_ack(self, session_id: str, seq: int) -> None:
        await self._run("CHECK_ACK", session_id, seq, change=False)

    async def set_limit(self, session_id: str, limit: int) -> int:
        (trimmed,) = await self._run("SET_LIMIT", session_id, limit, change=True)
        return int(trimmed)

    async def describe(self, session_id: str) -> tuple[Summary, list[CursorInfo]]:
        """The session's figures and its cursor table (most recently used first)."""
        head, limit, evals, retained, flat = await self._run("DESCRIBE", session_id, change=False)
        rows = []
        for i in range(0, len(flat), 2):
            seq, _, use = flat[i + 1].decode().partition(":")
            rows.append((int(use), flat[i].decode(), int(seq)))
        rows.sort(reverse=True)
        head = int(head)
        cursors = [CursorInfo(name, seq, max(0, head - seq)) for _, name, seq in rows]
        summary = Summary(
            id=session_id,
            head=head,
            retained=int(retained),
            limit=int(limit),
            cursors=len(cursors),
            recorded=head,
            lost=head - int(retained),
            evaluations=int(evals or 0),
        )
        return summary, cursors

    async def start(self, session_id: str, limit: int) -> bool:
        """Create the session; False when it exists already."""
        (created,) = await self._run("START", session_id, limit, change=True)
        return bool(created)

    async def stop(self, session_id: str) -> None:
        await self._run("STOP", session_id, self.origin, change=True)

    async def exists(self, session_id: str) -> bool:
        try:
            return bool(await self.client.exists(session_keys(session_id)[0]))
        except Exception as exc:
            raise StoreFailed(f"redis at {self.target.name} failed: {_reason(exc)}") from None

    async def ids(self) -> list[str]:
        """Every session's id: a scan of every primary for ``repl:{*}:meta`` keys.

        The keys themselves are the listing, so no crash can leave a session
        listed that is not there, or hide one that is.
        """
        found = set()
        try:
            async for raw in self.client.scan_iter(match="repl:{*}:meta", count=1000):
                key = raw.decode()
                found.add(key[len("repl:{") : -len("}:meta")])
        except Exception as exc:
            raise StoreFailed(f"redis at {self.target.name} failed: {_reason(exc)}") from None
        return sorted(found)


async def _on_node(
    node: Any, script: Any, keys: list[str], args: tuple[object, ...], replicas: int
) -> tuple[Any, Any]:
    """The script and ``WAIT`` on one connection of a cluster node.

    ``WAIT`` counts the writes of its own connection, so both must go on
    the one connection: a cluster client would route a keyless WAIT anywhere.
    """
    from redis.exceptions import ResponseError

    connection = node.acquire_connection()
    try:
        await connection.connect()
        await connection.send_packed_command(
            connection.pack_commands(
                [
                    ("EVAL", script.script, len(keys), *keys, *args),
                    ("WAIT", replicas, REPLICA_TIMEOUT_MS),
                ]
            )
        )
        replies = []
        for _ in range(2):
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:  # an error reply (MOVED too) is a reply
                replies.append(exc)
            except BaseException:  # a broken link or a cancel: the replies are unread
                await connection.disconnect(nowait=True)  # does not yield, even cancelled
                raise
        answer, acked = replies
        if isinstance(answer, Exception):
            raise answer
        return answer, acked
    finally:
        node.release(connection)


def _firing(entry: Any) -> Firing:
    raw_id, fields = entry  # from a script the fields are flat; redis-py's XRANGE makes a dict
    seq = int(raw_id.split(b"-", 1)[0])
    values = (
        fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=True))
    )
    result = values.get(b"r")
    event = values.get(b"e")
    return Firing(
        seq,
        values[b"h"].decode(),
        None if result is None else result.decode(),
        None if event is None else event.decode(),
        values[b"t"].decode(),
    )


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


class _Subscriber:
    """One subscriber connection to one node, read by one task: no polling.

    redis-py's own reconnect is off on this connection: after a broken link
    the subscriptions must be made again *and confirmed* before waiters read
    again, or a firing in between would wake nobody, so ``Wakes`` does that.
    Subscribing and unsubscribing go out in order under one lock, and an
    unsubscribe that finds its channel wanted again by then sends nothing.
    """

    def __init__(self, host: str, port: int, options: dict[str, Any]) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.name = f"{host}:{port}"
        self.client = aioredis.Redis(
            host=host, port=port, socket_timeout=None, retry=Retry(NoBackoff(), 0), **options
        )
        self.pubsub = self.client.pubsub()
        #: the channels this connection should hold
        self.channels: set[str] = set()
        self.confirmed: dict[str, anyio.Event] = {}
        #: channels with our own SUNSUBSCRIBE on its way (its echo is no slot move)
        self.leaving: set[str] = set()
        self.lock = anyio.Lock()
        self.reading = False

    async def send_subscribe(self, channel: str) -> anyio.Event:
        """Ask for ``channel``; the event is set once the node confirmed it."""
        self.channels.add(channel)
        confirmed = self.confirmed.get(channel)
        if confirmed is not None:
            return confirmed  # subscribed already, or on its way
        confirmed = self.confirmed[channel] = anyio.Event()
        async with self.lock:
            await self.pubsub.ssubscribe(channel)  # sends only: the reader sees the answer
        return confirmed

    async def unsubscribe(self, channel: str) -> None:
        async with self.lock:
            if channel in self.channels:
                return  # wanted again meanwhile
            self.confirmed.pop(channel, None)
            self.leaving.add(channel)
            await self.pubsub.sunsubscribe(channel)

    async def read(self, on_message: Callable[[str, bytes], None]) -> None:
        """Hand every message to ``on_message`` until the link breaks (then raise)."""
        while True:
            message = await self.pubsub.get_message(timeout=None)
            if message is None:
                continue
            kind = _text(message["type"])
            channel = _text(message["channel"])
            if kind == "smessage":
                on_message(channel, message["data"])
            elif kind == "ssubscribe":
                event = self.confirmed.get(channel)
                if event is not None:
                    event.set()
            elif kind == "sunsubscribe":
                if channel in self.leaving:
                    self.leaving.discard(channel)
                elif channel in self.channels:
                    # the node gave the channel's slot away (a resharding, a failover)
                    raise ConnectionError(f"{self.name} dropped {channel}: its slot moved")

    async def close(self) -> None:
        try:
            await self.pubsub.aclose()  # type: ignore[no-untyped-call]
            await self.client.aclose()
        except Exception as exc:
            log.debug("closing a subscriber: %s", exc)


class Wakes:
    """This daemon's subscriptions to the wake channels of the sessions it has waiters on.

    ``on_wake(session_id, payload)`` gets each message; ``on_restored()`` is
    called once every subscription of a broken link is made again (on the
    node that holds its slot now) and confirmed, and those nodes serve reads,
    so that every waiter reads again (a firing recorded while the link was
    down woke nobody). A broken link is never an error for a waiter: it goes
    on waiting, and reads again once the link is back.
    """

    def __init__(
        self,
        store: RedisStore,
        on_wake: Callable[[str, bytes], None],
        on_restored: Callable[[], None],
    ) -> None:
        self.store = store
        self.on_wake = on_wake
        self.on_restored = on_restored
        self.subscribers: dict[str, _Subscriber] = {}
        #: the sessions whose wakes this daemon wants (it has waiters on them)
        self.wanted: set[str] = set()
        #: sessions no waiter wants, still subscribed for ``LINGER`` seconds
        self.lingering: set[str] = set()
        self._tg: Any = None
        #: a repair is running; a link broke since the repair's last round began
        self._repairing = False
        self._broken = False

    async def run(self) -> None:
        """Hold the readers' task group until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                await anyio.sleep_forever()
            finally:
                self._tg = None
                with anyio.CancelScope(shield=True):
                    for subscriber in list(self.subscribers.values()):
                        await subscriber.close()
                self.subscribers.clear()

    def _node_for(self, channel: str) -> tuple[str, int]:
        if self.store.target.cluster:
            node = self.store.client.get_node_from_key(channel)
            return node.host, node.port
        return self.store.target.nodes[0]

    def _subscriber(self, host: str, port: int) -> _Subscriber:
        name = f"{host}:{port}"
        subscriber = self.subscribers.get(name)
        if subscriber is None:
            _, options = self.store.subscriber_options()
            subscriber = self.subscribers[name] = _Subscriber(host, port, options)
        return subscriber

    async def _subscribe(self, channel: str) -> None:
        subscriber = self._subscriber(*self._node_for(channel))
        try:
            confirmed = await subscriber.send_subscribe(channel)
            self._start_reading(subscriber)
            with anyio.fail_after(SUBSCRIBE_TIMEOUT):
                await confirmed.wait()
        except Exception:
            # a link that cannot subscribe is broken: the next attempt makes a new one
            # (and its reader, if it had one, repairs the channels it held)
            await self._drop(subscriber)
            raise

    async def _drop(self, subscriber: _Subscriber) -> None:
        if self.subscribers.get(subscriber.name) is subscriber:
            del self.subscribers[subscriber.name]
        await subscriber.close()

    async def subscribe(self, session_id: str) -> None:
        """Subscribe to the session's wakes; returns once Redis confirmed it."""
        self.wanted.add(session_id)
        try:
            await self._subscribe(wake_channel(session_id))
        except Exception as exc:
            self.unsubscribe(session_id)
            reason = "no answer" if isinstance(exc, TimeoutError) else _reason(exc)
            raise StoreFailed(
                f"cannot subscribe to the wakes of {session_id!r} on Redis: {reason}"
            ) from None

    def unsubscribe(self, session_id: str, linger: float | None = None) -> None:
        """The session's last waiter here left: unsubscribe, after ``linger`` seconds."""
        linger = LINGER if linger is None else linger
        self.wanted.discard(session_id)
        if self._tg is None:
            return
        if linger > 0:
            if session_id not in self.lingering:
                self.lingering.add(session_id)
                self._tg.start_soon(self._linger, session_id, linger)
            return
        channel = wake_channel(session_id)
        for subscriber in self.subscribers.values():
            if channel in subscriber.channels:
                subscriber.channels.discard(channel)
                self._tg.start_soon(self._quietly, subscriber.unsubscribe(channel))

    async def _linger(self, session_id: str, linger: float) -> None:
        await anyio.sleep(linger)
        self.lingering.discard(session_id)
        if session_id not in self.wanted:
            self.unsubscribe(session_id, linger=0)

    async def _quietly(self, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:  # the reader sees a broken link and repairs it
            log.debug("unsubscribing: %s", exc)

    def _start_reading(self, subscriber: _Subscriber) -> None:
        if subscriber.reading or self._tg is None:
            return
        subscriber.reading = True
        self._tg.start_soon(self._read, subscriber)

    async def _read(self, subscriber: _Subscriber) -> None:
        try:
            await subscriber.read(self._message)
        except Exception as exc:
            log.warning("redis wake link %s lost: %s", subscriber.name, _reason(exc))
        subscriber.reading = False
        await self._drop(subscriber)
        await self._repair()

    def _message(self, channel: str, data: bytes) -> None:
        session_id = channel_session(channel)
        if session_id is not None:
            self.on_wake(session_id, data)

    async def _repair(self) -> None:
        """Subscribe every wanted session again wherever its slot now lives, then wake all.

        One repair runs at a time: a link that breaks while one runs makes it go
        round once more, so waiters are woken once every link is back, not once a
        link. Until then they sleep on: a broken link is no error for a waiter.
        """
        self._broken = True
        if self._repairing:
            return
        self._repairing = True
        delay = 0.05
        try:
            while self._broken:
                self._broken = False
                try:
                    if self.store.target.cluster:
                        await self.store.client.nodes_manager.initialize()
                    for session_id in sorted(self.wanted):
                        await self._subscribe(wake_channel(session_id))
                    await self._serving()
                except Exception as exc:
                    self._broken = True
                    log.info("redis wakes not back yet (%s); trying again", _reason(exc))
                    await anyio.sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            self._repairing = False
        log.info("redis wake link is back")
        self.on_restored()

    async def _serving(self) -> None:
        """One read of a session key on each node the waiters' sessions live on.

        A node takes subscriptions before it serves keys (a cluster that is not
        yet ``ok`` after a restart or a failover still takes SSUBSCRIBE; a Redis
        loading its data too): the waiters read only once their reads can work,
        so a repair does not turn into a ``store_failed`` for each of them.
        """
        nodes: dict[tuple[str, int], str] = {}
        for session_id in sorted(self.wanted):
            nodes.setdefault(self._node_for(wake_channel(session_id)), session_id)
        for session_id in nodes.values():
            await self.store.exists(session_id)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
