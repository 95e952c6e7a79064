"""Every figure of the table: how repl is measured, and how its references are.

Each group of figures starts fresh servers (the daemon, the floor,
redis-server), drives them from this process over loopback, and fills its
rows. repl and its reference are driven in the same style: one asyncio
connection per client, one request at a time unless the figure is about
pipelining, the same 100-byte text. Every loop has a count and runs under
a deadline.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
from bench.procs import HOST, BenchError, Daemon, Floor, RedisServer, cpu_seconds, rss_bytes
from bench.table import Goal, Row
from bench.waiters import Plan, WaiterProcess

T = TypeVar("T")

PAYLOAD = "x" * 100  # the text of every firing: 100 bytes
RING = 256  # the daemon's default ring; Redis streams are trimmed to the same (MAXLEN 256)


@dataclass(frozen=True)
class Sizes:
    """How much each figure does; ``QUICK`` is for the smoke test."""

    round_trips: int = 10_000
    warmup: int = 1_000
    wakes: int = 2_000
    pipelined: int = 100_000
    pipelined_durable: int = 20_000
    batch: int = 1_000
    idle_waiters: int = 10_000
    idle_sessions: int = 1_000
    idle_window_s: float = 10.0
    # the daemon's idle timeout (60 s by default) re-arms a timer on every blocked
    # connection once a period, so a window of one whole period shows the average
    idle_period_s: float = 60.0
    settle_s: float = 1.0  # a pause before a memory or CPU reading, for the server to go quiet
    fanout: int = 1_000
    fanout_rounds: int = 10
    mem_sessions: int = 1_000
    mem_firings: int = 256
    cli_runs: int = 20
    restart_sessions: int = 1_000
    restart_firings: int = 256
    # several daemons on one Redis (bench/scaleout.py)
    scale_wakes: int = 1_000
    scale_clients: int = 6  # split evenly over 1, 2 or 3 daemons
    scale_sends: int = 6_000  # in all, per configuration (the Redis path does ~1-3k/s)
    scale_batch: int = 100  # requests each client writes before reading their answers
    scale_redis_sends: int = 60_000  # XADDs in all for the Redis-alone reference
    deadline_s: float = 600.0


FULL = Sizes()
QUICK = Sizes(
    round_trips=200,
    warmup=20,
    wakes=30,
    pipelined=2_000,
    pipelined_durable=500,
    batch=250,
    idle_waiters=100,
    idle_sessions=10,
    idle_window_s=0.5,
    idle_period_s=0.5,
    settle_s=0.1,
    fanout=50,
    fanout_rounds=3,
    mem_sessions=10,
    mem_firings=256,
    cli_runs=3,
    restart_sessions=10,
    restart_firings=32,
    scale_wakes=20,
    scale_sends=300,
    scale_batch=25,
    scale_redis_sends=1_200,
    deadline_s=60.0,
)


@dataclass
class Setup:
    """What a run has to work with; ``notes`` collects lines printed under the table."""

    sizes: Sizes
    workdir: Path
    redis_exe: str | None
    store_missing: bool
    cli: Path | None
    notes: list[str]
    # the second table's rows (bench/scaleout.py), by key
    scale: dict[str, Any] = field(default_factory=dict)

    def dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def blank_rows(s: Sizes) -> list[Row]:
    """Every row of the table, in order, before anything is measured."""
    idle = f"{s.idle_waiters:,} idle waits on {s.idle_sessions:,} sessions"
    window = f"{s.idle_window_s:g} s"
    period = "one idle-timeout period"
    if s.idle_period_s < 60:
        period = "the full run: " + period
    return [
        Row("rt_p50", "send round trip p50, µs", Goal("ratio_le", 1.0, "≤ 1.0 × Redis XADD")),
        Row("rt_p99", "send round trip p99, µs", Goal("ratio_le", 1.0, "≤ 1.0 × Redis XADD")),
        Row(
            "wake_p50",
            "wake latency p50 (settle 0), µs",
            Goal("ratio_le", 1.0, "≤ 1.0 × Redis XREAD BLOCK"),
        ),
        Row(
            "wake_p99",
            "wake latency p99 (settle 0), µs",
            Goal("ratio_le", 1.0, "≤ 1.0 × Redis XREAD BLOCK"),
        ),
        Row(
            "pipe_mem",
            "pipelined sends/s, one client, --memory",
            Goal("ratio_ge", 1.0, "≥ 1.0 × Redis pipelined XADD"),
        ),
        Row(
            "pipe_durable",
            "pipelined sends/s, one client, durable",
            Goal("ratio_ge", 0.5, "≥ 0.5 × Redis appendfsync always"),
        ),
        Row(
            "idle_cpu",
            f"{idle}: daemon CPU over {window}, % of a core",
            Goal("abs_le", 1.0, "≤ 1 %"),
        ),
        Row(
            "idle_cpu_period",
            f"{idle}: daemon CPU over {s.idle_period_s:g} s ({period}), % of a core",
            Goal("abs_le", 1.0, "≤ 1 %"),
        ),
        Row("idle_evals", f"{idle}: evaluations over {window}", Goal("abs_eq", 0, "= 0")),
        Row("idle_mem", f"{idle}: memory per waiter, KiB", Goal("abs_le", 16.0, "≤ 16 KiB")),
        Row(
            "fanout",
            f"fan-out, one send to {s.fanout:,} waiters (settle 0), ms",
            Goal("ratio_le", 1.0, "≤ 1.0 × Redis, XREAD BLOCK"),
        ),
        Row(
            "firing_mem",
            f"memory per retained firing ({s.mem_sessions:,} × {s.mem_firings}), bytes",
            Goal("ratio_le", 1.5, "≤ 1.5 × Redis used_memory"),
        ),
        Row(
            "cli_read",
            "`repl read` on an empty session, whole process, ms",
            Goal("ratio_le", 1.25, "≤ 1.25 × python -c 'import click, msgspec, socket'"),
        ),
        Row(
            "restart",
            f"restart until {s.restart_sessions:,} full sessions are served (durable), ms",
            Goal("report", 0, "report (Redis AOF reload)"),
        ),
    ]


# which rows each group fills; run.py runs the groups in this order
GROUPS: dict[str, tuple[str, ...]] = {
    "roundtrip": ("rt_p50", "rt_p99"),
    "wake": ("wake_p50", "wake_p99"),
    "pipelined": ("pipe_mem",),
    "durable": ("pipe_durable",),
    "idle": ("idle_cpu", "idle_cpu_period", "idle_evals", "idle_mem"),
    "fanout": ("fanout",),
    "memory": ("firing_mem",),
    "cli": ("cli_read",),
    "restart": ("restart",),
}


def percentile(values: list[int], fraction: float) -> float:
    """The nearest-rank percentile of ``values``."""
    ordered = sorted(values)
    rank = max(1, round(fraction * len(ordered) + 0.5))
    return float(ordered[min(rank, len(ordered)) - 1])


def send_request(session: str) -> dict[str, Any]:
    return {"op": "send", "session": session, "text": PAYLOAD}


def run_async(coro: Awaitable[T], deadline_s: float) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(deadline_s):
            return await coro

    return asyncio.run(bounded())


async def _start_sessions(client: LineClient, names: list[str], batch: int) -> None:
    """Start sessions over one connection, ``batch`` requests in flight at a time."""
    for first in range(0, len(names), batch):
        chunk = names[first : first + batch]
        client.write_raw(b"".join(encode({"op": "start", "session": n}) for n in chunk))
        for _ in chunk:
            answer = await client.answer()
            if not answer.get("ok"):
                raise BenchError(f"start failed: {answer}")


async def _pipeline(client: LineClient, requests: list[bytes], batch: int) -> None:
    """Write ``batch`` request lines, read their answers, and again until all are done."""
    for first in range(0, len(requests), batch):
        chunk = requests[first : first + batch]
        client.write_raw(b"".join(chunk))
        for _ in chunk:
            answer = await client.answer()
            if not answer.get("ok"):
                raise BenchError(f"request failed: {answer}")


async def _stats(client: LineClient, session: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"op": "stats"}
    if session is not None:
        request["session"] = session
    return await client.ok(request)


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


def roundtrip(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    with Daemon(setup.dir("roundtrip-daemon"), memory=True).start() as daemon:
        repl = run_async(line_round_trips(daemon.port, daemon.token, s), s.deadline_s)
    with Floor(setup.dir("roundtrip-floor")).start() as floor_server:
        floor = run_async(line_round_trips(floor_server.port, None, s), s.deadline_s)
    ref: list[int] | None = None
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("roundtrip-redis"), durable=False) as redis:
            redis.start()
            ref = run_async(redis_round_trips(redis.port, s), s.deadline_s)
    for key, fraction in (("rt_p50", 0.50), ("rt_p99", 0.99)):
        row = rows[key]
        row.repl = percentile(repl, fraction) / 1000
        row.floor = percentile(floor, fraction) / 1000
        row.reference = percentile(ref, fraction) / 1000 if ref else None


# -- wake latency and fan-out -------------------------------------------------


async def _rounds(
    plan: Plan,
    blocked: Callable[[], Awaitable[bool]],
    fire: Callable[[], Awaitable[Any]],
) -> list[int]:
    """Per round, nanoseconds from just before ``fire`` to the child's last waiter holding it."""
    child = WaiterProcess(plan)
    failed = True
    try:
        await child.report(120)  # connected
        times: list[int] = []
        for _round in range(plan.rounds):
            await until(blocked, what=f"{plan.waiters:,} blocked waits", interval_s=0.0005)
            t0 = time.perf_counter_ns()
            position = await fire()
            _kind, t_last, reported = await child.report(60)
            if str(reported) != str(position):
                raise BenchError(f"the waiters hold {reported}, the producer sent {position}")
            times.append(t_last - t0)
        failed = False
        return times
    finally:
        child.close(kill=failed)


async def repl_rounds(daemon: Daemon, session: str, waiters: int, rounds: int) -> list[int]:
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await control.ok({"op": "start", "session": session})
        send = send_request(session)

        async def blocked() -> bool:
            row = (await _stats(control, session))["sessions"][0]
            return bool(row["waiters"] == waiters)

        async def fire() -> int:
            seq: int = (await control.ok(send))["seq"]
            return seq

        plan = Plan("repl", daemon.port, daemon.token, session, waiters, rounds, 600)
        return await _rounds(plan, blocked, fire)
    finally:
        await control.close()


async def redis_rounds(port: int, key: str, waiters: int, rounds: int) -> list[int]:
    control = redis_client(port)
    try:

        async def blocked() -> bool:
            clients = await redis_info(control, "clients")
            return bool(clients["blocked_clients"] == waiters)

        async def fire() -> str:
            entry = await control.xadd(key, {"text": PAYLOAD}, maxlen=RING, approximate=False)
            return str(entry)

        plan = Plan("redis", port, None, key, waiters, rounds, 600)
        return await _rounds(plan, blocked, fire)
    finally:
        await control.aclose()


def wake(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    warm = s.warmup // 10
    with Daemon(setup.dir("wake-daemon"), memory=True, settle_ms=0).start() as daemon:
        repl = run_async(repl_rounds(daemon, "wake", 1, warm + s.wakes), s.deadline_s)[warm:]
    ref: list[int] | None = None
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("wake-redis"), durable=False) as redis:
            redis.start()
            ref = run_async(redis_rounds(redis.port, "wake", 1, warm + s.wakes), s.deadline_s)
            ref = ref[warm:]
    for key, fraction in (("wake_p50", 0.50), ("wake_p99", 0.99)):
        rows[key].repl = percentile(repl, fraction) / 1000
        rows[key].reference = percentile(ref, fraction) / 1000 if ref else None


def fanout(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    rounds = s.fanout_rounds + 1  # the first round warms up
    with Daemon(setup.dir("fanout-daemon"), memory=True, settle_ms=0).start() as daemon:
        repl = run_async(repl_rounds(daemon, "fan", s.fanout, rounds), s.deadline_s)[1:]
    row = rows["fanout"]
    row.repl = statistics.median(repl) / 1e6
    ref: list[int] = []
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("fanout-redis"), durable=False) as redis:
            redis.start()
            ref = run_async(redis_rounds(redis.port, "fan", s.fanout, rounds), s.deadline_s)[1:]
        row.reference = statistics.median(ref) / 1e6
    setup.notes.append(
        f"fan-out: median of {s.fanout_rounds} rounds (ms): repl "
        + " ".join(f"{t / 1e6:.1f}" for t in repl)
        + ("; Redis " + " ".join(f"{t / 1e6:.1f}" for t in ref) if ref else "")
    )


# -- pipelined sends ---------------------------------------------------------


async def line_pipelined(port: int, token: str | None, total: int, batch: int) -> float:
    """Sends per second: ``batch`` requests written at once, then their answers, repeated."""
    client = await LineClient.connect(port, token)
    try:
        if token is not None:
            await client.ok({"op": "start", "session": "pipe"})
        request = send_request("pipe")
        await _pipeline(client, [encode(request) for _ in range(batch)], batch)  # warm-up
        t0 = time.perf_counter()
        done = 0
        while done < total:
            count = min(batch, total - done)
            # encoding is the client's work, as redis-py encodes each command
            await _pipeline(client, [encode(request) for _ in range(count)], count)
            done += count
        return total / (time.perf_counter() - t0)
    finally:
        await client.close()


async def redis_pipelined(port: int, total: int, batch: int) -> float:
    client = redis_client(port)

    async def one_batch(count: int) -> None:
        async with client.pipeline(transaction=False) as pipe:
            for _ in range(count):
                pipe.xadd("pipe", {"text": PAYLOAD}, maxlen=RING, approximate=False)
            await pipe.execute()

    try:
        await one_batch(batch)  # warm-up
        t0 = time.perf_counter()
        done = 0
        while done < total:
            count = min(batch, total - done)
            await one_batch(count)
            done += count
        return total / (time.perf_counter() - t0)
    finally:
        await client.aclose()


def pipelined(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["pipe_mem"]
    with Daemon(setup.dir("pipelined-daemon"), memory=True).start() as daemon:
        row.repl = run_async(
            line_pipelined(daemon.port, daemon.token, s.pipelined, s.batch), s.deadline_s
        )
    with Floor(setup.dir("pipelined-floor")).start() as floor_server:
        row.floor = run_async(
            line_pipelined(floor_server.port, None, s.pipelined, s.batch), s.deadline_s
        )
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("pipelined-redis"), durable=False) as redis:
            redis.start()
            row.reference = run_async(redis_pipelined(redis.port, s.pipelined, s.batch), 600)


def durable(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["pipe_durable"]
    if setup.store_missing:
        row.missing = "store missing"
    else:
        with Daemon(setup.dir("durable-daemon"), memory=False).start() as daemon:
            row.repl = run_async(
                line_pipelined(daemon.port, daemon.token, s.pipelined_durable, s.batch),
                s.deadline_s,
            )
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("durable-redis"), durable=True) as redis:
            redis.start()
            row.reference = run_async(
                redis_pipelined(redis.port, s.pipelined_durable, s.batch), s.deadline_s
            )


# -- idle waiters ------------------------------------------------------------


@dataclass
class Idle:
    cpu_percent: float
    cpu_period_percent: float | None
    evaluations: float | None
    bytes_per_waiter: float


async def _measure_window(
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
        await _start_sessions(control, names, s.batch)
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
            daemon_stats = (await _stats(control))["daemon"]
            return bool(daemon_stats["waiters"] == s.idle_waiters)

        await until(all_blocked, what=f"{s.idle_waiters:,} blocked waits", deadline_s=120)
        await asyncio.sleep(s.settle_s)  # let the accept burst settle before measuring
        rss1 = rss_bytes(daemon.pid)
        evaluations0 = (await _stats(control))["daemon"]["evaluations"]
        cpu = await _measure_window(daemon.pid, s.idle_window_s)
        evaluations1 = (await _stats(control))["daemon"]["evaluations"]
        period = await _measure_window(
            daemon.pid, s.idle_period_s, lambda: control.ok({"op": "ping"})
        )
        # wake every waiter: this also proves each one was really blocked
        await _pipeline(control, [encode(send_request(n)) for n in names], s.batch)
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
        cpu = await _measure_window(floor_server.pid, s.idle_window_s)
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

        conns = await connect_many(s.idle_waiters, open_waiter)

        async def all_blocked() -> bool:
            clients = await redis_info(control, "clients")
            return bool(clients["blocked_clients"] == s.idle_waiters)

        await until(all_blocked, what=f"{s.idle_waiters:,} blocked XREADs", deadline_s=120)
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(redis.pid)
        cpu = await _measure_window(redis.pid, s.idle_window_s)
        period = await _measure_window(redis.pid, s.idle_period_s)
        async with control.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.xadd(key, {"text": PAYLOAD}, maxlen=RING, approximate=False)
            await pipe.execute()
        answers = await asyncio.gather(*(c.read_response() for c in conns))
        if sum(1 for a in answers if a) != s.idle_waiters:
            raise BenchError("not every blocked XREAD was woken")
        return Idle(cpu, period, None, (rss1 - rss0) / s.idle_waiters)
    finally:
        await asyncio.gather(*(c.disconnect() for c in conns), return_exceptions=True)
        await control.aclose()


def idle(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    # the daemon's default connection cap (4,096) is below the waiters this figure holds
    cap = s.idle_waiters + 100
    with Daemon(setup.dir("idle-daemon"), memory=True, max_connections=cap).start() as daemon:
        repl = run_async(repl_idle(daemon, s), s.deadline_s)
    with Floor(setup.dir("idle-floor")).start() as floor_server:
        floor = run_async(floor_idle(floor_server, s), s.deadline_s)
    ref: Idle | None = None
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("idle-redis"), durable=False) as redis:
            redis.start()
            ref = run_async(redis_idle(redis, s), s.deadline_s)
    rows["idle_cpu"].repl = repl.cpu_percent
    rows["idle_cpu"].floor = floor.cpu_percent
    rows["idle_cpu_period"].repl = repl.cpu_period_percent
    rows["idle_evals"].repl = repl.evaluations
    rows["idle_mem"].repl = repl.bytes_per_waiter / 1024
    rows["idle_mem"].floor = floor.bytes_per_waiter / 1024
    if ref is not None:
        rows["idle_cpu"].reference = ref.cpu_percent
        rows["idle_cpu_period"].reference = ref.cpu_period_percent
        rows["idle_mem"].reference = ref.bytes_per_waiter / 1024


# -- memory per retained firing ----------------------------------------------


async def repl_firing_memory(daemon: Daemon, s: Sizes) -> float:
    """Daemon RSS growth per firing for sessions, each filled to its ring of 256."""
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await asyncio.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        names = [f"mem-{j}" for j in range(s.mem_sessions)]
        await _start_sessions(control, names, s.batch)
        lines = [encode(send_request(n)) for n in names for _ in range(s.mem_firings)]
        await _pipeline(control, lines, s.batch)
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(daemon.pid)
        stats = (await _stats(control))["daemon"]
        if stats["firings"] != len(lines):
            raise BenchError(f"the daemon recorded {stats['firings']} of {len(lines)} firings")
        return (rss1 - rss0) / len(lines)
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
        for first in range(0, len(entries), s.batch):
            async with control.pipeline(transaction=False) as pipe:
                for key in entries[first : first + s.batch]:
                    pipe.xadd(key, {"text": PAYLOAD}, maxlen=RING, approximate=False)
                await pipe.execute()
        used1 = (await redis_info(control, "memory"))["used_memory"]
        rss1 = rss_bytes(redis.pid)
        return (used1 - used0) / len(entries), (rss1 - rss0) / len(entries)
    finally:
        await control.aclose()


def memory(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["firing_mem"]
    with Daemon(setup.dir("memory-daemon"), memory=True).start() as daemon:
        row.repl = run_async(repl_firing_memory(daemon, s), s.deadline_s)
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("memory-redis"), durable=False) as redis:
            redis.start()
            used, rss = run_async(redis_firing_memory(redis, s), s.deadline_s)
        row.reference = used
        setup.notes.append(f"memory per firing: Redis RSS delta {rss:.0f} bytes per entry")


# -- the CLI -----------------------------------------------------------------


def _run_ms(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return elapsed, done.stdout


PACKAGES = ("session", "repl_daemon", "repl_cli")


def cli(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["cli_read"]
    reference = [sys.executable, "-c", "import click, msgspec, socket"]
    ref_times: list[float] = []
    repl_times: list[float] = []
    if setup.cli is None:
        row.missing = "CLI missing"
        for _ in range(s.cli_runs + 1):
            ref_times.append(_run_ms(reference)[0])
    else:
        with Daemon(setup.dir("cli-daemon"), memory=True).start() as daemon:

            async def start_empty() -> None:
                client = await LineClient.connect(daemon.port, daemon.token)
                await client.ok({"op": "start", "session": "empty"})
                await client.close()

            run_async(start_empty(), 30)
            command = [str(setup.cli), "read", "empty"]
            env = daemon.env()
            # as an installed copy would be: the project's modules compiled to
            # bytecode, which PYTHONDONTWRITEBYTECODE (set in some sandboxes)
            # would otherwise make every run compile again
            packages = [str(Path(__file__).resolve().parent.parent / n) for n in PACKAGES]
            subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)
            # alternate the two, so both see the same machine; the first of each warms caches
            for _ in range(s.cli_runs + 1):
                ref_times.append(_run_ms(reference)[0])
                elapsed, out = _run_ms(command, env)
                if out.strip():
                    raise BenchError(f"`repl read` on an empty session printed {out!r}")
                repl_times.append(elapsed)
        row.repl = statistics.median(repl_times[1:])
    row.reference = statistics.median(ref_times[1:])


# -- restart -----------------------------------------------------------------


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


async def _fill_repl(daemon: Daemon, names: list[str], firings: int, batch: int) -> None:
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await _start_sessions(control, names, batch)
        lines = [encode(send_request(n)) for n in names for _ in range(firings)]
        await _pipeline(control, lines, batch)
    finally:
        await control.close()


async def _fill_redis(port: int, keys: list[str], firings: int, batch: int) -> None:
    control = redis_client(port)
    try:
        entries = [k for k in keys for _ in range(firings)]
        for first in range(0, len(entries), batch):
            async with control.pipeline(transaction=False) as pipe:
                for key in entries[first : first + batch]:
                    pipe.xadd(key, {"text": PAYLOAD}, maxlen=RING, approximate=False)
                await pipe.execute()
    finally:
        await control.aclose()


def restart(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    row = rows["restart"]
    names = [f"full-{j}" for j in range(s.restart_sessions)]
    if setup.store_missing:
        row.missing = "store missing"
    else:
        daemon = Daemon(setup.dir("restart-daemon"), memory=False).start()
        try:
            run_async(_fill_repl(daemon, names, s.restart_firings, s.batch), s.deadline_s)
            daemon.stop()
            t0 = time.perf_counter()
            daemon.start()
            _repl_served(daemon.port, daemon.token, names[-1], s.restart_firings, 60)
            row.repl = (time.perf_counter() - t0) * 1000
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
            run_async(_fill_redis(redis.port, names, s.restart_firings, s.batch), s.deadline_s)
            redis.stop()
            t0 = time.perf_counter()
            redis.spawn(redis.port)
            _redis_served(redis.port, names[-1], 60)
            row.reference = (time.perf_counter() - t0) * 1000


RUNNERS = {
    "roundtrip": roundtrip,
    "wake": wake,
    "pipelined": pipelined,
    "durable": durable,
    "idle": idle,
    "fanout": fanout,
    "memory": memory,
    "cli": cli,
    "restart": restart,
}
