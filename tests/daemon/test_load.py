"""Load and misbehaving clients (issue 7): a well-behaved client is served
throughout while a thousand others hold connections, read slowly, stall
half-way through a line, or vanish mid-request; limits give a clear error.

Latency figures are printed (run with -s to see them), never asserted.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from repl_daemon.config import Limits
from tests.helpers import (
    Client,
    Daemon,
    DaemonProc,
    InProcDaemon,
    daemon_config,
    eventually,
    inproc_daemon,
)


async def _connect(port: int, token: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(json.dumps({"op": "auth", "token": token}).encode() + b"\n")
    await writer.drain()
    assert json.loads(await reader.readline())["ok"]
    return reader, writer


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: dict[str, Any]
) -> dict[str, Any]:
    writer.write(json.dumps(request).encode() + b"\n")
    await writer.drain()
    answer: dict[str, Any] = json.loads(await reader.readline())
    return answer


async def _crowd(port: int, token: str, sizes: dict[str, int], rounds: int) -> dict[str, Any]:
    writers: list[asyncio.StreamWriter] = []
    setup_r, setup_w = await _connect(port, token)
    writers.append(setup_w)
    for i in range(10):
        await _call(setup_r, setup_w, {"op": "start", "session": f"s{i}"})
    await _call(setup_r, setup_w, {"op": "start", "session": "big"})
    await _call(setup_r, setup_w, {"op": "start", "session": "work"})
    for _ in range(200):
        await _call(setup_r, setup_w, {"op": "send", "session": "big", "text": "y" * 1000})

    # blocked waiters, one wait each
    for i in range(sizes["waiters"]):
        _, w = await _connect(port, token)
        w.write(json.dumps({"op": "wait", "sessions": [f"s{i % 10}"]}).encode() + b"\n")
        writers.append(w)
    # slow readers: pipeline many big reads and never read the answers
    for _ in range(sizes["slow"]):
        _, w = await _connect(port, token)
        line = json.dumps({"op": "read", "session": "big", "after": 0}).encode() + b"\n"
        w.write(line * 50)
        writers.append(w)
    # stallers: half a line, then nothing
    for _ in range(sizes["stallers"]):
        _, w = await _connect(port, token)
        w.write(b'{"op": "send", "session": "s0", "te')
        writers.append(w)
    for w in writers:
        await w.drain()

    async def vanishers() -> int:
        count = 0
        for _ in range(sizes["vanishers"]):
            _, w = await _connect(port, token)
            w.write(b'{"op": "start", "session": "gone", "exi')
            await w.drain()
            w.transport.abort()
            count += 1
        return count

    async def well_behaved() -> list[float]:
        reader, writer = await _connect(port, token)
        latencies = []
        try:
            for i in range(rounds):
                start = time.perf_counter()
                sent = await _call(
                    reader, writer, {"op": "send", "session": "work", "text": str(i)}
                )
                assert sent["ok"], sent
                read = await _call(reader, writer, {"op": "read", "session": "work", "max": 1})
                assert read["ok"], read
                latencies.append(time.perf_counter() - start)
        finally:
            writer.close()
        return latencies

    try:
        latencies, vanished = await asyncio.gather(well_behaved(), vanishers())
        stats_r, stats_w = await _connect(port, token)
        writers.append(stats_w)
        stats = await _call(stats_r, stats_w, {"op": "stats"})
    finally:
        for w in writers:
            w.transport.abort()
    latencies.sort()
    return {
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "vanished": vanished,
        "connections": stats["daemon"]["connections"],
        "waiters": stats["daemon"]["waiters"],
    }


def _run_crowd(d: Daemon, sizes: dict[str, int], rounds: int) -> dict[str, Any]:
    figures = asyncio.run(_crowd(d.port, d.token, sizes, rounds))
    print(
        f"\nload {sizes}: well-behaved round trip p50 {figures['p50_ms']:.2f} ms, "
        f"p99 {figures['p99_ms']:.2f} ms over {rounds} rounds"
    )
    return figures


@pytest.fixture
def roomy(tmp_path: Path) -> Iterator[DaemonProc]:
    """A memory daemon whose idle timeout outlasts the crowd (the stallers must stay).

    A process of its own: in the test's process the crowd of a thousand
    clients and the daemon would share one interpreter and take about twice
    as long.
    """
    d = DaemonProc(tmp_path / "home", "--memory", "--settle-ms", "0", "--idle-timeout", "120")
    yield d
    d.close_clients()
    d.stop()


def test_a_well_behaved_client_is_served_among_a_thousand_others(roomy: DaemonProc) -> None:
    daemon = roomy
    sizes = {"waiters": 600, "slow": 100, "stallers": 200, "vanishers": 100}
    figures = _run_crowd(daemon, sizes, rounds=300)
    held = sizes["waiters"] + sizes["slow"] + sizes["stallers"]
    assert figures["connections"] >= held, figures
    assert figures["waiters"] == sizes["waiters"]
    # and once they are all gone, the daemon holds nothing for them
    c = daemon.client()
    eventually(lambda: c.ok({"op": "stats"})["daemon"]["connections"] == 1, 10, "one connection")
    assert c.ok({"op": "stats"})["daemon"]["waiters"] == 0


@pytest.mark.slow
def test_a_long_crowd(roomy: DaemonProc) -> None:
    daemon = roomy
    sizes = {"waiters": 3000, "slow": 300, "stallers": 500, "vanishers": 1000}
    _run_crowd(daemon, sizes, rounds=3000)


def test_the_connection_limit_gives_a_clear_error(tmp_path: Path) -> None:
    config = daemon_config(tmp_path / "home", limits=Limits(max_connections=5))
    with inproc_daemon(config) as d:
        held = [d.client() for _ in range(5)]
        extra = Client(d.port)
        answer = extra.recv()
        assert answer["code"] == "too_many" and "5 connections" in answer["message"]
        assert extra.closed()
        extra.close()
        held[0].close()
        d.clients.remove(held[0])
        eventually(partial(_admitted, d), 5, "the freed connection place taken again")


def _admitted(d: Daemon) -> bool:
    """Whether a new connection is let in (authenticated), not refused as one too many."""
    again = Client(d.port, None)
    try:
        return bool(again.call({"op": "auth", "token": d.token}).get("ok"))
    except ConnectionError:
        return False
    finally:
        again.close()


def test_the_session_limit_gives_a_clear_error(tmp_path: Path) -> None:
    with inproc_daemon(daemon_config(tmp_path / "home", max_sessions=3)) as d:
        c = d.client()
        for i in range(3):
            c.ok({"op": "start", "session": f"s{i}"})
        answer = c.call({"op": "start", "session": "s3"})
        assert answer["code"] == "too_many" and "3 sessions" in answer["message"]
        assert len(c.ok({"op": "sessions"})["sessions"]) == 3


STOPPED_WAITER = textwrap.dedent(
    """
    import json, socket, sys
    port, token = int(sys.argv[1]), sys.argv[2]
    s = socket.create_connection(("127.0.0.1", port))
    f = s.makefile("rb")
    s.sendall(json.dumps({"op": "auth", "token": token}).encode() + b"\\n")
    f.readline()
    s.sendall(json.dumps({"op": "wait", "sessions": ["a"]}).encode() + b"\\n")
    print("waiting", flush=True)
    print(f.readline().decode(), end="", flush=True)
    """
)


def test_a_stopped_waiting_client_does_not_stall_the_daemon(
    inproc: InProcDaemon, tmp_path: Path
) -> None:
    c = inproc.client()
    c.ok({"op": "start", "session": "a"})
    script = tmp_path / "waiter.py"
    script.write_text(STOPPED_WAITER)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(inproc.port), inproc.token], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"waiting\n"
        proc.send_signal(signal.SIGSTOP)
        for i in range(200):  # the daemon goes on serving everyone else
            assert c.ok({"op": "send", "session": "a", "text": "z" * 5000 + str(i)})["seq"] == i + 1
        assert c.ok({"op": "read", "session": "a", "after": 199})["firings"][0]["seq"] == 200
        proc.send_signal(signal.SIGCONT)
        answer = json.loads(proc.stdout.readline())
        assert answer["ok"] and answer["batches"][0]["firings"][0]["seq"] == 1
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
