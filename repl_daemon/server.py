"""The connection loop: frame a line, decode it, call the hub, encode the answer.

No business rule lives here. Each connection has a reader (this loop) and a
writer task; answers go out in request order. An op that must wait (for the
disk, or a wait op for firings) runs as its own task, so the reader keeps
reading: that is what lets many pipelined sends share one commit, and what
notices at once that a waiting client has gone away (its waits are then
cancelled, moving no cursor).
"""

from __future__ import annotations

import errno
import hmac
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
from anyio.abc import SocketStream, TaskStatus

from repl_daemon import protocol as p
from repl_daemon.hub import Hosted, Hub, error_for
from repl_daemon.shared import SharedHub
from session.errors import (
    IdleTimeout,
    LineTooLong,
    ReplError,
    TooMany,
    Unauthorized,
)

log = logging.getLogger("repl.daemon")


@dataclass
class Limits:
    max_line: int = p.MAX_LINE
    idle_timeout: float = 60.0
    max_connections: int = 4096
    max_in_flight: int = 1024
    # answers written but not yet taken by a slow client: past this the
    # connection's reader pauses, so a client that never reads costs at most this
    max_queued_bytes: int = 1 << 20


class CannotListen(Exception):
    """The daemon's address cannot be bound (in use, not local, no permission)."""


class _Answer:
    """One answer in the connection's queue: ready bytes, or a task that will set them."""

    __slots__ = ("data", "done")

    def __init__(self, data: bytes | None = None) -> None:
        self.data = data
        self.done: anyio.Event | None = None if data is not None else anyio.Event()

    def set(self, data: bytes | None) -> None:
        self.data = data
        assert self.done is not None
        self.done.set()


async def serve(
    hub: Hub,
    host: str,
    port: int,
    token: str,
    limits: Limits | None = None,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections until cancelled; reports the bound port through ``task_status``."""
    limits = limits or Limits()
    try:
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
    except OSError as exc:
        raise CannotListen(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
            + (": is another daemon running there?" if exc.errno == errno.EADDRINUSE else "")
        ) from None
    bound = listener.extra(anyio.abc.SocketAttribute.local_port)
    secret = token.encode()

    async def handle(stream: SocketStream) -> None:
        await _serve_connection(hub, stream, secret, limits)

    async with listener:
        task_status.started(bound)
        await listener.serve(handle)


async def _serve_connection(hub: Hub, stream: SocketStream, token: bytes, limits: Limits) -> None:
    async with stream:
        if hub.connections >= limits.max_connections:
            err = TooMany(f"the daemon holds {limits.max_connections:,} connections, its limit")
            await _send_quietly(stream, p.encode(p.error(err)))
            return
        hub.connections += 1
        try:
            await Connection(hub, stream, token, limits).run()
        finally:
            hub.connections -= 1


async def _send_quietly(stream: SocketStream, data: bytes) -> None:
    try:
        with anyio.move_on_after(1):
            await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass


class Connection:
    """One client: a reader (requests, in order) and a writer (answers, in the same order).

    Answers wait in ``answers``; the writer sends every answer that is ready
    in one write, so a pipelining client costs one system call per batch,
    not per answer.
    """

    def __init__(self, hub: Hub, stream: SocketStream, token: bytes, limits: Limits) -> None:
        self.hub = hub
        self.stream = stream
        self.token = token
        self.limits = limits
        self.authed = False
        self.in_flight = 0
        self.answers: deque[_Answer] = deque()
        self.queued_bytes = 0
        self.closed = False
        self.shared = hub if isinstance(hub, SharedHub) else None
        self.more = anyio.Event()  # the writer sleeps on it when nothing is queued
        self.drained = anyio.Event()  # the reader sleeps on it when too much is queued

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._write_answers, tg.cancel_scope)
            async with anyio.create_task_group() as ops:
                await self._read_requests(ops)
                # the client is gone or done: waits are for nobody now
                ops.cancel_scope.cancel()
            self.closed = True
            self.more.set()

    async def _read_requests(self, ops: anyio.abc.TaskGroup) -> None:
        buffer = b""
        max_line = self.limits.max_line
        while True:
            idle = self.limits.idle_timeout
            try:
                with anyio.fail_after(idle):
                    chunk = await self.stream.receive(1 << 16)
            except TimeoutError:
                if self.in_flight:  # a blocked wait exempts its connection
                    continue
                err = IdleTimeout(f"nothing received for {idle:g} s: closing the connection")
                self._queue(p.encode(p.error(err)))
                return
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", start)) >= 0:
                if end - start > max_line:
                    break
                if not self._handle(buffer[start:end], ops):
                    return
                start = end + 1
                await self._backpressure()
            buffer = buffer[start:]
            if len(buffer) > max_line:
                too_long = LineTooLong(
                    f"request line over {max_line:,} bytes: closing the connection"
                )
                self._queue(p.encode(p.error(too_long)))
                return

    def _queue(self, data: bytes) -> None:
        self.queued_bytes += len(data)
        self.answers.append(_Answer(data))
        self.more.set()

    async def _backpressure(self) -> None:
        """Stop reading requests while a slow client leaves too many answers unread."""
        while self.queued_bytes > self.limits.max_queued_bytes or (
            len(self.answers) > self.limits.max_in_flight
        ):
            self.drained = anyio.Event()
            await self.drained.wait()

    def _handle(self, line: bytes, ops: anyio.abc.TaskGroup) -> bool:
        """Answer one line; False closes the connection."""
        hub = self.hub
        hub.requests += 1
        try:
            req = p.decode_request(line)
        except ReplError as exc:
            self._queue(p.encode(p.error(exc, p.request_id(line))))
            return self.authed
        if not self.authed:
            if isinstance(req, p.Auth) and hmac.compare_digest(req.token.encode(), self.token):
                self.authed = True
                self._queue(p.encode(p.Done(id=req.id)))
                return True
            err = Unauthorized("the first request must be auth with the daemon's token")
            if isinstance(req, p.Auth):
                err = Unauthorized("wrong token: the CLI reads it from the daemon's home")
            self._queue(p.encode(p.error(err, req.id)))
            return False
        try:
            answer = self._dispatch(req)
        except Exception as exc:  # every failure becomes an answer, never a crash
            self._queue(p.encode(p.error(self._report(exc), req.id)))
            return True
        if isinstance(answer, bytes):
            self._queue(answer)
        else:
            pending = _Answer()
            self.answers.append(pending)
            self.more.set()
            self.in_flight += 1
            ops.start_soon(self._finish, answer, pending, req.id)
        return True

    def _report(self, exc: BaseException) -> ReplError:
        err = error_for(exc)
        if not isinstance(exc, ReplError):
            log.exception("internal error", exc_info=exc)
        return err

    async def _finish(
        self, work: Callable[[], Awaitable[p.Response]], pending: _Answer, rid: p.RequestId
    ) -> None:
        data = None
        try:
            data = p.encode(await work())
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            data = p.encode(p.error(self._report(exc), rid))
        finally:
            self.in_flight -= 1
            if data is not None:
                self.queued_bytes += len(data)
            pending.set(data)

    def _dispatch(self, req: p.AnyRequest) -> bytes | Callable[[], Awaitable[p.Response]]:
        """Run a request against the hub: bytes now, or work to await."""
        hub = self.hub
        if self.shared is not None:
            shared = self.shared
            return lambda: shared.handle(req)
        match req:
            case p.Send():
                hosted, sent = hub.send(req)
                return self._after_commit(hosted, sent)
            case p.Read():
                return p.encode(hub.read(req))
            case p.Wait():
                return lambda: hub.wait(req)
            case p.Ack():
                hosted, acked = hub.ack(req)
                return self._after_commit(hosted, acked)
            case p.Poll():
                hosted, firings = hub.poll(req)
                return self._after_commit(hosted, firings)
            case p.Cursors():
                return p.encode(hub.cursors(req))
            case p.Ping():
                return p.encode(hub.ping(req))
            case p.Start():
                return lambda: hub.start(req)
            case p.Stop():
                return lambda: hub.stop(req)
            case p.Sessions():
                return p.encode(hub.list_sessions(req))
            case p.Buffer():
                hosted, buffered = hub.buffer(req)
                return self._after_commit(hosted, buffered)
            case p.Stats():
                return p.encode(hub.stats(req))
            case p.Auth():
                return p.encode(p.Done(id=req.id))
        raise AssertionError(f"unhandled op {req!r}")  # pragma: no cover

    def _after_commit(
        self, hosted: Hosted, answer: p.Response
    ) -> bytes | Callable[[], Awaitable[p.Response]]:
        ticket = self.hub.changed(hosted)
        if ticket is None:
            return p.encode(answer)

        async def work() -> p.Response:
            await ticket.wait()
            return answer

        return work

    async def _write_answers(self, scope: anyio.CancelScope) -> None:
        answers = self.answers
        while True:
            if not answers:
                if self.closed:
                    return
                self.more = anyio.Event()
                await self.more.wait()
                continue
            head = answers[0]
            if head.done is not None and not head.done.is_set():
                await head.done.wait()
            # everything ready from the front of the queue goes out in one write
            ready: list[bytes] = []
            while answers and (answers[0].done is None or answers[0].done.is_set()):
                data = answers.popleft().data
                if data is not None:
                    ready.append(data)
            if not ready:
                continue
            out = b"".join(ready)
            try:
                await self.stream.send(out)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                scope.cancel()
                return
            self.queued_bytes -= len(out)
            self.drained.set()
