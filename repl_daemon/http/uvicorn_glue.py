"""What the daemon needs of uvicorn that its public API cannot give: a protocol class
(each HTTP connection) and a server class, subclassed from uvicorn's internals.

The protocol, ``Connection``, is uvicorn's h11 protocol with a deadline for each
request's headers, the refusals uvicorn makes itself in the daemon's JSON, and the
close of a slow consumer:

- uvicorn's flow control already bounds what a client that does not read costs (a
  response's write waits while the transport is past its high-water mark, and nothing
  more is read meanwhile), but not how long: a stream or a response whose client never
  reads again would hold its task and its connection for ever. Past the high-water mark
  for ``slow_consumer_s`` without a resume, the connection is aborted, as the line
  protocol closes one (code ``slow_consumer``, counted in ``repl_errors_total``); its
  route is told as for a client that left.
- uvicorn closes a connection idle between requests (its keep-alive timeout), but not
  one whose request never finishes arriving: a client that sends half a request line,
  or its headers a byte a minute, would hold a connection for ever. This closes a
  connection that has no request in progress ``deadline`` seconds after it opened or
  after its last response, as the line protocol's idle timeout does; an event stream,
  a request in progress, is never cut.
- A request h11 cannot parse is 400 ``bad_request`` (uvicorn's own answer is plain
  text), and one that arrives while the HTTP connections are past ``max_connections``
  503 ``too_many`` (uvicorn's ``limit_concurrency`` with its plain text: the same
  count, this connection's included, taken at the same moment), each with
  ``Connection: close``.

uvicorn's server takes a protocol class and nothing smaller (no hook for a per-request
header deadline, for its own 400/503 bodies, or for its flow control's pause), and
makes one of it for each connection: a server's settings are its class's
(``protocol_class`` makes that subclass). ``Connection`` reads ``H11Protocol``'s
``conn``, ``cycle`` and ``flow``, and ``Server`` replaces ``uvicorn.Server``'s
``capture_signals`` and ``main_loop``. Those are uvicorn's internals: pyproject.toml
bounds uvicorn from above at the newest release this was tested against (0.55), so
neither a user's install nor ``scripts/pin`` takes a newer one until the bound is
moved by hand, with the suite passing on it.

uvicorn is an extra (``[http]``): ``repl_daemon.http.server`` imports this module
only when it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterator, MutableMapping
from typing import Any, ClassVar, NamedTuple, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from repl_daemon.http.answers import error_body
from repl_daemon.http.streams import line_of
from session.errors import Code

log = logging.getLogger("repl.daemon")

#: the answer to what h11 cannot parse
UNPARSABLE = error_body(
    Code.BAD_REQUEST,
    "not a request of HTTP/1.1: see RFC 9112, or use an HTTP client",
    own=True,
)


class Limits(NamedTuple):
    """A server's settings, which each of its connections reads."""

    #: seconds a connection may have no request in progress (--idle-timeout)
    deadline: float
    #: the HTTP connections past which a request is answered 503 (--max-connections)
    max_connections: int
    #: the engine's count of refusals by code (``repl_errors_total``)
    errors: Counter[str]
    #: seconds a client may leave a response untaken (--slow-consumer-s)
    slow_consumer_s: float
    #: the 503's body, which names ``max_connections``
    busy_body: bytes


def json_headers(length: int, *, close: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
    return [*headers, (b"connection", b"close")] if close else headers


def protocol_class(
    deadline: float, max_connections: int, errors: Counter[str], slow_consumer_s: float
) -> type[Connection]:
    """``Connection`` for one server: uvicorn makes each connection of the class it is
    given, so the server's settings are the subclass's ``limits``."""
    busy_body = error_body(
        Code.TOO_MANY,
        f"over {max_connections:,} HTTP connections (--max-connections): "
        "close one, or try again later",
        own=True,
    )
    limits = Limits(deadline, max_connections, errors, slow_consumer_s, busy_body)
    return type("Connection", (Connection,), {"limits": limits})


class Connection(H11Protocol):
    """One HTTP connection: uvicorn's, with the deadline, the refusals in JSON and the
    close of a slow consumer (the module's docstring)."""

    limits: ClassVar[Limits]
    _deadline: asyncio.TimerHandle | None = None
    _stalled: asyncio.TimerHandle | None = None
    _unsent = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._served = self.app

    # -- a slow consumer ----------------------------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._unsent = self.transport.get_write_buffer_size()
            self._stalled = self.loop.call_later(self.limits.slow_consumer_s, self._slow)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _slow(self) -> None:
        # a closing transport (``Connection: close``) still holds what it has not sent:
        # it is aborted all the same; its loss cancels this timer
        self._stalled = None
        unsent = self.transport.get_write_buffer_size()
        slow_consumer_s = self.limits.slow_consumer_s
        if unsent < self._unsent:  # it took some (a slow reader): it is given the time again
            self._unsent = unsent
            self._stalled = self.loop.call_later(slow_consumer_s, self._slow)
            return
        self.limits.errors[Code.SLOW_CONSUMER.value] += 1
        log.warning(
            "closing a slow HTTP consumer: %d bytes untaken for %g s", unsent, slow_consumer_s
        )
        self.transport.abort()

    # -- refusals in JSON -----------------------------------------------------

    async def _refuse_busy(self, scope: Any, receive: Any, send: Any) -> None:
        """The app for a request taken while the connections are past the limit."""
        busy_body = self.limits.busy_body
        self.limits.errors[Code.TOO_MANY.value] += 1
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": json_headers(len(busy_body), close=True),
            }
        )
        await send({"type": "http.response.body", "body": busy_body})

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what h11 cannot parse, in JSON; then the close."""
        self.limits.errors[Code.BAD_REQUEST.value] += 1
        headers = json_headers(len(UNPARSABLE), close=True)
        head = self.conn.send(h11.Response(status_code=400, headers=headers))
        body = self.conn.send(h11.Data(data=UNPARSABLE))
        end = self.conn.send(h11.EndOfMessage())
        self.transport.write(b"".join(part or b"" for part in (head, body, end)))
        self.transport.close()

    # -- the deadline for a request's headers -------------------------------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.limits.deadline, self._too_slow)

    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def handle_events(self) -> None:
        most = self.limits.max_connections
        over = len(self.connections) > most or len(self.tasks) > most
        self.app = self._refuse_busy if over else self._served  # the app for requests taken now
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and not cycle.more_body and not self.conn.trailing_data[0]:
            # the body is in, and nothing of a next request waits behind it: read on.
            # uvicorn pauses reading when a body's part takes its buffer over 64 KiB,
            # and only the route's next receive resumes it; after the last part there
            # is none, so an open stream or long poll would never hear its client go
            self.flow.resume_reading()
        if self._busy() and self._deadline is not None:
            self._deadline.cancel()  # its headers are in: the request runs as long as it must
            self._deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _too_slow(self) -> None:
        self._deadline = None
        if not self._busy() and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        unfinished = self._busy()
        super().connection_lost(exc)
        if unfinished:  # an open stream, a long poll: the route is told (``Line``)
            assert self.cycle is not None
            scope = cast("MutableMapping[str, Any]", self.cycle.scope)  # a TypedDict
            line_of(scope).lost()


class Server(uvicorn.Server):
    """uvicorn's server, with no signal handlers of its own and no 0.1 s ticker:
    it sleeps until it is told to stop."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._stop = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the daemon's own handlers stay: SIGTERM stops the whole daemon

    async def main_loop(self) -> None:
        await self.on_tick(0)  # the default headers, once
        await self._stop.wait()

    def stop(self) -> None:
        self.should_exit = True
        self._stop.set()
