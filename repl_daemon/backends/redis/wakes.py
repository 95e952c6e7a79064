"""The wakes: this daemon's subscriptions to the wake channels of the sessions it has
waiters on (sharded pub/sub, one subscriber connection per node, read by one task).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import anyio
import msgspec

from repl_daemon.backends.redis.entries import sender
from repl_daemon.backends.redis.keys import channel_session, wake_channel
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.backends.redis.target import reason
from session.errors import StoreFailed
from session.firing import NO_TAGS, Firing
from session.tags import Tags

_read_tags = msgspec.json.Decoder(Tags)

log = logging.getLogger("repl.daemon")

#: how long a subscription to a session's wakes may take to be confirmed
SUBSCRIBE_TIMEOUT = 2.0
#: how long a session's wakes stay subscribed after its last waiter left: a
#: monitor runs ``repl wait`` again at once, and then pays no SSUBSCRIBE
LINGER = 5.0


class Heard(NamedTuple):
    """A message on a session's wake channel."""

    #: a seq, or ``stop``
    what: str
    #: the daemon that published it
    origin: str
    #: the new firing, when the message carries it whole
    firing: Firing | None = None
    #: the session's incarnation the firing is of (``-``: a session too old to have one)
    incarnation: str = "-"


def heard(payload: bytes) -> Heard:
    """A message on a session's wake channel, as ``scripts.RECORD`` (and ``STOP``,
    ``FIRE``) publish it."""
    line, _, body = payload.partition(b"\n")
    words = line.decode().split(" ")
    if len(words) != 8:
        # SEQ ORIGIN, or stop ORIGIN: no firing; or a firing in another repl's form (the
        # 7 words before senders): heard as a bare wake, so its waiters read the ring
        return Heard(words[0], words[1] if len(words) > 1 else "")
    seq, origin, field, handler_length, ts_length, tags_length, by_length, incarnation = words
    handler_end = int(handler_length)
    ts_end = handler_end + int(ts_length)
    tags_end = ts_end + int(tags_length)
    by_end = tags_end + int(by_length)
    text = body[by_end:].decode()
    tags = body[ts_end:tags_end]
    firing = Firing(
        int(seq),
        body[:handler_end].decode(),
        text if field == "r" else None,
        None if field == "r" else text,
        body[handler_end:ts_end].decode(),
        _read_tags.decode(tags) if tags else NO_TAGS,
        sender(body[tags_end:by_end]),
    )
    return Heard(seq, origin, firing, incarnation)


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
        if confirmed is not None:  # subscribed already, or on its way
            async with self.lock:
                pass  # on its way: once it is sent, the connection is there to be read
            return confirmed
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
            await self.pubsub.aclose()
            await self.client.aclose()
        except Exception as exc:
            log.debug("closing a subscriber: %s", exc)


class Wakes:
    """This daemon's subscriptions to the wake channels of the sessions it has waiters on.

    ``on_wake(session_id, payload)`` gets each message; ``on_quiet(session_id)``
    is told when a session's subscription ends, its linger over; ``on_restored()`` is
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
        on_quiet: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.on_wake = on_wake
        self.on_restored = on_restored
        self.on_quiet = on_quiet
        self.subscribers: dict[str, _Subscriber] = {}
        #: the sessions whose wakes this daemon wants (it has waiters on them)
        self.wanted: set[str] = set()
        #: sessions no waiter wants, still subscribed for ``LINGER`` seconds
        self.lingering: set[str] = set()
        self._tg: Any = None
        #: set once ``run`` holds its task group: subscriptions can be read from then on
        self.ready = anyio.Event()
        #: a repair is running; a link broke since the repair's last round began
        self._repairing = False
        self._broken = False

    async def run(self) -> None:
        """Hold the readers' task group until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self.ready.set()
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

    def holds(self, session_id: str) -> bool:
        """Whether the session's wakes are subscribed and confirmed: if so, it is wanted now.

        The link it is on must still be read (a broken one is being
        repaired, and its waiters read again once it is back).
        """
        channel = wake_channel(session_id)
        for subscriber in self.subscribers.values():
            confirmed = subscriber.confirmed.get(channel)
            held = confirmed is not None and confirmed.is_set() and subscriber.reading
            if held and channel in subscriber.channels:
                self.wanted.add(session_id)
                return True
        return False

    async def subscribe(self, session_id: str) -> None:
        """Subscribe to the session's wakes; returns once Redis confirmed it."""
        self.wanted.add(session_id)
        try:
            await self._subscribe(wake_channel(session_id))
        except Exception as exc:
            self.unsubscribe(session_id)
            why = "no answer" if isinstance(exc, TimeoutError) else reason(exc)
            raise StoreFailed(
                f"cannot subscribe to the wakes of {session_id!r} on Redis: {why}"
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
            if self.on_quiet is not None:
                self.on_quiet(session_id)

    async def _quietly(self, work: Awaitable[None]) -> None:
        try:
            await work
        except Exception as exc:  # the reader sees a broken link and repairs it
            log.debug("unsubscribing: %s", exc)

    def _start_reading(self, subscriber: _Subscriber) -> None:
        if subscriber.reading or self._tg is None or subscriber.pubsub.connection is None:
            return  # reading, closing, or its first SSUBSCRIBE failed (its caller drops it)
        subscriber.reading = True
        self._tg.start_soon(self._read, subscriber)

    async def _read(self, subscriber: _Subscriber) -> None:
        try:
            await subscriber.read(self._message)
        except Exception as exc:
            log.warning("redis wake link %s lost: %s", subscriber.name, reason(exc))
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
                    log.info("redis wakes not back yet (%s); trying again", reason(exc))
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
