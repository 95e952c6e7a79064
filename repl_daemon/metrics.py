"""What the daemon counts for ``/metrics``: plain counters and one histogram, no library.

The engine and the committers count as they go (an increment, no lock: one
event loop); ``repl_daemon.http`` turns these into Prometheus metrics only
when scraped, with prometheus_client. So a daemon without the ``http``
extra pays one addition a request, and never imports prometheus_client.
"""

from __future__ import annotations

import bisect
from collections import Counter

#: upper bounds of the commit-latency buckets, in seconds (a commit's fsync is ~1-10 ms)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Observations in fixed buckets: counts a bucket, their sum, and how many."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...] = COMMIT_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count at or below it)`` for every bound, then ``+Inf``: Prometheus's form."""
        rows, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            rows.append((bound, total))
        return rows


class Counts:
    """The daemon's counters by label: requests by op, refusals by wire code."""

    __slots__ = ("commits", "errors", "heads_went_back", "requests", "store_failures")

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        #: how long each write to the store took (a commit, or a Redis round trip)
        self.commits = Histogram()
        self.store_failures = 0
        #: times a session's head was answered below one answered before (Redis lost firings)
        self.heads_went_back = 0
