"""The connection loop: frame a line, decode it, hand it to the engine, encode the answer.

No business rule lives here: authentication aside, every request is one
call, ``Engine.handle``, whose ``Outcome`` is ready now, ready once a commit
is durable (its callback answers), or a job that answers through a callback
(a wait, a shared store's round trip). A connection reads requests in order
and answers them in the same order, and keeps reading while answers wait:
that is what lets many pipelined sends share one commit, and what notices
at once that a waiting client has gone away (its jobs are then cancelled,
moving no cursor).

Authentication is the engine's too (``Engine.authenticate``): the first
request must be ``auth`` with the root token or a scoped one (rules K1-K5), and
a wrong one closes the connection, so each connection gets one try. While a
scoped token is looked up in a shared store nothing more is read. A
connection holds its token: when the token is revoked, its waits are
answered ``unauthorized`` and it is closed.

A connection is an asyncio protocol, not a task reading an anyio stream:
its requests are handled in the loop's own callback for the bytes that
came, and an answer is written with the transport's non-blocking ``write``
by whoever makes it ready (the reader, a woken wait, a commit). So an idle
connection costs no task, no cancel scope and no event (anyio's stream
had three events and a read queue per connection, and paused and resumed
the transport around every read: an epoll change each on uvloop). The daemon
runs under ``anyio.run`` on the asyncio backend (with or without uvloop),
whose loop serves these protocols.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import os
import ssl
from typing import Any, cast

import anyio
import msgspec
from anyio.abc import TaskStatus

from repl_daemon import protocol as p
from repl_daemon.config import Limits
from repl_daemon.engine import Engine
from repl_daemon.engine.outcome import Job
from session.errors import (
    CannotListen,
    IdleTimeout,
    Internal,
    LineTooLong,
    ReplError,
    SlowConsumer,
    StoreFailed,
    TooMany,
    Unauthorized,
)
from session.scopes import TokenRecord, scoped_refusal

log = logging.getLogger("repl.daemon")

#: how long a closing connection may take to hand its last answers to a client
CLOSE_GRACE_S = 1.0


class _Answer:
    """One answer in a connection's queue: its bytes, or a place for them (None) until ready."""

    __slots__ = ("data",)

    def __init__(self, data: bytes | None = None) -> None:
        self.data = data


class _JobAnswer(_Answer):
    """The place of an answer that a job gives; its ``done`` is the job's callback."""

    __slots__ = ("connection", "job", "rid")

    def __init__(self, connection: Connection, job: Job[Any], rid: p.RequestId) -> None:
        super().__init__()
        self.connection = connection
        self.job: Job[Any] | None = job
        self.rid = rid

    def done(self, value: p.Response | None, error: Exception | None) -> None:
        self.connection._job_done(self, value, error)


class _AuthAnswer(_JobAnswer):
    """The place of an ``auth``'s answer while its token is looked up in the store."""

    __slots__ = ()

    def done(self, value: TokenRecord | None, error: Exception | None) -> None:  # type: ignore[override]
        self.connection._auth_done(self, value, error)


class _IdleClock:
    """Every connection's idle deadline on one loop timer: arming or lifting one is a set operation.

    A deadline is kept in the bucket of its tick (a tenth of the idle timeout,
    at most a second), and the loop's timer is set for the earliest bucket
    only, so a connection is closed at most one tick after its deadline. With
    a timer of the loop's own per connection, every wait that blocked and
    woke cancelled one and made another: 1.4-1.8 µs a waiter (a fifth of a
    fan-out's work in the daemon).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_timeout: float) -> None:
        self.loop = loop
        self.tick = min(1.0, idle_timeout / 10)
        self.buckets: dict[int, set[Connection]] = {}
        self.due = math.inf  # the bucket the timer is set for
        self.timer: asyncio.TimerHandle | None = None

    def add(self, connection: Connection, deadline: float) -> int:
        """Call ``connection._idle()`` once ``deadline`` is past; returns its bucket."""
        key = math.ceil(deadline / self.tick)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = set()
            if key < self.due:
                self._set(key)
        bucket.add(connection)
        return key

    def discard(self, connection: Connection, key: int) -> None:
        bucket = self.buckets.get(key)
        if bucket is not None:
            bucket.discard(connection)  # an empty bucket goes when it is due

    def _set(self, key: int) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.due = key
        self.timer = self.loop.call_at(key * self.tick, self._fire)

    def _fire(self) -> None:
        # every bucket up to the one the timer was set for (a timer may fire a hair early:
        # a connection that is not quite due yet goes into a bucket again)
        limit = max(self.due, math.floor(self.loop.time() / self.tick))
        self.timer, self.due = None, -math.inf  # no timer is set while the buckets are called
        for key in sorted(k for k in self.buckets if k <= limit):
            for connection in self.buckets.pop(key):
                connection._idle()
        self.due = math.inf
        if self.buckets:
            self._set(min(self.buckets))


class _Woken:
    """The last wait's answer encoded, to give a fan-out's waiters at one position.

    The waiters of one session woken by one change, each at the same position,
    share their look (``LocalCommitter._look``): their answers hold the same
    list of firings, and differ at most by the request's id. Such an answer
    (a ``Woken`` of one batch, with no id) is encoded once: the next whose
    batch has the same firings (the same list, held here so that its identity
    cannot be taken by another) and the same session, ``next`` and ``lost``
    is given the same bytes.
    """

    __slots__ = ("batch", "data")

    def __init__(self) -> None:
        self.batch: p.SessionBatch | None = None
        self.data = b""

    def encode(self, value: p.Response) -> bytes:
        if (
            type(value) is not p.Woken
            or value.id is not msgspec.UNSET
            or value.timed_out  # neither kept nor given: only a woken answer's bytes are
            or len(value.batches) != 1
        ):
            return p.encode(value)
        batch, last = value.batches[0], self.batch
        if (
            last is not None
            and batch.firings is last.firings
            and batch.next == last.next
            and batch.lost == last.lost
            and batch.session == last.session
        ):
            return self.data
        data = p.encode(value)
        self.batch, self.data = batch, data
        return data


class _Connections:
    """The open connections, so that the end of the server can close them all."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_timeout: float) -> None:
        self.open: set[Connection] = set()
        self.woken = _Woken()
        self.stopping = False
        self.ended = anyio.Event()
        self.idle = _IdleClock(loop, idle_timeout)
        #: bytes the connections hold of requests not yet handled (half lines, mostly)
        self.buffered = 0

    def discard(self, connection: Connection) -> None:
        self.open.discard(connection)
        if self.stopping and not self.open:
            self.ended.set()


async def serve(
    engine: Engine,
    host: str,
    port: int,
    token: str,
    limits: Limits | None = None,
    *,
    tls: ssl.SSLContext | None = None,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Accept connections until cancelled (over TLS with ``tls``); reports the bound port
    through ``task_status``."""
    limits = limits or Limits()
    secret = token.encode()
    loop = asyncio.get_running_loop()
    connections = _Connections(loop, limits.idle_timeout)
    try:
        server = await loop.create_server(
            lambda: Connection(engine, secret, limits, connections),
            host,
            port,
            backlog=65_536,  # as anyio's listener: the kernel caps it at somaxconn
            ssl=tls,
            # a client that connects and never finishes its handshake is closed as an idle one
            ssl_handshake_timeout=None if tls is None else min(60.0, limits.idle_timeout),
        )
    except OSError as exc:
        # asyncio rewords the system's message ("error while attempting to bind..."): say it plainly
        # (a name that does not resolve has a negative errno and its own message)
        reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or exc
        raise CannotListen(
            f"cannot listen on {host}:{port}: {reason}"
            + (": is another daemon running there?" if exc.errno == errno.EADDRINUSE else "")
        ) from None
    bound: int = server.sockets[0].getsockname()[1]
    try:
        task_status.started(bound)
        await anyio.sleep_forever()
    finally:
        server.close()
        connections.stopping = True
        for connection in list(connections.open):
            connection.close()
        if connections.open:
            with anyio.move_on_after(CLOSE_GRACE_S, shield=True):
                await connections.ended.wait()


class Connection(asyncio.Protocol):
    """One client: requests read in order, answers written in the same order.

    Whoever makes the answer at the front of the queue ready flushes every
    ready answer in one write, so a pipelining client costs one system call
    per batch. A blocked wait exempts its connection from the idle timeout:
    its connection leaves the idle clock until the last job is done.
    """

    __slots__ = (
        "answers",
        "authed",
        "authing",
        "buffer",
        "closed",
        "connections",
        "counted",
        "engine",
        "flush_soon",
        "held",
        "idle_key",
        "in_flight",
        "limits",
        "loop",
        "paused",
        "processing",
        "queued_bytes",
        "secret",
        "seen",
        "stalled",
        "token",
        "transport",
        "unsent",
        "write_paused",
    )

    def __init__(
        self, engine: Engine, token: bytes, limits: Limits, connections: _Connections
    ) -> None:
        self.engine = engine
        self.secret = token  # the root token
        #: the scoped token this connection authenticated with (None: the root, or not yet)
        self.token: TokenRecord | None = None
        self.limits = limits
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.authed = False
        self.authing = False  # its auth's token is being looked up: nothing more is read
        self.counted = False
        self.closed = False
        self.buffer = b""
        # a list, not a deque: an idle connection's empty deque would cost 760 bytes
        self.answers: list[_Answer] = []
        self.queued_bytes = 0  # of ready answers not yet written (behind one that is not)
        self.in_flight = 0  # jobs not yet answered
        self.paused = False  # reading stopped: too many answers wait, or the client reads slowly
        self.processing = False
        self.flush_soon = False
        self.write_paused = False
        #: loop time of the last whole request line (or of the start, or the last job's
        #: end): bytes that end no line do not move it, so a line trickled a byte at a
        #: time must still arrive whole within the idle timeout
        self.seen = 0.0
        self.held = 0  # the bytes of ``buffer`` counted in the connections' ``buffered``
        self.idle_key: int | None = None  # its bucket in the idle clock, while it is in one
        #: while the transport is past its high-water mark: the close of a slow consumer
        self.stalled: asyncio.TimerHandle | None = None
        self.unsent = 0  # the bytes unsent when ``stalled`` was last set: a fall is progress

    # -- the transport's callbacks ------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have a Transport's methods but not its class
        self.transport = transport = cast(asyncio.Transport, transport)
        engine, limits = self.engine, self.limits
        if engine.connections >= limits.max_connections:
            err = TooMany(f"the daemon holds {limits.max_connections:,} connections, its limit")
            self._queue(self._refused(err))
            self.close()
            return
        engine.connections += 1
        self.counted = True
        self.connections.open.add(self)
        # past this much unsent, the transport says so (pause_writing) and reading stops
        transport.set_write_buffer_limits(high=limits.max_queued_bytes)
        self.seen = self.loop.time()
        self.idle_key = self.connections.idle.add(self, self.seen + limits.idle_timeout)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.authed and not self.buffer and data.startswith(b"\x16\x03"):
            # a TLS handshake (no request starts so) on a listener without TLS: closed at
            # once, so the client's handshake fails now, not at its timeout
            log.info("a TLS client reached this listener, which has no TLS: closing it")
            self.closed = True
            assert self.transport is not None
            self.transport.abort()
            return
        self.buffer = self.buffer + data if self.buffer else data
        self._process()

    def eof_received(self) -> bool:
        # the client is done: its jobs are for nobody now; what is ready is still written
        # (over TLS the transport cannot stay half open: asyncio would warn about True)
        tls = self.transport is not None and self.transport.get_extra_info("sslcontext")
        self.close()
        return not tls

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None
        self.connections.buffered -= self.held
        self.held = 0
        self._cancel_jobs()
        self._leave_idle_clock()
        self.answers.clear()
        self.transport = None
        if self.token is not None:
            self.engine.unhold(self.token, self)
        if self.counted:
            self.counted = False
            self.engine.connections -= 1
            self.connections.discard(self)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.stalled is None and self.transport is not None:
            self.unsent = self.transport.get_write_buffer_size()
            self.stalled = self.loop.call_later(self.limits.slow_consumer_s, self._slow)

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.stalled is not None:
            self.stalled.cancel()
            self.stalled = None
        self._resume_if_drained()

    def _slow(self) -> None:
        """Past the high-water mark, and nothing taken, for the whole ``slow_consumer_s``:
        the client has taken none of over a MiB of answers for that long (one that took
        some is given the time again). Closed at once (what it has not
        taken is dropped: it would never take it), as NATS drops a slow consumer; a
        blocked wait it had is not acknowledged, so the next wait gets its firings."""
        self.stalled = None
        if self.closed or self.transport is None:
            return
        unsent, after = self.transport.get_write_buffer_size(), self.limits.slow_consumer_s
        if unsent < self.unsent:  # it took some (a slow reader, not a stalled one): on
            self.unsent = unsent
            self.stalled = self.loop.call_later(after, self._slow)
            return
        log.warning("closing a slow consumer: %d bytes of answers untaken for %g s", unsent, after)
        err = SlowConsumer(
            f"{unsent:,} bytes of answers untaken for {after:g} s: closing the connection"
        )
        # counted (/metrics), and written behind what it has not read, so it never sees it
        # unless it reads again just as it is closed
        self.transport.write(self._refused(err))
        self._cancel_jobs()
        self.closed = True
        self._leave_idle_clock()
        self.transport.abort()

    # -- reading --------------------------------------------------------------

    def _process(self) -> None:
        """Handle every whole line in the buffer, unless the answers are backed up."""
        if self.processing or self.closed:
            return
        self.processing = True
        try:
            max_line, max_queued = self.limits.max_line, self.limits.max_queued_bytes
            while not self.closed:
                buffer, start, full = self.buffer, 0, False
                while not self.paused:
                    # answers past the bound stop the lines here, not at the end of the
                    # buffer: one read of many pipelined lines would otherwise queue all
                    # their answers at once (3,000 reads of a full ring: 600 MB)
                    if self.queued_bytes > max_queued:
                        full = True
                        break
                    end = buffer.find(b"\n", start)
                    if end < 0 or end - start > max_line:
                        break
                    line = buffer[start:end]
                    start = end + 1
                    if not self._handle(line):
                        self.close()
                        return
                if start:
                    self.seen = self.loop.time()
                if (start or full) and self._backed_up():
                    self._flush()
                    if self._backed_up() and self.transport is not None:
                        self.paused = True
                        self.transport.pause_reading()
                self.buffer = buffer = buffer[start:]
                if self.paused:
                    self._flush()  # which may catch up: then the loop goes on
                    if self.paused:
                        return
                    continue
                if full:
                    continue  # written, and the client takes it: on with the lines left
                if len(buffer) > max_line:
                    too_long = LineTooLong(
                        f"request line over {max_line:,} bytes: closing the connection"
                    )
                    self._queue(self._refused(too_long))
                    self.close()
                    return
                self._flush()
                return
        finally:
            self.processing = False
            self._hold()

    def _hold(self) -> None:
        """Count what the buffer holds in the connections' total; past the daemon's bound,
        the connection that holds the most is closed (half lines cost memory however they
        are spread over connections)."""
        if self.closed:
            return
        connections = self.connections
        size = len(self.buffer)
        connections.buffered += size - self.held
        self.held = size
        bound = self.limits.max_buffered_bytes
        while connections.buffered > bound:
            largest = max(connections.open, key=lambda c: c.held)
            if not largest.held:
                return
            largest._shed(bound)
            if largest is self:
                return

    def _shed(self, bound: int) -> None:
        err = TooMany(
            f"the daemon holds {bound:,} bytes of unfinished request lines, its bound, and "
            "this connection held the most: closing it"
        )
        log.warning("closing a connection holding %d bytes of unfinished lines", self.held)
        self.connections.buffered -= self.held
        self.held = 0
        self.buffer = b""
        self._queue(self._refused(err))
        self.close()

    def _backed_up(self) -> bool:
        """Too much waits to be written: stop reading requests until the client catches up."""
        return (
            self.write_paused
            or self.authing
            or self.queued_bytes > self.limits.max_queued_bytes
            or len(self.answers) > self.limits.max_in_flight
        )

    def _resume_if_drained(self) -> None:
        if self.paused and not self.closed and not self._backed_up():
            self.paused = False
            assert self.transport is not None
            self.transport.resume_reading()
            if not self.processing:
                # the lines that came before the pause; from a callback of its own, as
                # this may run in another connection's turn (a wake that answered here)
                self.loop.call_soon(self._process)

    def _idle(self) -> None:
        """The idle clock's call: close the connection if nothing came for the idle timeout."""
        self.idle_key = None
        if self.in_flight or self.closed:
            return  # a job in flight exempts its connection; its end sets the clock again
        due = self.seen + self.limits.idle_timeout
        if due > self.loop.time():
            self.idle_key = self.connections.idle.add(self, due)
            return
        what = "no whole request line" if self.buffer else "nothing"
        err = IdleTimeout(
            f"{what} received for {self.limits.idle_timeout:g} s: closing the connection"
        )
        self._queue(self._refused(err))
        self.close()

    def _leave_idle_clock(self) -> None:
        if self.idle_key is not None:
            self.connections.idle.discard(self, self.idle_key)
            self.idle_key = None

    # -- answering --------------------------------------------------------------

    def _handle(self, line: bytes) -> bool:
        """Answer one line; False closes the connection."""
        engine = self.engine
        try:
            req = p.decode_request(line)
        except ReplError as exc:
            engine.requests += 1  # a line that is no request never reaches the engine's count
            self._queue(self._refused(exc, p.request_id(line)))
            return self.authed
        if not self.authed:
            engine.requests += 1  # nor does an auth
            return self._auth(req)
        try:
            outcome = engine.handle(req, self.token)
        except Exception as exc:  # every failure becomes an answer, never a crash
            self._queue(self._refused(self._report(exc), req.id))
            return True
        job, ticket = outcome.job, outcome.ticket
        if job is None and ticket is None:
            self._queue(p.encode(outcome.value))
            return True
        if job is None:
            assert ticket is not None
            pending = _Answer()
            self.answers.append(pending)
            rid, reply = req.id, outcome.value

            def committed(error: StoreFailed | None) -> None:
                data = p.encode(reply) if error is None else self._refused(error, rid)
                # a commit answers a whole batch of pipelined sends at once: one write for all
                self._ready(pending, data, soon=True)

            ticket.add_done_callback(committed)
            return True
        waiting = _JobAnswer(self, job, req.id)
        self.answers.append(waiting)
        self.in_flight += 1
        job.start(waiting.done)  # it may answer before this returns
        if self.in_flight:
            self._leave_idle_clock()  # a blocked wait exempts its connection
        return True

    def _auth(self, req: p.Request) -> bool:
        """The first request: an ``auth`` with a token the daemon knows, or the end."""
        if not isinstance(req, p.Auth):
            first = Unauthorized("the first request must be auth with the daemon's token")
            self._queue(self._refused(first, req.id))
            return False
        try:
            outcome = self.engine.authenticate(req.token, self.secret)
        except ReplError as exc:
            self._queue(self._refused(exc, req.id))
            return False
        job = outcome.job
        if job is None:
            self._authed(outcome.value)
            self._queue(p.encode(p.Done(id=req.id)))
            return True
        # a scoped token this daemon has not seen: the store says; read nothing until then
        self.authing = True
        answer = _AuthAnswer(self, job, req.id)
        self.answers.append(answer)
        self.in_flight += 1
        job.start(answer.done)
        return True

    def _authed(self, token: TokenRecord | None) -> None:
        self.authed = True
        self.token = token
        if token is not None:
            self.engine.hold(token, self)

    def _auth_done(
        self, answer: _AuthAnswer, value: TokenRecord | None, error: Exception | None
    ) -> None:
        if answer.job is None:
            return  # cancelled: its connection is gone
        answer.job = None
        self.in_flight -= 1
        self.authing = False
        if error is not None:
            self._ready(answer, self._refused(self._report(error), answer.rid))
            self.close()
            return
        self._authed(value)
        self._ready(answer, p.encode(p.Done(id=answer.rid)))
        if not self.closed and self.idle_key is None:
            self.seen = self.loop.time()
            self.idle_key = self.connections.idle.add(self, self.seen + self.limits.idle_timeout)
        self._resume_if_drained()

    def revoke(self, error: Unauthorized) -> None:
        """Its token was revoked: its waits are answered ``error``, and it is closed."""
        self.token = None  # the engine holds it no more
        if self.closed:
            return
        answered = False
        for answer in self.answers:
            if isinstance(answer, _JobAnswer) and answer.job is not None:
                job, answer.job = answer.job, None
                self.in_flight -= 1
                job.cancel()
                answer.data = self._refused(error, answer.rid)
                self.queued_bytes += len(answer.data)
                answered = True
        if not answered:  # nothing asked: told all the same, as an idle connection is
            self._queue(self._refused(error))
        self.close()

    def _refused(self, exc: ReplError, rid: p.RequestId = msgspec.UNSET) -> bytes:
        """The error answer's line, counted by its code (``/metrics``); a scoped token is
        told a missing session with its own advice."""
        if self.token is not None:
            exc = scoped_refusal(self.token.scope, exc)
        self.engine.counts.errors[exc.code.value] += 1
        return p.encode(p.error(exc, rid))

    def _report(self, exc: BaseException) -> ReplError:
        if isinstance(exc, ReplError):
            return exc
        log.exception("internal error", exc_info=exc)
        return Internal(f"internal error: {type(exc).__name__}: {exc}")

    def _job_done(
        self, answer: _JobAnswer, value: p.Response | None, error: Exception | None
    ) -> None:
        if answer.job is None:
            return  # cancelled: its connection is gone
        answer.job = None
        self.in_flight -= 1
        if error is None and value is None:
            error = Internal("internal error: a job answered nothing")
        try:
            if error is None:
                assert value is not None
                data = self.connections.woken.encode(value)
            else:
                data = self._refused(self._report(error), answer.rid)
        except Exception as exc:  # an answer that cannot be encoded is an internal error
            data = self._refused(self._report(exc), answer.rid)
        self._ready(answer, data)
        if not self.in_flight and not self.closed and self.idle_key is None:
            self.seen = self.loop.time()
            self.idle_key = self.connections.idle.add(self, self.seen + self.limits.idle_timeout)

    def _cancel_jobs(self) -> None:
        for answer in self.answers:
            if isinstance(answer, _JobAnswer) and answer.job is not None:
                job, answer.job = answer.job, None
                self.in_flight -= 1
                job.cancel()

    def _queue(self, data: bytes) -> None:
        self.queued_bytes += len(data)
        self.answers.append(_Answer(data))

    def _ready(self, pending: _Answer, data: bytes, *, soon: bool = False) -> None:
        """An answer that was waiting is ready: write it if nothing is ahead of it.

        At once, or ``soon``: after the loop's current callback, when that
        callback makes many answers of this connection ready one by one.
        """
        if self.closed:
            return
        pending.data = data
        self.queued_bytes += len(data)
        if not self.answers or self.answers[0] is not pending or self.processing:
            return  # written with the answer ahead of it, or at the end of the reading
        if not soon:
            self._flush()
        elif not self.flush_soon:
            self.flush_soon = True
            self.loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self.flush_soon = False
        self._flush()

    def _flush(self) -> None:
        """Write every ready answer at the front of the queue, in one write."""
        answers, transport = self.answers, self.transport
        if not answers or answers[0].data is None or transport is None or self.closed:
            return
        if len(answers) == 1:  # the usual case: one answer, and nothing behind it
            out = answers[0].data
            answers.clear()
        else:
            ready = []
            for answer in answers:
                if answer.data is None:
                    break
                ready.append(answer.data)
            del answers[: len(ready)]
            out = b"".join(ready)
        self.queued_bytes -= len(out)
        transport.write(out)
        if self.paused:
            self._resume_if_drained()

    def close(self) -> None:
        """Write what is ready, then close; the client has a moment to take it."""
        if self.closed:
            return
        self._cancel_jobs()
        self._flush()
        self.closed = True
        self._leave_idle_clock()
        transport = self.transport
        if transport is None:
            return
        transport.close()
        if transport.get_write_buffer_size():
            # a client that never reads must not hold its connection open
            self.loop.call_later(CLOSE_GRACE_S, transport.abort)
