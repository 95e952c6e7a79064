"""Several daemons on one Redis: the second table of ``python -m bench``.

One redis-server (persistence off) is started for the group; daemons are
started on it one at a time (``--store redis://... --settle-ms 0``, each
with its own home and token), so each figure is taken with exactly the
daemons its column names, and no idle daemon is subscribed meanwhile:

- with daemon A alone: the wake latency with waiter and sender both on A,
  and pipelined sends from every client through A (one session);
- with A and B: the wake latency with the waiter blocked on B and the
  sender on A, and pipelined sends split over A and B, to one shared
  session (contended) and to one session per daemon (uncontended);
- with A, B and C: the same pipelined sends over three daemons.

The Redis-alone column is the same load on the same redis-server without a
daemon: XREAD BLOCK for the wakes, XADD pipelined from as many connections
for the sends. For context, two daemons without Redis (``--memory`` and
the default SQLite store) give the single-daemon wake figures.

A send that the daemons refuse (``store_failed``: the session changed
elsewhere too many times in a row) is counted, not retried, and not in the
sends per second; after each contended run the session's head is checked
against the sends that were answered, so a lost or doubled seq fails the
group.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.clients import LineClient, close_all, encode, redis_client, redis_info
from bench.measure import (
    PAYLOAD,
    PERCENTILES,
    RING,
    Setup,
    Sizes,
    on_daemon,
    percentiles_us,
    run_async,
    send_request,
    stats,
    xadd_each,
)
from bench.procs import HOST, BenchError, Daemon, RedisServer, cpu_seconds
from bench.table import grid, number
from bench.waiters import redis_rounds, repl_rounds

COLUMNS = ("figure", "1 daemon", "2 daemons", "3 daemons", "2 / 1", "3 / 1", "Redis alone")
COUNTS = (1, 2, 3)
NO_REDIS = "no redis-server"
# the wake rows: with 1 and 2 daemons on Redis, then one daemon alone with each store
WAKES = (
    ("wake", "2: waiter on B, send via A"),
    ("wake_mem", "one daemon, --memory"),
    ("wake_sql", "one daemon, SQLite"),
)


@dataclass
class ScaleRow:
    """One figure with one daemon, two and three on one Redis, and Redis alone."""

    key: str
    figure: str
    values: dict[int, float]
    redis: float | None = None
    missing: str | None = None
    # context rows are one daemon only and need no Redis
    needs_redis: bool = True

    def ratio(self, n: int) -> float | None:
        one, several = self.values.get(1), self.values.get(n)
        if one is None or several is None or not one:
            return None
        return several / one

    def cells(self) -> list[str]:
        first = number(self.values.get(1))
        if 1 not in self.values and self.missing is not None:
            first = f"n/a ({self.missing})"
        ratios = [self.ratio(n) for n in (2, 3)]
        return [
            self.figure,
            first,
            number(self.values.get(2)),
            number(self.values.get(3)),
            *("" if r is None else f"{r:.2f}" for r in ratios),
            number(self.redis),
        ]


def blank_rows(s: Sizes) -> list[ScaleRow]:
    clients = f"{s.scale_clients} clients"
    rows = [
        *(
            ScaleRow(f"{prefix}_{name}", f"wake {name} (settle 0), µs; {where}", {})
            for prefix, where in WAKES
            for name, _fraction in PERCENTILES
        ),
        ScaleRow("one_rate", f"pipelined sends/s, {clients}, one shared session", {}),
        ScaleRow("one_refused", "sends refused (store_failed), one shared session", {}),
        ScaleRow("one_attempts", "commit attempts (EVALSHA) per send, one shared session", {}),
        ScaleRow("one_reloads", "session reloads (MULTI/EXEC) per send, one shared session", {}),
        ScaleRow("one_cpu", "daemons' CPU per send, µs, one shared session", {}),
        ScaleRow("one_redis_cpu", "redis-server CPU per send, µs, one shared session", {}),
        ScaleRow("each_rate", f"pipelined sends/s, {clients}, one session per daemon", {}),
        ScaleRow("each_cpu", "daemons' CPU per send, µs, one session per daemon", {}),
        ScaleRow("each_redis_cpu", "redis-server CPU per send, µs, one session per daemon", {}),
    ]
    for row in rows:
        row.needs_redis = not row.key.startswith(("wake_mem", "wake_sql"))
    return rows


def render(rows: list[ScaleRow]) -> str:
    return grid(COLUMNS, [row.cells() for row in rows])


def _fill_wake(rows: dict[str, ScaleRow], prefix: str, n: int, times: list[int]) -> None:
    for name, value in percentiles_us(times):
        rows[f"{prefix}_{name}"].values[n] = value


# -- pipelined sends -----------------------------------------------------------


@dataclass
class Load:
    sent: int
    refused: int
    seconds: float
    daemon_cpu: float
    redis_cpu: float
    # Redis's own count of commit scripts run and of session reloads, during the load
    attempts: int = 0
    reloads: int = 0

    @property
    def rate(self) -> float:
        return self.sent / self.seconds


async def _client_sends(client: LineClient, session: str, count: int, batch: int) -> list[int]:
    """``count`` sends in batches of ``batch``; [answered, refused]."""
    line = encode(send_request(session))
    sent = refused = 0
    while sent + refused < count:
        chunk = min(batch, count - sent - refused)
        client.write_raw(line * chunk)
        for _ in range(chunk):
            answer = await client.answer()
            if answer.get("ok"):
                sent += 1
            elif answer.get("code") == "store_failed":
                refused += 1
            else:
                raise BenchError(f"a send answered {answer}")
    return [sent, refused]


async def repl_load(
    daemons: list[Daemon], redis: RedisServer, sessions: list[str], s: Sizes
) -> Load:
    """One client per entry of ``sessions``: client i on daemons[i % n], sending to sessions[i]."""
    clients: list[LineClient] = []
    control = redis_client(redis.port)
    try:
        for i in range(len(sessions)):
            daemon = daemons[i % len(daemons)]
            clients.append(await LineClient.connect(daemon.port, daemon.token))
        for name in dict.fromkeys(sessions):
            await clients[0].ok({"op": "start", "session": name})
        warm = await asyncio.gather(
            *(_client_sends(c, n, 10, 10) for c, n in zip(clients, sessions, strict=True))
        )
        per = s.scale_sends // len(sessions)
        pids = [d.pid for d in daemons]
        await control.config_resetstat()
        cpu0, redis0 = sum(map(cpu_seconds, pids)), cpu_seconds(redis.pid)
        t0 = asyncio.get_running_loop().time()
        done = await asyncio.gather(
            *(
                _client_sends(c, n, per, s.scale_batch)
                for c, n in zip(clients, sessions, strict=True)
            )
        )
        seconds = asyncio.get_running_loop().time() - t0
        cpu1, redis1 = sum(map(cpu_seconds, pids)), cpu_seconds(redis.pid)
        commands = await redis_info(control, "commandstats")
        # every answered send took one seq, none twice: the heads add up
        answered: dict[str, int] = {}
        for name, (w, _), (d, _) in zip(sessions, warm, done, strict=True):
            answered[name] = answered.get(name, 0) + w + d
        for name, count in answered.items():
            head = (await stats(clients[-1], name))["sessions"][0]["head"]
            if head != count:
                raise BenchError(f"session {name} has head {head} after {count} answered sends")
        sent = sum(d for d, _ in done)
        refused = sum(r for _, r in done)
        if not sent:
            raise BenchError(f"every one of {refused} sends was refused")
        load = Load(sent, refused, seconds, cpu1 - cpu0, redis1 - redis0)
        load.attempts = commands.get("cmdstat_evalsha", {}).get("calls", 0)
        load.reloads = commands.get("cmdstat_exec", {}).get("calls", 0)
        return load
    finally:
        await close_all(clients)
        await control.aclose()


async def redis_load(redis: RedisServer, keys: list[str], s: Sizes) -> Load:
    """The same load as XADD from as many redis.asyncio connections (one per key), no daemon."""
    clients = [redis_client(redis.port) for _ in keys]

    async def each(count: int) -> None:
        """``count`` XADDs from every client to its key, all clients at once."""
        entries = [[k] * count for k in keys]
        await asyncio.gather(
            *(xadd_each(c, e, s.scale_batch) for c, e in zip(clients, entries, strict=True))
        )

    try:
        await each(10)
        per = s.scale_redis_sends // len(keys)
        redis0 = cpu_seconds(redis.pid)
        t0 = asyncio.get_running_loop().time()
        await each(per)
        seconds = asyncio.get_running_loop().time() - t0
        return Load(per * len(keys), 0, seconds, 0.0, cpu_seconds(redis.pid) - redis0)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)


def _fill_load(rows: dict[str, ScaleRow], prefix: str, n: int, load: Load) -> None:
    rows[f"{prefix}_rate"].values[n] = load.rate
    rows[f"{prefix}_cpu"].values[n] = load.daemon_cpu / load.sent * 1e6
    rows[f"{prefix}_redis_cpu"].values[n] = load.redis_cpu / load.sent * 1e6
    if prefix == "one":
        rows["one_refused"].values[n] = load.refused
        rows["one_attempts"].values[n] = load.attempts / load.sent
        rows["one_reloads"].values[n] = load.reloads / load.sent


def redis_benchmark(exe: str, port: int, s: Sizes) -> str | None:
    """redis-benchmark's XADD rate with the same connections and pipeline depth, if installed."""
    found = shutil.which("redis-benchmark") or str(Path(exe).with_name("redis-benchmark"))
    if not Path(found).exists():
        return None
    argv = [found, "-h", HOST, "-p", str(port), "-c", str(s.scale_clients)]
    argv += ["-n", str(s.scale_redis_sends * 2), "-P", str(s.scale_batch), "-q"]
    argv += ["XADD", "bench-rb", "MAXLEN", str(RING), "*", "text", PAYLOAD]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    found_rate = re.search(r"([\d.]+) requests per second", done.stdout)
    if found_rate is None:
        return None
    return (
        f"scale-out: redis-benchmark (a C client), {s.scale_clients} connections, "
        f"pipeline {s.scale_batch}: XADD MAXLEN {RING} {float(found_rate.group(1)):,.0f}/s"
    )


# -- the group -----------------------------------------------------------------


def scaleout(setup: Setup, _rows: dict[str, Any]) -> None:
    s = setup.sizes
    rows: dict[str, ScaleRow] = setup.scale
    warm = max(2, s.scale_wakes // 20)
    rounds = warm + s.scale_wakes

    def one_wake(daemon: Daemon) -> Awaitable[list[int]]:
        return repl_rounds(daemon, "wake", 1, rounds)

    # context first: one daemon without Redis, for the wake rows
    times = on_daemon(setup, "scale-memory", one_wake, memory=True)
    _fill_wake(rows, "wake_mem", 1, times[warm:])
    if not setup.store_missing:
        times = on_daemon(setup, "scale-sqlite", one_wake, memory=False)
        _fill_wake(rows, "wake_sql", 1, times[warm:])
    else:
        rows["wake_sql_p50"].missing = rows["wake_sql_p99"].missing = "store missing"
    if setup.redis_exe is None:
        for row in rows.values():
            if row.needs_redis:
                row.missing = NO_REDIS
        return
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(
            RedisServer(setup.redis_exe, setup.dir("scale-redis"), durable=False)
        )
        redis.start()
        daemons: list[Daemon] = []
        for n in COUNTS:
            name = "ABC"[n - 1]
            daemon = Daemon(setup.dir(f"scale-daemon-{name}"), memory=False, store=redis.url)
            # the ExitStack stops the daemons before the redis-server they use
            daemons.append(stack.enter_context(daemon.start()))
            if n <= 2:  # the waiter on the last daemon started, the sender on A
                wake = repl_rounds(daemons[0], f"wake-{n}", 1, rounds, on=daemon)
                _fill_wake(rows, "wake", n, run_async(wake, s.deadline_s)[warm:])
            clients = range(s.scale_clients)
            shared = run_async(
                repl_load(daemons, redis, [f"one-{n}" for _ in clients], s), s.deadline_s
            )
            _fill_load(rows, "one", n, shared)
            if n == 1:  # one session per daemon is the same load with one daemon
                _fill_load(rows, "each", n, shared)
            else:
                each = run_async(
                    repl_load(daemons, redis, [f"each-{n}-{i % n}" for i in clients], s),
                    s.deadline_s,
                )
                if each.refused:
                    setup.notes.append(
                        f"scale-out: {each.refused} sends refused with one session per daemon "
                        f"({n} daemons), where no two daemons share a session"
                    )
                _fill_load(rows, "each", n, each)
        # Redis alone, on the same server
        times = run_async(redis_rounds(redis.port, "xwake", 1, rounds), s.deadline_s)[warm:]
        for name, value in percentiles_us(times):
            rows[f"wake_{name}"].redis = value
        layouts = {
            "one": ["xone"] * s.scale_clients,
            "each": [f"xeach-{i}" for i in range(s.scale_clients)],
        }
        for prefix, keys in layouts.items():
            alone = run_async(redis_load(redis, keys, s), s.deadline_s)
            rows[f"{prefix}_rate"].redis = alone.rate
            rows[f"{prefix}_redis_cpu"].redis = alone.redis_cpu / alone.sent * 1e6
        note = redis_benchmark(setup.redis_exe, redis.port, s)
        if note:
            setup.notes.append(note)
