"""The HTTP server in this process, for what a daemon process cannot be told: a short
heartbeat. An idle event stream gets a comment line every ``HEARTBEAT`` seconds (15 s in a
daemon), so a proxy keeps it open, and still costs the session no evaluation."""

from __future__ import annotations

import anyio
import pytest

from repl_daemon import http
from repl_daemon import protocol as p
from repl_daemon.engine import open_engine
from repl_daemon.stores.memory import MemoryStore

pytestmark = pytest.mark.anyio


async def test_an_idle_stream_gets_heartbeats_and_costs_no_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http, "HEARTBEAT", 0.2)
    engine = open_engine(MemoryStore(), settle=0)
    await engine.handle(p.Start(session="s")).result()
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        port = await tg.start(http.serve_http, engine, "127.0.0.1", 0, "tok", 5.0)
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
