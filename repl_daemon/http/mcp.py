"""``/mcp``: the client's MCP server over Streamable HTTP, behind the daemon's token.

The daemon never imports the client (scripts/imports.py, rule 4), and the MCP
server is the client's (``repl_cli.mcp.server``: its tools call the daemon as
the CLI does). So the server is given to the daemon: ``repl daemon`` passes
an ``McpFactory`` in its ``Config`` when the ``[mcp]`` extra is installed,
which the daemon enters once its HTTP port is bound (``Listener`` says where
the daemon listens), for as long as it serves HTTP. Without one (the extra
missing, or ``python -m repl_daemon``), ``/mcp`` is a JSON 501 that says so.

The daemon keeps the door: a request to ``/mcp`` is authenticated as every
data route is (``Api.authenticate``: 401 with ``WWW-Authenticate: Bearer``
without a token, or with a wrong or revoked one), and only then handed to the
factory's app with the token it presented in its scope (``SCOPE_TOKEN``), which the
server uses for every call it makes, so each tool has exactly that token's
rights. It also puts there the request's ``Line`` (``SCOPE_LINE``, both keys in
``repl_daemon.locations``, where the client finds them too),
which the daemon's protocol marks ``gone`` when the client's connection is lost
before the response ended: how a push server knows its client stayed on the GET
stream it was told on (uvicorn's ``http.disconnect`` tells only a task blocked in
``receive``, and tells it of an ended response too).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from starlette.requests import Request

from repl_daemon.http.answers import error_response
from repl_daemon.http.streams import line_of
from repl_daemon.locations import SCOPE_TOKEN
from session.errors import Code, ReplError

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from repl_daemon.http.routes import Api


NOT_SERVED = (
    "this daemon serves no MCP: /mcp is served by `repl daemon --http` with the [mcp] "
    "extra installed (pip install 'repl-inbox[mcp]')"
)


class Listener(NamedTuple):
    """Where the daemon listens, for the MCP server that calls it."""

    #: the line protocol's address to connect to (``tls://`` when it serves TLS)
    addr: str
    #: its state directory
    home: Path
    #: its certificate, to verify it by (None without TLS)
    tls_ca: Path | None
    #: the HTTP listener: host, bound port, and whether it serves TLS
    http_host: str
    http_port: int
    http_tls: bool


#: what the daemon is given to serve /mcp: entered once the HTTP port is bound, it yields
#: the ASGI app that serves the requests the daemon let through, until the daemon stops
McpFactory = Callable[[Listener], AbstractAsyncContextManager["ASGIApp"]]


def connect_host(host: str) -> str:
    """The address a client on this machine reaches a listener on ``host`` by."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


class Gate:
    """The ASGI app at /mcp: the token checked as every data route checks it, then the
    factory's app (``served``), or a 501 that names the extra when there is none."""

    def __init__(self, api: Api, served: ASGIApp | None) -> None:
        self.api = api
        self.served = served

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:

        request = Request(scope, receive)
        try:
            await self.api.authenticate(request)
        except ReplError as exc:  # none, a wrong one, or the store that keeps tokens away
            self.api.engine.counts.errors[exc.code.value] += 1
            challenge = {"WWW-Authenticate": "Bearer"}
            headers = challenge if exc.code is Code.UNAUTHORIZED else None
            await error_response(exc.code.value, exc.message, headers=headers)(scope, receive, send)
            return
        if self.served is None:
            await error_response(Code.UNKNOWN_OP.value, NOT_SERVED, 501, own=True)(
                scope, receive, send
            )
            return
        _, _, given = request.headers["authorization"].partition(" ")
        scope[SCOPE_TOKEN] = given.strip()
        line_of(scope)  # whether its client is still there, told by the protocol
        await self.served(scope, receive, send)


__all__ = ["NOT_SERVED", "Gate", "Listener", "McpFactory", "connect_host"]
