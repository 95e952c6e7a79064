"""``repl mcp --follow``: new firings pushed to the agent, one notification a firing (M4).

The server follows each session given with ``--follow``, without polling: the
daemon's wait, first after the follow cursor (``--cursor``, default ``mcp``),
then after the last seq this MCP session has read (``after``, which touches
no cursor), riding out a restart of the daemon. Each firing it finds is told
to the client as its own notification, in seq order:

- ``notifications/claude/channel``, the agent-channel notification Claude Code
  reads, on a connection of the ``initialize`` era (one that made the
  handshake); ``channel_params`` says what it holds, its ``meta`` keys made
  by ``meta_key`` so that every one matches Claude Code's filter and no two
  tags share one;
- ``notifications/resources/updated`` for ``repl://sessions/{id}`` to a client
  that subscribed to it (``resources/subscribe``), and on each
  ``subscriptions/listen`` stream that asked for it (``Listen``: the
  2026-07-28 protocol's only path, and the one way such a client is told).

**No acknowledgement without a path** (rule M5): a firing counts as told only
once a notification carrying it was written on a path the client reads: a
channel notification after the handshake, an update to a subscriber, an
update on an open listen stream. While there is none (a client of the
2026-07-28 protocol with no listen stream open, say) the follow waits for
one and moves nothing.

**Who acknowledges** (``Ack``, rule M6):

- ``agent`` (the default): nothing pushed is acknowledged by the server. The
  agent acknowledges with the ``ack`` tool (on a following server its cursor
  defaults to the follow cursor) or by a ``reply`` to a pushed firing; what it
  did not acknowledge is pushed again by the next MCP session (a harness
  restarted, a new conversation). Claude Code has no delivery receipt for a
  channel event, and one that arrives while the model is busy waits for a
  next turn that may never come: taken out of the pipe is not seen.
- ``pipe``: the receipt of rule S9, for a harness that hands on every line it
  reads: a firing is acknowledged once its notification was taken (out of the
  pipe; handed to the GET stream over HTTP) and the client then stayed
  connected ``HOLD_S`` seconds more, on the path it was told on. A health
  check (``claude mcp list``: connect, list, hang up) leaves sooner and
  consumes nothing.

``--allow-from`` is the gate: a firing whose sender (``Firing.by``) is not
named is pushed to nobody, and acknowledged as soon as everything told before
it is (a firing of no known sender, stored before senders were recorded,
passes no gate).

What must not live here: the tools, and the resources a client reads
(``repl_cli.mcp.server``); a transport (stdio's is ``repl_cli.mcp.stdio``,
HTTP's ``repl_cli.mcp.http``), which this module meets only as an ``Outlet``.
"""

from __future__ import annotations

import enum
import logging
import re
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import (
    SUBSCRIPTION_ID_META_KEY,
    ResourceUpdated,
    event_to_notification,
)
from mcp.types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    EmptyResult,
    NotificationParams,
    SubscribeRequestParams,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    UnsubscribeRequestParams,
)

from repl_cli.api import aio
from repl_cli.api.errors import Error, Unavailable
from repl_cli.api.reconnect import DEFAULT_RECONNECT, FIRST_PAUSE, MAX_PAUSE
from repl_daemon import protocol as p
from session.firing import Firing

log = logging.getLogger("repl.mcp")

#: the cursor a following server reads after, and the agent acknowledges on
MCP_CURSOR = "mcp"
#: the experimental capability a channel server declares, and its notification
CHANNEL = "claude/channel"
CHANNEL_METHOD = "notifications/claude/channel"
UPDATED_METHOD = "notifications/resources/updated"
#: a session as a resource; the template the server publishes for them
SESSION_URI = "repl://sessions/"
SESSION_TEMPLATE = SESSION_URI + "{id}"

#: how long a client must stay connected after taking a push before ``--ack pipe``
#: acknowledges it: a health check connects, lists and hangs up sooner
HOLD_S = 2.0


class Ack(enum.StrEnum):
    """Who acknowledges what a following server pushed (``--ack``)."""

    #: the agent, with the ``ack`` tool or a ``reply`` (the default)
    AGENT = "agent"
    #: the server, once the client took the push and stayed ``HOLD_S`` seconds
    PIPE = "pipe"


def session_uri(session: str) -> str:
    return SESSION_URI + session


def session_of(uri: str) -> str | None:
    """The session a ``repl://sessions/{id}`` URI names; None for any other URI."""
    if not uri.startswith(SESSION_URI):
        return None
    session = uri.removeprefix(SESSION_URI)
    return session if session and "/" not in session else None


def text_of(firing: Firing) -> str:
    """What a firing says: its result, or the raw event of an unhandled one."""
    if firing.result is not None or firing.event is None:
        return firing.result or ""
    return firing.event


def allowed(firing: Firing, allow_from: frozenset[str] | None) -> bool:
    """Whether the gate lets ``firing`` through: no gate, or its sender is named in it."""
    return allow_from is None or (firing.by is not None and firing.by in allow_from)


# -- a firing's meta ---------------------------------------------------------------

#: what Claude Code keeps of a channel notification's meta: any other key is dropped
META_KEY = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: a tag's meta key starts so: a tag can never stand in for the firing's own keys, and a
#: key that starts with a digit (``2fa``) still starts with a letter
TAG_PREFIX = "tag_"
#: how a tag key's characters other than ``a-z0-9`` are written: ``-`` as ``_`` (the
#: common one reads as it is: ``reply-to`` is ``tag_reply_to``), and ``.`` and ``_`` as
#: their hex code between underscores, in capitals, which no tag key holds (tag keys
#: are ``[a-z0-9][a-z0-9._-]*``), so the mapping can be read back (``tag_of``)
_WRITTEN = {"-": "_", ".": "_2E_", "_": "_5F_"}
_READ = {"2E_": ".", "5F_": "_"}


def meta_key(tag: str) -> str:
    """A tag's key as a meta key: ``tag_`` and the key, ``-`` written ``_``, ``.`` and
    ``_`` written ``_2E_`` and ``_5F_`` (``reply-to`` is ``tag_reply_to``, ``a.b``
    ``tag_a_2E_b``, ``a_b`` ``tag_a_5F_b``, ``2fa`` ``tag_2fa``)."""
    return TAG_PREFIX + "".join(_WRITTEN.get(c, c) for c in tag)


def tag_of(key: str) -> str | None:
    """The tag key ``meta_key`` wrote as ``key``; None for a key that is no tag's."""
    if not key.startswith(TAG_PREFIX):
        return None
    written, out, i = key.removeprefix(TAG_PREFIX), [], 0
    while i < len(written):
        c = written[i]
        if c == "_":
            escaped = _READ.get(written[i + 1 : i + 4])
            if escaped is not None:
                out.append(escaped)
                i += 4
                continue
            c = "-"
        out.append(c)
        i += 1
    return "".join(out)


def channel_params(session: str, firing: Firing, lost: int = 0) -> dict[str, Any]:
    """The params of ``notifications/claude/channel`` for one firing of ``session``.

    ``content`` is its text. ``meta`` (string values: Claude Code shows them as the
    attributes of ``<channel source="repl" ...>``) holds ``session``, ``seq`` (what the
    agent acknowledges, and replies to), ``handler``, ``ts``, ``by`` (left out when the
    sender is not known), ``lost`` when the ring dropped firings before this one could
    be told, and each tag under ``meta_key``.
    """
    meta = {meta_key(key): value for key, value in firing.tags.items()}
    meta.update(session=session, seq=str(firing.seq), handler=firing.handler, ts=firing.ts)
    if firing.by is not None:
        meta["by"] = firing.by
    if lost:
        meta["lost"] = str(lost)
    return {"content": text_of(firing), "meta": meta}


def lost_params(session: str, lost: int, upto: int) -> dict[str, Any]:
    """The params of the notification that tells of a loss with no firing after it:
    ``seq`` is what acknowledges the loss."""
    content = f"({lost} firings of session {session} were dropped before they could be read)"
    return {"content": content, "meta": {"session": session, "seq": str(upto), "lost": str(lost)}}


# -- where notifications go ------------------------------------------------------

#: a path a notification was written on, asked after the hold whether the client still
#: has it (awaited: an HTTP GET stream cut under it is waited for a while, in case the
#: client resumes it)
Held = Callable[[], Awaitable[bool]]


class Outlet(Protocol):
    """Where a client's notifications go (stdio: ``repl_cli.mcp.stdio.Pipe``; HTTP: a
    session's GET stream)."""

    async def notify(self, method: str, params: dict[str, Any]) -> Held | None:
        """Send one notification; once the client has it, as far as the transport can
        tell, what says later whether the path it went on stayed open; None when the
        client is gone (it may not have it)."""
        ...


class _Delivery:
    """One update on its way down a listen stream: ``done`` is set once it was written
    (``written``) or the stream ended without writing it."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.done = anyio.Event()
        self.written = False


class _Stream(NamedTuple):
    uris: frozenset[str]
    send: MemoryObjectSendStream[_Delivery]
    open: list[bool]  # one flag, shared with the handler that writes the stream


class Listen:
    """Serves ``subscriptions/listen`` (the SDK's ``ListenHandler``, which tells nobody
    whether an event was written): the acknowledgement first, then one
    ``resources/updated`` for each update of a URI the stream asked for, written by the
    stream's own request; ``updated`` says when it was written, and on which stream."""

    #: the streams one server keeps open at once, and the updates one may have queued
    MAX_STREAMS = 64
    MAX_QUEUED = 1024

    def __init__(self, opened: Callable[[], None]) -> None:
        self.streams: list[_Stream] = []
        self.opened = opened

    async def __call__(
        self, ctx: ServerRequestContext[Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        rid = ctx.request_id
        if rid is None:  # pragma: no cover - the SDK gives every request its id
            raise MCPError(INVALID_REQUEST, "repl: subscriptions/listen needs a request id")
        if len(self.streams) >= self.MAX_STREAMS:
            raise MCPError(INTERNAL_ERROR, f"repl: at most {self.MAX_STREAMS} listen streams")
        uris = frozenset(params.notifications.resource_subscriptions or ())
        honored = SubscriptionFilter(resource_subscriptions=sorted(uris) or None)
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: rid}
        send, receive = anyio.create_memory_object_stream[_Delivery](self.MAX_QUEUED)
        stream = _Stream(uris, send, [True])
        acknowledged = SubscriptionsAcknowledgedNotificationParams(
            notifications=honored, _meta=meta
        )
        await ctx.session.send_notification(
            SubscriptionsAcknowledgedNotification(params=acknowledged), related_request_id=rid
        )
        self.streams.append(stream)
        self.opened()
        current: _Delivery | None = None
        try:
            async for current in receive:
                notification = event_to_notification(ResourceUpdated(current.uri), meta)
                await ctx.session.send_notification(notification, related_request_id=rid)
                current.written = True
                current.done.set()
        finally:
            stream.open[0] = False
            self.streams.remove(stream)
            send.close()
            if current is not None:
                current.done.set()
            while True:  # what was never written: its waiters are told
                try:
                    receive.receive_nowait().done.set()
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            receive.close()
        return SubscriptionsListenResult(_meta=meta)

    async def updated(self, uri: str) -> Held | None:
        """``uri`` updated, on every open stream that asked for it; once one wrote it, a
        ``Held`` for that stream; None when no open stream asked for it (or none wrote it)."""
        deliveries: list[tuple[_Delivery, _Stream]] = []
        for stream in self.streams:
            if uri in stream.uris:
                delivery = _Delivery(uri)
                try:
                    stream.send.send_nowait(delivery)
                except anyio.WouldBlock:
                    continue  # a stream that does not drain is no path
                deliveries.append((delivery, stream))
        held: Held | None = None
        for delivery, stream in deliveries:
            await delivery.done.wait()
            if delivery.written and held is None:
                held = _open_flag(stream.open)
        return held


def _open_flag(flag: list[bool]) -> Held:
    async def held() -> bool:
        return flag[0]

    return held


# -- acknowledging ---------------------------------------------------------------

#: ``ack(session, seq)``: the follow cursor moved to ``seq`` in the daemon
Acknowledge = Callable[[str, int], Awaitable[None]]


class _Due(NamedTuple):
    seq: int
    at: float
    held: tuple[Held, ...]


class _PipeAcks:
    """``--ack pipe``'s receipts of one session: each batch told is acknowledged
    ``HOLD_S`` after it was taken, in order, if every path it went on is still open
    then; a batch whose path closed first stops this MCP session's acknowledgements
    (what was told after it could move the cursor past it)."""

    def __init__(self, session: str, acknowledge: Acknowledge, hold: float) -> None:
        self.session = session
        self.acknowledge = acknowledge
        self.hold = hold
        self.due: deque[_Due] = deque()
        self.added = anyio.Event()
        self.broken = False

    def add(self, seq: int, held: Sequence[Held]) -> None:
        now = anyio.current_time()
        at = now + self.hold if held else max(now, self.due[-1].at if self.due else now)
        self.due.append(_Due(seq, at, tuple(held)))
        self.added.set()

    async def run(self) -> None:
        while not self.broken:
            if not self.due:
                self.added = anyio.Event()
                await self.added.wait()
                continue
            first = self.due[0]
            await anyio.sleep_until(first.at)
            self.due.popleft()
            if not all([await held() for held in first.held]):
                log.warning(
                    "following %s: the client left within %g s of a push: nothing more is "
                    "acknowledged by this server",
                    self.session,
                    self.hold,
                )
                self.broken = True
                return
            try:
                await self.acknowledge(self.session, first.seq)
            except Error as exc:  # the next one covers it (a cursor never moves back)
                log.warning("acknowledging %s up to %d: %s", self.session, first.seq, exc.message)


# -- following -------------------------------------------------------------------


class Push:
    """The sessions followed, the gate, who acknowledges, and the client's paths: the
    handshake (channel notifications, and updates of what it subscribed to) and its
    listen streams (``listen``)."""

    def __init__(
        self,
        sessions: Sequence[str],
        cursor: str,
        allow_from: frozenset[str] | None,
        connect: Callable[[float], aio.AsyncRepl],
        acknowledge: Acknowledge,
        ack: Ack = Ack.AGENT,
        hold: float = HOLD_S,
    ) -> None:
        self.sessions = tuple(sessions)
        self.cursor = cursor
        self.allow_from = allow_from
        self.connect = connect
        self.acknowledge = acknowledge
        self.ack = ack
        self.hold = hold
        self.listen = Listen(self._path_opened)
        #: set (and made anew) each time a path opens: the handshake, a listen stream
        self.paths_opened = anyio.Event()
        #: the client made the handshake (the ``initialize`` era): channel notifications
        self.channel = False
        #: the URIs it subscribed to (``resources/subscribe``, handshake era)
        self.subscribed: set[str] = set()
        #: per session: the last seq read (what the next wait is after), the last seq told
        #: to the client, and the highest the agent acknowledged through this server
        self.read: dict[str, int] = {}
        self.told: dict[str, int] = {}
        self.agent_acked: dict[str, int] = {}
        self.pipe_acks: dict[str, _PipeAcks] = {}

    def install(self, server: LowLevelServer[Any]) -> None:
        """Serve the paths on ``server``: be told of the handshake, serve subscriptions
        and listen streams."""
        server.add_notification_handler(
            "notifications/initialized", NotificationParams, self._initialized
        )
        server.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        server.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe
        )
        server.add_request_handler(
            "subscriptions/listen", SubscriptionsListenRequestParams, self.listen
        )

    # -- the client's side -----------------------------------------------------

    def opened(self) -> None:
        """The client made its handshake: channel notifications reach it from now on."""
        self.channel = True
        self._path_opened()

    def _path_opened(self) -> None:
        self.paths_opened.set()
        self.paths_opened = anyio.Event()

    async def _initialized(self, ctx: ServerRequestContext[Any], params: Any) -> None:
        self.opened()

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        self.subscribed.add(self.followed(params.uri))
        return EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        self.subscribed.discard(params.uri)
        return EmptyResult()

    def followed(self, uri: str) -> str:
        """``uri``, when it is one of the sessions followed (only their updates are
        pushed); a JSON-RPC error that says which are, when it is not."""
        session = session_of(uri)
        if session is None:
            raise MCPError(INVALID_PARAMS, f"repl: {uri} is not a session (repl://sessions/ID)")
        if session not in self.sessions:
            raise MCPError(
                INVALID_PARAMS,
                f"repl: session {session!r} is not followed by this server, which pushes "
                f"the updates of {', '.join(self.sessions)} only; read {uri} to see it",
            )
        return uri

    # -- the agent's acknowledgements -------------------------------------------

    async def agent_acknowledged(self, session: str, seq: int) -> None:
        """The agent acknowledged ``session`` up to ``seq`` on the follow cursor: when that
        covers everything told, what the gate kept back since is acknowledged too."""
        if session not in self.read:
            return
        acked = self.agent_acked[session] = max(self.agent_acked.get(session, 0), seq)
        behind = self.read[session]
        if acked >= self.told.get(session, 0) and behind > acked:
            await self._acknowledge(session, behind)

    def replied_to(self, session: str, seq: int) -> int | None:
        """What a ``reply`` to firing ``seq`` of ``session`` acknowledges in ``--ack
        agent``: up to ``seq``, or up to what was told when ``seq`` is beyond it (the
        agent read it elsewhere: what was not told yet must still be); None when the
        session is not followed here or the agent does not acknowledge."""
        if self.ack is not Ack.AGENT or session not in self.sessions:
            return None
        return min(seq, self.told.get(session, 0))

    async def _acknowledge(self, session: str, seq: int) -> None:
        try:
            await self.acknowledge(session, seq)
        except Error as exc:
            log.warning("acknowledging %s up to %d: %s", session, seq, exc.message)

    # -- following -----------------------------------------------------------

    async def run(self, outlet: Outlet) -> None:
        """Follow every session, until cancelled (the client gone)."""
        async with anyio.create_task_group() as tg:
            for session in self.sessions:
                if self.ack is Ack.PIPE:
                    acks = self.pipe_acks[session] = _PipeAcks(session, self.acknowledge, self.hold)
                    tg.start_soon(acks.run)
                tg.start_soon(self.follow, session, outlet)

    async def follow(self, session: str, outlet: Outlet) -> None:
        """Tell each firing of ``session`` until the client is gone, or the session can no
        longer be followed (stopped, missing, forbidden: said once on stderr). A daemon
        that stays away longer than the API rides out is tried again, and so is one that
        was not there at first; each time the follow goes on from what it read."""
        tries = 0
        while True:
            try:
                async with self.connect(DEFAULT_RECONNECT) as repl:
                    while True:
                        after = self.read.get(session)
                        if after is None:  # the first look: after the cursor, moving nothing
                            woken = await repl.wait(session, cursor=self.cursor)
                        else:
                            woken = await repl.wait(session, after=after)
                        for batch in woken.batches:
                            tries = 0
                            if not await self.deliver(batch, outlet):
                                return  # the client is gone: what it did not take stays
            except Unavailable as exc:
                if not tries:
                    log.warning("following %s: %s; trying again", session, exc.message)
                await anyio.sleep(min(FIRST_PAUSE * 2**tries, MAX_PAUSE))
                tries += 1
            except Error as exc:
                log.error("following %s stopped: %s", session, exc.message)
                return

    async def deliver(self, batch: p.SessionBatch, outlet: Outlet) -> bool:
        """Tell one batch, a notification a firing; False when the client is gone."""
        session = batch.session
        shown = [f for f in batch.firings if allowed(f, self.allow_from)]
        told: list[Held] = []
        if not shown and batch.lost:
            held = await self.tell(session, lost_params(session, batch.lost, batch.next), outlet)
            if held is None:
                return False
            told.append(held)
        for i, firing in enumerate(shown):
            lost = batch.lost if i == 0 else 0
            held = await self.tell(session, channel_params(session, firing, lost), outlet)
            if held is None:
                return False
            told.append(held)
            self.told[session] = firing.seq
        if not shown and batch.lost:
            self.told[session] = batch.next
        self.read[session] = batch.next
        if self.ack is Ack.PIPE:
            self.pipe_acks[session].add(batch.next, told)
        elif not told and self.agent_acked.get(session, 0) >= self.told.get(session, 0):
            await self._acknowledge(session, batch.next)  # kept back, with nothing before it
        return True

    async def tell(self, session: str, params: dict[str, Any], outlet: Outlet) -> Held | None:
        """One notification on the client's paths, once there is one: the channel after
        the handshake (and an update to a subscriber), else an update on a listen stream
        that asked for the session. What it went on, once written; None: the client gone."""
        uri = session_uri(session)
        while True:
            opened = self.paths_opened
            if self.channel:
                held = await outlet.notify(CHANNEL_METHOD, params)
                if held is not None and uri in self.subscribed:
                    await outlet.notify(UPDATED_METHOD, {"uri": uri})
                await self.listen.updated(uri)
                return held
            held = await self.listen.updated(uri)
            if held is not None:
                return held
            await opened.wait()  # no path yet: nothing is told, nothing moves
