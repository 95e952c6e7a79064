"""The wake floor: a bare uvloop server doing a blocked wait's work, and nothing else.

The wake and fan-out rows (bench/waits.py) time a send that wakes blocked
waits. This server does that work the plainest way Python can, so that what
the daemon costs above it is the daemon's own: a wait request is decoded
(``json``), its cursor moved to its ``ack``, and, with nothing after the
cursor, the connection is put in its session's list of waiters; a send is
decoded, its firing recorded (seq, timestamp, its JSON encoded once, a ring
of 256), and every
waiter of the session answered with the firings after its cursor, each
distinct answer encoded once (a fan-out of 1,000 waiters at one position is
one encode and 1,000 writes), before the sender's own answer. No store,
no tokens, no settle, no idle timeout, no limits.

It speaks the part of the daemon's line protocol those rows use, with the
daemon's answers' shapes, so that the same waiter child (bench/waiters.py)
and the same sender drive it: ``auth`` (any token), ``start``, ``wait``
(one session, ``cursor``, ``ack``), ``send`` (``session``, ``text``) and
``stats`` with a ``session`` (its ``waiters``, the readiness probe).
Connections are asyncio protocols, a request is handled in the callback of
the bytes that carried it, and the answers to one read go out in one write,
as the daemon's do.

On uvloop when it is installed, as the daemon's ``--loop auto`` is;
``--loop asyncio`` forces the standard loop. Standard library (and uvloop)
only, run as a script: ``python bench/wake_floor.py --port 0`` prints
``listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import deque
from importlib.util import find_spec
from typing import Any, cast

RING = 256  # the daemon's default ring
_dumps = json.JSONEncoder(separators=(",", ":")).encode
_loads = json.loads


_second: list[tuple[int, str]] = [(-1, "")]


def stamp() -> str:
    """Now as the daemon stamps a firing, ISO 8601 UTC with milliseconds, its date
    formatted once a second as the daemon's is."""
    now = time.time()
    second = int(now)
    cached, prefix = _second[0]
    if cached != second:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second[0] = (second, prefix)
    return f"{prefix}.{int((now - second) * 1000):03d}Z"


class Session:
    """A ring of firings, each cursor's position, and the connections blocked on it."""

    __slots__ = ("cursors", "head", "name", "prefix", "ring", "waiters")

    def __init__(self, name: str) -> None:
        self.name = name
        self.prefix = b'{"ok":true,"batches":[{"session":' + _dumps(name).encode()
        self.head = 0
        #: each firing's JSON, encoded once when it is recorded
        self.ring: deque[bytes] = deque(maxlen=RING)
        self.cursors: dict[str, int] = {}
        #: each blocked wait: its connection and the position it reads after
        self.waiters: list[tuple[Line, int]] = []

    def answer(self, after: int) -> bytes:
        """A wait's answer: the firings after ``after``, as the daemon's ``wait`` gives them."""
        ring, head = self.ring, self.head
        lost = max(0, head - len(ring) - after)
        firings = b",".join(list(ring)[-(head - after) :]) if head > after else b""
        return b'%s,"next":%d,"lost":%d,"firings":[%s]}],"timed_out":false}\n' % (
            self.prefix,
            head,
            lost,
            firings,
        )

    def wake(self) -> None:
        """Answer every blocked wait: one encode a position, one write a waiter."""
        waiters, self.waiters = self.waiters, []
        answers: dict[int, bytes] = {}
        for line, after in waiters:
            data = answers.get(after)
            if data is None:
                data = answers[after] = self.answer(after)
            line.blocked = None
            line.transport.write(data)


SESSIONS: dict[str, Session] = {}


class Line(asyncio.Protocol):
    """One client, a request a line; the benchmark's clients put a connection's next
    request only once its wait is answered, so no queue keeps the answers in order."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport
        self.blocked: Session | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        session = self.blocked
        if session is not None:
            session.waiters = [w for w in session.waiters if w[0] is not self]

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer + data if self.buffer else data
        out: list[bytes] = []
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            line = buffer[start:end]
            start = end + 1
            answer = self.handle(_loads(line))
            if answer is not None:
                out.append(answer)
        self.buffer = buffer[start:]
        if out:
            self.transport.write(b"".join(out))

    def handle(self, request: dict[str, Any]) -> bytes | None:
        op = request["op"]
        if op == "wait":
            return self.wait(request)
        if op == "send":
            return self.send(request)
        if op == "auth":
            return b'{"ok":true}\n'
        if op == "start":
            name = request["session"]
            created = name not in SESSIONS
            if created:
                SESSIONS[name] = Session(name)
            return _dumps({"ok": True, "session": name, "created": created}).encode() + b"\n"
        if op == "stats":
            session = SESSIONS[request["session"]]
            row = {"id": session.name, "head": session.head, "waiters": len(session.waiters)}
            return _dumps({"ok": True, "sessions": [row]}).encode() + b"\n"
        return _dumps({"ok": False, "code": "unknown_op", "message": op}).encode() + b"\n"

    def wait(self, request: dict[str, Any]) -> bytes | None:
        name = request["sessions"][0]
        session = SESSIONS[name]
        cursor = request["cursor"]
        after = session.cursors.get(cursor, 0)
        ack = request.get("ack")
        if ack:
            after = session.cursors[cursor] = max(after, ack[name])
        if session.head > after:
            return session.answer(after)
        self.blocked = session
        session.waiters.append((self, after))
        return None

    def send(self, request: dict[str, Any]) -> bytes:
        session = SESSIONS[request["session"]]
        session.head += 1
        firing = {
            "seq": session.head,
            "handler": "on-message",
            "result": request["text"],
            "event": None,
            "ts": stamp(),
            "tags": {},
            "by": "root",
        }
        session.ring.append(_dumps(firing).encode())
        session.wake()  # the waiters first, as the daemon answers them before the sender
        return _dumps({"ok": True, "seq": session.head, "duplicate": False}).encode() + b"\n"


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Line, host, port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on {host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/wake_floor.py")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=("auto", "asyncio"), default="auto")
    args = parser.parse_args()
    if args.loop == "auto" and find_spec("uvloop") is not None:
        import uvloop

        uvloop.run(serve(args.host, args.port))
    else:
        asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
