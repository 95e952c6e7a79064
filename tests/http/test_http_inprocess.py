"""The HTTP server in this process, for what a daemon process cannot be told or show.

A short heartbeat: an idle event stream gets a comment line every ``HEARTBEAT`` seconds
(15 s in a daemon), so a proxy keeps it open, and still costs the session no evaluation.
A long poll cut off by the server stopping releases its wait. And the server's side of a
connection: every accepted socket has ``TCP_NODELAY``, read
from the socket itself (the test and the server share a process, so its descriptor is
here), on the asyncio loop, which is what ``pip install 'repl-inbox[http]'`` runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from http.client import HTTPConnection

import anyio
import anyio.to_thread
import pytest

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.engine import Engine
from repl_daemon.http import server, streams

pytestmark = pytest.mark.anyio


async def test_an_idle_stream_gets_heartbeats_and_costs_no_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streams, "HEARTBEAT", 0.2)
    engine = Engine(LocalBackend(MemoryStore()), settle=0)
    await engine.handle(p.Start(session="s")).result()
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        port = await tg.start(server.serve_http, engine, "127.0.0.1", 0, "tok", 5.0)
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            await conn.send(
                b"GET /sessions/s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n\r\n"
            )
            seen = b""
            with anyio.fail_after(5):
                while seen.count(b": ping") < 3:
                    seen += await conn.receive()
            assert seen.startswith(b"HTTP/1.1 200")
            before = engine.committer.sessions["s"].session.evaluations  # type: ignore[attr-defined]
            with anyio.fail_after(5):
                while seen.count(b": ping") < 5:
                    seen += await conn.receive()
            assert engine.committer.sessions["s"].session.evaluations == before  # type: ignore[attr-defined]
            assert b"event: firing" not in seen
        tg.cancel_scope.cancel()


@contextlib.contextmanager
def accepted(peer: tuple[str, int]) -> Iterator[socket.socket]:
    """This process's socket whose peer is ``peer``: the server's side of a client's
    connection (a duplicate of its descriptor, closed after; options are the socket's)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:  # not a socket, or gone since the listing
            continue
        with sock:
            try:
                if sock.getpeername() == peer:
                    yield sock
                    return
            except OSError:  # a socket with no peer: a listener, or not TCP
                continue
    raise AssertionError(f"no socket here is connected to {peer}")


async def test_keep_alive_answers_are_not_held_back_by_nagle() -> None:
    """uvicorn writes an answer's head and body in two writes; with Nagle's algorithm on,
    the body waits for the ACK of the head, which the client delays (40 ms on Linux), so
    every answer after the first on a keep-alive connection came 40 ms late (0.6 ms
    without). The accepted socket has ``TCP_NODELAY``: the body goes out at once. No
    clock: the option is read from the server's own socket, after two answers on one
    connection of a stock client (``http.client``)."""
    engine = Engine(LocalBackend(MemoryStore()), settle=0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        port = await tg.start(server.serve_http, engine, "127.0.0.1", 0, "tok", 5.0)
        conn = HTTPConnection("127.0.0.1", port, timeout=10)

        def two_requests() -> list[int]:
            statuses = []
            for _ in range(2):
                conn.request("GET", "/sessions", headers={"Authorization": "Bearer tok"})
                answer = conn.getresponse()
                answer.read()
                statuses.append(answer.status)
            return statuses

        try:
            assert await anyio.to_thread.run_sync(two_requests) == [200, 200]
            assert conn.sock is not None  # still open: both answers came on it
            with accepted(conn.sock.getsockname()) as server_side:
                assert server_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            conn.close()
        tg.cancel_scope.cancel()


async def test_a_failure_of_the_daemons_own_is_a_json_500_and_the_daemon_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug in a route (here: the health check made to raise) is 500 ``internal`` in the
    daemon's JSON, not Starlette's plain text; the next request is served."""
    engine = Engine(LocalBackend(MemoryStore()), settle=0)
    calls = []

    async def broken() -> str | None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return None

    monkeypatch.setattr(engine, "health", broken)
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        port = await tg.start(server.serve_http, engine, "127.0.0.1", 0, "tok", 5.0)
        conn = HTTPConnection("127.0.0.1", port, timeout=10)

        def healthz() -> tuple[int, str, bytes]:
            conn.request("GET", "/healthz")
            answer = conn.getresponse()
            return answer.status, answer.getheader("content-type", ""), answer.read()

        try:
            status, kind, body = await anyio.to_thread.run_sync(healthz)
            assert (status, kind) == (500, "application/json")
            assert json.loads(body) == {
                "code": "internal",
                "message": "the daemon failed on this request: its log (daemon.log in its "
                "state directory) says why",
            }
            conn.close()
            assert await anyio.to_thread.run_sync(healthz) == (
                200,
                "application/json",
                b'{"ok":true}',
            )
        finally:
            conn.close()
        tg.cancel_scope.cancel()


async def test_a_long_poll_cut_off_by_the_server_stopping_releases_its_wait() -> None:
    """The HTTP server stopping while a long poll is blocked (uvicorn cancels what still
    runs past its grace period): the request's end releases the wait at once, with no
    answer and no cursor moved; the engine is left with no waiter."""
    engine = Engine(LocalBackend(MemoryStore()), settle=0)
    await engine.handle(p.Start(session="s")).result()
    web = anyio.CancelScope()

    async def serve(*, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        with web:
            await server.serve_http(engine, "127.0.0.1", 0, "tok", 5.0, task_status=task_status)

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        port = await tg.start(serve)
        async with await anyio.connect_tcp("127.0.0.1", port) as conn:
            await conn.send(
                b"GET /sessions/s/wait?timeout=600 HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer tok\r\n\r\n"
            )
            with anyio.fail_after(5):
                while engine.waiters_of("s") != 1:  # noqa: ASYNC110 - a bounded look at the engine
                    await anyio.sleep(0.01)
            web.cancel()  # the server stops; the client is still there, waiting
            with anyio.fail_after(10):
                while engine.waiting:  # noqa: ASYNC110 - a bounded look at the engine
                    await anyio.sleep(0.01)
        assert engine.waiters_of("s") == 0
        cursors = await engine.handle(p.Cursors(session="s")).result()
        assert isinstance(cursors, p.CursorList) and cursors.cursors == []
        tg.cancel_scope.cancel()
