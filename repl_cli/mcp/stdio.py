"""``repl mcp`` on stdin/stdout: the SDK's stdio transport, our pipe, and the era.

- **The pipe.** The server's stdout is ``Pipe``: the SDK's writer writes its
  messages through it, and a push goes through ``notify``, which returns once
  the reader has taken the line out of the pipe (rule S9's receipt,
  ``repl_cli.api.receipt``, as the CLI's stdout has it). ``claimed_stdout``
  gives it a descriptor of its own, with fd 1 pointed at stderr, so nothing
  else printed can reach the protocol's stream.
- **The era** (rule M5). A following server speaks only the ``initialize``
  era: Claude Code (2.1.332, the newest on 2026-12-05) first probes a stdio
  server with ``server/discover`` (the 2026-07-28 protocol) and registers
  channel notifications only on a connection of the ``initialize`` era; it
  falls back to ``initialize`` when the probe is answered with an error, and
  checks for -32601 (method not found). The SDK's serving loop would answer the
  probe and pick the 2026-07-28 era for the whole connection, so ``refusing``
  answers it here, before the SDK sees it. A non-following ``repl mcp`` serves
  both eras (it pushes nothing). What Claude Code remembers of a probe (its
  ``mcp-discover-verdicts.json``, seven days a stdio command) is a server found
  to be of the ``initialize`` era, which then gets its ``initialize`` at once;
  a server found to be of the new era is forgotten, never remembered, so an
  older repl that answered the probe left nothing behind.

``serve`` runs ``repl mcp`` (the server ``repl_cli.mcp.server.build`` makes) here.
What must not live here: what a push says and when it is acknowledged
(``repl_cli.mcp.push``), the tools (``repl_cli.mcp.server``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc
import msgspec
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import (
    METHOD_NOT_FOUND,
    ErrorData,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
)

from repl_cli.api.receipt import ReaderGone, Receipt, pauses
from repl_cli.mcp.approvals import PERMISSION_REQUEST
from repl_cli.mcp.log import CLIENT, Lines
from repl_cli.mcp.push import Held
from repl_cli.mcp.server import Server, Settings, build

_encode = msgspec.json.Encoder().encode

log = logging.getLogger("repl.mcp")

#: the probe of the 2026-07-28 protocol that a following server refuses
DISCOVER = "server/discover"
#: what it is refused with: JSON-RPC's "method not found", the code Claude Code falls back on
REFUSED = ErrorData(
    code=METHOD_NOT_FOUND,
    message="Method not found: server/discover (this repl mcp --follow server speaks the "
    "initialize handshake, where Claude Code channels are pushed)",
)


class Pipe(anyio.AsyncFile[str]):
    """The server's stdout, for the SDK's stdio transport and for the pushes.

    The SDK's writer writes each of its messages through ``write``; a push goes
    through ``notify``, which returns once the reader has taken it out of the pipe.
    One lock keeps them whole and in order, and a push holds it until its line is
    taken (so the pipe's unread bytes are that line's: its ``Receipt`` looks at
    them). A line the pipe has room for is written at once (at most ``PIPE_BUF``
    bytes, which a pipe takes whole, into a pipe that polls writable); any other
    runs in a worker thread, as the SDK's own writes do: a full pipe blocks a
    thread, never the event loop. (Handing every line to a thread cost a push
    about 80 µs of its 400, docs/benchmarks.md.) Once the reader is gone nothing
    more is written.
    """

    def __init__(self, fd: int) -> None:
        super().__init__(os.fdopen(fd, "w", encoding="utf-8", closefd=False))
        self.receipt = Receipt(fd)
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

    async def there(self) -> bool:
        """Whether the reader is still there: no write found it gone, and the pipe (or
        socket) still has its reader."""
        return not self.gone and self.receipt.reader_there()

    async def notify(self, method: str, params: dict[str, Any]) -> Held | None:
        # the line JSONRPCNotification(...).model_dump_json() writes, without pydantic
        line = _encode({"jsonrpc": "2.0", "method": method, "params": params}).decode()
        async with self.lock:
            if not await self._written(line):
                return None
            for pause in pauses():
                try:
                    if self.receipt.taken():
                        return self.there
                except ReaderGone:
                    self.gone = True
                    return None
                await anyio.sleep(pause)
        raise AssertionError("unreachable: pauses() never ends")  # pragma: no cover

    async def _written(self, line: str) -> bool:
        if self.gone:
            return False
        try:
            if self._fits(line):  # characters: at most 4 bytes each in UTF-8
                self.receipt.write(line)
            else:
                await anyio.to_thread.run_sync(self.receipt.write, line)
        except ReaderGone:  # the reader is gone: nothing more can reach it
            self.gone = True
            return False
        except OSError as exc:  # stdout failed (a full disk)
            log.error("cannot write to stdout (%s)", exc.strerror or exc)
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


async def refusing(
    source: anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
    sink: anyio.abc.ObjectSendStream[SessionMessage | Exception],
    replies: anyio.abc.ObjectSendStream[SessionMessage],
    asked: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Pass the client's messages on to the SDK, but for ``server/discover``: that is
    answered -32601 here, so the client falls back to the ``initialize`` handshake; and,
    with a relay of permission prompts, Claude Code's ``permission_request``
    notifications, which go to ``asked`` (the SDK knows no such notification)."""
    async with sink:
        async for message in source:
            if isinstance(message, SessionMessage):
                said = message.message
                if isinstance(said, JSONRPCRequest) and said.method == DISCOVER:
                    refused = JSONRPCError(jsonrpc="2.0", id=said.id, error=REFUSED)
                    await replies.send(SessionMessage(refused))
                    continue
                if (
                    asked is not None
                    and isinstance(said, JSONRPCNotification)
                    and said.method == PERMISSION_REQUEST
                ):
                    asked(dict(said.params or {}))
                    continue
            await sink.send(message)


def serve(settings: Settings) -> None:
    """Run the server on stdin/stdout until the client closes it."""
    server = build(settings)
    plain_log()
    anyio.run(run_stdio, server)


def plain_log() -> None:
    """Our own lines on stderr as the CLI writes its, ``repl: ...`` one a line (a daemon
    away, a session that cannot be followed), not through the SDK's handler, which
    wraps them at 80 columns; warnings and worse there, and from ``info`` on to a
    client that asks for them (``repl_cli.mcp.log``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("repl: %(message)s"))
    handler.setLevel(logging.WARNING)
    logger = logging.getLogger("repl")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)


async def run_stdio(server: Server) -> None:
    """Serve one client on stdin/stdout (the SDK's transport, writing through our
    ``Pipe``), pushing to it while it is there: a following server in the ``initialize``
    era only; its own lines as log messages to a client that asks (``CLIENT``)."""
    lines = Lines()
    CLIENT.set(lines)
    with claimed_stdout() as pipe:

        async def written(data: bytes) -> None:
            await pipe.write(data.decode() + "\n")

        async with stdio_server(stdout=pipe) as (read, write), anyio.create_task_group() as tg:
            tg.start_soon(lines.run, written)
            options = server.initialization_options()
            if server.push is None:
                await server.lowlevel.run(read, write, options)
            else:
                send, receive = anyio.create_memory_object_stream[SessionMessage | Exception]()
                asked = None
                if (relay := server.relay) is not None:
                    tg.start_soon(relay.run, pipe.notify)
                    asked = relay.ask
                tg.start_soon(refusing, read, send, write, asked)
                tg.start_soon(server.push.run, pipe)
                async with receive:
                    await server.lowlevel.run(receive, write, options)
            tg.cancel_scope.cancel()
