"""The benchmark's clients: JSON lines and HTTP/1.1 over asyncio streams, and redis.asyncio.

``LineClient`` is one asyncio connection speaking newline-delimited JSON,
the way a user's program would talk to the daemon (and, with the same code,
to the floor server). ``HttpClient`` is one keep-alive HTTP/1.1 connection
to the daemon's HTTP routes and ``EventStream`` one open event stream, both
written by hand on the same asyncio streams (the standard library has no
asyncio HTTP client, and the benchmark adds no dependency), so that the HTTP
rows and their line-protocol references pay the same kind of client. Redis
is driven through the ``redis`` package's asyncio client (the ``bench``
extra); it is imported only when a reference is measured, so the benchmark
still runs (without that column) when the package is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self

from bench.procs import HOST, BenchError

READ_LIMIT = 1 << 24  # a stats answer on 1,000 sessions is ~150 KB


def encode(request: dict[str, Any]) -> bytes:
    return json.dumps(request).encode() + b"\n"


class LineClient:
    """One connection, JSON lines; ``call`` is one request and its answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, token: str | None = None) -> LineClient:
        reader, writer = await asyncio.open_connection(HOST, port, limit=READ_LIMIT)
        client = cls(reader, writer)
        if token is not None:
            await client.ok({"op": "auth", "token": token})
        return client

    def write(self, request: dict[str, Any]) -> None:
        self.writer.write(encode(request))

    def write_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def answer(self) -> dict[str, Any]:
        line = await self.reader.readline()
        if not line:
            raise BenchError("the server closed the connection")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def timed_answer(self) -> tuple[int, dict[str, Any]]:
        """The next answer and the perf_counter_ns at which it was read."""
        answer = await self.answer()
        return time.perf_counter_ns(), answer

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.writer.write(encode(request))
        await self.writer.drain()
        return await self.answer()

    async def ok(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = await self.call(request)
        if not answer.get("ok"):
            raise BenchError(f"{request.get('op')} failed: {answer}")
        return answer

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


# -- HTTP ---------------------------------------------------------------------


async def _http_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """A response's status and headers (names in lower case)."""
    status_line = await reader.readline()
    if not status_line:
        raise BenchError("the HTTP server closed the connection")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise BenchError(f"not an HTTP response: {status_line!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _chunk(reader: asyncio.StreamReader) -> bytes:
    """The next chunk of a chunked body; b"" at its end."""
    size_line = await reader.readline()
    if not size_line:
        raise BenchError("the HTTP server closed the connection in a chunked body")
    size = int(size_line.split(b";", 1)[0], 16)
    if size == 0:  # the last chunk: skip the trailers, up to the empty line
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        return b""
    data = await reader.readexactly(size + 2)  # the chunk and its CRLF
    return data[:size]


def _request_head(method: str, path: str, port: int, token: str, extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
        f"Authorization: Bearer {token}\r\n{extra}"
    ).encode()


class HttpClient:
    """One keep-alive HTTP/1.1 connection; ``post`` is one request and its answer."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, token: str
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.port = port
        self.token = token

    @classmethod
    async def connect(cls, port: int, token: str) -> HttpClient:
        reader, writer = await asyncio.open_connection(HOST, port, limit=READ_LIMIT)
        return cls(reader, writer, port, token)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: str = ""
    ) -> tuple[int, Any]:
        """Status and decoded JSON body of one request (``headers``: extra CRLF-ended lines)."""
        length = f"Content-Length: {len(body)}\r\n" if body or method == "POST" else ""
        head = _request_head(method, path, self.port, self.token, headers + length)
        self.writer.write(head + b"\r\n" + body)
        await self.writer.drain()
        status, response = await _http_head(self.reader)
        if "content-length" in response:
            data = await self.reader.readexactly(int(response["content-length"]))
        elif response.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while part := await _chunk(self.reader):
                parts.append(part)
            data = b"".join(parts)
        else:
            raise BenchError(f"an HTTP answer with no length: {status} {response}")
        if response.get("connection", "").lower() == "close":
            self.writer.close()
        return status, json.loads(data) if data else None

    async def post(self, path: str, text: bytes, headers: str = "") -> Any:
        """POST ``text`` (a firing); the answer's JSON, BenchError unless it is 201 or 200."""
        content = "Content-Type: text/plain; charset=utf-8\r\n"
        status, answer = await self.request("POST", path, text, content + headers)
        if status not in (200, 201):
            raise BenchError(f"POST {path} answered {status} {answer}")
        return answer

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


class EventStream:
    """One open ``GET /sessions/{id}/events``: its Server-Sent Events, one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = b""

    @classmethod
    async def open(cls, port: int, token: str, session: str, after: int | None = None) -> Self:
        """The stream once its answer's headers are in (200), from the head or after ``after``."""
        reader, writer = await asyncio.open_connection(HOST, port, limit=READ_LIMIT)
        query = "" if after is None else f"?after={after}"
        path = f"/sessions/{session}/events{query}"
        writer.write(_request_head("GET", path, port, token, "Accept: text/event-stream\r\n"))
        writer.write(b"\r\n")
        await writer.drain()
        status, headers = await _http_head(reader)
        if status != 200 or not headers.get("content-type", "").startswith("text/event-stream"):
            writer.close()
            raise BenchError(f"GET {path} answered {status} {headers}")
        if headers.get("transfer-encoding", "").lower() != "chunked":
            writer.close()
            raise BenchError(f"an event stream that is not chunked: {headers}")
        return cls(reader, writer)

    async def event(self) -> dict[str, str]:
        """The next event's fields (``event``, ``id``, ``data``); comments (pings) and
        ``position`` events (where a stream starts) skipped."""
        while True:
            block, blank, rest = self.buffer.partition(b"\n\n")
            if not blank:
                chunk = await _chunk(self.reader)
                if not chunk:
                    raise BenchError("the event stream ended")
                # SSE ends a line with CRLF, LF or CR; sse-starlette writes CRLF
                self.buffer = (self.buffer + chunk).replace(b"\r\n", b"\n")
                continue
            self.buffer = rest
            fields: dict[str, str] = {}
            for line in block.decode().split("\n"):
                if line and not line.startswith(":"):
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    fields[name] = fields[name] + "\n" + value if name in fields else value
            if fields.get("event", "position") != "position":  # where it starts: no firing
                return fields

    async def firing(self) -> tuple[int, dict[str, Any]]:
        """The next ``firing`` event's JSON and the perf_counter_ns at which it was read."""
        fields = await self.event()
        if fields.get("event") != "firing":
            raise BenchError(f"the event stream sent {fields}")
        firing: dict[str, Any] = json.loads(fields["data"])
        if str(firing.get("seq")) != fields.get("id"):
            raise BenchError(f"an event's id {fields.get('id')} is not its seq {firing}")
        return time.perf_counter_ns(), firing

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def connect_many(
    count: int,
    opener: Callable[[int], Awaitable[Any]],
    *,
    concurrency: int = 200,
    deadline_s: float = 120.0,
) -> list[Any]:
    """``opener(i)`` for i in range(count), ``concurrency`` at a time, within a deadline."""
    out: list[Any] = []
    async with asyncio.timeout(deadline_s):
        for start in range(0, count, concurrency):
            chunk = range(start, min(count, start + concurrency))
            out.extend(await asyncio.gather(*(opener(i) for i in chunk)))
    return out


async def until(
    probe: Callable[[], Awaitable[bool]],
    *,
    what: str,
    deadline_s: float = 60.0,
    interval_s: float = 0.02,
) -> None:
    """Poll ``probe`` every ``interval_s`` until it is true; BenchError after the deadline."""
    end = time.monotonic() + deadline_s
    while not await probe():
        if time.monotonic() > end:
            raise BenchError(f"timed out after {deadline_s:g} s waiting for {what}")
        await asyncio.sleep(interval_s)


async def close_all(clients: Iterable[LineClient]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


# -- redis -------------------------------------------------------------------


def redis_client(port: int) -> Any:
    """A redis.asyncio client on one connection (as LineClient is one connection)."""
    import redis.asyncio

    return redis.asyncio.Redis(host=HOST, port=port, single_connection_client=True)


async def redis_connection(port: int) -> Any:
    """A bare redis.asyncio Connection with no read timeout, for a blocked XREAD."""
    from redis.asyncio.connection import Connection

    conn = Connection(host=HOST, port=port, socket_timeout=None)
    await conn.connect()  # type: ignore[no-untyped-call]
    return conn


async def redis_info(client: Any, section: str) -> dict[str, Any]:
    info: dict[str, Any] = await client.info(section)
    return info
