"""Sends: the round trip of one send at a time, and pipelined sends (in memory and durable).

The daemon and the floor are driven with the same code (``LineClient``);
Redis with XADD (MAXLEN 256, exact) through redis.asyncio, one at a time
or ``pipeline(transaction=False)`` in the same batches.
"""

from __future__ import annotations

import time

from bench.clients import LineClient, encode, redis_client
from bench.measure import (
    PAYLOAD,
    RING,
    Group,
    Setup,
    Sizes,
    fill_percentiles,
    on_daemon,
    on_floor,
    on_redis,
    percentile_rows,
    pipeline,
    send_request,
    xadd_each,
)
from bench.procs import BenchError
from bench.table import Goal, Row

# -- send round trip ---------------------------------------------------------


async def line_round_trips(port: int, token: str | None, s: Sizes) -> list[int]:
    """Nanoseconds per send, one at a time, after a warm-up (the daemon, or the floor)."""
    client = await LineClient.connect(port, token)
    try:
        if token is not None:
            await client.ok({"op": "start", "session": "rt"})
        request = send_request("rt")
        times: list[int] = []
        for i in range(s.warmup + s.round_trips):
            t0 = time.perf_counter_ns()
            answer = await client.call(request)
            t1 = time.perf_counter_ns()
            if not answer.get("ok"):
                raise BenchError(f"send failed: {answer}")
            if i >= s.warmup:
                times.append(t1 - t0)
        return times
    finally:
        await client.close()


async def redis_round_trips(port: int, s: Sizes) -> list[int]:
    client = redis_client(port)
    try:
        times: list[int] = []
        for i in range(s.warmup + s.round_trips):
            t0 = time.perf_counter_ns()
            await client.xadd("rt", {"text": PAYLOAD}, maxlen=RING, approximate=False)
            t1 = time.perf_counter_ns()
            if i >= s.warmup:
                times.append(t1 - t0)
        return times
    finally:
        await client.aclose()


def roundtrip_rows(_s: Sizes) -> list[Row]:
    return percentile_rows(
        "rt", "send round trip {}, µs", Goal("ratio_le", 1.0, "≤ 1.0 × Redis XADD")
    )


def roundtrip(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    repl = on_daemon(
        setup, "roundtrip-daemon", lambda d: line_round_trips(d.port, d.token, s), memory=True
    )
    floor = on_floor(setup, "roundtrip-floor", lambda f: line_round_trips(f.port, None, s))
    ref = on_redis(setup, "roundtrip-redis", lambda r: redis_round_trips(r.port, s))
    fill_percentiles(rows, "rt", "repl", repl)
    fill_percentiles(rows, "rt", "floor", floor)
    fill_percentiles(rows, "rt", "reference", ref)


# -- pipelined sends ---------------------------------------------------------


async def line_pipelined(port: int, token: str | None, total: int, batch: int) -> float:
    """Sends per second: ``batch`` requests written at once, then their answers, repeated."""
    client = await LineClient.connect(port, token)
    try:
        if token is not None:
            await client.ok({"op": "start", "session": "pipe"})
        request = send_request("pipe")
        await pipeline(client, [encode(request) for _ in range(batch)], batch)  # warm-up
        t0 = time.perf_counter()
        done = 0
        while done < total:
            count = min(batch, total - done)
            # encoding is the client's work, as redis-py encodes each command
            await pipeline(client, [encode(request) for _ in range(count)], count)
            done += count
        return total / (time.perf_counter() - t0)
    finally:
        await client.close()


async def redis_pipelined(port: int, total: int, batch: int) -> float:
    client = redis_client(port)
    try:
        await xadd_each(client, ["pipe"] * batch, batch)  # warm-up
        keys = ["pipe"] * total
        t0 = time.perf_counter()
        await xadd_each(client, keys, batch)
        return total / (time.perf_counter() - t0)
    finally:
        await client.aclose()


def pipelined_rows(_s: Sizes) -> list[Row]:
    goal = Goal("ratio_ge", 1.0, "≥ 1.0 × Redis pipelined XADD")
    return [Row("pipe_mem", "pipelined sends/s, one client, --memory", goal)]


def durable_rows(_s: Sizes) -> list[Row]:
    goal = Goal("ratio_ge", 0.5, "≥ 0.5 × Redis appendfsync always")
    return [Row("pipe_durable", "pipelined sends/s, one client, durable", goal)]


def pipelined_sends(setup: Setup, row: Row, group: str, total: int, *, durable: bool) -> None:
    """``total`` pipelined sends: the daemon (and the floor, in memory) against Redis.

    ``durable``: the daemon with its store, Redis with appendfsync always.
    """
    s = setup.sizes
    if durable and setup.store_missing:
        setup.cannot_run([row], "store missing")
    else:
        row.repl = on_daemon(
            setup,
            f"{group}-daemon",
            lambda d: line_pipelined(d.port, d.token, total, s.batch),
            memory=not durable,
        )
    if not durable:
        row.floor = on_floor(
            setup, f"{group}-floor", lambda f: line_pipelined(f.port, None, total, s.batch)
        )
    row.reference = on_redis(
        setup, f"{group}-redis", lambda r: redis_pipelined(r.port, total, s.batch), durable=durable
    )


def pipelined(setup: Setup, rows: dict[str, Row]) -> None:
    total = setup.sizes.pipelined
    pipelined_sends(setup, rows["pipe_mem"], "pipelined", total, durable=False)


def durable(setup: Setup, rows: dict[str, Row]) -> None:
    total = setup.sizes.pipelined_durable
    pipelined_sends(setup, rows["pipe_durable"], "durable", total, durable=True)


ROUNDTRIP = Group("roundtrip", roundtrip_rows, roundtrip)
PIPELINED = Group("pipelined", pipelined_rows, pipelined)
DURABLE = Group("durable", durable_rows, durable)
