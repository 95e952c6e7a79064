"""Memory per retained firing: sessions each filled to its ring of 256, against Redis streams.

The daemon's figure is its RSS growth; Redis's is its own ``used_memory``
growth for the same streams (MAXLEN 256), with its RSS growth in a note.
"""

from __future__ import annotations

import asyncio

from bench.clients import LineClient, redis_client, redis_info
from bench.measure import Group, Setup, Sizes, fill_sessions, on_daemon, on_redis, stats, xadd_each
from bench.procs import BenchError, Daemon, RedisServer, rss_bytes
from bench.table import Goal, Row


async def repl_firing_memory(daemon: Daemon, s: Sizes) -> float:
    """Daemon RSS growth per firing for sessions, each filled to its ring of 256."""
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await asyncio.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        names = [f"mem-{j}" for j in range(s.mem_sessions)]
        sent = await fill_sessions(control, names, s.mem_firings, s.batch)
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(daemon.pid)
        recorded = (await stats(control))["daemon"]["firings"]
        if recorded != sent:
            raise BenchError(f"the daemon recorded {recorded} of {sent} firings")
        return (rss1 - rss0) / sent
    finally:
        await control.close()


async def redis_firing_memory(redis: RedisServer, s: Sizes) -> tuple[float, float]:
    """used_memory and RSS growth per entry for the same streams, MAXLEN 256."""
    control = redis_client(redis.port)
    try:
        used0 = (await redis_info(control, "memory"))["used_memory"]
        rss0 = rss_bytes(redis.pid)
        keys = [f"mem-{j}" for j in range(s.mem_sessions)]
        entries = [k for k in keys for _ in range(s.mem_firings)]
        await xadd_each(control, entries, s.batch)
        used1 = (await redis_info(control, "memory"))["used_memory"]
        rss1 = rss_bytes(redis.pid)
        return (used1 - used0) / len(entries), (rss1 - rss0) / len(entries)
    finally:
        await control.aclose()


def memory_rows(s: Sizes) -> list[Row]:
    figure = f"memory per retained firing ({s.mem_sessions:,} × {s.mem_firings}), bytes"
    return [Row("firing_mem", figure, Goal("ratio_le", 1.5, "≤ 1.5 × Redis used_memory"))]


def memory(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["firing_mem"]
    row.repl = on_daemon(setup, "memory-daemon", lambda d: repl_firing_memory(d, s), memory=True)
    ref = on_redis(setup, "memory-redis", lambda r: redis_firing_memory(r, s))
    if ref is not None:
        row.reference, rss = ref
        setup.notes.append(f"memory per firing: Redis RSS delta {rss:.0f} bytes per entry")


MEMORY = Group("memory", memory_rows, memory)
