"""What every group of figures shares: the sizes, the servers, the requests, the rows.

Each group of figures (bench/sends.py, bench/waits.py, bench/memory.py,
bench/cli.py, bench/restart.py, bench/timers.py, bench/http_api.py,
bench/scaleout.py) starts fresh servers through ``on_daemon``, ``on_floor``
and ``on_redis``, drives them from this process over loopback, and fills
its rows. repl and its reference are
driven in the same style: one asyncio connection per client, one request
at a time unless the figure is about pipelining, the same 100-byte text.
Every loop has a count and runs under a deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from bench.clients import LineClient, encode, redis_client
from bench.procs import BenchError, Daemon, Floor, RedisServer
from bench.table import Goal, Row

T = TypeVar("T")

PAYLOAD = "x" * 100  # the text of every firing: 100 bytes
RING = 256  # the daemon's default ring; Redis streams are trimmed to the same (MAXLEN 256)
PERCENTILES = (("p50", 0.50), ("p99", 0.99))


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
    # several daemons on one Redis, and on a Redis Cluster (bench/scaleout.py)
    scale_wakes: int = 1_000
    scale_clients: int = 6  # split evenly over 1, 2 or 3 daemons
    scale_sends: int = 24_000  # in all, per configuration
    scale_batch: int = 100  # requests each client writes before reading their answers
    scale_redis_sends: int = 60_000  # XADDs in all for the redis-py reference
    scale_reads: int = 6_000  # pipelined reads from one client, for the commands per read
    # timers (bench/timers.py): one-shots on an idle daemon, one due every spacing
    timer_lateness: int = 200
    timer_spacing_ms: int = 30
    timer_lead_ms: int = 300  # the first is due this long after their scheduling began
    # pending timers, and a burst due at once: spread over sessions (at most 1,024 timers
    # each, and at most the ring of 256 each for the burst, so every firing is kept)
    timers: int = 10_000
    timer_sessions: int = 40
    timer_window_s: float = 10.0
    burst_lead_s: float = 3.0  # the burst is due this long after its scheduling began
    # HTTP beside the line protocol (bench/http_api.py): each figure beside its line twin
    http_round_trips: int = 2_000
    http_warmup: int = 200
    http_wakes: int = 300
    http_streams: int = 1_000  # the fan-out's streams, and the memory figure's
    # many sessions (bench/many.py): pipelined durable sends spread round-robin over them
    many_sessions: int = 10_000
    many_sends: int = 32  # to each
    # every ring full at scale (bench/full.py): filled, then sent to round-robin, restarted
    full_sessions: int = 10_000
    full_firings: int = 256
    full_sends: int = 32  # to each, timed, once the rings are full
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
    scale_reads=100,
    timer_lateness=20,
    timer_spacing_ms=20,
    timer_lead_ms=500,  # scheduling 20 timers under load (coverage, other tests) takes time
    timers=1_000,
    timer_sessions=10,
    timer_window_s=1.0,
    burst_lead_s=2.0,  # and 1,000 took past 0.5 s in a loaded CI run
    many_sessions=50,
    many_sends=4,
    full_sessions=4,
    full_firings=256,
    full_sends=4,
    http_round_trips=100,
    http_warmup=10,
    http_wakes=30,
    http_streams=50,
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
    # the scale-out tables' rows (bench/scaleout.py): table key -> row key -> Row
    scale: dict[str, Any] = field(default_factory=dict)
    #: the rows that could not run, key -> why (a piece the bench extra or the project
    #: brings, not there): the run says so and exits 1 (``cannot_run``)
    unrun: dict[str, str] = field(default_factory=dict)

    def dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def cannot_run(self, rows: Iterable[Row], why: str, hint: str | None = None) -> None:
        """``rows`` cannot be measured here: each says ``why`` (``n/a (why)``), ``hint``
        (how to get what is missing) is noted once, and the run's exit status is 1: what
        README's bench command installs measures every row, so a row left out is a fault
        of the install, not a figure (issue 50). Not for the Redis reference or the
        scale-out rows without redis-server, which README says stay empty."""
        for row in rows:
            row.missing = why
            self.unrun[row.key] = why
        if hint is not None and hint not in self.notes:
            self.notes.append(hint)


@dataclass(frozen=True)
class Group:
    """Rows of the main table and what measures them: ``--only NAME`` runs one group."""

    name: str
    rows: Callable[[Sizes], list[Row]]
    run: Callable[[Setup, dict[str, Row]], None]


# -- rows --------------------------------------------------------------------


def percentile(values: list[int], fraction: float) -> float:
    """The nearest-rank percentile of ``values``."""
    ordered = sorted(values)
    rank = max(1, round(fraction * len(ordered) + 0.5))
    return float(ordered[min(rank, len(ordered)) - 1])


def percentiles_us(times: list[int]) -> list[tuple[str, float]]:
    """("p50", µs) and ("p99", µs) of nanosecond ``times``."""
    return [(name, percentile(times, fraction) / 1000) for name, fraction in PERCENTILES]


def percentile_rows(prefix: str, figure: str, goal: Goal) -> list[Row]:
    """The p50 and p99 rows of one latency: keys ``prefix_p50``, ``figure`` with {} the name."""
    return [Row(f"{prefix}_{name}", figure.format(name), goal) for name, _ in PERCENTILES]


def fill_percentiles(
    rows: dict[str, Row], prefix: str, column: str, times: list[int] | None
) -> None:
    """Set ``column`` of the p50 and p99 rows to ``times``' percentiles in µs (None: not run)."""
    for name, fraction in PERCENTILES:
        value = percentile(times, fraction) / 1000 if times else None
        setattr(rows[f"{prefix}_{name}"], column, value)


# -- servers -------------------------------------------------------------------


def run_async(coro: Awaitable[T], deadline_s: float) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(deadline_s):
            return await coro

    return asyncio.run(bounded())


def on_daemon(
    setup: Setup, name: str, measure: Callable[[Daemon], Awaitable[T]], **options: Any
) -> T:
    """``measure`` a fresh daemon (``options`` as for Daemon) in ``name``, then stop it."""
    with Daemon(setup.dir(name), **options).start() as daemon:
        return run_async(measure(daemon), setup.sizes.deadline_s)


def on_floor(setup: Setup, name: str, measure: Callable[[Floor], Awaitable[T]]) -> T:
    with Floor(setup.dir(name)).start() as floor:
        return run_async(measure(floor), setup.sizes.deadline_s)


def on_redis(
    setup: Setup,
    name: str,
    measure: Callable[[RedisServer], Awaitable[T]],
    *,
    durable: bool = False,
) -> T | None:
    """``measure`` a fresh redis-server, or None when there is none to run (a note says why)."""
    if not setup.redis_exe:
        return None
    with RedisServer(setup.redis_exe, setup.dir(name), durable=durable) as redis:
        redis.start()
        return run_async(measure(redis), setup.sizes.deadline_s)


# -- requests ------------------------------------------------------------------


def send_request(session: str) -> dict[str, Any]:
    return {"op": "send", "session": session, "text": PAYLOAD}


async def stats(client: LineClient, session: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"op": "stats"}
    if session is not None:
        request["session"] = session
    return await client.ok(request)


async def pipeline(
    client: LineClient, requests: list[bytes], batch: int, what: str = "request"
) -> None:
    """Write ``batch`` request lines, read their answers, and again until all are done."""
    for first in range(0, len(requests), batch):
        chunk = requests[first : first + batch]
        client.write_raw(b"".join(chunk))
        for _ in chunk:
            answer = await client.answer()
            if not answer.get("ok"):
                raise BenchError(f"{what} failed: {answer}")


async def pipeline_answers(
    client: LineClient, requests: list[bytes], batch: int, what: str = "request"
) -> list[dict[str, Any]]:
    """``pipeline``, keeping the answers (in the order of ``requests``)."""
    answers: list[dict[str, Any]] = []
    for first in range(0, len(requests), batch):
        chunk = requests[first : first + batch]
        client.write_raw(b"".join(chunk))
        for _ in chunk:
            answer = await client.answer()
            if not answer.get("ok"):
                raise BenchError(f"{what} failed: {answer}")
            answers.append(answer)
    return answers


async def start_sessions(client: LineClient, names: list[str], batch: int) -> None:
    """Start sessions over one connection, ``batch`` requests in flight at a time."""
    await pipeline(client, [encode({"op": "start", "session": n}) for n in names], batch, "start")


async def fill_sessions(client: LineClient, names: list[str], firings: int, batch: int) -> int:
    """Start ``names`` and send ``firings`` to each, pipelined; returns the sends made."""
    await start_sessions(client, names, batch)
    lines = [encode(send_request(n)) for n in names for _ in range(firings)]
    await pipeline(client, lines, batch)
    return len(lines)


async def fill_daemon(daemon: Daemon, names: list[str], firings: int, batch: int) -> int:
    """``fill_sessions`` over a connection of its own."""
    client = await LineClient.connect(daemon.port, daemon.token)
    try:
        return await fill_sessions(client, names, firings, batch)
    finally:
        await client.close()


async def xadd_each(client: Any, keys: list[str], batch: int) -> None:
    """One XADD (MAXLEN 256, exact) per entry of ``keys``, ``batch`` to a pipeline."""
    for first in range(0, len(keys), batch):
        async with client.pipeline(transaction=False) as pipe:
            for key in keys[first : first + batch]:
                pipe.xadd(key, {"text": PAYLOAD}, maxlen=RING, approximate=False)
            await pipe.execute()


async def fill_streams(port: int, keys: list[str], firings: int, batch: int) -> int:
    """``firings`` entries on each of ``keys``, pipelined; returns the entries added."""
    client = redis_client(port)
    try:
        entries = [k for k in keys for _ in range(firings)]
        await xadd_each(client, entries, batch)
        return len(entries)
    finally:
        await client.aclose()
