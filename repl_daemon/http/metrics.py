"""``GET /metrics``'s output: the engine's counters (``repl_daemon.metrics``) as a
prometheus_client collector, read at each scrape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

if TYPE_CHECKING:
    from repl_daemon.engine import Engine
    from repl_daemon.engine.committer import Totals


class Collector:
    """A prometheus_client collector of the engine's counters as they are at this scrape.

    Names and units are Prometheus's (``_total`` for counters, seconds); no
    label is a session id, so the number of series does not grow with the
    sessions.
    """

    def __init__(self, engine: Engine, totals: Totals) -> None:
        self.engine = engine
        self.totals = totals

    def collect(self) -> Iterator[Any]:

        engine, counts = self.engine, self.engine.counts
        yield CounterMetricFamily(
            "repl_firings", "Firings this daemon recorded (sends and timers).", engine.firings
        )
        requests = CounterMetricFamily("repl_requests", "Requests handled, by op.", labels=["op"])
        for op, n in sorted(counts.requests.items()):
            requests.add_metric([op], n)
        yield requests
        errors = CounterMetricFamily("repl_errors", "Refusals, by wire code.", labels=["code"])
        for code, n in sorted(counts.errors.items()):
            errors.add_metric([code], n)
        yield errors
        commits = counts.commits  # the committer's writes (with Redis: its round trips)
        yield HistogramMetricFamily(
            "repl_commit_seconds",
            "How long a write to the store took: a group commit, or a Redis round trip.",
            buckets=commits.cumulative(),
            sum_value=commits.sum,
        )
        yield CounterMetricFamily(
            "repl_store_failures",
            "Writes the store refused or did not answer.",
            counts.store_failures,
        )
        yield CounterMetricFamily(
            "repl_heads_went_back",
            "Times a session's head came back from Redis below one this daemon had learned: "
            "Redis lost answered firings (a failover to a lagging replica), and their seqs go "
            "to new ones.",
            counts.heads_went_back,
        )
        yield GaugeMetricFamily("repl_sessions", "Sessions in the store.", self.totals.sessions)
        yield GaugeMetricFamily(
            "repl_lost_firings",
            "Firings the rings let go of before a reader read them.",
            self.totals.lost,
        )
        yield GaugeMetricFamily(
            "repl_waiters", "Waits blocked now (event streams too).", engine.waiting
        )
        yield GaugeMetricFamily(
            "repl_connections", "Connections of the line protocol open now.", engine.connections
        )
        yield GaugeMetricFamily(
            "repl_uptime_seconds", "Seconds since the daemon started.", engine.uptime()
        )
