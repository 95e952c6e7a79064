"""Micro-benchmark of the pure session core: what one operation costs, and what a firing weighs.

Not a test: it asserts nothing and prints two tables. Each time is the best
of several timeit repeats, in nanoseconds per operation, and includes the
cost of one Python call (the first row), since every operation is timed
through a closure. The memory table fills 1,000 sessions with 256 firings
of 100-byte text, as the daemon-level benchmark does (bench/memory.py),
with a fresh text and an ISO timestamp a few milliseconds apart per firing,
as the daemon makes them, and divides the growth by the number of firings.

    .venv/bin/python bench/core_bench.py
"""

from __future__ import annotations

import gc
import os
import sys
import timeit
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from session.ring import Ring
from session.rules import MAX_KEYS, MAX_LIMIT
from session.session import Session

REPEATS = 7
MEMORY_SESSIONS = 1_000
MEMORY_FIRINGS = 256
PAYLOAD = "x" * 100
TS = "2026-11-30T07:00:00.123Z"  # a ts as the daemon writes one (repl_daemon.engine.utc_now)
START = datetime(2026, 11, 30, 7, 0, tzinfo=UTC)


def best_ns(operation: Callable[[], object], number: int | None = None) -> float:
    """The best of ``REPEATS`` timeit runs, in ns per call."""
    timer = timeit.Timer(operation)
    if number is None:
        number, _ = timer.autorange()
    return min(timer.repeat(repeat=REPEATS, number=number)) / number * 1e9


def full_session(limit: int, step_ms: int = 7) -> Session:
    session = Session("bench", limit)
    for n, ts in enumerate(daemon_timestamps(limit + 10, step_ms)):
        session.record("on-message", f"message {n}", ts)
    return session


def daemon_ts(ms: int) -> str:
    """The time ``ms`` after START as the daemon writes it (repl_daemon.engine.utc_now)."""
    when = START + timedelta(milliseconds=ms)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def daemon_timestamps(count: int, step_ms: int = 7) -> list[str]:
    return [daemon_ts(n * step_ms) for n in range(count)]


def fill_sessions() -> list[Session]:
    """1,000 sessions, each with a full ring of 256; every text and ts a new object."""
    sessions = [Session(f"mem-{j}") for j in range(MEMORY_SESSIONS)]
    n = 0
    for session in sessions:
        for _ in range(MEMORY_FIRINGS):
            session.record("on-message", PAYLOAD[:50] + PAYLOAD[50:], daemon_ts(n * 7))
            n += 1
    return sessions


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_rows() -> list[tuple[str, float]]:
    """Run first, in a fresh process: RSS only grows where no freed memory can be reused."""
    firings = MEMORY_SESSIONS * MEMORY_FIRINGS
    gc.collect()
    rss0 = rss_bytes()
    sessions = fill_sessions()
    gc.collect()
    rss = rss_bytes() - rss0
    del sessions
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    sessions = fill_sessions()
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del sessions
    return [
        ("allocated per firing (tracemalloc)", traced / firings),
        ("RSS growth per firing", rss / firings),
    ]


def main() -> None:
    memory = memory_rows()
    rows: list[tuple[str, float]] = []

    rows.append(("an empty call (overhead, included below)", best_ns(lambda: None)))

    small = full_session(256)
    rows.append(
        (
            "record a firing (full ring of 256)",
            best_ns(lambda: small.record("on-message", "hello", TS)),
        )
    )
    number = 20_000
    stamps = iter(daemon_timestamps(number * REPEATS, step_ms=1_001))
    rows.append(
        (
            "record a firing, each in a second of its own",
            best_ns(lambda: small.record("on-message", "hello", next(stamps)), number),
        )
    )

    ring = full_session(256).ring
    head = ring.head
    rows.append(
        ("events_after, ring of 256, tail (1 firing)", best_ns(lambda: ring.events_after(head - 1)))
    )
    rows.append(("events_after, ring of 256, from 0 (256)", best_ns(lambda: ring.events_after(0))))
    rows.append(
        ("events_after, ring of 256, from 0, max 100", best_ns(lambda: ring.events_after(0, 100)))
    )
    sparse = full_session(256, step_ms=1_001).ring
    rows.append(
        (
            "events_after, ring of 256, from 0 (256), a second apart",
            best_ns(lambda: sparse.events_after(0)),
        )
    )

    stored = ring.firings()  # as a store hands them back at a restart
    rows.append(
        (
            "rebuild a ring of 256 from its firings (restart)",
            best_ns(lambda: Ring(256, head, stored)),
        )
    )

    big = full_session(MAX_LIMIT).ring
    big_head = big.head
    rows.append(
        (
            "events_after, ring of 65,536, tail (1 firing)",
            best_ns(lambda: big.events_after(big_head - 1)),
        )
    )
    rows.append(
        (
            "events_after, ring of 65,536, head-100 (100)",
            best_ns(lambda: big.events_after(big_head - 100)),
        )
    )
    rows.append(
        (
            "events_after, ring of 65,536, from 0, max 100",
            best_ns(lambda: big.events_after(0, 100)),
        )
    )
    rows.append(
        ("events_after, ring of 65,536, from 0 (65,536)", best_ns(lambda: big.events_after(0)))
    )

    reader = full_session(256)
    reader.ack("c", reader.head)

    def read_ack_idle() -> None:
        batch = reader.read("c")
        reader.ack("c", batch.next)

    def record_read_ack() -> None:
        reader.record("on-message", "hello", "2024-01-01T00:00:00.000Z")
        batch = reader.read("c")
        reader.ack("c", batch.next)

    rows.append(("cursor read + ack, nothing new", best_ns(read_ack_idle)))
    rows.append(("record + cursor read + ack of it", best_ns(record_read_ack)))

    keyed = full_session(256)
    for n in range(MAX_KEYS):  # a full dedup window, so every new key also forgets one
        keyed.record("on-message", "warm", TS, key=f"warm {n}")
    fresh = iter([f"key {n}" for n in range(number * REPEATS)])
    rows.append(
        (
            "keyed send, new key (full window of 1,024)",
            best_ns(lambda: keyed.record("on-message", "hello", TS, key=next(fresh)), number),
        )
    )
    rows.append(
        (
            "keyed send, duplicate key",
            best_ns(lambda: keyed.record("on-message", "hello", TS, key="key 0"), number),
        )
    )

    print_table(("operation", "ns/op"), rows)
    print(f"\nbest of {REPEATS} repeats; Python {sys.version.split()[0]}\n")
    print_table(
        (f"{MEMORY_SESSIONS:,} sessions × {MEMORY_FIRINGS} firings of 100 bytes", "bytes"),
        memory,
    )


def print_table(header: tuple[str, str], rows: list[tuple[str, float]]) -> None:
    width = max(len(label) for label, _ in [header, *rows])
    print(f"{header[0]:<{width}}  {header[1]:>12}")
    print(f"{'-' * width}  {'-' * 12}")
    for label, value in rows:
        print(f"{label:<{width}}  {value:>12,.0f}")


if __name__ == "__main__":
    main()
