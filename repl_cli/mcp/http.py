"""The MCP server over Streamable HTTP, at ``/mcp`` on the daemon's ``--http`` listener.

The daemon serves it (``repl_daemon.http.mcp``): it checks the bearer token
as every data route does and hands the request here with the token it
presented. ``serving`` is the factory ``repl daemon`` gives the daemon: for
each token, the same server ``repl mcp`` serves on stdio (``mcp_server.build``),
whose settings carry that token and the daemon's own line-protocol address,
so that every tool call is made with exactly that token's rights, and the
SDK's session manager for it (a client's MCP session belongs to the token
that opened it: another token does not find it). Each is made at the token's
first request and kept while the daemon serves HTTP.

DNS rebinding: on a loopback listener, the SDK's transport security lets
through only a Host of the listener's own address (its localhost forms too)
and an Origin of those; a listener beyond loopback is reached by whatever
names its clients use, and is left to its token (and TLS).

Pushes (§17, rule M4) over HTTP: the client names what to follow in the
URL it is configured with, ``/mcp?follow=inbox&follow=b&allow_from=alice&cursor=mcp``
(each repeatable or comma-separated; ``cursor`` defaults to ``mcp``): the
options of ``repl mcp --follow``, one for one. A harness author writes a URL
into a config file (``.mcp.json``) once, as he writes ``repl mcp``'s argv
for stdio, and a channel harness (Claude Code) never sends
``resources/subscribe``, so following by subscription would push it
nothing; and the server's capabilities and instructions (which name the
sessions and the gate) are made before any session exists. So each distinct
query is a server of its own (``build`` with those settings) beside the
token's, with its own session manager. Subscribing to
``repl://sessions/{id}`` still adds ``notifications/resources/updated`` for a
followed session, as on stdio.

Each MCP session (not each token) has its own (``Slot``), made with it: its
recent events (``repl_cli.mcp.events``), its GET stream when one is open, and
on a following URL its pushes: it follows from its handshake
(``notifications/initialized``) as ``repl_cli.mcp.push.Push`` does, and stops
when the session ends: a DELETE of it, a request that finds it gone (404), the
SDK's end of it when idle (``IDLE_S``, and ``IDLE_AFTER_S`` more here), or the
daemon's stop. A push goes out on the session's GET stream (the SSE response of
its ``GET /mcp``): it is written there as one SSE event, with its id, through
that response's ASGI ``send``, under the session's lock with the SDK's own
writes, and "handed" means that ``send`` returned: uvicorn took the bytes for
the socket (waiting while its buffer is full), as a pipe's reader took the line
on stdio. While the session has no GET stream open a push is held until one
opens; so a client that goes away before its stream had it gets it again from
its next session: duplicates, never loss. The sessions of one URL share its
cursor, as two ``repl follow`` of one cursor do: one reader, whose
acknowledgements move them all; clients that must each get every push give
each its own ``cursor``.

Approvals (SPEC §19, rule P4): ``approvals=SESSION`` (with ``follow``; ``approvers=``
whose verdict counts, ``root`` by default) relays an agent's permission prompts as
``repl mcp --approvals`` does, for each MCP session apart (``repl_cli.mcp.approvals.Relay``,
made at its handshake): the capability ``claude/channel/permission`` is declared, each
``notifications/claude/channel/permission_request`` the client POSTs is taken here,
before the SDK (which knows no such notification), answered 202 as any notification,
and recorded; the verdict that counts goes out as a push does, on the session's GET
stream.

Resuming (SPEC §17, rule M7): every event of every stream carries an ``id:``
(a GET stream opens with a priming event, its id and ``retry:``, for a client
of 2025-11-25 or later), and the session keeps its newest events
(``repl_cli.mcp.events``). ``GET /mcp`` with ``Last-Event-ID`` resumes the
stream that event was on: a request's POST stream by the SDK (from the
session's ``Events``, through ``Store``); a GET stream here, because the
session's own events go on it: the SDK is asked for a GET stream as any other,
and it opens with what came after that event, in order, before anything else,
superseding the session's old stream if the daemon still holds it (a path that
went away without a word). An id the session cannot resume after whole is
refused with a JSON 400 (``Gone``), never an empty stream. In ``ack=pipe`` a
push's receipt (``Receipt``) holds across a resume: the client had it, or got
it in the replay, on a stream that stayed open 2 s; a GET opened afresh is no
resume, and stops the session's acknowledgements as a client that left does.
Every refusal is the daemon's JSON (``repl_cli.mcp.refusals``).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qs

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
from mcp.server.streamable_http import GET_STREAM_KEY
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    TransportSecuritySettings,
)
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_REQUEST,
    EmptyResult,
    JSONRPCNotification,
    NotificationParams,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)
from starlette.responses import JSONResponse, Response

from repl_cli.mcp.approvals import PERMISSION_CAPABILITY, PERMISSION_REQUEST, Relay
from repl_cli.mcp.events import EVENTS, RETRY_MS, Event, Events, Gone, Store, dumped
from repl_cli.mcp.log import CLIENT, Lines
from repl_cli.mcp.push import CHANNEL, MCP_CURSOR, Ack, Held, Push
from repl_cli.mcp.refusals import refusing
from repl_cli.mcp.server import Server, Settings, build, push_for
from repl_cli.mcp.stdio import DISCOVER, REFUSED
from session.approvals import DEFAULT_APPROVERS
from session.errors import ReplError
from session.names import check_session_id
from session.scopes import check_token_name

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

    from repl_daemon.http.mcp import Listener

#: the scope's keys the daemon puts the presented token and the request's ``Line`` under
from repl_daemon.locations import SCOPE_LINE as LINE
from repl_daemon.locations import SCOPE_TOKEN as TOKEN

#: the notification that ends a client's handshake
INITIALIZED = "notifications/initialized"
SESSION_HEADER = b"mcp-session-id"
LAST_EVENT_HEADER = b"last-event-id"
VERSION_HEADER = b"mcp-protocol-version"
#: the protocol from which a client takes a priming event (an id with no data)
PRIMED_SINCE = "2025-11-25"

#: how long an MCP session may have no request in flight (an open GET stream is one)
#: before the SDK ends it: 30 minutes, the SDK's default, said here so repl's own goes too
IDLE_S = 30 * 60.0
#: and how much longer repl keeps what it holds for the session (its events, its follow)
IDLE_AFTER_S = 60.0
#: how long a push's receipt waits for a client to resume a GET stream cut under it: the
#: SDK's client asks again after ``RETRY_MS``
RESUME_S = 10.0
#: how long a resumed stream waits for the one it supersedes to be let go
SUPERSEDE_S = 5.0

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Spec(NamedTuple):
    """What a URL's query asks to be pushed: ``repl mcp``'s ``--follow``, ``--cursor``,
    ``--allow-from``, ``--ack``, and ``--approvals`` with its ``--approvers`` (``root``
    when it names none; none without ``approvals``)."""

    follow: tuple[str, ...] = ()
    cursor: str = MCP_CURSOR
    allow_from: frozenset[str] | None = None
    ack: Ack = Ack.AGENT
    approvals: str | None = None
    approvers: tuple[str, ...] = ()


class BadQuery(ValueError):
    """A query ``spec_of`` cannot serve, in one line."""


def spec_of(scope: Scope) -> Spec:
    """The query's ``follow``, ``cursor``, ``allow_from``, ``ack``, ``approvals`` and
    ``approvers`` (each repeatable or comma-separated; the last ``cursor``, ``ack`` and
    ``approvals`` count; ``allow_from=`` allows nobody). ``BadQuery`` for an ``ack`` that
    is neither ``agent`` nor ``pipe``, and for ``approvals`` or ``approvers`` that
    ``repl mcp`` would refuse as ``--approvals`` and ``--approvers``."""
    query = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True)

    def names(key: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for v in query.get(key, ()) for n in v.split(",") if n))

    follow = names("follow")
    approvals, approvers = relayed(names("approvals"), names("approvers"), bool(follow))
    if not follow:
        return Spec()
    cursors = names("cursor")
    allow = frozenset(names("allow_from")) if "allow_from" in query else None
    acks = names("ack")
    try:
        ack = Ack(acks[-1]) if acks else Ack.AGENT
    except ValueError:
        raise BadQuery(
            f"ack={acks[-1]!r} is not agent or pipe: give ack=agent (the agent acknowledges "
            "with the ack tool, the default) or ack=pipe (acknowledged once written)"
        ) from None
    return Spec(follow, cursors[-1] if cursors else MCP_CURSOR, allow, ack, approvals, approvers)


def relayed(
    approvals: tuple[str, ...], approvers: tuple[str, ...], following: bool
) -> tuple[str | None, tuple[str, ...]]:
    """The session a URL relays permission prompts through (None: it relays none), and
    whose verdicts count: checked as ``repl mcp --approvals``, ``--approvers`` are."""
    if not approvals and not approvers:
        return None, ()
    if not following:
        given = "approvals" if approvals else "approvers"
        raise BadQuery(f"{given}= relays prompts over the channel: give follow=ID too")
    if not approvals:
        raise BadQuery("approvers= says whose verdict counts: give approvals=SESSION too")
    try:
        session = check_session_id(approvals[-1])
        named = tuple(sorted(check_token_name(name) for name in approvers))
    except ReplError as exc:
        raise BadQuery(f"approvals: {exc.message}") from None
    return session, named or DEFAULT_APPROVERS


def header(scope: Scope | Message, name: bytes) -> str | None:
    """A request's (or a response's start's) header ``name``, None when it has none."""
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def dropped_header(scope: Scope, name: bytes) -> Scope:
    """``scope`` without the header ``name``."""
    return {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != name]}


def sse(event: Event, events: Events) -> bytes:
    """One event of a GET stream as its SSE frame: its id, and its message (or the priming
    event's ``retry:``, how long to wait before asking again for a cut stream)."""
    head = f"id: {events.id_of(event)}\r\n".encode()
    if event.data is None:
        return head + f"retry: {RETRY_MS}\r\ndata: \r\n\r\n".encode()
    return head + b"event: message\r\ndata: " + event.data + b"\r\n\r\n"


def body(chunk: bytes) -> Message:
    return {"type": "http.response.body", "body": chunk, "more_body": True}


class Stream:
    """One GET stream of an MCP session: the ASGI ``send`` of its SSE response.

    The SDK writes it through ``sent``, and the session's own events (pushes, log lines)
    go through ``Slot.write``, one whole event at a time under the session's lock, each
    recorded in the session's ``Events`` as it is written (so the order recorded is the
    order written, and a resume gives exactly what came after what the client saw). It
    opens with what the client missed, when it resumes with ``Last-Event-ID`` one of the
    session's GET streams (``after``), and a priming event (its id, for a client of
    2025-11-25 or later), before anything else is written on it."""

    def __init__(
        self, slot: Slot, send: Send, receive: Receive, line: Any, after: int | None, prime: bool
    ) -> None:
        self.slot = slot
        self.send = send
        self.receive = receive
        self.line = line
        self.after = after
        self.prime = prime
        self.open = False
        self.status = 0
        self.opened_at = math.inf
        #: the GET streams of one client that resume each other share one (a fresh GET,
        #: without Last-Event-ID, is a new one: what the last one wrote is not written again)
        self.generation = 0
        #: a newer stream of the session resumed this one: this one is ended
        self.superseded = False
        self.listening: anyio.CancelScope | None = None  # the SDK's wait for the client
        self.closed = anyio.Event()

    def still_open(self) -> bool:
        """Whether the response goes on and its client is still connected."""
        return self.open and not getattr(self.line, "gone", False)

    async def received(self) -> Message:
        """What the client sends (a GET sends only its end: ``http.disconnect``), or its
        end once a newer stream of the session superseded this one, so the SDK ends it."""
        with anyio.CancelScope() as self.listening:
            if not self.superseded:
                return await self.receive()
        return {"type": "http.disconnect"}

    def supersede(self) -> None:
        """End this stream for a newer one of its session (the SDK serves one GET stream a
        session, and lets this one go once it hears its end)."""
        self.open = False
        self.superseded = True
        if self.listening is not None:
            self.listening.cancel()

    async def sent(self, message: Message) -> None:
        async with self.slot.lock:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                await self.send(message)
                if self.status == 200:
                    await self._start()
                return
            # a body: the last one ends the response
            self.open = self.open and bool(message.get("more_body", False))
            await self.send(message)

    async def _start(self) -> None:
        """What the client missed, and the priming event; then the session's events come
        here (called under the session's lock)."""
        slot, events = self.slot, self.slot.events
        missed: list[Event] = []
        if self.after is not None:
            if events.dropped.get(0, 0) > self.after:  # pragma: no cover - a race: dropped
                self.supersede()  # since it was asked; ended at once, asked again refused
                return
            missed = [e for e in events.kept if not e.stream and e.n > self.after and e.data]
            self.generation = slot.generation
        else:
            self.generation = slot.generation = slot.generation + 1
        self.open = True
        self.opened_at = anyio.current_time()
        for event in missed:
            await self.send(body(sse(event, events)))
        if self.prime:
            await self.send(body(sse(events.record(GET_STREAM_KEY, None), events)))
        slot.set(self)


class Receipt:
    """Whether a client still has a push written on one of its MCP session's GET streams,
    asked ``hold`` seconds after it was written (``--ack pipe``, rule M6): yes when that
    stream, or one that resumed it, is open and has been for ``hold``; no when the session
    ended, or a fresh GET stream took its place. A stream cut under it is waited for
    ``RESUME_S`` seconds: a client that resumes it with ``Last-Event-ID`` is given what it
    missed (the push too, when it had not seen it), so it has the push after all."""

    def __init__(self, slot: Slot, generation: int, hold: float) -> None:
        self.slot = slot
        self.generation = generation
        self.hold = hold

    async def __call__(self) -> bool:
        slot = self.slot
        while not slot.ended:
            stream = slot.stream
            if stream is not None and stream.still_open():
                if stream.generation != self.generation:
                    return False
                rest = stream.opened_at + self.hold - anyio.current_time()
                if rest <= 0:
                    return True
                await anyio.sleep(rest)  # a resumed stream, open for less than the hold
                continue
            changed = slot.changed  # cut, and not resumed yet
            with anyio.move_on_after(RESUME_S) as waited:
                await changed.wait()
            if waited.cancelled_caught:
                return False
        return False


class Slot:
    """One MCP session's own: its recent events (``Events``), its GET stream when one is
    open, its pushes (from its handshake on, on a following URL), and the requests it has
    in flight (when none has been for ``IDLE_S`` and ``IDLE_AFTER_S`` more, after the SDK
    ended the session for it, this goes too); the ``Outlet`` of its ``Push``."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.events = Events()
        self.lock = anyio.Lock()
        self.stream: Stream | None = None
        self.changed = anyio.Event()
        self.generation = 0
        self.push: Push | None = None
        #: its relay of permission prompts, from its handshake on (``approvals=``)
        self.relay: Relay | None = None
        self.lines = Lines()  # its log lines, once it asks (repl_cli.mcp.log)
        self.scope = anyio.CancelScope()  # its follow's
        self.idle = anyio.CancelScope()
        self.in_flight = 0
        self.ended = False

    def set(self, stream: Stream | None) -> None:
        self.stream = stream
        self.changed.set()
        self.changed = anyio.Event()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """A request of the session in flight (an open GET stream is one): the session is
        not idle while it is."""
        self.in_flight += 1
        self.idle.deadline = math.inf
        try:
            yield
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.deadline = anyio.current_time() + IDLE_S + IDLE_AFTER_S

    def end(self) -> None:
        """The MCP session ended: its follow stops (what it held stays unacknowledged)."""
        self.ended = True
        self.scope.cancel()
        self.idle.cancel()
        self.set(None)

    async def write(self, data: bytes) -> Held | None:
        """One message (its JSON) written on the open GET stream as an event with its id,
        and recorded; None when none is open."""
        async with self.lock:
            stream = self.stream
            if stream is None or not stream.open:
                return None
            event = self.events.record(GET_STREAM_KEY, data)
            try:
                await stream.send(body(sse(event, self.events)))
            except OSError:  # pragma: no cover - the connection failed under the write
                stream.open = False
                return None
            return Receipt(self, stream.generation, self.hold)

    async def notify(self, method: str, params: dict[str, Any]) -> Held | None:
        """Written on the session's open GET stream (held until one is open); what says,
        after the hold, whether the client still has it; None once the session ended."""
        data = dumped(JSONRPCNotification(jsonrpc="2.0", method=method, params=params))
        while not self.ended:
            changed = self.changed
            written = await self.write(data)
            if written is not None:
                return written
            await changed.wait()
        return None


class Pushes:
    """The pushes of one server (one token and one query), per MCP session of the
    ``initialize`` era (the 2026-07-28 era has no session over HTTP to push to: a
    client of it gets the tools, and nothing is pushed or acknowledged for it)."""

    def __init__(self, server: Server, sessions: dict[str, Slot], tg: TaskGroup) -> None:
        self.server = server
        self.tg = tg
        self.slots = sessions
        low = server.lowlevel
        # the session manager asks the low-level server for what to declare; the channel
        # is declared by ``Server.initialization_options``, which it does not call
        declare = low.create_initialization_options
        settings = server.tools.settings
        experimental: dict[str, dict[str, Any]] = {CHANNEL: {}}
        if settings.approvals is not None:  # Claude Code relays its prompts only then
            experimental[PERMISSION_CAPABILITY] = {}

        def declared(**kwargs: Any) -> Any:
            return declare(**{**kwargs, "experimental_capabilities": experimental})

        low.create_initialization_options = declared  # type: ignore[method-assign,assignment]
        low.add_notification_handler(
            "notifications/initialized", NotificationParams, self._initialized
        )
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        low.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe
        )
        server.pushes_of = self.push_of

    def _slot_of(self, request: ServerRequestContext[Any]) -> Slot | None:
        session = header(request.request.scope, SESSION_HEADER) if request.request else None
        return self.slots.get(session) if session else None

    def of(self, ctx: ServerRequestContext[Any]) -> Push:
        """The pushes of the MCP session ``ctx`` came in, once it made its handshake."""
        slot = self._slot_of(ctx)
        if slot is None or slot.push is None:
            raise MCPError(INVALID_REQUEST, "repl: this MCP session has not made its handshake")
        return slot.push

    def push_of(self, ctx: Context) -> Push | None:
        """A tool's caller's pushes (``Server.push_of``)."""
        slot = self._slot_of(ctx.request_context)
        return None if slot is None else slot.push

    async def _initialized(self, ctx: ServerRequestContext[Any], params: Any) -> None:
        slot = self._slot_of(ctx)
        if slot is not None:
            self.handshake(slot)

    def handshake(self, slot: Slot) -> None:
        """The MCP session made its handshake: it is pushed to from now on (once). Called
        as its ``notifications/initialized`` arrives (``Served.__call__``), before the SDK
        runs the notification's handler in a task of its own: a request the client sends
        next (a subscription) must find it made, however late that task runs."""
        if slot.push is not None:
            return
        tools = self.server.tools
        settings = tools.settings
        push = slot.push = push_for(settings, tools)
        push.opened()
        if settings.approvals is not None:
            slot.relay = Relay(settings.approvals, settings.approvers, tools.connection)
        self.tg.start_soon(self.follow, slot, push)

    async def follow(self, slot: Slot, push: Push) -> None:
        """The session's pushes, and its relay of prompts (on the same GET stream), until
        the session ends."""
        with slot.scope:
            async with anyio.create_task_group() as tg:
                if slot.relay is not None:
                    tg.start_soon(slot.relay.run, slot.notify)
                await push.run(slot)

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: SubscribeRequestParams
    ) -> EmptyResult:
        push = self.of(ctx)
        push.subscribed.add(push.followed(params.uri))
        return EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams
    ) -> EmptyResult:
        self.of(ctx).subscribed.discard(params.uri)
        return EmptyResult()


def security(listener: Listener) -> TransportSecuritySettings | None:
    """The SDK's DNS-rebinding protection for a loopback listener: its own address only."""
    if listener.http_host not in LOOPBACK and not listener.http_host.startswith("127."):
        return None
    port = listener.http_port
    hosts = {listener.http_host, "127.0.0.1", "localhost", "[::1]"}
    named = sorted(f"[{h}]" if ":" in h and not h.startswith("[") else h for h in hosts)
    scheme = "https" if listener.http_tls else "http"
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:{port}" for h in named],
        allowed_origins=[f"{scheme}://{h}:{port}" for h in named],
    )


class App:
    """One server (one token and one query): its session manager's app, its pushes (a
    following URL), and its MCP sessions' own (``Slot``), by session id."""

    def __init__(self, server: Server, spec: Spec, security: Any, tg: TaskGroup) -> None:
        self.sessions: dict[str, Slot] = {}
        self.hold = server.tools.settings.hold
        self.pushes = Pushes(server, self.sessions, tg) if spec.follow else None
        self.manager = StreamableHTTPSessionManager(
            app=server.lowlevel,
            event_store=Store(),
            security_settings=security,
            retry_interval=RETRY_MS,
            session_idle_timeout=IDLE_S,
        )
        self.app = StreamableHTTPASGIApp(self.manager)

    def end(self, session: str) -> None:
        """The MCP session ended (a DELETE, a request the SDK no longer knew, idle)."""
        slot = self.sessions.pop(session, None)
        if slot is not None:
            slot.end()


class Served:
    """The ASGI app the daemon hands /mcp's requests to: the server of the request's token
    and query, and each MCP session's own (its events, its GET streams, its pushes)."""

    def __init__(self, listener: Listener, tg: TaskGroup) -> None:
        self.listener = listener
        self.security = security(listener)
        self.tg = tg
        self.apps: dict[tuple[str, Spec], App] = {}
        self.lock = anyio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        send = refusing(scope, send)  # every refusal in the daemon's JSON
        try:
            spec = spec_of(scope)
        except BadQuery as exc:
            await refused(400, "bad_request", str(exc))(scope, receive, send)
            return
        key = (scope[TOKEN], spec)
        served = self.apps.get(key) or await self.start(*key)
        said: dict[str, Any] = {}
        if served.pushes is not None and scope["method"] == "POST":
            replayed = await self.era(scope, receive, send)
            if replayed is None:
                return
            receive, said = replayed
        method = said.get("method")
        session = header(scope, SESSION_HEADER)
        if session is None:
            await self.opening(served, scope, receive, send)
            return
        slot = served.sessions.get(session)
        if slot is None:  # none of this server's: the SDK says so (404)
            await served.app(scope, receive, send)
            return
        if method == PERMISSION_REQUEST and slot.relay is not None and "id" not in said:
            # Claude Code's prompt, which the SDK knows no notification of: the relay's,
            # and answered as the SDK answers any notification it takes
            params = said.get("params")
            slot.relay.ask(params if isinstance(params, dict) else {})
            await Response(status_code=202)(scope, receive, send)
            return
        EVENTS.set(slot.events)  # what the SDK stores as it answers this request
        CLIENT.set(slot.lines)  # and the lines this request's work writes
        if method == INITIALIZED and served.pushes is not None:
            # before the SDK runs the notification's handler in a task of its own: a
            # request the client sends next (a subscription) must find the pushes made
            served.pushes.handshake(slot)
        status = 0

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with slot.busy():
            if scope["method"] == "GET":
                await self.listened(served, slot, scope, receive, sent)
            else:
                await served.app(scope, receive, sent)
        if status == 404 or (scope["method"] == "DELETE" and status < 300):
            served.end(session)

    async def opening(self, served: App, scope: Scope, receive: Receive, send: Send) -> None:
        """A request with no MCP session: the SDK makes one when it is an ``initialize``
        it answers, whose own is made here first (the tasks the SDK starts for it store
        their events in its ``Events``: ``EVENTS``, inherited) and kept under its id."""
        slot = Slot(served.hold)
        EVENTS.set(slot.events)
        CLIENT.set(slot.lines)

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                made = header(message, SESSION_HEADER)
                if made is not None:  # a new session's id, never given before
                    served.sessions[made] = slot
                    self.tg.start_soon(self.expire, served, made, slot)
            await send(message)

        with slot.busy():
            await served.app(scope, receive, sent)

    async def expire(self, served: App, session: str, slot: Slot) -> None:
        """An MCP session's own goes once none of its requests has been in flight for
        ``IDLE_AFTER_S`` more than the SDK gives it (``IDLE_S``): the SDK ended it by then.
        Till then its log lines go out on its GET stream (none open: they are dropped)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(slot.lines.run, slot.write)
            with slot.idle:
                await anyio.sleep_forever()
            tg.cancel_scope.cancel()
        served.end(session)

    async def era(
        self, scope: Scope, receive: Receive, send: Send
    ) -> tuple[Receive, dict[str, Any]] | None:
        """A following URL speaks the ``initialize`` era (``repl_cli.mcp.stdio`` says why):
        a POSTed ``server/discover`` is answered -32601 here (None: answered), anything
        else goes on to the SDK with its body as it came (what the ``receive`` returned
        then gives), with the message it is (a single message's; empty for a batch)."""
        body, more = b"", True
        while more and len(body) <= DEFAULT_MAX_REQUEST_BODY_SIZE:
            message = await receive()
            if message["type"] != "http.request":
                more = False
                break
            body += message.get("body", b"")
            more = bool(message.get("more_body", False))
        try:
            asked = json.loads(body) if not more else None
        except ValueError:
            asked = None
        if isinstance(asked, dict) and asked.get("method") == DISCOVER and "id" in asked:
            refusal = {"jsonrpc": "2.0", "id": asked["id"], "error": REFUSED.model_dump()}
            await JSONResponse(refusal)(scope, receive, send)
            return None
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        return replay, asked if isinstance(asked, dict) else {}

    async def listened(
        self, served: App, slot: Slot, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """A GET of an MCP session: its GET stream, open for the session's events from its
        200 to its end; with ``Last-Event-ID``, resumed: a GET stream's by us (what it
        missed is written first), a request's by the SDK (from ``Store``), or refused as
        JSON when the session cannot give all it missed (``Gone``)."""
        after: int | None = None
        last = header(scope, LAST_EVENT_HEADER)
        if last is not None:
            try:
                stream_id, _, after = slot.events.where(last)
            except Gone as exc:
                await refused(400, "bad_request", str(exc))(scope, receive, send)
                return
            if stream_id != GET_STREAM_KEY:
                await served.app(scope, receive, send)
                return
            scope = dropped_header(scope, LAST_EVENT_HEADER)
            old = slot.stream
            if old is not None:  # the daemon holds it still: a path gone without a word
                old.supersede()
                with anyio.move_on_after(SUPERSEDE_S):
                    await old.closed.wait()
        version = header(scope, VERSION_HEADER) or ""
        prime = version >= PRIMED_SINCE  # dates, compared as strings
        stream = Stream(slot, send, receive, scope.get(LINE), after, prime)
        try:
            await served.app(scope, stream.received, stream.sent)
        finally:
            stream.open = False
            stream.closed.set()
            if slot.stream is stream:
                slot.set(None)

    async def start(self, token: str, spec: Spec) -> App:
        """The server of ``token`` and ``spec`` and its session manager, running from now on."""
        async with self.lock:
            if (token, spec) in self.apps:  # made while this request waited for the lock
                return self.apps[token, spec]
            where = self.listener
            settings = Settings(
                addr=where.addr,
                home=where.home,
                token=token,
                tls_ca=where.tls_ca,
                follow=spec.follow,
                cursor=spec.cursor,
                allow_from=spec.allow_from,
                ack=spec.ack,
                approvals=spec.approvals,
                approvers=spec.approvers or DEFAULT_APPROVERS,
            )
            server = build(settings, per_session=True)
            served = App(server, spec, self.security, self.tg)
            await self.tg.start(run, served.manager)
            self.apps[token, spec] = served
            return served


def refused(status: int, code: str, message: str) -> JSONResponse:
    """A refusal of /mcp as every refusal of the daemon's HTTP is: JSON, with its code."""
    return JSONResponse({"code": code, "message": message}, status_code=status)


async def run(
    manager: StreamableHTTPSessionManager,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    async with manager.run():
        task_status.started()
        await anyio.sleep_forever()


@asynccontextmanager
async def serving(listener: Listener) -> AsyncIterator[Any]:
    """The app that serves /mcp for as long as the daemon serves HTTP
    (``repl_daemon.http.mcp.McpFactory``)."""
    async with anyio.create_task_group() as tg:
        try:
            yield Served(listener, tg)
        finally:
            tg.cancel_scope.cancel()


__all__ = ["TOKEN", "Spec", "security", "serving", "spec_of"]
