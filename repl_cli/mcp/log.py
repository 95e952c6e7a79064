"""The MCP server's own lines, told to its client as MCP log messages too (rule M8).

What ``repl mcp`` writes on stderr, ``repl: ...`` one a line (a daemon away and
back, a session that cannot be followed, an acknowledgement that failed, a client
that left within the hold), is what the person behind the client would want to
see, and a harness shows a server's log messages where it does not show its
stderr. So a client that asked with ``logging/setLevel`` is sent each of those
lines at its level or above as ``notifications/message`` (``level``, ``logger``
``repl``, ``data`` the line), as well as stderr having it. A client that did not
ask is sent none, and the 2026-07-28 protocol has no ``logging/setLevel`` (the
SDK marks it deprecated there: a log message of that protocol rides one request's
stream, asked for in that request's ``_meta``, and these lines answer no request),
so a client of it is sent none either.

The lines are the ``repl`` logger's (the API's notes of a daemon away, and
``repl.mcp``'s), and go to the client whose work wrote them: ``CLIENT``, a
context variable, is set for stdio's one client when the server starts, and over
HTTP, where one daemon serves many clients in one process, for each MCP session
as it is made (``repl_cli.mcp.http``), and the tasks that work for a client
inherit it. A line written in no client's context (the daemon's own) goes to
none. ``Lines`` holds what waits to be sent (a few dozen at most: a client that
does not read drops lines, never holds up the server); its ``run`` sends them,
through what the transport writes with.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import suppress
from contextvars import ContextVar
from typing import Any, cast

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server as LowLevelServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    EmptyResult,
    JSONRPCNotification,
    LoggingLevel,
    SetLevelRequestParams,
)

#: MCP's levels (RFC 5424's) as the logging module's numbers
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "notice": 25,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "alert": 60,
    "emergency": 70,
}
#: the lines of these loggers are the daemon's, never a client's
DAEMONS = "repl.daemon"
#: the most lines waiting to be sent to one client
QUEUED = 64


def level_name(number: int) -> LoggingLevel:
    """The MCP level of a logging level number: the highest at or below it."""
    names = [name for name, n in LEVELS.items() if n <= number] or ["debug"]
    return cast("LoggingLevel", names[-1])


def message(level: str, line: str) -> bytes:
    """A ``notifications/message`` as JSON."""
    params = {"level": level, "logger": "repl", "data": line}
    notification = JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params=params)
    return notification.model_dump_json(by_alias=True, exclude_unset=True).encode()


class Lines:
    """One client's log lines on their way: its level (None until it asks), and the lines
    at that level or above, sent by ``run`` through ``write``."""

    def __init__(self) -> None:
        self.level: int | None = None
        self.send: MemoryObjectSendStream[bytes] | None = None  # while ``run`` runs

    def tell(self, number: int, line: str) -> None:
        """Queue ``line`` (of logging level ``number``) when the client asked for it."""
        if self.send is None or self.level is None or number < self.level:
            return
        # a client that does not read drops lines: stderr has them
        with suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            self.send.send_nowait(message(level_name(number), line))

    async def run(self, write: Callable[[bytes], Awaitable[object]]) -> None:
        """Send each line queued, as long as the client is served."""
        send, receive = anyio.create_memory_object_stream[bytes](QUEUED)
        self.send = send
        async with send, receive:
            async for data in receive:
                await write(data)


#: the client whose work is in hand: where the ``repl`` logger's lines go
CLIENT: ContextVar[Lines | None] = ContextVar("repl.mcp.client", default=None)


class ToClient(logging.Handler):
    """The ``repl`` logger's lines to the client in hand, formatted as on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        client = CLIENT.get()
        if client is not None and not record.name.startswith(DAEMONS):
            client.tell(record.levelno, record.getMessage())


_HANDLER = ToClient()


def install() -> None:
    """Send the ``repl`` logger's lines to the client in hand too (once a process)."""
    logger = logging.getLogger("repl")
    if _HANDLER not in logger.handlers:
        logger.addHandler(_HANDLER)


async def set_level(ctx: ServerRequestContext[Any], params: SetLevelRequestParams) -> EmptyResult:
    """``logging/setLevel``: this client is sent the lines at ``params.level`` or above."""
    client = CLIENT.get()
    if client is None:  # pragma: no cover - every transport sets one for its clients
        raise MCPError(INVALID_PARAMS, "repl: this server sends no log messages")
    client.level = LEVELS[params.level]
    return EmptyResult()


def serve_levels(server: LowLevelServer[Any]) -> None:
    """Serve ``logging/setLevel`` on ``server`` (the handshake then declares ``logging``)."""
    install()
    server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)


__all__ = ["CLIENT", "LEVELS", "Lines", "install", "serve_levels"]
