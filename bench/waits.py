"""Waits: the wake latency, the fan-out of one send, and many idle waiters.

The wake and fan-out rows time blocked waiters in a child process of their
own (bench/waiters.py) against one send from this process. Three kinds of
waiter are alive at once, each in a child of its own, and woken in turn
round by round (bench/paired_wakes.py: every one blocked again before each
send): the daemon's waits; the wake floor's (bench/wake_floor.py, a bare
uvloop server doing a blocked wait's work, the rows' reference and goal,
issue 50); and Redis's, blocked in XREAD BLOCK, whose ratio is reported.
The idle rows hold many blocked waits and read the server's CPU, its
evaluations and its memory per waiter meanwhile.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import traceback
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
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
    PAYLOAD,
    RING,
    Group,
    Setup,
    Sizes,
    fill_percentiles,
    on_daemon,
    on_floor,
    on_redis,
    percentile,
    percentile_rows,
    pipeline,
    run_async,
    send_request,
    start_sessions,
    stats,
    xadd_each,
)
from bench.paired_wakes import Waker, alternate, children, send_fire, waiting_on
from bench.procs import (
    BenchError,
    Daemon,
    Floor,
    RedisServer,
    WakeFloor,
    cpu_ns,
    cpu_seconds,
    rss_bytes,
)
from bench.table import Goal, Row, number
from bench.waiters import Plan, WaiterProcess

# -- wake latency and fan-out -------------------------------------------------

#: the goal of issue 50: repl's wake within 15 % of the wake floor's, measured beside it
FLOOR_GOAL = Goal("ratio_le", 1.15, "≤ 1.15 × the wake floor")
REDIS_REPORT = Goal("report", 0, "report (× Redis XREAD BLOCK)")


@dataclass
class Kind:
    """One kind of waiter's rounds: ns per round, and what its server spent meanwhile."""

    name: str
    times: list[int]
    #: the server's CPU over all the rounds (the scheduler's count, ns): its waits put
    #: and answered, its sends, and the readiness polls before each send
    cpu_ns: int
    polls: int

    def cpu_note(self, rounds: int) -> str:
        return (
            f"{self.name} {number(self.cpu_ns / rounds / 1000)} µs "
            f"({self.polls / rounds:.1f} polls a round)"
        )


@dataclass
class Wakes:
    """Waiters of each kind woken alternately, after the warm-up rounds."""

    repl: Kind
    floor: Kind
    redis: Kind | None  # None: no redis-server to run

    def kinds(self) -> list[Kind]:
        return [self.repl, self.floor] + ([self.redis] if self.redis is not None else [])


def redis_waker(port: int, control: Any, key: str, waiters: int, rounds: int) -> Waker:
    """``waiters`` blocked XREAD BLOCKs on ``key`` (bench/waiters.py, kind "redis"), woken
    by one XADD; readiness from ``INFO clients`` ``blocked_clients``."""

    async def blocked() -> bool:
        clients = await redis_info(control, "clients")
        return bool(clients["blocked_clients"] == waiters)

    async def fire(_round: int) -> tuple[int, Any]:
        t0 = time.perf_counter_ns()
        entry = await control.xadd(key, {"text": PAYLOAD}, maxlen=RING, approximate=False)
        return t0, str(entry)

    child = WaiterProcess(Plan("redis", port, None, key, waiters, rounds, 600))
    return Waker("Redis", child, blocked, fire)


def line_waker(
    name: str, port: int, token: str, control: LineClient, session: str, waiters: int, rounds: int
) -> Waker:
    """``waiters`` blocked waits on ``session`` (bench/waiters.py, kind "repl"), woken by
    one ``send``: on the daemon, or on the wake floor, which speaks the same lines."""
    child = WaiterProcess(Plan("repl", port, token, session, waiters, rounds, 600))
    return Waker(name, child, waiting_on(control, session, waiters), send_fire(control, session))


def counted(waker: Waker, polls: list[int]) -> Waker:
    """``waker`` with each of its readiness polls counted in ``polls``."""
    probe = waker.blocked

    async def blocked() -> bool:
        polls[0] += 1
        return await probe()

    waker.blocked = blocked
    return waker


async def paired_wakes(
    daemon: Daemon,
    floor: WakeFloor,
    redis: RedisServer | None,
    session: str,
    waiters: int,
    rounds: int,
) -> list[Kind]:
    """Rounds of ``waiters`` blocked on each server, woken in turn (bench/paired_wakes.py:
    each send once every waiter of every kind is blocked again): repl's, the wake floor's,
    then Redis's when it runs."""
    control = await LineClient.connect(daemon.port, daemon.token)
    floor_control = await LineClient.connect(floor.port, "floor")
    redis_control = redis_client(redis.port) if redis is not None else None
    servers: list[Daemon | WakeFloor | RedisServer] = [daemon, floor]
    try:
        start = {"op": "start", "session": session, "exist_ok": True}
        await control.ok(start)
        await floor_control.ok(start)
        with children([]) as wakers:
            each = (session, waiters, rounds)
            wakers.append(line_waker("repl", daemon.port, daemon.token, control, *each))
            wakers.append(line_waker("wake floor", floor.port, "floor", floor_control, *each))
            if redis is not None:
                wakers.append(redis_waker(redis.port, redis_control, session, waiters, rounds))
                servers.append(redis)
            polls = [[0] for _ in wakers]
            for waker, count in zip(wakers, polls, strict=True):
                counted(waker, count)
            cpu0: list[int] = []

            def connected() -> None:  # from here on, the rounds alone
                cpu0.extend(cpu_ns(server.pid) for server in servers)

            await alternate(wakers, rounds, connected)
            cpu = [cpu_ns(server.pid) - c for server, c in zip(servers, cpu0, strict=True)]
        return [
            Kind(waker.name, waker.times, used, count[0])
            for waker, used, count in zip(wakers, cpu, polls, strict=True)
        ]
    finally:
        await close_all([control, floor_control])
        if redis_control is not None:
            await redis_control.aclose()


def on_three(setup: Setup, name: str, session: str, waiters: int, rounds: int) -> Wakes:
    """``paired_wakes`` on a fresh ``--memory`` daemon (settle 0), a fresh wake floor and,
    when there is one to run, a fresh redis-server, all alive at once."""
    with ExitStack() as stack:
        daemon = stack.enter_context(
            Daemon(setup.dir(f"{name}-daemon"), memory=True, settle_ms=0).start()
        )
        floor = stack.enter_context(WakeFloor(setup.dir(f"{name}-floor")).start())
        redis = None
        if setup.redis_exe:
            redis = stack.enter_context(
                RedisServer(setup.redis_exe, setup.dir(f"{name}-redis"), durable=False)
            )
            redis.start()
        kinds = run_async(
            paired_wakes(daemon, floor, redis, session, waiters, rounds), setup.sizes.deadline_s
        )
    return Wakes(kinds[0], kinds[1], kinds[2] if len(kinds) > 2 else None)


def wake_rows(_s: Sizes) -> list[Row]:
    # issue 50: held to the wake floor (bench/wake_floor.py) measured beside it; the ratio
    # to Redis's XREAD BLOCK (the goal of the issue "one engine") is reported
    return [
        *percentile_rows("wake", "wake latency {} (settle 0), µs", FLOOR_GOAL),
        *percentile_rows(
            "wake_redis", "wake latency {} (settle 0) against Redis XREAD BLOCK, µs", REDIS_REPORT
        ),
    ]


def wake(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    warm = s.warmup // 10
    wakes = on_three(setup, "wake", "wake", 1, warm + s.wakes)
    repl = wakes.repl.times[warm:]
    fill_percentiles(rows, "wake", "repl", repl)
    fill_percentiles(rows, "wake", "reference", wakes.floor.times[warm:])
    fill_percentiles(rows, "wake_redis", "repl", repl)
    redis = wakes.redis.times[warm:] if wakes.redis is not None else None
    fill_percentiles(rows, "wake_redis", "reference", redis)

    def p50_p99(kind: Kind) -> str:
        p50, p99 = (number(percentile(kind.times[warm:], f) / 1000) for f in (0.5, 0.99))
        return f"{kind.name} {p50} / {p99}"

    kinds, rounds = wakes.kinds(), warm + s.wakes
    setup.notes.append(
        f"wake: {s.wakes:,} wakes after {warm} of each kind, alternated; p50 / p99, µs: "
        + ", ".join(p50_p99(kind) for kind in kinds)
        + "; the server's CPU a round (a wait put and answered, a send, the polls): "
        + ", ".join(kind.cpu_note(rounds) for kind in kinds)
    )


def fanout_rows(s: Sizes) -> list[Row]:
    figure = f"fan-out, one send to {s.fanout:,} waiters (settle 0)"
    return [
        Row("fanout", f"{figure}, ms", FLOOR_GOAL),
        Row("fanout_redis", f"{figure} against Redis XREAD BLOCK, ms", REDIS_REPORT),
    ]


def fanout(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    rounds = s.fanout_rounds + 1  # the first round warms up
    wakes = on_three(setup, "fanout", "fan", s.fanout, rounds)
    repl = wakes.repl.times[1:]
    rows["fanout"].repl = rows["fanout_redis"].repl = statistics.median(repl) / 1e6
    rows["fanout"].reference = statistics.median(wakes.floor.times[1:]) / 1e6
    if wakes.redis is not None:
        rows["fanout_redis"].reference = statistics.median(wakes.redis.times[1:]) / 1e6
    kinds = wakes.kinds()
    setup.notes.append(
        f"fan-out: median of {s.fanout_rounds} rounds, alternated (ms): "
        + "; ".join(
            f"{kind.name} " + " ".join(f"{t / 1e6:.1f}" for t in kind.times[1:]) for kind in kinds
        )
        + f"; the server's CPU a round ({s.fanout:,} waits put and answered, a send, the "
        + "polls): "
        + ", ".join(kind.cpu_note(rounds) for kind in kinds)
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
