"""The benchmark's clients: JSON lines over asyncio streams, and redis.asyncio.

``LineClient`` is one asyncio connection speaking newline-delimited JSON,
the way a user's program would talk to the daemon (and, with the same code,
to the floor server). Redis is driven through the ``redis`` package's
asyncio client (the ``bench`` extra); it is imported only when a reference
is measured, so the benchmark still runs (without that column) when the
package is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

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
