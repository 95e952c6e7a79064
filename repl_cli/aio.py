"""repl from async Python (anyio: asyncio, and trio, checked by hand): ``repl_cli.api``'s twin.

    from repl_cli import aio

    async with aio.connect() as repl:
        await repl.start("inbox", exist_ok=True)
        await repl.send("inbox", "hello")
        async for batch in repl.follow("inbox"):   # acknowledged when the next is asked for
            ...

The same methods, answers (the protocol's msgspec Structs) and errors
(``api.Error``, ``api.Unavailable``) as ``repl_cli.api``; ``wait`` and
``follow`` ride out a daemon restart for ``reconnect`` seconds the same way,
sleeping without blocking the event loop. One ``AsyncRepl`` is one
connection: give each task that waits its own.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

import anyio
from anyio.abc import ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream
from msgspec import UNSET, UnsetType

from repl_cli.api import (
    MatchLike,
    Unavailable,
    _log_note,
    _typed,
    as_match,
    no_firing,
    reply_tags,
    wait_cursor,
)
from repl_cli.client import (
    CALL_TIMEOUT,
    HTTP_PROBE_AFTER,
    Client,
    decode_answer,
    encoded,
    http_answers,
    not_a_daemon,
    parse_addr,
    plain_to_tls,
    speaks_tls,
    tls_failure,
)
from repl_cli.errors import CliError
from repl_cli.reconnect import DEFAULT_RECONNECT, Outage
from repl_daemon import protocol as p
from session.errors import Code
from session.firing import CursorInfo, Firing
from session.rules import ACK_CURSOR, DEFAULT_HANDLER, FOLLOW_CURSOR, WAIT_CURSOR, WEBHOOK_HANDLER
from session.tags import CORR, REPLY_TO, correlation_id

__all__ = ["AsyncRepl", "connect"]

R = TypeVar("R", bound=p.Response)
T = TypeVar("T")

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


class AsyncRepl:
    """One connection to a daemon, and its operations, awaited."""

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
        self._where = Client(addr, home, token=token, tls_ca=tls_ca, token_file=token_file)
        self.reconnect = reconnect
        self.note = note or _log_note
        self._stream: ByteStream | None = None
        self._lines: BufferedByteReceiveStream | None = None
        #: a daemon answered once: only then is a lost connection an outage to ride out
        self._connected_once = False

    @property
    def addr(self) -> str:
        return self._where.addr

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        stream, self._stream, self._lines = self._stream, None, None
        if stream is not None:
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    # -- the connection -------------------------------------------------------

    async def _connect(self) -> None:
        host, port = parse_addr(self.addr)
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
        except TimeoutError as exc:
            if self._where.tls:
                raise _typed(tls_failure(exc, self.addr)) from None
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise Unavailable(
                f"no daemon at {self.addr} ({reason}): start one with `repl daemon`"
            ) from None
        except OSError as exc:
            if self._where.tls:
                raise _typed(tls_failure(exc, self.addr)) from None
            raise Unavailable(
                f"no daemon at {self.addr} ({exc.strerror or exc}): start one with `repl daemon`"
            ) from None
        except (anyio.EndOfStream, anyio.BrokenResourceError):  # closed in the handshake
            raise _typed(tls_failure(ConnectionResetError(0, "closed"), self.addr)) from None
        self._stream = stream
        self._lines = BufferedByteReceiveStream(stream)
        token = self._where._token()
        try:
            await self._exchange(p.Auth(token=token), p.Done, CALL_TIMEOUT, probe=(host, port))
        except CliError as exc:
            if exc.code == Code.UNAUTHORIZED:  # say which token that was
                exc.message = f"{exc.message}; this one was {self._where._token_source()}"
            elif (
                exc.code is None
                and not self._where.tls
                and await anyio.to_thread.run_sync(speaks_tls, host, port)
            ):
                raise plain_to_tls(self.addr) from None
            raise
        self._connected_once = True

    async def _exchange(
        self,
        request: p.Request,
        expect: type[R],
        within: float | None,
        probe: tuple[str, int] | None = None,
    ) -> R:
        """Send ``request`` and read its answer (within ``within`` s, None: however long a
        wait takes); a broken link is ``Unavailable``. ``probe``: the host and port to ask
        whether an HTTP server answers there, when the answer is slow to come (the auth)."""
        data = encoded(request)
        if self._stream is None:
            await self._connect()
        assert self._stream is not None and self._lines is not None
        try:
            with anyio.fail_after(math.inf if within is None else within):
                await self._stream.send(data)
                line = await self._answer(probe)
        except TimeoutError:
            await self.aclose()
            raise Unavailable(
                f"the daemon at {self.addr} did not answer within {within:g} s: see its log"
            ) from None
        except (
            OSError,
            anyio.EndOfStream,
            anyio.IncompleteRead,  # the daemon went away part-way (or before a line)
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
        ):
            await self.aclose()
            raise Unavailable(
                f"the daemon at {self.addr} closed the connection: "
                "check it with `repl ping` and run the command again"
            ) from None
        return decode_answer(line, expect, self.addr)

    async def _answer(self, probe: tuple[str, int] | None) -> bytes:
        assert self._lines is not None
        if probe is not None:
            with anyio.move_on_after(HTTP_PROBE_AFTER):
                return await self._lines.receive_until(b"\n", MAX_ANSWER)
            if await anyio.to_thread.run_sync(http_answers, *probe, self._where.tls):
                await self.aclose()
                raise not_a_daemon(self.addr)
        return await self._lines.receive_until(b"\n", MAX_ANSWER)

    async def _call(self, request: p.Request, expect: type[R]) -> R:
        try:
            return await self._exchange(request, expect, CALL_TIMEOUT)
        except CliError as exc:
            raise _typed(exc) from None

    # -- the daemon ----------------------------------------------------------

    async def ping(self) -> p.Pong:
        return await self._call(p.Ping(), p.Pong)

    async def shutdown(self) -> None:
        await self._call(p.Shutdown(), p.Done)
        await self.aclose()

    async def stats(self, session: str | None = None) -> p.StatsReply:
        return await self._call(p.Stats(session=session), p.StatsReply)

    # -- sessions ------------------------------------------------------------

    async def start(
        self, session: str | None = None, *, buffer: int | None = None, exist_ok: bool = False
    ) -> p.Started:
        request = p.Start(session=session, buffer=buffer, exist_ok=exist_ok)
        return await self._call(request, p.Started)

    async def stop(self, session: str) -> None:
        await self._call(p.Stop(session=session), p.Done)

    async def sessions(self) -> list[p.SessionInfo]:
        return (await self._call(p.Sessions(), p.SessionList)).sessions

    async def buffer(self, session: str, limit: int) -> p.Buffered:
        return await self._call(p.Buffer(session=session, limit=limit), p.Buffered)

    async def cursors(self, session: str) -> list[CursorInfo]:
        return (await self._call(p.Cursors(session=session), p.CursorList)).cursors

    # -- firings -------------------------------------------------------------

    async def send(
        self,
        session: str,
        text: str,
        *,
        handler: str = DEFAULT_HANDLER,
        key: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> p.Sent:
        request = p.Send(
            session=session, text=text, handler=handler, key=key, tags=dict(tags or {})
        )
        return await self._call(request, p.Sent)

    async def schedule(
        self,
        session: str,
        text: str = "",
        *,
        in_: str | None = None,
        at: str | None = None,
        every: str | None = None,
        handler: str | None = None,
        key: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> p.TimerSet:
        request = p.Schedule(
            session=session,
            text=text,
            handler=handler,
            in_=in_,
            at=at,
            every=every,
            key=key,
            tags=dict(tags or {}),
        )
        return await self._call(request, p.TimerSet)

    async def webhook(
        self, session: str, secret: str | None, *, handler: str = WEBHOOK_HANDLER
    ) -> None:
        """Give the session a webhook secret (``POST /hooks/{id}``), or with None take it away."""
        await self._call(p.SetWebhook(session=session, secret=secret, handler=handler), p.Done)

    async def token_add(self, name: str, sessions: list[str], can: list[str]) -> p.TokenMade:
        """Make a scoped token (the root token's only): its secret is in the answer, once."""
        request = p.Token(action="add", name=name, sessions=sessions, can=can)
        return await self._call(request, p.TokenMade)

    async def token_list(self) -> list[p.TokenInfo]:
        return (await self._call(p.Token(action="list"), p.TokenList)).tokens

    async def token_revoke(self, name: str) -> None:
        await self._call(p.Token(action="revoke", name=name), p.Done)

    async def timers(self, session: str | None = None) -> list[p.TimerInfo]:
        return (await self._call(p.Timers(session=session), p.TimerList)).timers

    async def cancel(self, session: str, timer: str) -> p.TimerInfo:
        return (await self._call(p.Cancel(session=session, timer=timer), p.Cancelled)).timer

    async def read(
        self,
        session: str,
        *,
        cursor: str | None = None,
        after: int | None = None,
        max: int | None = None,
        peek: bool = False,
        match: MatchLike | None = None,
    ) -> p.Firings:
        """As ``api.Repl.read``: acknowledges nothing; ``ack`` the batch's ``next``."""
        request = p.Read(
            session=session, cursor=cursor, after=after, max=max, peek=peek, match=as_match(match)
        )
        return await self._call(request, p.Firings)

    async def ack(self, session: str, seq: int, *, cursor: str = ACK_CURSOR) -> p.Acked:
        return await self._call(p.Ack(session=session, cursor=cursor, seq=seq), p.Acked)

    async def poll(self, session: str, *, max: int | None = None) -> p.Firings:
        return await self._call(p.Poll(session=session, max=max), p.Firings)

    async def wait(
        self,
        sessions: str | list[str],
        *,
        cursor: str | UnsetType | None = UNSET,
        timeout: float | None = None,  # noqa: ASYNC109 - the daemon's own timeout_ms
        max: int | None = None,
        ack: dict[str, int] | None = None,
        match: MatchLike | None = None,
        after: int | None = None,
    ) -> p.Woken:
        """As ``api.Repl.wait``: blocks (without blocking the loop), rides out a restart.

        ``timeout`` is the wait's own (the daemon answers ``timed_out``), not a
        cancel scope: cancelling from outside drops the wait and moves nothing.
        """
        ids = [sessions] if isinstance(sessions, str) else list(sessions)
        now = anyio.current_time
        deadline = None if timeout is None else now() + timeout
        outage = Outage(self.reconnect, self.addr, self.note, deadline, clock=now)
        chosen = None if after is not None else wait_cursor(cursor, match, WAIT_CURSOR)
        wanted = as_match(match)
        while True:
            request = p.Wait(
                sessions=ids,
                cursor=chosen,
                timeout_ms=outage.remaining_ms(),
                max=max,
                ack=ack or {},
                match=wanted,
                after=after,
            )
            try:
                woken = await self._exchange(request, p.Woken, None)
            except CliError as exc:
                try:
                    pause = outage.lost(exc, was_there=self._connected_once)
                except CliError as final:
                    raise _typed(final) from None
                await self.aclose()
                await anyio.sleep(pause)
                if outage.timed_out:
                    return p.Woken(batches=[], timed_out=True)
                continue
            outage.back()
            return woken

    async def follow(
        self,
        session: str,
        *,
        cursor: str | UnsetType | None = UNSET,
        max: int | None = None,
        match: MatchLike | None = None,
    ) -> AsyncIterator[p.SessionBatch]:
        """As ``api.Repl.follow``: a batch is acknowledged when the next is asked for."""
        chosen = wait_cursor(cursor, match, FOLLOW_CURSOR)
        carried: dict[str, int] = {}
        after: int | None = None
        while True:
            if chosen is None:
                woken = await self.wait(session, cursor=None, max=max, match=match, after=after)
            else:
                woken = await self.wait(session, cursor=chosen, max=max, ack=carried, match=match)
            for batch in woken.batches:
                yield batch
                carried, after = {batch.session: batch.next}, batch.next

    # -- request and reply -------------------------------------------------------

    async def request(
        self,
        session: str,
        text: str,
        *,
        reply_to: str,
        timeout: float | None = 30.0,  # noqa: ASYNC109 - the wait's own timeout
        handler: str = DEFAULT_HANDLER,
        tags: Mapping[str, str] | None = None,
    ) -> Firing | None:
        """As ``api.Repl.request``: the reply firing, or None at ``timeout``."""
        corr = correlation_id()
        await self.stats(reply_to)  # where the reply goes must exist before the request leaves
        sent_tags = {**(tags or {}), REPLY_TO: reply_to, CORR: corr}
        await self.send(session, text, handler=handler, tags=sent_tags)
        woken = await self.wait(reply_to, cursor=None, match={CORR: corr}, timeout=timeout, max=1)
        if woken.timed_out or not woken.batches:
            return None
        return woken.batches[0].firings[0]

    async def reply(
        self, session: str, seq: int, text: str, *, handler: str = DEFAULT_HANDLER
    ) -> p.Sent:
        """As ``api.Repl.reply``."""
        firing = await self.firing(session, seq)
        target, tags = reply_tags(firing, session)
        return await self.send(target, text, handler=handler, tags=tags)

    async def firing(self, session: str, seq: int) -> Firing:
        """As ``api.Repl.firing``."""
        if seq < 1:
            raise CliError(f"seq {seq} names no firing: seqs start at 1")
        head = (await self.stats(session)).sessions[0].head
        if seq > head:
            raise CliError(f"session {session!r} has no firing {seq}: its head is {head}")
        batch = await self.read(session, after=seq - 1, max=1)
        if not batch.firings or batch.firings[0].seq != seq:
            raise no_firing(session, seq, batch)
        return batch.firings[0]
