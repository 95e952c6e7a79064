"""One MCP session's recent events, so that a cut stream of ``/mcp`` resumes (SPEC §17).

Over Streamable HTTP every event a server writes on an SSE stream (a request's
POST stream, or the session's GET stream) carries an ``id:``; a client whose
stream was cut asks again with ``GET /mcp`` and ``Last-Event-ID: ID``, and is
given what came on that stream after that event. ``Events`` keeps them for one
MCP session, bounded: its newest ``MAX_EVENTS`` events, and of those only as
many as ``MAX_BYTES`` of JSON hold (its newest always). A stream resumes
exactly or not at all: ``after`` answers the events of the stream after the
one named, and refuses (``Gone``) an id it cannot answer for whole: one of
another MCP session, one it never gave, or one after which an event of that
stream was dropped. An event id says which stream it is of (``TAG-K-N``: the
session's tag, the stream's number, the event's), so a stream whose events
stopped before the bound moved past them resumes however much the session's
other streams wrote since.

The SDK asks for a store through its ``EventStore`` interface, one for its
session manager, whose every session it serves, and the stream ids it stores
under repeat from session to session (a request's id, ``_GET_stream``): one
store would replay one session's events to another. So ``Store`` is the
interface over the ``Events`` of the MCP session in hand: ``EVENTS``, a context
variable that ``repl_cli.mcp.http`` sets for each request before the SDK sees
it, which the tasks the SDK starts for the session (its message router, which
stores each message it sends) inherit from the request that opened it.

What must not live here: the HTTP (``repl_cli.mcp.http``).
"""

from __future__ import annotations

import secrets
from collections import Counter, deque
from contextvars import ContextVar
from typing import NamedTuple

from mcp.server.streamable_http import (
    GET_STREAM_KEY,
    EventCallback,
    EventId,
    EventMessage,
    EventStore,
    StreamId,
)
from mcp.types import JSONRPCError, JSONRPCMessage, JSONRPCResponse, jsonrpc_message_adapter

#: the most events one MCP session keeps, and the most bytes of their JSON: a client
#: reconnects within seconds (the SDK's after ``RETRY_MS``), and a session of Claude Code
#: or of the SDK writes a few events a second at most, so a bound of either kind is
#: minutes of it; the newest event is kept whatever its size
MAX_EVENTS = 256
MAX_BYTES = 4 * 1024 * 1024
#: how long a client waits before it asks again for a cut stream (the SSE ``retry:`` field)
RETRY_MS = 1000


class Gone(LookupError):
    """A ``Last-Event-ID`` this MCP session cannot resume after, in one line."""


class Event(NamedTuple):
    n: int
    #: the stream's number (0: the GET stream)
    stream: int
    #: the message's JSON; None for a priming event (an id with no data)
    data: bytes | None


class Events:
    """One MCP session's newest events, on all its streams, in the order they were
    recorded (which, for each stream, is the order it writes them)."""

    def __init__(self, max_events: int = MAX_EVENTS, max_bytes: int = MAX_BYTES) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        #: what tells this session's ids from another's
        self.tag = secrets.token_hex(4)
        self.kept: deque[Event] = deque()
        self.size = 0
        #: the number of the last event recorded
        self.last = 0
        #: each stream's number, and back; a request's stream is forgotten with its last event
        self.numbers: dict[StreamId, int] = {GET_STREAM_KEY: 0}
        self.names: dict[int, StreamId] = {0: GET_STREAM_KEY}
        self.streams = 0  # the number of the last stream numbered (never given twice)
        self.held: Counter[int] = Counter()
        #: per stream, the number of the newest event of it dropped that had a message
        self.dropped: dict[int, int] = {}

    def id_of(self, event: Event) -> EventId:
        return f"{self.tag}-{event.stream}-{event.n}"

    def record(self, stream_id: StreamId, data: bytes | None) -> Event:
        """Keep one event of ``stream_id`` (``data`` its message's JSON, None to prime)."""
        number = self.numbers.get(stream_id)
        if number is None:
            self.streams += 1
            number = self.numbers[stream_id] = self.streams
            self.names[number] = stream_id
        self.last += 1
        event = Event(self.last, number, data)
        self.kept.append(event)
        self.held[number] += 1
        self.size += len(data or b"")
        while len(self.kept) > self.max_events or (
            self.size > self.max_bytes and len(self.kept) > 1
        ):
            self._drop()
        return event

    def _drop(self) -> None:
        old = self.kept.popleft()
        self.size -= len(old.data or b"")
        if old.data is not None:
            self.dropped[old.stream] = old.n
        self.held[old.stream] -= 1
        if not self.held[old.stream] and old.stream:  # a request's stream is over
            del self.held[old.stream], self.numbers[self.names.pop(old.stream)]
            self.dropped.pop(old.stream, None)

    def where(self, last_event_id: str) -> tuple[StreamId, int, int]:
        """The stream ``last_event_id`` is of, its number and the event's; ``Gone`` when
        this session cannot give all that came on it after that event."""
        tag, _, rest = last_event_id.partition("-")
        stream, _, n = rest.partition("-")
        if tag != self.tag or not stream.isdigit() or not n.isdigit() or int(n) > self.last:
            raise Gone(
                f"Last-Event-ID {last_event_id!r} is no event of this MCP session: open the "
                "stream without it (what it wrote before is not written again)"
            )
        number, after = int(stream), int(n)
        name = self.names.get(number)
        if name is None or self.dropped.get(number, 0) > after:
            raise Gone(
                f"the events after Last-Event-ID {last_event_id!r} are no longer kept (an "
                f"MCP session keeps its newest {self.max_events} events, "
                f"{self.max_bytes // 1024 // 1024} MiB at most): open the stream without it"
            )
        return name, number, after

    def after(self, last_event_id: str) -> tuple[StreamId, list[Event]]:
        """The stream of ``last_event_id`` and its events after it, oldest first."""
        name, number, after = self.where(last_event_id)
        return name, [e for e in self.kept if e.stream == number and e.n > after]


#: the MCP session whose request, or task, is in hand
EVENTS: ContextVar[Events] = ContextVar("repl.mcp.events")


def dumped(message: JSONRPCMessage) -> bytes:
    """A message's JSON as the SDK writes it in an event's ``data:``."""
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode()


class Store(EventStore):
    """The SDK's ``EventStore``, over the ``Events`` of the MCP session in hand."""

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        events = EVENTS.get()
        return events.id_of(events.record(stream_id, None if message is None else dumped(message)))

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Send what came on the stream after ``last_event_id``; its id, for the SDK to go
        on sending what comes on it, or None when it ended (its answer was among them)."""
        events = EVENTS.get()
        try:
            name, later = events.after(last_event_id)
        except Gone:  # refused before the SDK was asked (repl_cli.mcp.http): nothing to send
            return None
        ended = False
        for event in later:
            if event.data is None:
                continue
            message = jsonrpc_message_adapter.validate_json(event.data, by_name=False)
            await send_callback(EventMessage(message, events.id_of(event)))
            ended = isinstance(message, JSONRPCResponse | JSONRPCError)
        return None if ended else name


__all__ = ["EVENTS", "MAX_BYTES", "MAX_EVENTS", "RETRY_MS", "Events", "Gone", "Store", "dumped"]
