"""Many sessions: pipelined durable sends spread over 10,000 sessions (issue 29).

The one-session durable row (``sends``) sends to one session; here the same
pipelined sends go round-robin over ``many_sessions`` sessions (32 each by
default), so that every batch the daemon commits touches as many sessions as
it holds sends. The daemon is durable (SQLite) and Redis has
``appendfsync always`` with one stream a session; both are driven with the
same batches. The one-session rate of the same run (same daemon kind, same
count of sends, one session) is measured here too, so the goal's ratio to it
is of two figures taken minutes apart at most.

The Redis store's rows: the same sends through one daemon whose store is one
redis-server (no AOF), against redis-py's pipelined XADD to the same 10,000
streams on a fresh redis-server of the same kind, and the daemon's CPU per send.
"""

from __future__ import annotations

import time

from bench.clients import LineClient, encode, redis_client
from bench.measure import (
    Group,
    Setup,
    Sizes,
    on_daemon,
    on_redis,
    pipeline,
    run_async,
    send_request,
)
from bench.procs import Daemon, RedisServer, cpu_seconds
from bench.table import Goal, Row


def _targets(s: Sizes) -> list[str]:
    names = [f"m{n:05d}" for n in range(s.many_sessions)]
    return [names[i % len(names)] for i in range(s.many_sessions * s.many_sends)]


async def line_spread(
    port: int, token: str | None, targets: list[str], batch: int, *, start: bool = True
) -> float:
    """Sends per second, ``batch`` at once, to the sessions of ``targets`` in that order
    (each started first unless ``start`` is False, in pipelined batches too, not timed)."""
    rate, _ = await line_spread_cpu(port, token, targets, batch, start=start)
    return rate


async def line_spread_cpu(
    port: int,
    token: str | None,
    targets: list[str],
    batch: int,
    *,
    start: bool = True,
    pid: int | None = None,
) -> tuple[float, float]:
    """``line_spread``, and the CPU time (s) of process ``pid`` over the timed sends."""
    client = await LineClient.connect(port, token)
    try:
        if start:
            starts = [encode({"op": "start", "session": sid}) for sid in sorted(set(targets))]
            await pipeline(client, starts, batch, what="start")
        requests = [encode(send_request(sid)) for sid in targets]
        cpu0 = cpu_seconds(pid) if pid is not None else 0.0
        t0 = time.perf_counter()
        await pipeline(client, requests, batch, what="send")
        seconds = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0 if pid is not None else 0.0
        return len(targets) / seconds, cpu
    finally:
        await client.close()


async def redis_spread(port: int, targets: list[str], batch: int) -> float:
    client = redis_client(port)
    try:
        t0 = time.perf_counter()
        for first in range(0, len(targets), batch):
            async with client.pipeline(transaction=False) as pipe:
                for key in targets[first : first + batch]:
                    pipe.xadd(key, {"text": "x" * 100}, maxlen=256, approximate=False)
                await pipe.execute()
        return len(targets) / (time.perf_counter() - t0)
    finally:
        await client.aclose()


def many_rows(s: Sizes) -> list[Row]:
    spread = f"pipelined sends/s over {s.many_sessions:,} sessions × {s.many_sends}, durable"
    return [
        Row("many_durable", spread, Goal("ratio_ge", 0.5, "≥ 0.5 × Redis appendfsync always")),
        Row(
            "many_vs_one",
            f"{spread}, against one session (reference: the same sends to one)",
            Goal("ratio_ge", 0.8, "≥ 0.8 × one session"),
        ),
        Row(
            "many_redis_store",
            f"pipelined sends/s over {s.many_sessions:,} sessions × {s.many_sends}, "
            "Redis store (one daemon, one redis-server)",
            Goal("report", 0, "report (× redis-py pipelined XADD)"),
        ),
        Row(
            "many_redis_cpu",
            "daemon CPU per send of that row, µs",
            Goal("report", 0, "report"),
        ),
    ]


def many(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    targets = _targets(s)
    if setup.store_missing:
        setup.cannot_run([rows["many_durable"], rows["many_vs_one"]], "store missing")
        return
    spread = on_daemon(
        setup, "many-daemon", lambda d: line_spread(d.port, d.token, targets, s.batch), memory=False
    )
    one = on_daemon(
        setup,
        "many-one-daemon",
        lambda d: line_spread(d.port, d.token, ["one"] * len(targets), s.batch),
        memory=False,
    )
    rows["many_durable"].repl = rows["many_vs_one"].repl = spread
    rows["many_vs_one"].reference = one
    rows["many_durable"].reference = on_redis(
        setup, "many-redis", lambda r: redis_spread(r.port, targets, s.batch), durable=True
    )
    store, cpu = rows["many_redis_store"], rows["many_redis_cpu"]
    if not setup.redis_exe:
        store.missing = cpu.missing = "redis-server missing"
        return
    with RedisServer(setup.redis_exe, setup.dir("many-store-redis"), durable=False) as redis:
        redis.start()
        with Daemon(setup.dir("many-store-daemon"), memory=False, store=redis.url) as daemon:
            daemon.start()
            rate, seconds = run_async(
                line_spread_cpu(daemon.port, daemon.token, targets, s.batch, pid=daemon.pid),
                s.deadline_s,
            )
    store.repl, cpu.repl = rate, seconds / len(targets) * 1e6
    store.reference = on_redis(
        setup, "many-store-xadd", lambda r: redis_spread(r.port, targets, s.batch)
    )


MANY = Group("many", many_rows, many)
