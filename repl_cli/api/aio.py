"""repl from async Python (anyio: asyncio, and trio, checked by hand): ``repl_cli.api``'s twin.

    from repl_cli.api import aio

    async with aio.connect() as repl:
        await repl.start("inbox", exist_ok=True)
        await repl.send("inbox", "hello")
        async for batch in repl.follow("inbox"):   # acknowledged when the next is asked for
            ...

The same methods, answers (the protocol's msgspec Structs) and errors
(``repl_cli.api.errors``: ``api.Error`` and its classes) as ``repl_cli.api``; ``wait`` and
``follow`` ride out a daemon restart for ``reconnect`` seconds the same way,
sleeping without blocking the event loop, and every call rides out an idle
close or a restart between two calls as ``repl_cli.api``'s do (the rules are
``repl_cli/api/_async/operations.py``'s, one path for both). One ``AsyncRepl`` is
one connection: give each task that waits its own. A call cancelled before
its answer came leaves that answer owed on the connection, so the next call
is made on a new one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import anyio
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

from repl_cli.api._async.operations import AsyncOperations
from repl_cli.api._common import R, log_note
from repl_cli.api.client import (
    CALL_TIMEOUT,
    HTTP_PROBE_AFTER,
    Opening,
    Where,
    closed_by_daemon,
    connection_closed,
    decode_answer,
    encoded,
    http_answers,
    no_answer,
    speaks_tls,
)
from repl_cli.api.errors import Error
from repl_cli.api.reconnect import DEFAULT_RECONNECT
from repl_daemon import protocol as p

__all__ = ["AsyncRepl", "connect"]

#: the longest answer line read (the daemon's own request limit is 1 MiB; a read answers more)
MAX_ANSWER = 256 * 1024 * 1024


def connect(
    addr: str | None = None,
    home: str | Path | None = None,
    *,
    reconnect: float = DEFAULT_RECONNECT,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    token_file: str | Path | None = None,
) -> AsyncRepl:
    """An ``AsyncRepl`` for the daemon at ``addr`` (``REPL_ADDR``, else 127.0.0.1:7427),
    with ``token`` (else ``REPL_TOKEN``, else the root token in ``home``); it connects on
    the first call, over TLS as ``api.connect`` does. Use ``async with``."""
    return AsyncRepl(
        addr, home, reconnect=reconnect, token=token, tls_ca=tls_ca, token_file=token_file
    )


class AsyncRepl(AsyncOperations):
    """One connection to a daemon, and its operations (``repl_cli/api/_async/operations.py``
    says what each does), awaited."""

    def __init__(
        self,
        addr: str | None = None,
        home: str | Path | None = None,
        *,
        reconnect: float = DEFAULT_RECONNECT,
        note: Callable[[str], None] | None = None,
        token: str | None = None,
        tls_ca: str | Path | None = None,
        token_file: str | Path | None = None,
    ) -> None:
        # the sync client knows where the daemon and its token are; it never connects here
        self._where = Where(addr, home, token=token, tls_ca=tls_ca, token_file=token_file)
        self.reconnect = reconnect
        self.note = note or log_note
        self._stream: ByteStream | None = None
        self._lines: BufferedByteReceiveStream | None = None
        #: a request was written and its answer not read (a call cancelled meanwhile left
        #: it on the connection, where the next call must not take it for its own)
        self._owed = False
        #: a daemon answered once: only then is a lost connection an outage to ride out
        self._connected_once = False

    @property
    def addr(self) -> str:
        return self._where.addr

    async def aclose(self) -> None:
        stream, self._stream, self._lines = self._stream, None, None
        self._owed = False
        if stream is not None:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    # -- the connection -------------------------------------------------------

    async def _connect(self) -> None:
        """Open, authenticate and probe (``client.Opening``), over an anyio stream."""
        opening = Opening(self._where)
        host, port = opening.host, opening.port
        tls = self._where.tls  # anyio's connect makes the handshake too: its failure is one
        try:
            stream: ByteStream
            with anyio.fail_after(CALL_TIMEOUT):
                if self._where.tls:  # anyio's TLS, over the standard library's ssl
                    stream = await anyio.connect_tcp(
                        host,
                        port,
                        ssl_context=self._where.tls_context(),
                        tls_hostname=host,
                        tls_standard_compatible=False,
                    )
                else:
                    stream = await anyio.connect_tcp(host, port)
        except OSError as exc:  # TimeoutError too
            raise opening.connect_failed(exc, handshake=tls) from None
        except (anyio.EndOfStream, anyio.BrokenResourceError):  # closed in the handshake
            closed = ConnectionResetError(0, "closed")
            raise opening.connect_failed(closed, handshake=True) from None
        self._stream = stream
        self._lines = BufferedByteReceiveStream(stream)
        try:  # a token that cannot be read is no reason to probe for TLS
            auth = opening.auth()
        except Error:
            await self.aclose()
            raise
        try:
            await self._exchange(auth, p.Done, CALL_TIMEOUT, probe=opening)
        except Error as exc:
            tls = opening.probe_tls(exc) and await anyio.to_thread.run_sync(speaks_tls, host, port)
            raise opening.failed(exc, tls) from None
        self._connected_once = True

    async def _exchange(
        self,
        request: p.Request,
        expect: type[R],
        within: float | None,
        probe: Opening | None = None,
    ) -> R:
        """Send ``request`` and read its answer (within ``within`` s, None: however long a
        wait takes); a broken link is ``AnswerLost``. ``probe`` (the auth, on the connection
        just opened): the host and port to ask whether an HTTP server answers there, when
        the answer is slow to come."""
        data = encoded(request)
        if probe is None:
            await self._open()
        assert self._stream is not None and self._lines is not None
        try:
            with anyio.fail_after(math.inf if within is None else within):
                self._owed = True
                await self._stream.send(data)
                line = await self._answer(probe)
                self._owed = False
        except TimeoutError:
            await self.aclose()
            raise no_answer(self.addr, within or 0) from None
        except (
            OSError,
            anyio.EndOfStream,
            anyio.IncompleteRead,  # the daemon went away part-way (or before a line)
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
        ):
            await self.aclose()
            raise connection_closed(self.addr) from None
        return decode_answer(line, expect, self.addr)

    async def _open(self) -> None:
        """A connection that can carry a request: this one, unless the daemon closed it
        (``client.closed_by_daemon``) or a cancelled call's answer is owed on it, else a
        new one."""
        stream, lines = self._stream, self._lines
        if stream is not None and lines is not None:
            raw = stream.extra(SocketAttribute.raw_socket)
            if self._owed or closed_by_daemon(raw, len(lines.buffer)):
                await self.aclose()
        if self._stream is None:
            await self._connect()

    async def _answer(self, probe: Opening | None) -> bytes:
        assert self._lines is not None
        if probe is not None:
            with anyio.move_on_after(HTTP_PROBE_AFTER):
                return await self._lines.receive_until(b"\n", MAX_ANSWER)
            found = await anyio.to_thread.run_sync(
                http_answers, probe.host, probe.port, probe.where.tls
            )
            slow = probe.slow(found)
            if slow is not None:
                await self.aclose()
                raise slow
        return await self._lines.receive_until(b"\n", MAX_ANSWER)

    # -- the primitives of the operations -------------------------------------------

    async def _request(self, request: p.Request, expect: type[R]) -> R:
        return await self._exchange(request, expect, CALL_TIMEOUT)

    async def _blocking(self, request: p.Request, expect: type[R]) -> R:
        return await self._exchange(request, expect, None)

    def _answered_once(self) -> bool:
        return self._connected_once

    def _clock(self) -> float:
        return anyio.current_time()

    async def _sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)
