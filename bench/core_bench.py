"""Micro-benchmark of the pure session core: what one operation costs in memory.

Not a test: it asserts nothing and prints a table. Each figure is the best
of several timeit repeats, in nanoseconds per operation, and includes the
cost of one Python call (the first row), since every operation is timed
through a closure.

    .venv/bin/python bench/core_bench.py
"""

from __future__ import annotations

import sys
import timeit
from collections.abc import Callable

from session import MAX_KEYS, MAX_LIMIT, Session

REPEATS = 7


def best_ns(operation: Callable[[], object], number: int | None = None) -> float:
    """The best of ``REPEATS`` timeit runs, in ns per call."""
    timer = timeit.Timer(operation)
    if number is None:
        number, _ = timer.autorange()
    return min(timer.repeat(repeat=REPEATS, number=number)) / number * 1e9


def full_session(limit: int) -> Session:
    session = Session("bench", limit)
    for n in range(limit + 10):
        session.record("on-message", f"message {n}", "2024-01-01T00:00:00.000Z")
    return session


def main() -> None:
    rows: list[tuple[str, float]] = []

    rows.append(("an empty call (overhead, included below)", best_ns(lambda: None)))

    small = full_session(256)
    rows.append(
        (
            "record a firing (full ring of 256)",
            best_ns(lambda: small.record("on-message", "hello", "2024-01-01T00:00:00.000Z")),
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

    number = 20_000
    keyed = full_session(256)
    for n in range(MAX_KEYS):  # a full dedup window, so every new key also forgets one
        keyed.record("on-message", "warm", "t", f"warm {n}")
    fresh = iter([f"key {n}" for n in range(number * REPEATS)])
    rows.append(
        (
            "keyed send, new key (full window of 1,024)",
            best_ns(lambda: keyed.record("on-message", "hello", "t", next(fresh)), number),
        )
    )
    rows.append(
        (
            "keyed send, duplicate key",
            best_ns(lambda: keyed.record("on-message", "hello", "t", "key 0"), number),
        )
    )

    width = max(len(label) for label, _ in rows)
    print(f"{'operation':<{width}}  {'ns/op':>12}")
    print(f"{'-' * width}  {'-' * 12}")
    for label, ns in rows:
        print(f"{label:<{width}}  {ns:>12,.0f}")
    print(f"\nbest of {REPEATS} repeats; Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
