"""Serving the app: Starlette's routes with event streams in front, the page's files,
and uvicorn in the daemon's own loop, with the glue its public API cannot give."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
from anyio.abc import TaskStatus

from repl_daemon.config import DEFAULTS
from repl_daemon.http import verbs
from repl_daemon.http.answers import PAGE_HEADERS, WEB, error_body
from repl_daemon.http.mcp import Gate, Listener, McpFactory
from repl_daemon.http.routes import Api
from repl_daemon.http.streams import line_of
from session.errors import (
    Code,
)

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.types import ASGIApp, Receive, Scope, Send

    from repl_daemon.engine import Engine

log = logging.getLogger("repl.daemon")


def static_files() -> Any:
    from starlette.staticfiles import StaticFiles

    class Static(StaticFiles):
        """The page's files, with the page's headers."""

        async def get_response(self, path: str, scope: Any) -> Response:
            response = await super().get_response(path, scope)
            response.headers.update(PAGE_HEADERS)
            return response

    return Static


def Static(directory: Path) -> Any:
    return static_files()(directory=directory)


class Front:
    """The app uvicorn runs: Starlette's, but for an event stream's request, which goes
    to its route's endpoint as soon as Starlette's own route has matched it.

    Through Starlette's stack, a request holds a frame of each layer for as long as
    it is in flight (the app, its error middleware and its closure around ``send``,
    the exception middleware and its wrapper, the router and the route): 3.5 KB for
    each open stream (docs/benchmarks.md), for layers that a stream's route never
    uses once it has answered. Starlette still matches its path (``Route.matches``),
    so a wrong method still gets Starlette's 405 from the whole stack; a failure of
    the daemon's own is still ``Api.failed``'s JSON 500, raised on for uvicorn to log,
    as Starlette's error middleware does. ``routes`` are Starlette's, all of them.
    """

    def __init__(
        self,
        app: Any,
        stream: Route,
        endpoint: Callable[[Request], Awaitable[Response]],
        failed: Callable[[Request, Exception], Awaitable[Response]],
    ) -> None:
        self.app = app
        self.routes = app.routes
        self.stream = stream
        self.endpoint = endpoint
        self.failed = failed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.routing import Match

        if scope["type"] == "http":
            matched, found = self.stream.matches(scope)
            if matched is Match.FULL:
                scope.update(found)
                response = await self._answer(scope, receive, send)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> Response:
        """The route's response, in a frame of its own, so that its ``Request`` (and the
        headers and query it parsed) is not held while the stream is open."""
        from starlette.requests import Request

        request = Request(scope, receive, send)
        try:
            return await self.endpoint(request)
        except Exception as exc:  # a failure of the daemon's own: 500, and uvicorn logs it
            await (await self.failed(request, exc))(scope, receive, send)
            raise


def make_app(engine: Engine, token: str, mcp: ASGIApp | None = None) -> Any:
    """The ASGI app of the daemon's HTTP routes: Starlette's, streams in front (``Front``);
    ``mcp`` the MCP server's app at /mcp, behind the token (``repl_daemon.http.mcp``)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Mount, Route

    api = Api(engine, token)
    guarded = api.guarded
    events = guarded(api.events)
    stream = Route("/sessions/{id}/events", events, methods=["GET"])
    routes = [
        # the page and its files need no token: they hold no data until it is given
        Route("/", guarded(api.page, open=True), methods=["GET"]),
        Mount("/static", app=Static(directory=WEB), name="static"),
        Route("/favicon.ico", guarded(api.favicon, open=True), methods=["GET"]),
        # one route for both methods, so a 405's Allow lists every method it serves
        Route("/sessions/{id}/firings", guarded(api.firings), methods=["GET", "POST"]),
        stream,
        Route("/sessions/{id}/wait", guarded(api.wait), methods=["GET"]),
        # a claim (SPEC §16), a long poll; before the group's own route, whose name (which
        # may hold a slash, as a cursor's may) would take "/claim" too
        Route("/sessions/{id}/groups/{name:path}/claim", guarded(api.claim), methods=["POST"]),
        # every verb the table serves by the one generic route (repl_daemon.http.verbs)
        *verbs.routes(api),
        Route("/sessions", guarded(api.sessions_root), methods=["GET", "POST"]),
        Route("/metrics", guarded(api.metrics), methods=["GET"]),
        # the MCP server's own transport: every method it serves (POST, GET, DELETE)
        Route("/mcp", Gate(api, mcp)),
        Route("/healthz", guarded(api.healthz, open=True), methods=["GET"]),
        # a webhook carries its own secret: no token
        Route("/hooks/{id}", guarded(api.hook, open=True), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes, exception_handlers={HTTPException: api.refused, Exception: api.failed}
    )
    return Front(app, stream, events.endpoint, api.failed)


async def serve_http(
    engine: Engine,
    host: str,
    port: int,
    token: str,
    idle_timeout: float,
    max_connections: int = 4096,
    tls: ssl.SSLContext | None = None,
    *,
    slow_consumer_s: float = DEFAULTS["slow_consumer_s"],
    mcp: tuple[McpFactory, Listener] | None = None,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP routes on ``host:port`` until cancelled; reports the bound port.

    uvicorn serves them in this event loop, on a socket bound here (so that a
    port in use is the same one-line refusal as the protocol's, and port 0
    reports the port it got). The daemon keeps its own signal handling: the
    server is told to stop when this task is cancelled, and given a moment
    to close its connections. ``mcp``, the MCP server's factory with where the daemon
    listens (its HTTP port still to be bound), is entered once the port is bound, and
    its app served at /mcp.
    """

    from session.errors import CannotListen

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on an accepted connection
    # only when its socket says TCP (uvloop always does). uvicorn writes an answer's head
    # and its body apart, and with Nagle's algorithm on, the body waited for the ACK of
    # the head, which the client delays: 40 ms for every answer after the first on a
    # keep-alive connection (tests/http/test_http_inprocess.py)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise CannotListen(f"cannot serve HTTP on {host}:{port}: {exc.strerror}") from None
    async with contextlib.AsyncExitStack() as stack:
        served = None
        if mcp is not None:
            factory, listener = mcp
            bound = listener._replace(http_port=sock.getsockname()[1], http_tls=tls is not None)
            served = await stack.enter_async_context(factory(bound))
        await _serve(
            make_app(engine, token, served),
            sock,
            engine,
            idle_timeout,
            max_connections,
            tls,
            slow_consumer_s,
            task_status,
        )


async def _serve(
    app: Any,
    sock: socket.socket,
    engine: Engine,
    idle_timeout: float,
    max_connections: int,
    tls: ssl.SSLContext | None,
    slow_consumer_s: float,
    task_status: TaskStatus[int],
) -> None:
    import uvicorn

    config = uvicorn.Config(
        app,
        http=protocol_class(idle_timeout, max_connections, engine.counts.errors, slow_consumer_s),
        # no X-Forwarded-For: nothing here reads the client's address, and the middleware
        # would be one more frame held by every request in flight (an open stream's)
        proxy_headers=False,
        log_level="warning",
        access_log=False,
        lifespan="off",
        date_header=False,
        server_header=False,
        timeout_keep_alive=max(1, int(idle_timeout)),
        timeout_graceful_shutdown=1,
        # no limit_concurrency: the protocol class keeps --max-connections, so that what is
        # past it is answered in JSON as every other refusal
        h11_max_incomplete_event_size=64 * 1024,
    )
    if tls is not None:  # the daemon's own context (rules L1-L3), shared with the protocol's
        config.load()  # listener, so that a reload on SIGHUP serves both
        config.ssl = tls
    server = server_class()(config)
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    task_status.started(sock.getsockname()[1])
    try:
        await asyncio.shield(serving)
    finally:
        server.stop()
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await serving
        sock.close()


def json_headers(length: int, *, close: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
    return [*headers, (b"connection", b"close")] if close else headers


def protocol_class(
    deadline: float, max_connections: int, errors: Counter[str], slow_consumer_s: float
) -> Any:
    """uvicorn's h11 protocol, with a deadline for each request's headers, the refusals
    uvicorn makes itself in the daemon's JSON, and the close of a slow consumer.

    uvicorn's flow control already bounds what a client that does not read
    costs (a response's write waits while the transport is past its
    high-water mark, and nothing more is read meanwhile), but not how long:
    a stream or a response whose client never reads again would hold its
    task and its connection for ever. Past the high-water mark for
    ``slow_consumer_s`` without a resume, the connection is aborted, as the
    line protocol closes one (code ``slow_consumer``, counted in
    ``repl_errors_total``); its route is told as for a client that left.

    uvicorn closes a connection idle between requests (its keep-alive
    timeout), but not one whose request never finishes arriving: a client
    that sends half a request line, or its headers a byte a minute, would
    hold a connection for ever. This closes a connection that has no
    request in progress ``deadline`` seconds after it opened or after its
    last response, as the line protocol's idle timeout does; an event
    stream, a request in progress, is never cut.

    A request h11 cannot parse is 400 ``bad_request`` (uvicorn's own answer
    is plain text), and one that arrives while the HTTP connections are
    past ``max_connections`` 503 ``too_many`` (uvicorn's ``limit_concurrency``
    with its plain text: the same count, this connection's included, taken
    at the same moment), each with ``Connection: close``.

    uvicorn's public API cannot serve these: its server takes a protocol
    class and nothing smaller (no hook for a per-request header deadline, for
    its own 400/503 bodies, or for its flow control's pause), so this
    subclasses ``H11Protocol`` and reads its ``conn``, ``cycle`` and ``flow``.
    Those are uvicorn's internals: pyproject.toml bounds uvicorn from above at
    the newest release this was tested against (0.55), so neither a user's
    install nor ``scripts/pin`` takes a newer one until the bound is moved by
    hand, with the suite passing on it.
    """
    # Long (some 150 lines): one class, the subclass of uvicorn's protocol, whose methods
    # share the deadline, the counts and the bodies built here once per server
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    busy_body = error_body(
        Code.TOO_MANY,
        f"over {max_connections:,} HTTP connections (--max-connections): "
        "close one, or try again later",
        own=True,
    )

    async def busy(scope: Any, receive: Any, send: Any) -> None:
        errors[Code.TOO_MANY.value] += 1
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": json_headers(len(busy_body), close=True),
            }
        )
        await send({"type": "http.response.body", "body": busy_body})

    unparsable = error_body(
        Code.BAD_REQUEST,
        "not a request of HTTP/1.1: see RFC 9112, or use an HTTP client",
        own=True,
    )

    class Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _stalled: asyncio.TimerHandle | None = None

        _unsent = 0

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stalled is None:
                self._unsent = self.transport.get_write_buffer_size()
                self._stalled = self.loop.call_later(slow_consumer_s, self._slow)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._stalled is not None:
                self._stalled.cancel()
                self._stalled = None

        def _slow(self) -> None:
            # a closing transport (``Connection: close``) still holds what it has not sent:
            # it is aborted all the same; its loss cancels this timer
            self._stalled = None
            unsent = self.transport.get_write_buffer_size()
            if unsent < self._unsent:  # it took some (a slow reader): it is given the time again
                self._unsent = unsent
                self._stalled = self.loop.call_later(slow_consumer_s, self._slow)
                return
            errors[Code.SLOW_CONSUMER.value] += 1
            log.warning(
                "closing a slow HTTP consumer: %d bytes untaken for %g s", unsent, slow_consumer_s
            )
            self.transport.abort()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._served = self.app

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to what h11 cannot parse, in JSON; then the close."""
            errors[Code.BAD_REQUEST.value] += 1
            headers = json_headers(len(unparsable), close=True)
            head = self.conn.send(h11.Response(status_code=400, headers=headers))
            body = self.conn.send(h11.Data(data=unparsable))
            end = self.conn.send(h11.EndOfMessage())
            self.transport.write(b"".join(part or b"" for part in (head, body, end)))
            self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(deadline, self._too_slow)

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def handle_events(self) -> None:
            over = len(self.connections) > max_connections or len(self.tasks) > max_connections
            self.app = busy if over else self._served  # the app for requests taken now
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not self.conn.trailing_data[0]:
                # the body is in, and nothing of a next request waits behind it: read on.
                # uvicorn pauses reading when a body's part takes its buffer over 64 KiB,
                # and only the route's next receive resumes it; after the last part there
                # is none, so an open stream or long poll would never hear its client go
                self.flow.resume_reading()
            if self._busy() and self._deadline is not None:
                self._deadline.cancel()  # its headers are in: the request runs as long as it must
                self._deadline = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _too_slow(self) -> None:
            self._deadline = None
            if not self._busy() and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if self._stalled is not None:
                self._stalled.cancel()
                self._stalled = None
            unfinished = self._busy()
            super().connection_lost(exc)
            if unfinished:  # an open stream, a long poll: the route is told (``Line``)
                assert self.cycle is not None
                scope = cast("MutableMapping[str, Any]", self.cycle.scope)  # a TypedDict
                line_of(scope).lost()

    return Protocol


def server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, with no signal handlers of its own and no 0.1 s ticker:
        it sleeps until it is told to stop."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self._stop = asyncio.Event()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the daemon's own handlers stay: SIGTERM stops the whole daemon

        async def main_loop(self) -> None:
            await self.on_tick(0)  # the default headers, once
            await self._stop.wait()

        def stop(self) -> None:
            self.should_exit = True
            self._stop.set()

    return Server
