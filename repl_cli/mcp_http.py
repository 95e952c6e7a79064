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

Each MCP session (not each token) follows from its handshake (``notifications/initialized``) as
``repl_cli.mcp_push.Push`` does, and stops when the session ends: a DELETE
of it, a request that finds it gone (404), or the daemon's stop. A push goes
out on the session's GET stream (the SSE response of its ``GET /mcp``): it is
written there as one SSE event through that response's ASGI ``send``, under
one lock with the SDK's own writes, and "handed" means that ``send``
returned: uvicorn took the bytes for the socket (waiting while its buffer is
full), as a pipe's reader took the line on stdio. Only then is the batch
acknowledged. While the session has no GET stream open the batch is held,
unacknowledged, until one opens (a stream that closes under a push gets it
again on the next); so a client that goes away before its stream had it gets
it again from its next session: duplicates, never loss. The sessions of one URL
share its cursor, as two ``repl follow`` of one cursor do: one reader, whose
acknowledgements move them all; clients that must each get every push give
each its own ``cursor``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qs

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context
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
from starlette.responses import JSONResponse

from repl_cli.mcp_push import CHANNEL, MCP_CURSOR, Ack, Held, Push
from repl_cli.mcp_server import Server, Settings, build, push_for
from repl_cli.mcp_stdio import DISCOVER, REFUSED

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

    from repl_daemon.http.mcp import Listener

#: the scope's keys the daemon puts the presented token and the request's ``Line`` under
from repl_daemon.locations import SCOPE_LINE as LINE
from repl_daemon.locations import SCOPE_TOKEN as TOKEN

SESSION_HEADER = b"mcp-session-id"

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Spec(NamedTuple):
    """What a URL's query asks to be pushed: ``repl mcp``'s ``--follow``, ``--cursor``,
    ``--allow-from`` and ``--ack``."""

    follow: tuple[str, ...] = ()
    cursor: str = MCP_CURSOR
    allow_from: frozenset[str] | None = None
    ack: Ack = Ack.AGENT


class BadQuery(ValueError):
    """A query ``spec_of`` cannot serve, in one line."""


def spec_of(scope: Scope) -> Spec:
    """The query's ``follow``, ``cursor``, ``allow_from`` and ``ack`` (each repeatable or
    comma-separated; the last ``cursor`` and ``ack`` count; ``allow_from=`` allows
    nobody). ``BadQuery`` for an ``ack`` that is neither ``agent`` nor ``pipe``."""
    query = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True)

    def names(key: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for v in query.get(key, ()) for n in v.split(",") if n))

    follow = names("follow")
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
    return Spec(follow, cursors[-1] if cursors else MCP_CURSOR, allow, ack)


def header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


class Stream:
    """A session's GET stream: the ASGI ``send`` of its SSE response, which the SDK
    writes through ``sent`` and a push through ``write``, one whole event at a time."""

    def __init__(self, send: Send, opened: Any, line: Any) -> None:
        self.send = send
        self.opened = opened
        self.line = line
        self.lock = anyio.Lock()
        self.open = False
        self.status = 0

    def still_open(self) -> bool:
        """Whether the response goes on and its client is still connected."""
        return self.open and not getattr(self.line, "gone", False)

    async def sent(self, message: Message) -> None:
        async with self.lock:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                self.open = self.status == 200
                if self.open:
                    self.opened(self)
            else:  # a body: the last one ends the response
                self.open = self.open and bool(message.get("more_body", False))
            await self.send(message)

    async def write(self, event: bytes) -> bool:
        """True once ``event`` was handed to the open response (its ``send`` returned)."""
        async with self.lock:
            if not self.open:  # pragma: no cover - it ended while the push waited for the lock
                return False
            try:
                await self.send({"type": "http.response.body", "body": event, "more_body": True})
            except OSError:  # pragma: no cover - the connection failed under the write
                self.open = False
                return False
            return True


class Slot:
    """One MCP session's pushes: its ``Push`` (from its handshake on), its GET stream
    when one is open, and the scope its follow runs in; the ``Outlet`` of its ``Push``."""

    def __init__(self) -> None:
        self.push: Push | None = None
        self.stream: Stream | None = None
        self.changed = anyio.Event()
        self.scope = anyio.CancelScope()

    def set(self, stream: Stream | None) -> None:
        self.stream = stream
        self.changed.set()
        self.changed = anyio.Event()

    async def notify(self, method: str, params: dict[str, Any]) -> Held | None:
        """Written to the session's open GET stream (held until one is open); what it
        went on: that stream, open or not by the time it is asked."""
        message = JSONRPCNotification(jsonrpc="2.0", method=method, params=params)
        data = message.model_dump_json(by_alias=True, exclude_unset=True)
        event = f"event: message\r\ndata: {data}\r\n\r\n".encode()
        while True:
            changed = self.changed
            stream = self.stream
            if stream is not None and await stream.write(event):
                return stream.still_open
            await changed.wait()


class Pushes:
    """The pushes of one server (one token and one query), per MCP session of the
    ``initialize`` era (the 2026-07-28 era has no session over HTTP to push to: a
    client of it gets the tools, and nothing is pushed or acknowledged for it)."""

    def __init__(self, server: Server, spec: Spec, tg: TaskGroup) -> None:
        self.server = server
        self.spec = spec
        self.tg = tg
        self.slots: dict[str, Slot] = {}
        low = server.lowlevel
        # the session manager asks the low-level server for what to declare; the channel
        # is declared by ``Server.initialization_options``, which it does not call
        declare = low.create_initialization_options

        def declared(**kwargs: Any) -> Any:
            return declare(**{**kwargs, "experimental_capabilities": {CHANNEL: {}}})

        low.create_initialization_options = declared  # type: ignore[method-assign,assignment]
        low.add_notification_handler(
            "notifications/initialized", NotificationParams, self._initialized
        )
        low.add_request_handler("resources/subscribe", SubscribeRequestParams, self._subscribe)
        low.add_request_handler(
            "resources/unsubscribe", UnsubscribeRequestParams, self._unsubscribe
        )
        server.pushes_of = self.push_of

    def slot(self, session: str) -> Slot:
        return self.slots.setdefault(session, Slot())

    def end(self, session: str) -> None:
        """The MCP session ended: its follow stops (what it held stays unacknowledged)."""
        self.slots.pop(session, Slot()).scope.cancel()

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
        session = header(ctx.request.scope, SESSION_HEADER) if ctx.request else None
        if session is None:  # pragma: no cover - a stateful session always has its id
            return
        slot = self.slot(session)
        if slot.push is not None:
            return
        push = slot.push = push_for(self.server.tools.settings, self.server.tools)
        push.opened()
        self.tg.start_soon(self.follow, slot, push)

    async def follow(self, slot: Slot, push: Push) -> None:
        with slot.scope:
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


class App(NamedTuple):
    app: StreamableHTTPASGIApp
    pushes: Pushes | None


class Served:
    """The ASGI app the daemon hands /mcp's requests to: the server of the request's token
    and query, and the GET streams its pushes go out on."""

    def __init__(self, listener: Listener, tg: TaskGroup) -> None:
        self.listener = listener
        self.security = security(listener)
        self.tg = tg
        self.apps: dict[tuple[str, Spec], App] = {}
        self.lock = anyio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            spec = spec_of(scope)
        except BadQuery as exc:
            await refused(400, "bad_request", str(exc))(scope, receive, send)
            return
        key = (scope[TOKEN], spec)
        served = self.apps.get(key) or await self.start(*key)
        session = header(scope, SESSION_HEADER)
        if served.pushes is not None and scope["method"] == "POST":
            replayed = await self.era(scope, receive, send)
            if replayed is None:
                return
            receive = replayed
        if served.pushes is None or session is None:
            await served.app(scope, receive, send)
        elif scope["method"] == "GET":
            await self.listened(served.app, served.pushes, session, scope, receive, send)
        else:
            status = 0

            async def sent(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            await served.app(scope, receive, sent)
            if status == 404 or (scope["method"] == "DELETE" and status < 300):
                served.pushes.end(session)

    async def era(self, scope: Scope, receive: Receive, send: Send) -> Receive | None:
        """A following URL speaks the ``initialize`` era (``repl_cli.mcp_stdio`` says why):
        a POSTed ``server/discover`` is answered -32601 here (None: answered), anything
        else goes on to the SDK with its body as it came (what ``receive`` then gives)."""
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

        return replay

    async def listened(
        self,
        app: StreamableHTTPASGIApp,
        pushes: Pushes,
        session: str,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """A session's GET stream: open for its pushes from its 200 to its end."""
        slot = pushes.slot(session)
        stream = Stream(send, slot.set, scope.get(LINE))
        try:
            await app(scope, receive, stream.sent)
        finally:
            stream.open = False
            if slot.stream is stream:
                slot.set(None)
            if stream.status == 404:
                pushes.end(session)

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
            )
            server = build(settings, per_session=True)
            pushes = Pushes(server, spec, self.tg) if spec.follow else None
            manager = StreamableHTTPSessionManager(
                app=server.lowlevel, security_settings=self.security
            )
            await self.tg.start(run, manager)
            served = self.apps[token, spec] = App(StreamableHTTPASGIApp(manager), pushes)
            return served


def refused(status: int, code: str, message: str) -> JSONResponse:
    """A refusal of /mcp as every refusal of the daemon's HTTP is: JSON, with its code."""
    return JSONResponse({"code": code, "message": f"repl: {message}"}, status_code=status)


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
