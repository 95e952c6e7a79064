"""Every ring full, at scale (issue 29): 10,000 sessions × 256 firings, durable.

One durable daemon is filled to ``full_sessions`` × ``full_firings``
(2.56 million firings of 100 bytes by default), and then measured four ways:

- its RSS growth per retained firing, against Redis's ``used_memory`` growth
  for the same streams (MAXLEN 256, ``appendfsync always``);
- pipelined sends spread round-robin over its full sessions, so that every
  send drops its ring's oldest firing, against the same sends to the same
  number of empty sessions on a fresh daemon of the same run;
- a restart, until the newest firing of the last session is served, against
  Redis reloading the same streams from its AOF;
- its RSS after that restart, against its RSS before it;
- a read of every session's newest firing after it (which brings in each ring
  the restart left folded, issue 29 step 7), against Redis's XREVRANGE of every
  stream after its reload, and the RSS after those reads against the RSS
  before the restart.

The fill takes a minute or two on this machine; ``--only full`` runs the group
alone.
"""

from __future__ import annotations

import time

from bench.clients import LineClient, encode, redis_client, redis_info
from bench.many import line_spread
from bench.measure import (
    Group,
    Setup,
    Sizes,
    fill_daemon,
    fill_streams,
    pipeline,
    run_async,
    stats,
)
from bench.procs import BenchError, Daemon, RedisServer, rss_bytes
from bench.restart import _redis_served, _repl_served
from bench.table import Goal, Row


def _names(s: Sizes) -> list[str]:
    return [f"f{n:05d}" for n in range(s.full_sessions)]


def _spread(s: Sizes) -> list[str]:
    """Each session ``full_sends`` times, round-robin: every batch touches ``batch`` sessions."""
    names = _names(s)
    return [names[i % len(names)] for i in range(len(names) * s.full_sends)]


async def _retained(daemon: Daemon) -> int:
    client = await LineClient.connect(daemon.port, daemon.token)
    try:
        return int((await stats(client))["daemon"]["firings"])
    finally:
        await client.close()


async def _read_every(daemon: Daemon, names: list[str], head: int, batch: int) -> float:
    """Seconds to read the newest firing of every session, ``batch`` reads at once."""
    client = await LineClient.connect(daemon.port, daemon.token)
    try:
        reads = [encode({"op": "read", "session": n, "after": head - 1}) for n in names]
        t0 = time.perf_counter()
        await pipeline(client, reads, batch, what="read")
        return time.perf_counter() - t0
    finally:
        await client.close()


async def _redis_read_every(port: int, names: list[str], batch: int) -> float:
    client = redis_client(port)
    try:
        t0 = time.perf_counter()
        for first in range(0, len(names), batch):
            async with client.pipeline(transaction=False) as pipe:
                for key in names[first : first + batch]:
                    pipe.xrevrange(key, count=1)
                found = await pipe.execute()
            if not all(found):
                raise BenchError("a stream was empty after the reload")
        return time.perf_counter() - t0
    finally:
        await client.aclose()


async def _used_memory(port: int) -> int:
    client = redis_client(port)
    try:
        return int((await redis_info(client, "memory"))["used_memory"])
    finally:
        await client.aclose()


def full_rows(s: Sizes) -> list[Row]:
    scale = f"{s.full_sessions:,} sessions × {s.full_firings}"
    total = s.full_sessions * s.full_firings
    return [
        Row(
            "full_sends",
            f"pipelined sends/s, {s.full_sends} to each of {s.full_sessions:,} full rings "
            f"(× {s.full_firings}), durable (reference: the same sends to empty rings)",
            Goal("ratio_ge", 0.8, "within 20 % of empty rings"),
        ),
        Row(
            "full_memory",
            f"memory per retained firing at {total:,} firings (the durable daemon's RSS), bytes",
            Goal("ratio_le", 1.5, "≤ 1.5 × Redis used_memory"),
        ),
        Row(
            "full_restart",
            f"restart of {scale} (every ring full) until served, ms",
            Goal("ratio_le", 1.5, "≤ 1.5 × Redis AOF reload"),
        ),
        Row(
            "full_restart_rss",
            f"RSS after that restart, MiB (reference: the daemon's RSS before it, {scale})",
            Goal("ratio_le", 1.1, "≤ 1.1 × the RSS before it"),
        ),
        Row(
            "full_read_every",
            f"after that restart, a read of each of the {s.full_sessions:,} sessions' newest "
            "firing (pipelined), ms (reference: Redis XREVRANGE of each after its reload)",
            Goal("report", 0, "report (× Redis)"),
        ),
        Row(
            "full_read_every_rss",
            "RSS after those reads, MiB (reference: the daemon's RSS before the restart)",
            Goal("ratio_le", 1.1, "≤ 1.1 × the RSS before it"),
        ),
    ]


def full(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    names, targets = _names(s), _spread(s)
    if setup.store_missing:
        setup.cannot_run([rows[row.key] for row in full_rows(s)], "store missing")
        return
    deadline = s.deadline_s * 10  # the fill is 2.56 M durable sends
    daemon = Daemon(setup.dir("full-daemon"), memory=False).start()
    try:
        time.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        t0 = time.perf_counter()
        sent = run_async(fill_daemon(daemon, names, s.full_firings, s.batch), deadline)
        setup.notes.append(
            f"full: {sent:,} durable sends filled {len(names):,} rings in "
            f"{time.perf_counter() - t0:.0f} s"
        )
        time.sleep(s.settle_s)
        retained = run_async(_retained(daemon), s.deadline_s)
        if retained != len(names) * s.full_firings:
            raise BenchError(f"the daemon retains {retained} firings after the fill")
        rows["full_memory"].repl = (rss_bytes(daemon.pid) - rss0) / retained
        rows["full_sends"].repl = run_async(
            line_spread(daemon.port, daemon.token, targets, s.batch, start=False), deadline
        )
        time.sleep(s.settle_s)
        rows["full_restart_rss"].reference = rss_bytes(daemon.pid) / 2**20
        t0 = time.perf_counter()
        daemon.stop()  # a clean stop: it keeps every ring's image for the start
        setup.notes.append(f"full: the clean stop before it took {time.perf_counter() - t0:.2f} s")
        t0 = time.perf_counter()
        daemon.start()
        _repl_served(daemon.port, daemon.token, names[-1], s.full_firings + s.full_sends, 120)
        rows["full_restart"].repl = (time.perf_counter() - t0) * 1000
        time.sleep(s.settle_s)
        rows["full_restart_rss"].repl = rss_bytes(daemon.pid) / 2**20
        head = s.full_firings + s.full_sends
        seconds = run_async(_read_every(daemon, names, head, s.batch), deadline)
        rows["full_read_every"].repl = seconds * 1000
        time.sleep(s.settle_s)
        rows["full_read_every_rss"].repl = rss_bytes(daemon.pid) / 2**20
        rows["full_read_every_rss"].reference = rows["full_restart_rss"].reference
    finally:
        daemon.stop()
    with Daemon(setup.dir("full-empty-daemon"), memory=False).start() as empty:
        rows["full_sends"].reference = run_async(
            line_spread(empty.port, empty.token, targets, s.batch), deadline
        )
    if setup.redis_exe:
        with RedisServer(setup.redis_exe, setup.dir("full-redis"), durable=True) as redis:
            redis.start()
            used0 = run_async(_used_memory(redis.port), s.deadline_s)
            entries = run_async(fill_streams(redis.port, names, s.full_firings, s.batch), deadline)
            used1 = run_async(_used_memory(redis.port), s.deadline_s)
            rows["full_memory"].reference = (used1 - used0) / entries
            redis.stop()
            t0 = time.perf_counter()
            redis.spawn(redis.port)
            _redis_served(redis.port, names[-1], 120)
            rows["full_restart"].reference = (time.perf_counter() - t0) * 1000
            seconds = run_async(_redis_read_every(redis.port, names, s.batch), deadline)
            rows["full_read_every"].reference = seconds * 1000


FULL = Group("full", full_rows, full)
