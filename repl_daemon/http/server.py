"""Serving the app: Starlette's routes with event streams in front, the page's files,
and uvicorn in the daemon's own loop (its protocol and server as the daemon needs them,
which its public API cannot give, are ``repl_daemon.http.uvicorn_glue``'s)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import uvicorn
from anyio.abc import TaskStatus
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles

from repl_daemon.config import DEFAULTS
from repl_daemon.http import verbs
from repl_daemon.http.answers import PAGE_HEADERS, WEB
from repl_daemon.http.approvals import Approvals
from repl_daemon.http.mcp import Gate, Listener, McpFactory
from repl_daemon.http.routes import Api
from repl_daemon.http.uvicorn_glue import Server, protocol_class
from session.errors import CannotListen

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.types import ASGIApp, Receive, Scope, Send

    from repl_daemon.engine import Engine


class Static(StaticFiles):
    """The page's files, with the page's headers."""

    async def get_response(self, path: str, scope: Any) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response


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

        request = Request(scope, receive, send)
        try:
            return await self.endpoint(request)
        except Exception as exc:  # a failure of the daemon's own: 500, and uvicorn logs it
            await (await self.failed(request, exc))(scope, receive, send)
            raise


def make_app(engine: Engine, token: str, mcp: ASGIApp | None = None) -> Any:
    """The ASGI app of the daemon's HTTP routes: Starlette's, streams in front (``Front``);
    ``mcp`` the MCP server's app at /mcp, behind the token (``repl_daemon.http.mcp``)."""

    api = Api(engine, token)
    guarded = api.guarded
    approvals = Approvals(api)
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
        # a wait on several sessions, or on every one of them (?all=true, SPEC §18)
        Route("/wait", guarded(api.waits), methods=["GET"]),
        # a claim (SPEC §16), a long poll; before the group's own route, whose name (which
        # may hold a slash, as a cursor's may) would take "/claim" too
        Route("/sessions/{id}/groups/{name:path}/claim", guarded(api.claim), methods=["POST"]),
        # every verb the table serves by the one generic route (repl_daemon.http.verbs)
        *verbs.routes(api),
        # the permission prompts of an agent, and a verdict on one (SPEC §19)
        Route("/sessions/{id}/approvals", guarded(approvals.listed), methods=["GET"]),
        Route(
            "/sessions/{id}/approvals/{request_id}",
            guarded(approvals.one),
            methods=["GET", "POST"],
        ),
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
    server = Server(config)
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    task_status.started(sock.getsockname()[1])
    try:
        await asyncio.shield(serving)
    finally:
        server.stop()
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await serving
        sock.close()
