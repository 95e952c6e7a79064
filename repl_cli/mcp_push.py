"""``repl mcp --follow``: new firings pushed to the agent, acknowledged once it has them (M4).

The server follows each session given with ``--follow`` as ``repl follow`` does: the
one client API's ``follow`` (``repl_cli.aio``), which blocks in the daemon's wait (never
polls), rides out a restart of the daemon, and acknowledges a batch on the cursor
(``--cursor``, default ``mcp``) when it is asked for the next one. Each batch (a burst:
what the daemon's wait returns within its settle time) is pushed as one notification:

- ``notifications/claude/channel``, the agent-channel notification Claude Code reads,
  to a client that made the handshake (``channel_params`` says what it holds);
- ``notifications/resources/updated`` for ``repl://sessions/{id}`` to a client that
  subscribed to it (``resources/subscribe``), and the same as an event of the SDK's
  ``subscriptions/listen`` streams (the 2026-07-28 protocol's subscriptions).

Rule S9 for the MCP server: a batch is acknowledged only once its notifications were
written to stdout and taken out of the pipe by the reader (``Pipe``: the CLI's
``Sink``, whose looks at the pipe's unread bytes tell it), so a harness that dies before
reading them gets them again from the next server: duplicates, never loss. A listen
stream is the SDK's to write, and its events are level triggers ("read it again") whose
firings stay in the resource: they are published, not confirmed.

``--allow-from`` is the gate: a firing whose sender (``Firing.by``) is not named is
acknowledged unseen, pushed to nobody; a firing of no known sender (one stored before
senders were recorded) passes no gate.

What must not live here: the tools, and the resources a client reads
(``repl_cli.mcp_server``); nothing here knows a transport but ``Pipe``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
from collections.abc import Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from typing import Any, Protocol

import anyio
import msgspec
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    EmptyResult,
    NotificationParams,
    SubscribeRequestParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    UnsubscribeRequestParams,
)

from repl_cli import aio
from repl_cli._common import Unavailable
from repl_cli.errors import CliError, ReaderGone
from repl_cli.reconnect import DEFAULT_RECONNECT, FIRST_PAUSE, MAX_PAUSE
from repl_cli.sink import Sink, pauses
from repl_daemon import protocol as p
from session.firing import Firing

_encode = msgspec.json.Encoder().encode

log = logging.getLogger("repl.mcp")

#: the cursor the server acknowledges what it pushed on, unless ``--cursor`` names another
MCP_CURSOR = "mcp"
#: the experimental capability a channel server declares, and its notification
CHANNEL = "claude/channel"
CHANNEL_METHOD = "notifications/claude/channel"
UPDATED_METHOD = "notifications/resources/updated"
#: a session as a resource; the template the server publishes for them
SESSION_URI = "repl://sessions/"
SESSION_TEMPLATE = SESSION_URI + "{id}"


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


def sender(firing: Firing) -> str | None:
    """Who sent ``firing`` (``Firing.by``), None when not known."""
    return firing.by


def allowed(firing: Firing, allow_from: frozenset[str] | None) -> bool:
    """Whether the gate lets ``firing`` through: no gate, or its sender is named in it."""
    by = sender(firing)
    return allow_from is None or (by is not None and by in allow_from)


def meta_key(tag: str) -> str:
    """A tag's key as a channel attribute: ``.`` and ``-`` written ``_`` (``reply_to``)."""
    return tag.replace(".", "_").replace("-", "_")


def channel_params(session: str, firings: Sequence[Firing], lost: int) -> dict[str, Any]:
    """The params of ``notifications/claude/channel`` for one burst of ``session``.

    ``content`` is the firings' texts, one a line. ``meta`` (string values, as Claude
    Code shows them as attributes of ``<channel source="repl" ...>``) describes the
    burst's last firing: ``session``, ``seq`` (the last seq: the one acknowledged, and
    the one to ``reply`` to when the burst is one request), ``handler``, ``ts``, ``by``
    (left out when the sender is not known) and each of its tags, the key written by
    ``meta_key``; a tag cannot stand in for one of those (they are written last).
    ``first_seq`` is the first firing's seq when the burst holds more than one, and
    ``lost`` the firings the ring dropped before they could be pushed, when any (then,
    with no firing to show, the content says so).
    """
    meta: dict[str, str] = {}
    if firings:
        last = firings[-1]
        meta.update((meta_key(key), value) for key, value in last.tags.items())
        meta.update(session=session, seq=str(last.seq), handler=last.handler, ts=last.ts)
        by = sender(last)
        if by is not None:
            meta["by"] = by
        else:
            meta.pop("by", None)
        if len(firings) > 1:
            meta["first_seq"] = str(firings[0].seq)
        content = "\n".join(text_of(f) for f in firings)
    else:
        meta["session"] = session
        content = f"({lost} firings of session {session} were dropped before they could be read)"
    if lost:
        meta["lost"] = str(lost)
    return {"content": content, "meta": meta}


class Outlet(Protocol):
    """Where a client's notifications go (stdio: ``Pipe``)."""

    async def notify(self, method: str, params: dict[str, Any]) -> bool:
        """Send one notification; True once the client has it, as far as the transport
        can tell; False when the client is gone (it may not have it)."""
        ...


class Pipe(anyio.AsyncFile[str]):
    """The server's stdout, for the SDK's stdio transport and for the pushes.

    The SDK's writer writes each of its messages through ``write``; a push goes
    through ``notify``, which returns once the reader has taken it out of the pipe.
    One lock keeps them whole and in order, and a push holds it until its line is
    taken (so the pipe's unread bytes are that line's: the CLI's ``Sink`` looks at
    them). A line the pipe has room for is written at once (at most ``PIPE_BUF``
    bytes, which a pipe takes whole, into a pipe that polls writable); any other
    runs in a worker thread, as the SDK's own writes do: a full pipe blocks a
    thread, never the event loop. (Handing every line to a thread cost a push
    about 80 µs of its 400, docs/benchmarks.md.) Once the reader is gone nothing
    more is written.
    """

    def __init__(self, fd: int) -> None:
        super().__init__(os.fdopen(fd, "w", encoding="utf-8", closefd=False))
        self.sink = Sink(fd)
        self.lock = anyio.Lock()
        self.gone = False
        self._room = select.poll()
        self._room.register(fd, select.POLLOUT)

    def _fits(self, line: str) -> bool:
        """Whether ``line`` and its newline go into the pipe now without blocking."""
        return len(line) < select.PIPE_BUF // 4 and bool(self._room.poll(0))

    async def write(self, b: str) -> int:
        async with self.lock:
            await self._written(b.removesuffix("\n"))
        return len(b)

    async def flush(self) -> None:
        """Each write went to the pipe whole: nothing is buffered here."""

    async def notify(self, method: str, params: dict[str, Any]) -> bool:
        # the line JSONRPCNotification(...).model_dump_json() writes, without pydantic
        line = _encode({"jsonrpc": "2.0", "method": method, "params": params}).decode()
        async with self.lock:
            if not await self._written(line):
                return False
            for pause in pauses():
                try:
                    if self.sink.taken():
                        return True
                except ReaderGone:
                    self.gone = True
                    return False
                await anyio.sleep(pause)
        raise AssertionError("unreachable: pauses() never ends")  # pragma: no cover

    async def _written(self, line: str) -> bool:
        if self.gone:
            return False
        try:
            if self._fits(line):  # characters: at most 4 bytes each in UTF-8
                self.sink.write(line)
            else:
                await anyio.to_thread.run_sync(self.sink.write, line)
        except CliError as exc:  # the reader is gone, or stdout failed (a full disk)
            if not isinstance(exc, ReaderGone):
                log.error("%s", exc.message)
            self.gone = True
            return False
        return True


@contextmanager
def claimed_stdout() -> Iterator[Pipe]:
    """Stdout as a ``Pipe`` on a descriptor of its own, while fd 1 points at stderr: what
    anything else prints cannot reach the protocol's stream (the SDK claims fd 1 so when
    it writes stdout itself). Restored on the way out."""
    private = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)
    os.dup2(2, 1)
    try:
        yield Pipe(private)
    finally:
        os.dup2(private, 1)
        os.close(private)


class Push:
    """The sessions followed, the gate, and who hears of them: the client of the
    handshake (channel notifications, and updates of what it subscribed to) and the
    listen streams (on ``bus``)."""

    def __init__(
        self,
        sessions: Sequence[str],
        cursor: str,
        allow_from: frozenset[str] | None,
        connect: Callable[[float], aio.AsyncRepl],
        bus: SubscriptionBus,
    ) -> None:
        self.sessions = tuple(sessions)
        self.cursor = cursor
        self.allow_from = allow_from
        self.connect = connect
        self.bus = bus
        self.listen = ListenHandler(bus)
        #: a client is there to push to: it made the handshake, or opened a listen stream
        self.ready = anyio.Event()
        #: it made the handshake: channel notifications and subscriptions are its
        self.handshake = False
        #: the URIs it subscribed to
        self.subscribed: set[str] = set()

    def install(self, server: LowLevelServer[Any]) -> None:
        """Serve subscriptions on ``server``, and be told when a client is there."""
        server.add_notification_handler(
            "notifications/initialized", NotificationParams, self._initialized
        )
        server.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        server.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe
        )
        server.add_request_handler(
            "subscriptions/listen", SubscriptionsListenRequestParams, self._listened
        )

    # -- the client's side -----------------------------------------------------

    async def _initialized(self, ctx: ServerRequestContext[Any], params: Any) -> None:
        self.handshake = True
        self.ready.set()

    async def _listened(
        self, ctx: ServerRequestContext[Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        self.ready.set()
        return await self.listen(ctx, params)

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

    # -- following -----------------------------------------------------------

    async def run(self, outlet: Outlet) -> None:
        """Follow every session, once a client is there, until cancelled."""
        await self.ready.wait()
        async with anyio.create_task_group() as tg:
            for session in self.sessions:
                tg.start_soon(self.follow, session, outlet)

    async def follow(self, session: str, outlet: Outlet) -> None:
        """Push each batch of ``session`` until the client is gone, or the session can no
        longer be followed (stopped, missing, forbidden: said once on stderr). A daemon
        that stays away longer than the API rides out is tried again, and so is one that
        was not there at first; each time the follow goes on from the cursor."""
        tries = 0
        while True:
            try:
                async with (
                    self.connect(DEFAULT_RECONNECT) as repl,
                    aclosing(repl.follow(session, cursor=self.cursor)) as batches,
                ):
                    async for batch in batches:
                        tries = 0
                        if not await self.deliver(batch, outlet):
                            return  # the client is gone: what it did not take stays unacked
            except Unavailable as exc:
                if not tries:
                    log.warning("following %s: %s; trying again", session, exc.message)
                await anyio.sleep(min(FIRST_PAUSE * 2**tries, MAX_PAUSE))
                tries += 1
            except CliError as exc:
                log.error("following %s stopped: %s", session, exc.message)
                return

    async def deliver(self, batch: p.SessionBatch, outlet: Outlet) -> bool:
        """Push one batch; True once its notifications were taken, so that the follow
        acknowledges it with its next wait. A batch of which the gate lets nothing through
        is acknowledged unseen."""
        shown = [f for f in batch.firings if allowed(f, self.allow_from)]
        if not shown and not batch.lost:
            return True
        uri = session_uri(batch.session)
        if not self.handshake:
            await self.bus.publish(ResourceUpdated(uri))
            return True  # a listen stream's client: its events are published, not confirmed
        told = channel_params(batch.session, shown, batch.lost)
        if not await outlet.notify(CHANNEL_METHOD, told):  # first: the push's latency
            return False
        await self.bus.publish(ResourceUpdated(uri))
        if uri in self.subscribed:
            return await outlet.notify(UPDATED_METHOD, {"uri": uri})
        return True
