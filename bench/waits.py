"""Waits: the wake latency, the fan-out of one send, and many idle waiters.

The wake and fan-out rows time blocked waiters in a child process of their
own (bench/waiters.py) against one send from this process; Redis's waiters
block in XREAD BLOCK. The idle rows hold many blocked waits and read the
server's CPU, its evaluations and its memory per waiter meanwhile.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.clients import (
    LineClient,
    close_all,
    connect_many,
    encode,
    redis_client,
    redis_connection,
    redis_info,
    until,
)
from bench.measure import (
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
    start_sessions,
    stats,
    xadd_each,
)
from bench.procs import BenchError, Daemon, Floor, RedisServer, cpu_seconds, rss_bytes
from bench.table import Goal, Row
from bench.waiters import redis_rounds, repl_rounds

# -- wake latency and fan-out -------------------------------------------------


def wake_rows(_s: Sizes) -> list[Row]:
    # the goals of the issue "one engine": p50 at most Redis's, p99 at most 1.5 × Redis's
    p50, p99 = percentile_rows("wake", "wake latency {} (settle 0), µs", Goal("ratio_le", 1.0, ""))
    p50.goal = Goal("ratio_le", 1.0, "≤ 1.0 × Redis XREAD BLOCK")
    p99.goal = Goal("ratio_le", 1.5, "≤ 1.5 × Redis XREAD BLOCK")
    return [p50, p99]


def wake(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    warm = s.warmup // 10
    rounds = warm + s.wakes
    repl = on_daemon(
        setup,
        "wake-daemon",
        lambda d: repl_rounds(d, "wake", 1, rounds),
        memory=True,
        settle_ms=0,
    )
    ref = on_redis(setup, "wake-redis", lambda r: redis_rounds(r.port, "wake", 1, rounds))
    fill_percentiles(rows, "wake", "repl", repl[warm:])
    fill_percentiles(rows, "wake", "reference", ref[warm:] if ref else None)


def fanout_rows(s: Sizes) -> list[Row]:
    figure = f"fan-out, one send to {s.fanout:,} waiters (settle 0), ms"
    return [Row("fanout", figure, Goal("ratio_le", 1.0, "≤ 1.0 × Redis, XREAD BLOCK"))]


def fanout(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    rounds = s.fanout_rounds + 1  # the first round warms up
    repl = on_daemon(
        setup,
        "fanout-daemon",
        lambda d: repl_rounds(d, "fan", s.fanout, rounds),
        memory=True,
        settle_ms=0,
    )[1:]
    row = rows["fanout"]
    row.repl = statistics.median(repl) / 1e6
    ref = on_redis(setup, "fanout-redis", lambda r: redis_rounds(r.port, "fan", s.fanout, rounds))
    if ref is not None:
        ref = ref[1:]
        row.reference = statistics.median(ref) / 1e6
    setup.notes.append(
        f"fan-out: median of {s.fanout_rounds} rounds (ms): repl "
        + " ".join(f"{t / 1e6:.1f}" for t in repl)
        + ("; Redis " + " ".join(f"{t / 1e6:.1f}" for t in ref) if ref else "")
    )


# -- idle waiters ------------------------------------------------------------


@dataclass
class Idle:
    cpu_percent: float
    cpu_period_percent: float | None
    evaluations: float | None
    bytes_per_waiter: float


async def cpu_percent(
    pid: int, window_s: float, keepalive: Callable[[], Awaitable[Any]] | None = None
) -> float:
    """Percent of one core that ``pid`` used over ``window_s`` while this process sleeps.

    ``keepalive`` is called every 15 s of a long window, so that a control
    connection is not closed by the server's idle timeout (its cost is counted).
    """
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    end = t0 + window_s
    while (left := end - time.monotonic()) > 0:
        await asyncio.sleep(min(left, 15.0))
        if keepalive is not None and end - time.monotonic() > 0:
            await keepalive()
    cpu1, t1 = cpu_seconds(pid), time.monotonic()
    return 100 * (cpu1 - cpu0) / (t1 - t0)


async def repl_idle(daemon: Daemon, s: Sizes) -> Idle:
    control = await LineClient.connect(daemon.port, daemon.token)
    names = [f"idle-{j}" for j in range(s.idle_sessions)]
    waiters: list[LineClient] = []
    try:
        await start_sessions(control, names, s.batch)
        await asyncio.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        auth = encode({"op": "auth", "token": daemon.token})

        async def open_waiter(i: int) -> LineClient:
            client = await LineClient.connect(daemon.port)
            session, cursor = names[i % len(names)], f"w{i // len(names)}"
            client.write_raw(auth + encode({"op": "wait", "sessions": [session], "cursor": cursor}))
            answer = await client.answer()
            if not answer.get("ok"):
                raise BenchError(f"auth failed: {answer}")
            return client

        waiters = await connect_many(s.idle_waiters, open_waiter)

        async def all_blocked() -> bool:
            daemon_stats = (await stats(control))["daemon"]
            return bool(daemon_stats["waiters"] == s.idle_waiters)

        await until(all_blocked, what=f"{s.idle_waiters:,} blocked waits", deadline_s=120)
        await asyncio.sleep(s.settle_s)  # let the accept burst settle before measuring
        rss1 = rss_bytes(daemon.pid)
        evaluations0 = (await stats(control))["daemon"]["evaluations"]
        cpu = await cpu_percent(daemon.pid, s.idle_window_s)
        evaluations1 = (await stats(control))["daemon"]["evaluations"]
        period = await cpu_percent(daemon.pid, s.idle_period_s, lambda: control.ok({"op": "ping"}))
        # wake every waiter: this also proves each one was really blocked
        await pipeline(control, [encode(send_request(n)) for n in names], s.batch)
        answers = await asyncio.gather(*(w.answer() for w in waiters))
        woken = sum(1 for a in answers if a.get("ok") and a.get("batches"))
        if woken != s.idle_waiters:
            raise BenchError(f"only {woken} of {s.idle_waiters} waiters were woken")
        return Idle(cpu, period, evaluations1 - evaluations0, (rss1 - rss0) / s.idle_waiters)
    finally:
        await close_all([control, *waiters])


async def floor_idle(floor_server: Floor, s: Sizes) -> Idle:
    """The floor holding the same number of idle connections (each answered one line)."""
    rss0 = rss_bytes(floor_server.pid)

    async def open_idle(_i: int) -> LineClient:
        client = await LineClient.connect(floor_server.port)
        await client.call({"op": "ping"})
        return client

    clients = await connect_many(s.idle_waiters, open_idle)
    try:
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(floor_server.pid)
        cpu = await cpu_percent(floor_server.pid, s.idle_window_s)
        return Idle(cpu, None, None, (rss1 - rss0) / s.idle_waiters)
    finally:
        await close_all(clients)


async def redis_idle(redis: RedisServer, s: Sizes) -> Idle:
    control = redis_client(redis.port)
    keys = [f"idle-{j}" for j in range(s.idle_sessions)]
    conns: list[Any] = []
    try:
        await control.ping()
        rss0 = rss_bytes(redis.pid)

        async def open_waiter(i: int) -> Any:
            conn = await redis_connection(redis.port)
            await conn.send_command("XREAD", "BLOCK", 0, "STREAMS", keys[i % len(keys)], "$")
            return conn

        # opened as the daemon's waiters are, in batches, and given as long (Redis accepts
        # in one thread: 10,000 at 200 at a time once ran past the shorter deadline)
        conns = await connect_many(s.idle_waiters, open_waiter, concurrency=100, deadline_s=300)

        async def all_blocked() -> bool:
            clients = await redis_info(control, "clients")
            return bool(clients["blocked_clients"] == s.idle_waiters)

        await until(all_blocked, what=f"{s.idle_waiters:,} blocked XREADs", deadline_s=120)
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(redis.pid)
        cpu = await cpu_percent(redis.pid, s.idle_window_s)
        period = await cpu_percent(redis.pid, s.idle_period_s)
        await xadd_each(control, keys, len(keys))
        answers = await asyncio.gather(*(c.read_response() for c in conns))
        if sum(1 for a in answers if a) != s.idle_waiters:
            raise BenchError("not every blocked XREAD was woken")
        return Idle(cpu, period, None, (rss1 - rss0) / s.idle_waiters)
    finally:
        await asyncio.gather(*(c.disconnect() for c in conns), return_exceptions=True)
        await control.aclose()


def idle_rows(s: Sizes) -> list[Row]:
    idle = f"{s.idle_waiters:,} idle waits on {s.idle_sessions:,} sessions"
    window = f"{s.idle_window_s:g} s"
    period = "one idle-timeout period"
    if s.idle_period_s < 60:
        period = "the full run: " + period
    cpu_goal = Goal("abs_le", 1.0, "≤ 1 %")
    return [
        Row("idle_cpu", f"{idle}: daemon CPU over {window}, % of a core", cpu_goal),
        Row(
            "idle_cpu_period",
            f"{idle}: daemon CPU over {s.idle_period_s:g} s ({period}), % of a core",
            cpu_goal,
        ),
        Row("idle_evals", f"{idle}: evaluations over {window}", Goal("abs_eq", 0, "= 0")),
        Row("idle_mem", f"{idle}: memory per waiter, KiB", Goal("abs_le", 12.0, "≤ 12 KiB")),
    ]


def idle(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    # the daemon's default connection cap (4,096) is below the waiters this figure holds
    cap = s.idle_waiters + 100
    repl = on_daemon(
        setup, "idle-daemon", lambda d: repl_idle(d, s), memory=True, max_connections=cap
    )
    # repl's figures are kept before the others are measured: a floor or a reference that
    # fails (Redis's 10,000 connections once timed out) leaves them standing
    rows["idle_cpu"].repl = repl.cpu_percent
    rows["idle_cpu_period"].repl = repl.cpu_period_percent
    rows["idle_evals"].repl = repl.evaluations
    rows["idle_mem"].repl = repl.bytes_per_waiter / 1024
    floor = on_floor(setup, "idle-floor", lambda f: floor_idle(f, s))
    rows["idle_cpu"].floor = floor.cpu_percent
    rows["idle_mem"].floor = floor.bytes_per_waiter / 1024
    try:
        ref = on_redis(setup, "idle-redis", lambda r: redis_idle(r, s))
    except Exception as exc:
        traceback.print_exc()
        setup.notes.append(f"idle: the Redis reference failed ({type(exc).__name__}: {exc})")
        for key in ("idle_cpu", "idle_cpu_period", "idle_mem"):
            rows[key].reference_missing = "error"
        return
    if ref is not None:
        rows["idle_cpu"].reference = ref.cpu_percent
        rows["idle_cpu_period"].reference = ref.cpu_period_percent
        rows["idle_mem"].reference = ref.bytes_per_waiter / 1024


WAKE = Group("wake", wake_rows, wake)
IDLE = Group("idle", idle_rows, idle)
FANOUT = Group("fanout", fanout_rows, fanout)
