"""HTTP beside the line protocol (docs/http.md): what the same figure costs over HTTP.

Every row is measured twice in one run on the same daemon: over the HTTP
routes (``repl daemon --http``), and over the line protocol, which is the
reference column, so the ratio says what HTTP costs over JSON lines. The
daemon is durable (the default SQLite store, in a temporary home) with
``--settle-ms 0``, as for the wake and timer rows. The HTTP client is the
benchmark's own (bench/clients.py: HTTP/1.1 written by hand on asyncio
streams, one keep-alive connection), so both sides pay the same kind of
client.

- send round trip: ``POST /sessions/{id}/firings`` one at a time on one
  keep-alive connection, alternating request by request with a ``send`` of
  the line protocol on one connection (another session), after a warm-up.
- the same with a stock client: the standard library's ``http.client`` on
  one keep-alive connection, against a ``--memory`` daemon on the asyncio
  loop (what ``pip install 'repl-inbox[http]'`` runs: no uvloop), the line
  protocol's ``send`` on that daemon beside it. It is the row that shows an answer held
  back on a keep-alive connection (Nagle's algorithm and the client's
  delayed ACK: 40 ms each before the daemon set ``TCP_NODELAY``), which the
  row above, on uvloop when it is installed, could not: uvloop sets
  ``TCP_NODELAY`` itself.
- wake: one event stream (``GET /sessions/{id}/events``) in a child process
  (bench/waiters.py), woken by a ``send`` over TCP; the reference is one
  ``wait`` blocked in the same kind of child, re-issued with its ack each
  round, woken the same way: from just before the send is written to the
  child holding the firing.
- long-poll wake: one ``GET /sessions/{id}/wait`` blocked in the same kind of
  child on a keep-alive connection, re-issued with its ``ack`` each round as
  the TCP wait is, woken the same way; its reference is that TCP wait's
  rounds of the same run, measured just before it.
- fan-out: ``http_streams`` event streams on one session, one send, until
  the last of them holds the firing; the reference: as many connections
  blocked in ``wait`` (one shared cursor), the fan-out row's method; the
  median of ``fanout_rounds`` rounds after a warm-up round, for each.
- memory: on a fresh daemon, RSS growth over ``http_streams`` blocked
  ``wait`` connections (one shared cursor), then over as many open event
  streams (one of each is opened before, so what the first of a kind
  costs once is not counted), each divided by their number.

The module is not named ``http``: run as ``python bench/run.py``, this
directory is on ``sys.path``, and it would shadow the standard library's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from http.client import HTTPConnection
from importlib.util import find_spec

from bench.clients import (
    EventStream,
    HttpClient,
    LineClient,
    close_all,
    connect_many,
    encode,
    until,
)
from bench.measure import (
    PAYLOAD,
    Group,
    Setup,
    Sizes,
    percentile,
    run_async,
    send_request,
    stats,
)
from bench.procs import HOST, BenchError, Daemon, raise_nofile, rss_bytes
from bench.table import Goal, Row
from bench.waiters import repl_rounds

# what ``repl daemon --http`` imports (repl_daemon.http.extra.check_installed)
HTTP_MODULES = ("starlette", "uvicorn", "sse_starlette", "prometheus_client")
HTTP_HINT = (
    "the http rows need the http extra (Starlette, uvicorn, sse-starlette, prometheus_client): "
    "`pip install -c constraints.txt -e '.[bench]'`, which brings it (or the `http` extra)"
)
KEYS = ("http_rt", "http_keepalive", "http_wake", "http_poll_wake", "http_fanout", "http_mem")


def http_missing() -> bool:
    return any(find_spec(module) is None for module in HTTP_MODULES)


def http_daemon(setup: Setup, name: str) -> Daemon:
    return Daemon(setup.dir(name), memory=False, settle_ms=0, http=True)


# -- send round trip -------------------------------------------------------------


async def round_trips(daemon: Daemon, s: Sizes) -> tuple[list[int], list[int]]:
    """Nanoseconds per send over HTTP and over the line protocol, alternating, after a warm-up."""
    line = await LineClient.connect(daemon.port, daemon.token)
    web = await HttpClient.connect(daemon.http_port, daemon.token)
    try:
        for session in ("rt-http", "rt-line"):
            await line.ok({"op": "start", "session": session})
        path = "/sessions/rt-http/firings"
        body = PAYLOAD.encode()
        request = send_request("rt-line")
        over_http: list[int] = []
        over_line: list[int] = []
        for i in range(s.http_warmup + s.http_round_trips):
            t0 = time.perf_counter_ns()
            answer = await web.post(path, body)
            t1 = time.perf_counter_ns()
            if answer != {"seq": i + 1, "duplicate": False}:
                raise BenchError(f"POST {path} #{i + 1} answered {answer}")
            t2 = time.perf_counter_ns()
            sent = await line.call(request)
            t3 = time.perf_counter_ns()
            if not sent.get("ok"):
                raise BenchError(f"send failed: {sent}")
            if i >= s.http_warmup:
                over_http.append(t1 - t0)
                over_line.append(t3 - t2)
        return over_http, over_line
    finally:
        await line.close()
        await web.close()


# -- a stock client on one keep-alive connection ---------------------------------


async def stock_round_trips(daemon: Daemon, s: Sizes) -> tuple[list[int], list[int]]:
    """Nanoseconds per POST of ``http.client`` on one keep-alive connection, and per send of
    the line protocol, alternating, after a warm-up. ``http.client`` blocks: each POST runs
    in a thread and is timed there, so the hop to the thread is not counted."""
    line = await LineClient.connect(daemon.port, daemon.token)
    conn = HTTPConnection(HOST, daemon.http_port, timeout=30)
    path = "/sessions/ka-http/firings"
    body = PAYLOAD.encode()
    headers = {
        "Authorization": f"Bearer {daemon.token}",
        "Content-Type": "text/plain; charset=utf-8",
    }
    kept: list[object] = []  # the connection's socket: the same one for every POST

    def post(seq: int) -> int:
        t0 = time.perf_counter_ns()
        conn.request("POST", path, body, headers)
        answer = conn.getresponse()
        data = answer.read()
        t1 = time.perf_counter_ns()
        if answer.status != 201 or json.loads(data) != {"seq": seq, "duplicate": False}:
            raise BenchError(f"POST {path} #{seq} answered {answer.status} {data[:200]!r}")
        kept.append(conn.sock)
        if conn.sock is None or conn.sock is not kept[0]:
            raise BenchError(f"POST {path} #{seq}: the keep-alive connection was not kept")
        return t1 - t0

    try:
        for session in ("ka-http", "ka-line"):
            await line.ok({"op": "start", "session": session})
        request = send_request("ka-line")
        over_http: list[int] = []
        over_line: list[int] = []
        for i in range(s.http_warmup + s.http_round_trips):
            took = await asyncio.to_thread(post, i + 1)
            t2 = time.perf_counter_ns()
            sent = await line.call(request)
            t3 = time.perf_counter_ns()
            if not sent.get("ok"):
                raise BenchError(f"send failed: {sent}")
            if i >= s.http_warmup:
                over_http.append(took)
                over_line.append(t3 - t2)
            kept[1:] = []
        return over_http, over_line
    finally:
        conn.close()
        await line.close()


# -- wake and fan-out ------------------------------------------------------------


@dataclass
class Rounds:
    """Per round, ns from before the send to the (last) waiter holding it: HTTP (an event
    stream; for the wakes, a long poll too), then TCP."""

    sse: list[int]
    tcp: list[int]
    poll: list[int] | None = None


async def wakes(daemon: Daemon, s: Sizes) -> Rounds:
    warm = max(1, s.http_wakes // 10)
    rounds = warm + s.http_wakes
    sse = await repl_rounds(daemon, "wake-sse", 1, rounds, kind="sse")
    tcp = await repl_rounds(daemon, "wake-tcp", 1, rounds)
    poll = await repl_rounds(daemon, "wake-poll", 1, rounds, kind="longpoll")
    return Rounds(sse[warm:], tcp[warm:], poll[warm:])


async def fanouts(daemon: Daemon, s: Sizes) -> Rounds:
    rounds = s.fanout_rounds + 1  # the first round warms up
    sse = await repl_rounds(daemon, "fan-sse", s.http_streams, rounds, kind="sse")
    tcp = await repl_rounds(daemon, "fan-tcp", s.http_streams, rounds)
    return Rounds(sse[1:], tcp[1:])


# -- memory ------------------------------------------------------------------------


@dataclass
class Memory:
    per_stream: float
    per_wait: float
    rss0: int
    rss1: int
    rss2: int


async def memory(daemon: Daemon, s: Sizes) -> Memory:
    """RSS growth per blocked ``wait`` connection, then per open event stream, on one daemon."""
    session, n = "mem", s.http_streams
    control = await LineClient.connect(daemon.port, daemon.token)
    waits: list[LineClient] = []
    streams: list[EventStream] = []
    auth = encode({"op": "auth", "token": daemon.token})
    wait = encode({"op": "wait", "sessions": [session], "cursor": "mem"})

    async def open_wait(_i: int) -> LineClient:
        client = await LineClient.connect(daemon.port)
        client.write_raw(auth + wait)
        answer = await client.answer()
        if not answer.get("ok"):
            raise BenchError(f"auth failed: {answer}")
        waits.append(client)
        return client

    async def open_stream(_i: int) -> EventStream:
        stream = await EventStream.open(daemon.http_port, daemon.token, session)
        streams.append(stream)
        return stream

    async def waiting(count: int) -> None:
        async def probe() -> bool:
            row = (await stats(control, session))["sessions"][0]
            return bool(row["waiters"] == count)

        await until(probe, what=f"{count:,} waiters on {session}", deadline_s=120)

    try:
        await control.ok({"op": "start", "session": session})
        await open_wait(-1)
        await open_stream(-1)
        await waiting(2)
        await asyncio.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        await connect_many(n, open_wait)
        await waiting(n + 2)
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(daemon.pid)
        await connect_many(n, open_stream)
        await waiting(2 * n + 2)
        await asyncio.sleep(s.settle_s)
        rss2 = rss_bytes(daemon.pid)
        # one send wakes them all: this also proves each one was really waiting
        seq = (await control.ok(send_request(session)))["seq"]
        answers = await asyncio.gather(*(w.answer() for w in waits))
        held = await asyncio.gather(*(st.firing() for st in streams))
        woken = sum(1 for a in answers if a.get("ok") and a.get("batches"))
        if woken != len(waits) or any(firing["seq"] != seq for _t, firing in held):
            raise BenchError(f"{woken} of {len(waits)} waits woken; streams held {len(held)}")
        return Memory((rss2 - rss1) / n, (rss1 - rss0) / n, rss0, rss1, rss2)
    finally:
        await close_all([control, *waits])
        await asyncio.gather(*(st.close() for st in streams), return_exceptions=True)


# -- the rows ----------------------------------------------------------------------


def http_rows(s: Sizes) -> list[Row]:
    n = s.http_streams
    return [
        Row(
            "http_rt",
            f"HTTP send round trip p50 ({s.http_round_trips:,} POSTs, one keep-alive "
            "connection, durable, settle 0), ms",
            Goal("report", 0, "report (× line protocol send)"),
        ),
        Row(
            "http_keepalive",
            f"HTTP send round trip p50, stock client (http.client, {s.http_round_trips:,} "
            "POSTs on one keep-alive connection, asyncio loop, --memory), ms",
            Goal("report", 0, "report (× line protocol send)"),
        ),
        Row(
            "http_wake",
            "SSE wake latency p50 (one event stream, woken by a TCP send, settle 0), ms",
            Goal("report", 0, "report (× a blocked TCP wait)"),
        ),
        Row(
            "http_poll_wake",
            "HTTP long-poll wake latency p50 (one GET /sessions/ID/wait, woken by a TCP send, "
            "settle 0), ms",
            Goal("ratio_le", 1.5, "≤ 1.5 × a blocked TCP wait"),
        ),
        Row(
            "http_fanout",
            f"SSE fan-out, one send to {n:,} event streams (settle 0), ms",
            Goal("ratio_le", 1.5, f"≤ 1.5 × {n:,} blocked TCP waits"),
        ),
        Row(
            "http_mem",
            f"memory per open event stream ({n:,} streams), bytes",
            Goal("abs_le", 12 * 1024, "≤ 12 KiB (12,288 bytes)"),
        ),
    ]


def ms(times: list[int], fraction: float) -> float:
    return percentile(times, fraction) / 1e6


def p50_p99(name: str, over_http: list[int], over_line: list[int]) -> str:
    return (
        f"{name} p50 / p99, ms: HTTP {ms(over_http, 0.5):.3f} / {ms(over_http, 0.99):.3f}, "
        f"line protocol {ms(over_line, 0.5):.3f} / {ms(over_line, 0.99):.3f}"
    )


def http(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    if http_missing() or setup.store_missing:
        if http_missing():
            setup.cannot_run([rows[key] for key in KEYS], "http extra missing", HTTP_HINT)
        else:
            setup.cannot_run([rows[key] for key in KEYS], "store missing")
        return
    # this process holds a connection a stream and a wait in the memory figure; so does the daemon
    raise_nofile(2 * s.http_streams + 1_000)

    async def sends_and_wakes(daemon: Daemon) -> tuple[list[int], list[int], Rounds, Rounds]:
        over_http, over_line = await round_trips(daemon, s)
        return over_http, over_line, await wakes(daemon, s), await fanouts(daemon, s)

    with http_daemon(setup, "http-daemon").start() as daemon:
        over_http, over_line, wake, fan = run_async(sends_and_wakes(daemon), s.deadline_s)
    rows["http_rt"].repl = ms(over_http, 0.5)
    rows["http_rt"].reference = ms(over_line, 0.5)
    # a daemon of its own, on asyncio whether or not uvloop is here (this module's top), in
    # memory: what this row is about is the connection, not the disk
    stock = Daemon(setup.dir("http-stock-daemon"), memory=True, http=True, loop="asyncio")
    with stock.start() as daemon:
        stock_http, stock_line = run_async(stock_round_trips(daemon, s), s.deadline_s)
    rows["http_keepalive"].repl = ms(stock_http, 0.5)
    rows["http_keepalive"].reference = ms(stock_line, 0.5)
    rows["http_wake"].repl = ms(wake.sse, 0.5)
    rows["http_wake"].reference = ms(wake.tcp, 0.5)
    assert wake.poll is not None
    rows["http_poll_wake"].repl = ms(wake.poll, 0.5)
    rows["http_poll_wake"].reference = ms(wake.tcp, 0.5)
    rows["http_fanout"].repl = statistics.median(fan.sse) / 1e6
    rows["http_fanout"].reference = statistics.median(fan.tcp) / 1e6
    setup.notes.append(p50_p99("HTTP send round trip", over_http, over_line))
    setup.notes.append(
        p50_p99("HTTP send round trip, http.client, asyncio loop", stock_http, stock_line)
    )
    setup.notes.append(p50_p99(f"SSE wake ({s.http_wakes} wakes)", wake.sse, wake.tcp))
    setup.notes.append(p50_p99(f"long-poll wake ({s.http_wakes} wakes)", wake.poll, wake.tcp))
    setup.notes.append(
        f"SSE fan-out: median of {s.fanout_rounds} rounds (ms): event streams "
        + " ".join(f"{t / 1e6:.1f}" for t in fan.sse)
        + "; TCP waits "
        + " ".join(f"{t / 1e6:.1f}" for t in fan.tcp)
    )
    with http_daemon(setup, "http-memory-daemon").start() as daemon:
        mem = run_async(memory(daemon, s), s.deadline_s)
    rows["http_mem"].repl = mem.per_stream
    rows["http_mem"].reference = mem.per_wait
    setup.notes.append(
        f"memory per stream: daemon RSS {mem.rss0 / 2**20:.1f} MiB, "
        f"{mem.rss1 / 2**20:.1f} with {s.http_streams:,} blocked waits, "
        f"{mem.rss2 / 2**20:.1f} with as many event streams too"
    )


HTTP = Group("http", http_rows, http)
