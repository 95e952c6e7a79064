"""Restart: a durable daemon full of sessions, stopped and started again, until it serves.

The reference is redis-server with the same streams in an AOF (fsync
always), stopped and started again until an XREVRANGE is answered (it
answers ``LOADING`` while it reads the AOF). Both probes are plain sockets,
so no client library's start-up is timed.
"""

from __future__ import annotations

import json
import socket
import time

from bench.clients import encode
from bench.measure import Group, Setup, Sizes, fill_daemon, fill_streams, run_async
from bench.procs import HOST, BenchError, Daemon, RedisServer, rss_bytes
from bench.table import Goal, Row


def _repl_served(port: int, token: str, session: str, head: int, deadline_s: float) -> None:
    """Block until a read of ``session``'s newest firing is answered."""
    with socket.create_connection((HOST, port), timeout=deadline_s) as sock:
        reader = sock.makefile("rb")
        request = {"op": "read", "session": session, "after": head - 1}
        sock.sendall(encode({"op": "auth", "token": token}) + encode(request))
        auth, answer = json.loads(reader.readline()), json.loads(reader.readline())
        reader.close()
    if not auth.get("ok") or len(answer.get("firings") or []) != 1:
        raise BenchError(f"after the restart the read answered {answer}")


def _resp(*args: str) -> bytes:
    """One Redis command in RESP, for the restart probe that must not wait on a client library."""
    parts = [f"*{len(args)}\r\n"] + [f"${len(a)}\r\n{a}\r\n" for a in args]
    return "".join(parts).encode()


def _redis_served(port: int, key: str, deadline_s: float) -> None:
    """Poll until Redis answers an XREVRANGE of ``key`` with an entry (it loads its AOF first)."""
    end = time.monotonic() + deadline_s
    request = _resp("XREVRANGE", key, "+", "-", "COUNT", "1")
    while time.monotonic() < end:
        try:
            with socket.create_connection((HOST, port), timeout=deadline_s) as sock:
                while time.monotonic() < end:
                    sock.sendall(request)
                    reply = sock.recv(65536)
                    if reply.startswith(b"*1"):
                        return
                    if not reply:
                        break
                    time.sleep(0.001)  # -LOADING: the AOF is still being read
        except OSError:
            time.sleep(0.001)
    raise BenchError(f"redis did not serve {key} within {deadline_s:g} s")


def restart_rows(s: Sizes) -> list[Row]:
    figure = f"restart until {s.restart_sessions:,} full sessions are served (durable), ms"
    memory = (
        f"RSS after that restart, MiB (reference: the daemon's RSS before it, its "
        f"{s.restart_sessions:,} sessions filled)"
    )
    return [
        Row("restart", figure, Goal("report", 0, "report (Redis AOF reload)")),
        Row("restart_rss", memory, Goal("ratio_le", 1.1, "≤ 1.1 × the RSS before it")),
    ]


def restart(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["restart"]
    names = [f"full-{j}" for j in range(s.restart_sessions)]
    if setup.store_missing:
        setup.cannot_run([row, rows["restart_rss"]], "store missing")
    else:
        daemon = Daemon(setup.dir("restart-daemon"), memory=False).start()
        try:
            run_async(fill_daemon(daemon, names, s.restart_firings, s.batch), s.deadline_s)
            time.sleep(s.settle_s)
            rows["restart_rss"].reference = rss_bytes(daemon.pid) / 2**20
            t0 = time.perf_counter()
            daemon.stop()  # a clean stop: it keeps every ring's image for the start
            setup.notes.append(
                f"restart: the clean stop before it took {time.perf_counter() - t0:.2f} s"
            )
            t0 = time.perf_counter()
            daemon.start()
            _repl_served(daemon.port, daemon.token, names[-1], s.restart_firings, 60)
            row.repl = (time.perf_counter() - t0) * 1000
            time.sleep(s.settle_s)
            rows["restart_rss"].repl = rss_bytes(daemon.pid) / 2**20
        finally:
            daemon.stop()
        with Daemon(setup.dir("restart-empty"), memory=False) as empty:
            t0 = time.perf_counter()
            empty.start()
            ms = (time.perf_counter() - t0) * 1000
        setup.notes.append(f"restart: an empty durable daemon takes {ms:.0f} ms to listen")
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("restart-redis"), durable=True) as redis:
            redis.start()
            run_async(fill_streams(redis.port, names, s.restart_firings, s.batch), s.deadline_s)
            redis.stop()
            t0 = time.perf_counter()
            redis.spawn(redis.port)
            _redis_served(redis.port, names[-1], 60)
            row.reference = (time.perf_counter() - t0) * 1000


RESTART = Group("restart", restart_rows, restart)
