"""The connection loop: frame a line, decode it, hand it to the engine, encode the answer.

No business rule lives here: authentication aside, every request is one
call, ``Engine.handle``, whose ``Outcome`` is ready now, ready once a commit
is durable (its callback answers), or work that runs as its own task (a
wait, a shared store's round trip). A connection reads requests in order
and answers them in the same order, and the reader keeps reading while
answers wait: that is what lets many pipelined sends share one commit, and
what notices at once that a waiting client has gone away (its waits are
then cancelled, moving no cursor).
"""

from __future__ import annotations

import errno
import hmac
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import SocketStream, TaskStatus

from repl_daemon import protocol as p
from repl_daemon.config import Limits
from repl_daemon.engine import Engine
from session.errors import (
    CannotListen,
    IdleTimeout,
    Internal,
    LineTooLong,
    ReplError,
    StoreFailed,
    TooMany,
    Unauthorized,
)

log = logging.getLogger("repl.daemon")


class _Answer:
    """One answer in a connection's queue: its bytes, or a place for them until ready."""

    __slots__ = ("data", "ready")

    def __init__(self, data: bytes | None = None) -> None:
        self.data = data
        self.ready = data is not None


async def serve(
    engine: Engine,
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
        await _serve_connection(engine, stream, secret, limits)

    async with listener:
        task_status.started(bound)
        await listener.serve(handle)


async def _serve_connection(
    engine: Engine, stream: SocketStream, token: bytes, limits: Limits
) -> None:
    async with stream:
        if engine.connections >= limits.max_connections:
            err = TooMany(f"the daemon holds {limits.max_connections:,} connections, its limit")
            await _send_quietly(stream, p.encode(p.error(err)))
            return
        engine.connections += 1
        try:
            await Connection(engine, stream, token, limits).run()
        finally:
            engine.connections -= 1


async def _send_quietly(stream: SocketStream, data: bytes) -> None:
    try:
        with anyio.move_on_after(1):
            await stream.send(data)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass


class Connection:
    """One client: requests read in order, answers written in the same order.

    There is no writer task: whoever makes the answer at the front of the
    queue ready (the reader, a finished wait, a commit) flushes every ready
    answer in one write. So a pipelining client costs one system call per
    batch, and a blocked waiter costs one task (its wait) and no timer: the
    idle deadline is lifted while a wait is in flight.
    """

    def __init__(self, engine: Engine, stream: SocketStream, token: bytes, limits: Limits) -> None:
        self.engine = engine
        self.stream = stream
        self.token = token
        self.limits = limits
        self.authed = False
        self.in_flight = 0
        # a list, not a deque: an idle connection's empty deque would cost 760 bytes
        self.answers: list[_Answer] = []
        self.queued_bytes = 0
        self.flushing = False
        self.flush_soon = False
        self.drained: anyio.Event | None = None  # exists only while the reader waits on it
        self.idle = anyio.CancelScope()
        self.ops: anyio.abc.TaskGroup | None = None

    async def run(self) -> None:
        async with anyio.create_task_group() as ops:
            self.ops = ops
            try:
                await self._read_requests()
            finally:
                # the client is gone or done: its waits are for nobody now
                ops.cancel_scope.cancel()
        self.ops = None  # a commit that ends after this has nowhere to write
        with anyio.move_on_after(1, shield=True):
            await self._flush()  # what was answered before the end (an idle or too-long error)

    async def _read_requests(self) -> None:
        buffer = b""
        max_line = self.limits.max_line
        idle = self.limits.idle_timeout
        while True:
            with anyio.CancelScope(deadline=anyio.current_time() + idle) as scope:
                self.idle = scope
                if self.in_flight:
                    scope.deadline = math.inf
                while True:
                    try:
                        chunk = await self.stream.receive(1 << 16)
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        return
                    buffer += chunk
                    start = 0
                    while (end := buffer.find(b"\n", start)) >= 0:
                        if end - start > max_line:
                            break
                        if not self._handle(buffer[start:end]):
                            return
                        start = end + 1
                        if len(self.answers) > self.limits.max_in_flight:
                            await self._backpressure()
                    buffer = buffer[start:]
                    if len(buffer) > max_line:
                        too_long = LineTooLong(
                            f"request line over {max_line:,} bytes: closing the connection"
                        )
                        self._queue(p.encode(p.error(too_long)))
                        return
                    await self._flush()
                    await self._backpressure()
                    if not self.in_flight:
                        # move the deadline only when it has gone stale: each move costs a timer
                        now = anyio.current_time()
                        if scope.deadline - now < idle * 0.9:
                            scope.deadline = now + idle
            if self.in_flight:  # a blocked wait exempts its connection
                continue
            err = IdleTimeout(f"nothing received for {idle:g} s: closing the connection")
            self._queue(p.encode(p.error(err)))
            return

    def _queue(self, data: bytes) -> None:
        self.queued_bytes += len(data)
        self.answers.append(_Answer(data))

    async def _backpressure(self) -> None:
        """Stop reading requests while a slow client leaves too many answers unread."""
        while self.queued_bytes > self.limits.max_queued_bytes or (
            len(self.answers) > self.limits.max_in_flight
        ):
            self.drained = anyio.Event()
            await self._flush()
            if self.queued_bytes > self.limits.max_queued_bytes or (
                len(self.answers) > self.limits.max_in_flight
            ):
                await self.drained.wait()
        self.drained = None

    async def _flush(self) -> None:
        """Write every ready answer at the front of the queue, in one write per pass."""
        if self.flushing:
            return  # the flush in progress picks up what became ready meanwhile
        self.flushing = True
        answers = self.answers
        try:
            while answers and answers[0].ready:
                taken = 0
                for answer in answers:
                    if not answer.ready:
                        break
                    taken += 1
                ready = [a.data for a in answers[:taken] if a.data is not None]
                del answers[:taken]
                if not ready:
                    continue
                out = b"".join(ready)
                await self.stream.send(out)
                self.queued_bytes -= len(out)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            answers.clear()  # the client is gone; its reader sees the end too
            self.queued_bytes = 0
        finally:
            self.flushing = False
            if self.drained is not None:
                self.drained.set()

    def _ready(self, pending: _Answer, data: bytes) -> None:
        """An answer that was waiting is ready: flush it, from a task if need be."""
        pending.data = data
        pending.ready = True
        self.queued_bytes += len(data)
        if self.ops is None:
            return
        if self.answers and self.answers[0] is pending and not self.flush_soon:
            self.flush_soon = True
            self.ops.start_soon(self._flush_from_task)

    async def _flush_from_task(self) -> None:
        self.flush_soon = False
        await self._flush()

    def _handle(self, line: bytes) -> bool:
        """Answer one line; False closes the connection."""
        engine = self.engine
        engine.requests += 1
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
            outcome = engine.handle(req)
        except Exception as exc:  # every failure becomes an answer, never a crash
            self._queue(p.encode(p.error(self._report(exc), req.id)))
            return True
        job, ticket = outcome.job, outcome.ticket
        if job is None and ticket is None:
            self._queue(p.encode(outcome.value))
            return True
        pending = _Answer()
        self.answers.append(pending)
        if job is None:
            assert ticket is not None
            rid, reply = req.id, outcome.value

            def committed(error: StoreFailed | None) -> None:
                data = p.encode(reply) if error is None else p.encode(p.error(error, rid))
                self._ready(pending, data)

            ticket.add_done_callback(committed)
            return True
        assert self.ops is not None
        self.in_flight += 1
        self.idle.deadline = math.inf
        self.ops.start_soon(self._finish, job, pending, req.id)
        return True

    def _report(self, exc: BaseException) -> ReplError:
        if isinstance(exc, ReplError):
            return exc
        log.exception("internal error", exc_info=exc)
        return Internal(f"internal error: {type(exc).__name__}: {exc}")

    async def _finish(
        self, work: Callable[[], Awaitable[Any]], pending: _Answer, rid: p.RequestId
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
            if not self.in_flight:
                self.idle.deadline = anyio.current_time() + self.limits.idle_timeout
            pending.data = data
            pending.ready = True
            if data is not None:
                self.queued_bytes += len(data)
        await self._flush()
