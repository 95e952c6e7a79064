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

Pushes (``--follow``, rule M4) are not served over HTTP yet: the server
declares neither the channel nor subscriptions (``build`` with no
``follow``), only its tools and resources.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from repl_cli.mcp_server import Settings, build

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from repl_daemon.http.mcp import Listener

#: the scope's key the daemon puts the presented token under (``repl_daemon.http.mcp.TOKEN``)
TOKEN = "repl.token"

LOOPBACK = ("127.0.0.1", "localhost", "::1")


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


class Served:
    """The ASGI app the daemon hands /mcp's requests to: the server of the request's token."""

    def __init__(self, listener: Listener, tg: TaskGroup) -> None:
        self.listener = listener
        self.security = security(listener)
        self.tg = tg
        self.apps: dict[str, StreamableHTTPASGIApp] = {}
        self.lock = anyio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token: str = scope[TOKEN]
        app = self.apps.get(token) or await self.start(token)
        await app(scope, receive, send)

    async def start(self, token: str) -> StreamableHTTPASGIApp:
        """The server of ``token`` and its session manager, running from now on."""
        async with self.lock:
            if token in self.apps:  # made while this request waited for the lock
                return self.apps[token]
            where = self.listener
            server = build(
                Settings(addr=where.addr, home=where.home, token=token, tls_ca=where.tls_ca)
            )
            manager = StreamableHTTPSessionManager(
                app=server.lowlevel, security_settings=self.security
            )
            await self.tg.start(run, manager)
            app = self.apps[token] = StreamableHTTPASGIApp(manager)
            return app


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


__all__ = ["TOKEN", "security", "serving"]
