"""Event streams (``GET /sessions/{id}/events``): a wait that never ends, written by the
request's own task, one heartbeat for every stream, and each firing framed once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from sse_starlette.event import ServerSentEvent
from starlette.responses import Response

from repl_daemon import protocol as p
from repl_daemon.engine.wait import Wait
from repl_daemon.http.answers import encoder, error_body
from repl_daemon.locations import SCOPE_LINE
from session.errors import (
    ReplError,
    Unauthorized,
)
from session.firing import Firing
from session.scopes import TokenRecord
from session.tags import Match

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from repl_daemon.engine import Engine


#: an event stream sends a comment line at least this often, so proxies keep it open
HEARTBEAT = 15.0
#: an event stream's headers, as sse-starlette's ``EventSourceResponse`` sets them (with
#: its media type, ``text/event-stream; charset=utf-8``): no cache, no proxy's buffering
STREAM_HEADERS = {
    "Cache-Control": "no-store",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}
#: SSE's line ending, sse-starlette's default
SEP = "\r\n"
#: how many sessions' newest firings' frames are kept at most (``Streams.frame``)
MAX_FRAMED = 1024


class _State(Enum):
    """Where an event stream is (``Follow.state``); ``_MOVES`` lists how it goes on."""

    IDLE = "idle"  # opened: no wait yet
    WAITING = "waiting"  # its wait runs (blocked with no work, or reading)
    ANSWERED = "answered"  # the wait's answer is in hand, not yet told
    SCHEDULED = "scheduled"  # told: the next wait starts in the loop's next pass
    ENDING = "ending"  # its token was revoked: that is told next, last
    OVER = "over"  # its last chunk was told, or it was closed
    GONE = "gone"  # its client went away: nothing more is written


_S = _State
_AT_ANY_TIME = frozenset({_S.ENDING, _S.OVER, _S.GONE})
#: every move a stream makes; one it does not list raises (as a wait's ``_MOVES``)
_MOVES: dict[_State, frozenset[_State]] = {
    _S.IDLE: frozenset({_S.WAITING, _S.ANSWERED}) | _AT_ANY_TIME,  # answered: refused at once
    _S.WAITING: frozenset({_S.ANSWERED}) | _AT_ANY_TIME,
    _S.ANSWERED: frozenset({_S.SCHEDULED}) | _AT_ANY_TIME,  # told; or an error told, over
    _S.SCHEDULED: frozenset({_S.WAITING, _S.ANSWERED}) | _AT_ANY_TIME,
    _S.ENDING: frozenset({_S.OVER, _S.GONE}),
    _S.OVER: frozenset({_S.GONE}),  # the client may go after the last chunk: no end written
    _S.GONE: frozenset(),
}


class Follow:
    """What an event stream writes next: its waits after ``after``, one after another,
    until its client goes, and its heartbeat.

    The stream's task (the request's own) asks ``next`` for its next chunk and
    writes it. In between it awaits one future, and nothing else of the stream's
    runs: the engine's wait (a callback job, blocked with no work), the heartbeat
    (``Streams``, one timer for every stream), a revocation of its token and
    the hang-up (``Line``) each resolve that future. sse-starlette's
    ``EventSourceResponse`` ran a task group of four tasks per stream (the
    sender, the ping, a disconnect listener and an exit listener, each with
    its cancel scope and event, and a lock): three times what this costs
    (docs/benchmarks.md). Its framing, ``ServerSentEvent``, is what this writes.

    Its life is a ``_State`` that moves only as ``_MOVES`` says (a wait's are
    ``engine.wait._MOVES``): idle, then waiting, answered, scheduled, waiting
    again..., until its token is revoked (ending, then over), it ends with an
    error or is closed (over), or its client goes (gone). The heartbeat is
    apart from it: due or not, at any state short of the end.

    A batch's chunk goes on from the last event it told: ``event: position``
    first of all, where the stream starts, so that a client that reconnects
    before the first firing resumes from there, with no hole; an ``event:
    lost`` before a gap, whose id is the last seq it stands for, so a resume
    counts it once; one ``event: firing`` a firing; and with a match, an
    ``event: position`` when a batch ends past its last firing (the firings
    after it did not match), so that a resume does not look again.
    """

    __slots__ = (
        "after",
        "answer",
        "beat_due",
        "engine",
        "job",
        "match",
        "revoked",
        "session_id",
        "soon",
        "state",
        "streams",
        "token",
        "woken",
    )

    def __init__(
        self,
        engine: Engine,
        streams: Streams,
        token: TokenRecord | None,
        session_id: str,
        after: int,
        match: Match | None,
    ) -> None:
        self.engine = engine
        self.streams = streams
        self.token = token
        self.session_id = session_id
        self.after = after
        self.match = match
        self.state = _S.IDLE
        self.job: Wait | None = None
        #: the wait's answer once it has one: (value, None) or (None, error)
        self.answer: tuple[p.Response | None, Exception | None] | None = None
        self.woken: asyncio.Future[None] | None = None  # what the stream's task awaits
        self.beat_due = False
        self.revoked: Unauthorized | None = None
        #: the next wait, once a wait's answer is told: it starts in the next pass of the
        #: event loop, a callback, so that every stream the same firing woke writes it
        #: before any waits again (a wait's start costs about what a write does: the last
        #: stream's write would wait for all the others' waits too, where a TCP wait is
        #: put back by its client)
        self.soon: asyncio.Handle | None = None
        if token is not None:
            engine.hold(token, self)

    @property
    def gone(self) -> bool:
        """Its client went away: its response is not ended either."""
        return self.state is _S.GONE

    def opening(self) -> bytes:
        """The first chunk: where the stream starts. Its heartbeat starts with it."""
        self.streams.add(self)
        return position(self.after)

    async def next(self) -> bytes | None:
        """The next chunk to write, once there is one; None: the stream is over."""
        while True:
            state = self.state
            if state is _S.OVER or state is _S.GONE:
                return None
            if state is _S.ENDING:
                assert self.revoked is not None
                return self._error(self.revoked)
            if state is _S.ANSWERED:
                assert self.answer is not None
                value, error = self.answer
                self.answer = self.job = None
                if isinstance(error, ReplError):  # stopped, the daemon closing, the store gone
                    return self._error(error)
                if error is not None:  # a failure of the daemon's own: uvicorn logs it
                    raise error
                assert isinstance(value, p.Woken)
                chunk = self._told(value)
                self._move(_S.SCHEDULED)
                self.soon = asyncio.get_running_loop().call_soon(self._wait)  # see ``soon``
                return chunk
            if self.beat_due:
                self.beat_due = False
                return ping()
            if state is _S.IDLE:  # the first wait, at once
                self._wait()
                continue  # it may have its answer already: firings were there
            woken = self.woken = asyncio.get_running_loop().create_future()
            try:
                await woken
            finally:
                self.woken = None

    def close(self) -> None:
        """The stream is over, however it ended (its task cancelled too): its wait, its
        heartbeat and its hold on the token end with it."""
        if self.state is not _S.OVER and self.state is not _S.GONE:
            self._move(_S.OVER)
        if self.soon is not None:
            self.soon.cancel()
            self.soon = None
        if self.job is not None:
            self.job.cancel()  # nothing, once it has answered
            self.job = None
        self.streams.discard(self)
        if self.token is not None:
            self.engine.unhold(self.token, self)

    # -- what wakes the stream's task ---------------------------------------------------

    def answered(self, value: p.Response | None, error: Exception | None) -> None:
        """The wait's callback (never called once the wait is cancelled)."""
        self.answer = (value, error)
        self._move(_S.ANSWERED)
        self._wake()

    def beat(self) -> None:
        """The heartbeat's turn: a comment line goes out next."""
        self.beat_due = True
        self._wake()

    def revoke(self, error: Unauthorized) -> None:
        """The token was revoked: the stream ends with ``event: ended``."""
        if _S.ENDING in _MOVES[self.state]:  # once: not after its end, or its first
            self.revoked = error
            self._cancel_wait()
            self._move(_S.ENDING)
            self._wake()

    def hung_up(self) -> None:
        """The client went away: nobody reads what the stream would write."""
        if self.state is not _S.GONE:
            self._cancel_wait()
            self._move(_S.GONE)  # whatever it was about to tell, nobody hears
            self._wake()

    def _cancel_wait(self) -> None:
        if self.job is not None:
            self.job.cancel()  # it moved nothing: a stream touches no cursor
            self.job = None
            self.answer = None

    def _wake(self) -> None:
        woken = self.woken
        if woken is not None and not woken.done():
            woken.set_result(None)

    def _move(self, to: _State) -> None:
        """Go to state ``to``, one of the moves ``_MOVES`` allows from the state it is in."""
        if to not in _MOVES[self.state]:
            raise AssertionError(f"an event stream cannot go from {self.state} to {to}")
        self.state = to

    # -- the steps --------------------------------------------------------------------

    def _wait(self) -> None:
        """The next wait, after what the stream has told; refused at once (a revoked
        token, the daemon closing), that is its answer."""
        self.soon = None
        if self.state is not _S.IDLE and self.state is not _S.SCHEDULED:
            return
        engine = self.engine
        req = p.Wait(sessions=[self.session_id], after=self.after, match=self.match)
        try:
            job = engine.handle(req, self.token).job
        except Exception as exc:
            self.answered(None, exc)
            return
        assert isinstance(job, Wait)  # a wait is the engine's job, started here
        self.job = job
        self._move(_S.WAITING)
        job.start(self.answered)

    def _told(self, woken: p.Woken) -> bytes:
        """A wait's answer as one chunk of events; the stream then goes on after it."""
        after = self.after
        events = []
        for batch in woken.batches:
            if batch.lost:  # its id: the last seq it stands for, so a resume counts it once
                lost = json.dumps({"lost": batch.lost})
                events.append(frame(event="lost", id=str(after + batch.lost), data=lost))
            told = after + batch.lost
            for firing in batch.firings:
                events.append(self.streams.frame(self.session_id, firing))
                told = firing.seq
            if batch.next > told:
                events.append(position(batch.next))
            after = batch.next
        self.after = after
        return b"".join(events)

    def _error(self, exc: ReplError) -> bytes:
        """The last chunk: ``event: ended`` (the session stopped, the daemon closing, the
        store gone, the token revoked). Not ``error``: that is the name EventSource gives
        its own connection errors, so a listener for it would take ours for a broken
        connection (and reconnect), and ours for its own."""
        self._move(_S.OVER)
        error = error_body(exc.code.value, exc.message).decode()
        return frame(event="ended", data=error)


class Streams:
    """What the daemon's open event streams share.

    One heartbeat: every ``HEARTBEAT`` seconds every stream writes a comment line,
    so that proxies keep it open (a stream's first within ``HEARTBEAT`` seconds of
    its start); a timer of each stream's own cost 0.6 KB a stream, and with no
    stream open there is no timer. And the frame of each session's newest firing
    told: one send to a thousand streams is framed once, not a thousand times
    (sse-starlette's framing of a firing costs more than its write).
    """

    def __init__(self) -> None:
        self.streams: set[Follow] = set()
        self.timer: asyncio.TimerHandle | None = None
        #: a session's id -> its firing last framed, and that frame
        self.framed: dict[str, tuple[Firing, bytes]] = {}

    def frame(self, session_id: str, firing: Firing) -> bytes:
        """``event: firing``, its seq as ``id:``, its JSON as ``data:``."""
        last = self.framed.get(session_id)
        if last is not None and last[0] == firing:  # the same firing, to another stream
            return last[1]
        data = encoder.encode(firing).decode()
        framed = frame(event="firing", id=str(firing.seq), data=data)
        if len(self.framed) >= MAX_FRAMED:
            self.framed.clear()
        self.framed[session_id] = (firing, framed)
        return framed

    def add(self, stream: Follow) -> None:
        self.streams.add(stream)
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(HEARTBEAT, self._beat)

    def discard(self, stream: Follow) -> None:
        self.streams.discard(stream)
        if not self.streams:
            self.framed.clear()
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def _beat(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(HEARTBEAT, self._beat)
        for stream in self.streams:
            stream.beat()  # only marks it, and resolves its future: none leaves the set here


class Line:
    """Whether a request's client is still there, kept in the request's ASGI scope
    (``SCOPE_LINE``): the protocol (``uvicorn_glue.Connection``) marks it gone when its connection
    is lost before the response's end, and calls what the route left to be told.

    uvicorn tells an app so by answering ``receive`` with ``http.disconnect``, but
    only to a task blocked in ``receive``: a task of each open stream's own, with its
    frames and its future, 1.5 KB a stream, for an end told once.
    """

    __slots__ = ("gone", "then")

    def __init__(self) -> None:
        self.gone = False
        self.then: Callable[[], None] | None = None

    def listen(self, then: Callable[[], None]) -> None:
        """Call ``then`` when the client goes; at once if it has gone already."""
        if self.gone:
            then()
        else:
            self.then = then

    def stop(self) -> None:
        """The request is over: nothing more is told."""
        self.then = None

    def lost(self) -> None:
        """The protocol's: the connection is lost, the response unfinished."""
        self.gone = True
        then, self.then = self.then, None
        if then is not None:
            then()


def line_of(scope: MutableMapping[str, Any]) -> Line:
    """The request's ``Line``, made by whichever comes first: the route, or the loss."""
    line = scope.get(SCOPE_LINE)
    if line is None:
        line = scope[SCOPE_LINE] = Line()
    assert isinstance(line, Line)
    return line


def frame(*, id: str | None = None, event: str | None = None, data: str | None = None) -> bytes:
    """One event as sse-starlette frames it."""
    return ServerSentEvent(data, event=event, id=id, sep=SEP).encode()


def position(seq: int) -> bytes:
    """``event: position``: how far the stream has got (its start, or a look past firings
    that did not match), as ``id:`` with data: a client drops an event without data (the
    npm ``eventsource`` package does, and so remembers no ``Last-Event-ID`` from it), so
    one that reconnects before the next firing would resume from further back."""
    return frame(event="position", id=str(seq), data=f'{{"after": {seq}}}')


def ping() -> bytes:
    """The heartbeat: sse-starlette's own ping comment (``: ping - TIME``)."""
    return ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=SEP).encode()


class EventStream(Response):
    """An open event stream: its head, then ``follow``'s chunks as they come, written
    in the request's own task; its ``Line`` tells the hang-up."""

    media_type = "text/event-stream"
    #: every stream's headers, one list (each response would make its own: 0.6 KB)
    shared_headers: list[tuple[bytes, bytes]] | None = None

    def __init__(self, follow: Follow) -> None:
        self.follow = follow
        self.status_code = 200
        self.background = None
        if EventStream.shared_headers is None:
            self.init_headers(STREAM_HEADERS)
            EventStream.shared_headers = self.raw_headers
        self.raw_headers = EventStream.shared_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        follow = self.follow
        try:
            start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            await send(start)
            if scope["method"] == "HEAD":  # its head, and no stream (sse-starlette's too)
                await send({"type": "http.response.body", "body": b""})
                return
            line = line_of(scope)
            line.listen(follow.hung_up)
            try:
                chunk: bytes | None = follow.opening()
                while chunk is not None:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    chunk = await follow.next()
                if not follow.gone:
                    await send({"type": "http.response.body", "body": b""})
            finally:
                line.stop()
        finally:
            follow.close()
