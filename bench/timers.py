"""Timers (SPEC §9): how late a one-shot fires, what pending timers cost, a burst due at once.

Every daemon here is durable (the default SQLite store) with ``--settle-ms
0``, as for the wake rows, so a waiter is answered as soon as a firing is
committed. Times are the wall clock (``time.time_ns``), because a timer's
``due_ms`` is a wall-clock time; the daemon and this process read the same
clock.

- lateness: one session, ``timer_lateness`` one-shot timers scheduled up
  front with ``at`` (one due every ``timer_spacing_ms``, the first
  ``timer_lead_ms`` after their scheduling began), so while they fire the
  daemon does nothing else; a client blocked in ``wait`` (acknowledging as
  it goes) notes when it holds each firing. The reference is the floor of a
  Python event loop's timer on this machine: bench/timer_floor.py, on the
  daemon's kind of loop, given the same due times, writing a line back when
  ``call_later`` runs, read by the same client code.
- pending timers: ``timers`` one-shots due in an hour, spread over
  ``timer_sessions`` sessions (pipelined); daemon CPU over
  ``timer_window_s``, against a second daemon with the same sessions and no
  timers, over the same window, at the same time; and RSS growth over the
  scheduling per timer, against Redis's ``used_memory`` growth for the same
  timers kept the least a Redis-backed scheduler would: one sorted set of
  due times (member ``SESSION TIMER``) and a hash a session (timer id ->
  its definition as JSON, as ``timers`` lists it). A second ``--memory``
  daemon's figure is in a note: the durable one's includes SQLite's cache.
- a burst: ``timers`` one-shots on ``timer_sessions`` sessions, all ``at``
  one time ``burst_lead_s`` after their scheduling began; from that due
  time until a client blocked in ``wait`` on every session holds the last
  firing. Reference: as many XADDs (MAXLEN 256) pipelined over as many
  streams, Redis with appendfsync always (the durable sends row's
  reference), timed by its client from the first write to the last answer.

The lateness is also measured on a daemon whose store is Redis
(persistence off), for a note.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bench.clients import LineClient, close_all, encode, redis_client, redis_info
from bench.measure import (
    Group,
    Setup,
    Sizes,
    fill_percentiles,
    on_redis,
    percentile,
    percentile_rows,
    pipeline_answers,
    run_async,
    start_sessions,
    stats,
    xadd_each,
)
from bench.procs import BenchError, Daemon, RedisServer, TimerFloor, rss_bytes
from bench.table import Goal, Row
from bench.waits import cpu_percent

TEXT = "t{:09d}"  # the text of every timer: 10 bytes
LATENESS = "lateness"  # the session of the lateness figure
FAR = "1h"  # pending timers are due this far ahead: none fires during the figure
MARGIN_MS = 20  # scheduling must be done this long before the first due time


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rfc3339(ms: int) -> str:
    """``ms`` since the epoch as an RFC 3339 UTC time with milliseconds (a schedule's ``at``)."""
    second, milli = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)) + f".{milli:03d}Z"


def stamp_ms(ts: str) -> int:
    """A firing's ``ts`` (ISO 8601 UTC, milliseconds) in ms since the epoch."""
    return round(datetime.fromisoformat(ts).timestamp() * 1000)


def schedule_at(session: str, i: int, due_ms: int) -> bytes:
    at = rfc3339(due_ms)
    return encode({"op": "schedule", "session": session, "text": TEXT.format(i), "at": at})


def spread(names: list[str], count: int) -> list[str]:
    """The session of each of ``count`` timers, round robin over ``names``."""
    return [names[i % len(names)] for i in range(count)]


async def schedule_all(
    client: LineClient, lines: list[bytes], dues: list[int] | None, batch: int
) -> list[dict[str, Any]]:
    """Pipeline ``lines`` (schedules); check each answer is due when it was asked for."""
    answers = await pipeline_answers(client, lines, batch, "schedule")
    for i, answer in enumerate(answers):
        if dues is not None and answer.get("due_ms") != dues[i]:
            raise BenchError(f"timer {i} due at {answer.get('due_ms')}, asked for {dues[i]}")
    return answers


# -- lateness of one-shot timers ------------------------------------------------


@dataclass
class Lateness:
    """Per timer, in µs after its due time: when a client held it, and the firing's own stamp."""

    delivered: list[int]
    stamped: list[int]


async def repl_lateness(daemon: Daemon, s: Sizes) -> Lateness:
    control = await LineClient.connect(daemon.port, daemon.token)
    waiter = await LineClient.connect(daemon.port, daemon.token)
    try:
        await control.ok({"op": "start", "session": LATENESS})
        # a schedule's answer takes well under a millisecond; the lead is checked below
        first = now_ms() + s.timer_lead_ms
        dues = [first + i * s.timer_spacing_ms for i in range(s.timer_lateness)]
        lines = [schedule_at(LATENESS, i, due) for i, due in enumerate(dues)]
        await schedule_all(control, lines, dues, s.batch)
        if now_ms() >= first - MARGIN_MS:  # the waiter would not be blocked before it
            raise BenchError("scheduling the timers took past the first due time")
        delivered: list[int] = []
        stamped: list[int] = []
        acked = 0
        while len(delivered) < len(dues):
            wait: dict[str, Any] = {"op": "wait", "sessions": [LATENESS], "cursor": "late"}
            wait["timeout_ms"] = s.timer_lead_ms + 10_000
            if acked:
                wait["ack"] = {LATENESS: acked}
            answer = await waiter.call(wait)
            held = time.time_ns()
            batches = answer.get("batches") or []
            if not answer.get("ok") or not batches:
                raise BenchError(f"a wait for a timer's firing answered {answer}")
            for batch in batches:
                for firing in batch["firings"]:
                    due = dues[int(firing["result"][1:])]
                    delivered.append(held // 1000 - due * 1000)
                    stamped.append((stamp_ms(firing["ts"]) - due) * 1000)
                acked = batch["next"]
        return Lateness(delivered, stamped)
    finally:
        await close_all([control, waiter])


async def floor_lateness(floor: TimerFloor, s: Sizes) -> Lateness:
    """The same due times given to the timer floor, its lines read by the same kind of client."""
    client = await LineClient.connect(floor.port)
    try:
        first = now_ms() + s.timer_lead_ms
        dues = [first + i * s.timer_spacing_ms for i in range(s.timer_lateness)]
        client.write_raw(b"".join(encode({"id": i, "at_ms": d}) for i, d in enumerate(dues)))
        await client.writer.drain()
        delivered: list[int] = []
        stamped: list[int] = []
        for _ in dues:
            answer = await client.answer()
            held = time.time_ns()
            due = dues[answer["id"]]
            delivered.append(held // 1000 - due * 1000)
            stamped.append(round(answer["fired_ms"] * 1000) - due * 1000)
        return Lateness(delivered, stamped)
    finally:
        await client.close()


def lateness_ms(times: list[int]) -> str:
    return " / ".join(f"{percentile(times, f) / 1000:.2f}" for f in (0.5, 0.99, 1.0))


# -- pending timers: CPU and memory ----------------------------------------------


@dataclass
class Pending:
    cpu_percent: float
    idle_cpu_percent: float  # the daemon with the same sessions and no timer, same window
    bytes_per_timer: float


async def repl_pending(daemon: Daemon, idle: Daemon, s: Sizes) -> Pending:
    names = [f"timers-{j}" for j in range(s.timer_sessions)]
    control = await LineClient.connect(daemon.port, daemon.token)
    idle_control = await LineClient.connect(idle.port, idle.token)
    try:
        await start_sessions(control, names, s.batch)
        await start_sessions(idle_control, names, s.batch)
        await asyncio.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        lines = [
            encode({"op": "schedule", "session": n, "text": TEXT.format(i), "in": FAR})
            for i, n in enumerate(spread(names, s.timers))
        ]
        await schedule_all(control, lines, None, s.batch)
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(daemon.pid)
        cpu, idle_cpu = await asyncio.gather(
            cpu_percent(daemon.pid, s.timer_window_s), cpu_percent(idle.pid, s.timer_window_s)
        )
        pending = len((await control.ok({"op": "timers"}))["timers"])
        if pending != s.timers:
            raise BenchError(f"{pending} of {s.timers} timers pending after the window")
        return Pending(cpu, idle_cpu, (rss1 - rss0) / s.timers)
    finally:
        await close_all([control, idle_control])


async def repl_memory_per_timer(daemon: Daemon, s: Sizes) -> float:
    """RSS growth per pending timer of a daemon without a store (``--memory``)."""
    names = [f"timers-{j}" for j in range(s.timer_sessions)]
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await start_sessions(control, names, s.batch)
        await asyncio.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        lines = [
            encode({"op": "schedule", "session": n, "text": TEXT.format(i), "in": FAR})
            for i, n in enumerate(spread(names, s.timers))
        ]
        await schedule_all(control, lines, None, s.batch)
        await asyncio.sleep(s.settle_s)
        return (rss_bytes(daemon.pid) - rss0) / s.timers
    finally:
        await control.close()


def timer_definition(i: int, session: str, due_ms: int) -> tuple[str, str]:
    """A timer id and its definition, as the daemon lists a pending timer (``timers``)."""
    timer = f"t-{i:012x}"
    definition = {
        "timer": timer,
        "session": session,
        "due_ms": due_ms,
        "every_ms": None,
        "handler": "on-message",
        "text": TEXT.format(i),
        "key": None,
    }
    return timer, json.dumps(definition, separators=(",", ":"))


async def redis_pending_memory(redis: RedisServer, s: Sizes) -> tuple[float, float]:
    """used_memory and RSS growth per timer: a due-time sorted set, a hash of definitions."""
    control = redis_client(redis.port)
    names = [f"timers-{j}" for j in range(s.timer_sessions)]
    try:
        used0 = (await redis_info(control, "memory"))["used_memory"]
        rss0 = rss_bytes(redis.pid)
        due = now_ms() + 3_600_000
        sessions = spread(names, s.timers)
        for first in range(0, s.timers, s.batch):
            async with control.pipeline(transaction=False) as pipe:
                for i in range(first, min(first + s.batch, s.timers)):
                    timer, definition = timer_definition(i, sessions[i], due + i)
                    pipe.zadd("timers:due", {f"{sessions[i]} {timer}": due + i})
                    pipe.hset(f"timers:{sessions[i]}", timer, definition)
                await pipe.execute()
        used1 = (await redis_info(control, "memory"))["used_memory"]
        rss1 = rss_bytes(redis.pid)
        return (used1 - used0) / s.timers, (rss1 - rss0) / s.timers
    finally:
        await control.aclose()


# -- a burst due at once --------------------------------------------------------------


@dataclass
class Burst:
    first_ms: float  # from the due time until a waiter held the first firing
    last_ms: float  # ... the last


async def repl_burst(daemon: Daemon, s: Sizes) -> Burst:
    names = [f"burst-{j}" for j in range(s.timer_sessions)]
    control = await LineClient.connect(daemon.port, daemon.token)
    waiter = await LineClient.connect(daemon.port, daemon.token)
    try:
        await start_sessions(control, names, s.batch)
        due = now_ms() + round(s.burst_lead_s * 1000)
        lines = [schedule_at(n, i, due) for i, n in enumerate(spread(names, s.timers))]
        await schedule_all(control, lines, [due] * s.timers, s.batch)
        if now_ms() >= due - MARGIN_MS:
            raise BenchError(f"scheduling {s.timers:,} timers took past their due time")
        held: list[int] = []
        ack: dict[str, int] = {}
        while len(held) < s.timers:
            wait: dict[str, Any] = {"op": "wait", "sessions": names, "cursor": "burst"}
            wait["timeout_ms"] = round(s.burst_lead_s * 1000) + 30_000
            if ack:
                wait["ack"] = ack
            answer = await waiter.call(wait)
            now = time.time_ns()
            batches = answer.get("batches") or []
            if not answer.get("ok") or not batches:
                raise BenchError(f"a wait for the burst answered {answer}")
            ack = {}
            for batch in batches:
                if batch["lost"]:
                    raise BenchError(
                        f"the burst lost {batch['lost']} firings of {batch['session']}"
                    )
                held.extend(now for _ in batch["firings"])
                ack[batch["session"]] = batch["next"]
        fired = (await stats(control))["daemon"]["firings"]
        if len(held) != s.timers or fired != s.timers:
            raise BenchError(f"{s.timers:,} timers made {len(held):,} firings ({fired:,} recorded)")
        return Burst((held[0] / 1e6) - due, (held[-1] / 1e6) - due)
    finally:
        await close_all([control, waiter])


async def redis_burst(redis: RedisServer, s: Sizes) -> float:
    """ms to XADD ``timers`` entries on ``timer_sessions`` streams, pipelined, in batches."""
    client = redis_client(redis.port)
    try:
        await client.ping()
        keys = spread([f"burst-{j}" for j in range(s.timer_sessions)], s.timers)
        t0 = time.perf_counter()
        await xadd_each(client, keys, s.batch)
        return (time.perf_counter() - t0) * 1000
    finally:
        await client.aclose()


# -- the rows --------------------------------------------------------------------


def timers_rows(s: Sizes) -> list[Row]:
    late = f"one-shot timer lateness {{}} ({s.timer_lateness} timers, idle daemon, settle 0), ms"
    p50, p99 = percentile_rows("late", late, Goal("abs_le", 20.0, "≤ 20 ms"))
    pending = f"{s.timers:,} pending timers on {s.timer_sessions} sessions"
    burst = f"{s.timers:,} timers due at once on {s.timer_sessions} sessions"
    window = f"{s.timer_window_s:g} s"
    return [
        p50,
        p99,
        Row(
            "timers_cpu",
            f"{pending}: daemon CPU over {window}, % of a core",
            Goal("abs_le", 1.0, "≤ 1 %"),
        ),
        Row(
            "timers_mem",
            f"{pending}: memory per timer, bytes",
            Goal("report", 0, "report (Redis used_memory)"),
        ),
        Row(
            "burst_ms",
            f"{burst}: due time to the last firing held by a waiter, ms",
            Goal("report", 0, "report (Redis XADD pipelined, fsync always)"),
        ),
        Row(
            "burst_rate",
            f"{burst}: firings/s",
            Goal("report", 0, "report (Redis XADD pipelined, fsync always)"),
        ),
    ]


def durable_daemon(setup: Setup, name: str) -> Daemon:
    return Daemon(setup.dir(name), memory=False, settle_ms=0)


def timers(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    setup.notes.append(
        "timer anchors (quoted, not measured): Sidekiq's scheduled set is polled about every "
        "5 s on average (lateness ~2.5 s mean); BullMQ users report ~100 ms jitter"
    )
    floor = TimerFloor(setup.dir("timers-floor"))
    with floor.start():
        ref = run_async(floor_lateness(floor, s), s.deadline_s)
    fill_percentiles(rows, "late", "reference", ref.delivered)
    if setup.store_missing:
        keys = ("late_p50", "late_p99", "timers_cpu", "timers_mem", "burst_ms", "burst_rate")
        setup.cannot_run([rows[key] for key in keys], "store missing")
    else:
        with durable_daemon(setup, "timers-late-daemon").start() as daemon:
            repl = run_async(repl_lateness(daemon, s), s.deadline_s)
        fill_percentiles(rows, "late", "repl", repl.delivered)
        setup.notes.append(
            "timer lateness p50 / p99 / max, ms: held by the waiter "
            f"{lateness_ms(repl.delivered)}, the firing's ts (whole ms) "
            f"{lateness_ms(repl.stamped)}; timer floor: held {lateness_ms(ref.delivered)}, "
            f"its callback ran {lateness_ms(ref.stamped)}"
        )
        busy = durable_daemon(setup, "timers-pending-daemon")
        idle = durable_daemon(setup, "timers-idle-daemon")
        with busy.start(), idle.start():
            pending = run_async(repl_pending(busy, idle, s), s.deadline_s)
        rows["timers_cpu"].repl = pending.cpu_percent
        rows["timers_cpu"].reference = pending.idle_cpu_percent
        rows["timers_mem"].repl = pending.bytes_per_timer
        with durable_daemon(setup, "timers-burst-daemon").start() as daemon:
            burst = run_async(repl_burst(daemon, s), s.deadline_s)
        rows["burst_ms"].repl = burst.last_ms
        rows["burst_rate"].repl = s.timers / (burst.last_ms / 1000)
        setup.notes.append(
            f"timer burst: the waiter held the first of {s.timers:,} firings "
            f"{burst.first_ms:.0f} ms after their due time, the last {burst.last_ms:.0f} ms"
        )
    with Daemon(setup.dir("timers-memory-daemon"), memory=True).start() as daemon:
        in_memory = run_async(repl_memory_per_timer(daemon, s), s.deadline_s)
    setup.notes.append(f"memory per pending timer, --memory daemon: {in_memory:.0f} bytes")
    if not setup.redis_exe:
        return
    ref_mem = on_redis(setup, "timers-redis", lambda r: redis_pending_memory(r, s))
    if ref_mem is not None:
        rows["timers_mem"].reference, rss = ref_mem
        setup.notes.append(f"memory per pending timer: Redis RSS delta {rss:.0f} bytes per timer")
    ref_burst = on_redis(setup, "timers-burst-redis", lambda r: redis_burst(r, s), durable=True)
    if ref_burst is not None:
        rows["burst_ms"].reference = ref_burst
        rows["burst_rate"].reference = s.timers / (ref_burst / 1000)
    # the same lateness figure on a daemon whose store is Redis (persistence off)
    with RedisServer(setup.redis_exe, setup.dir("timers-store-redis"), durable=False) as redis:
        redis.start()
        daemon = Daemon(setup.dir("timers-store-daemon"), memory=False, store=redis.url)
        with daemon.start():
            on_store = run_async(repl_lateness(daemon, s), s.deadline_s)
    setup.notes.append(
        "timer lateness on the Redis store (--store redis://, p50 / p99 / max, ms): "
        f"held by the waiter {lateness_ms(on_store.delivered)}"
    )


TIMERS = Group("timers", timers_rows, timers)
