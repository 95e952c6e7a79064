"""Tags and matching readers (SPEC §15): what tags cost a send, a firing and a wake.

Every figure is measured beside repl's own plain variant in the same run,
so the ratio says what tags or a match cost: the repl column is the tagged
(or matching) figure, the reference column the plain one.

- sends with 4 tags (``TAGS``: short values, one of them a fresh ``corr``
  each send, as request and reply make them): two daemons of the same kind
  alive side by side, one sent plain sends and the other the same sends
  with tags, driven alternately, request by request for the round trip
  (the roundtrip row's method) and batch by batch for the pipelined rate
  (the pipelined row's: ``batch`` written at once, then their answers),
  on one pair durable (the default SQLite store) and one ``--memory``. A note gives
  the p99s and each daemon's CPU per send (/proc, over the timed loop).
- memory per retained firing: two fresh ``--memory`` daemons, one filled
  with plain firings and one with tagged ones, ``mem_sessions`` sessions ×
  ``mem_firings`` (each ring exactly full), the memory row's method: RSS
  growth from before the sessions were started, over the firings (the
  wake's daemon is started with them, and idles meanwhile). A note
  gives a tagged and a plain firing as the ring keeps them (``sys.getsizeof``
  of what a ring records of the request line the daemon decodes): each is
  packed into one ``bytes``, a tagged one with its tags' values.
- a matching wait's wake: one ``--memory`` daemon, settle 0, with two
  waiters in child processes of their own, woken alternately round by
  round (bench/paired_wakes.py). The matching waiter is a request's
  waiter: each round one ``wait`` with no cursor and a match on a fresh
  ``corr`` (so it looks at the whole ring first, then at each new firing
  once, SPEC §15); the producer sends ``NOISE`` firings with 4 tags that do
  not match, pipelined, waiting for their answers, checks that the wait is
  still blocked, then sends the one that matches: the time is from just
  before that send to the waiter holding it. The reference is the wake
  row's waiter (a ``wait`` on a cursor, acknowledging the last round's),
  woken by one plain send. A note gives the evaluations each firing that
  did not match cost (its send's own included).
"""

from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from bench.clients import LineClient, close_all, encode, until
from bench.measure import (
    Group,
    Setup,
    Sizes,
    fill_percentiles,
    percentile,
    percentile_rows,
    pipeline,
    run_async,
    send_request,
    start_sessions,
    stats,
)
from bench.paired_wakes import ChildProcess, Waker, alternate, children, plain_waker, waiting_on
from bench.procs import BenchError, Daemon, cpu_seconds, rss_bytes
from bench.table import Goal, Row, number

NOISE = 100  # firings that do not match, before the one that does
#: the goal's bound: a tagged send at most 1.15 × a plain one's time
SEND_BOUND = 1.15
RT_GOAL = Goal("ratio_le", SEND_BOUND, "≤ 1.15 × plain send")
PIPE_GOAL = Goal("ratio_ge", 1 / SEND_BOUND, "≥ 1/1.15 × plain send")
MEM_GOAL = Goal("ratio_le", 2.0, "≤ 2 × a plain firing")
KINDS = (("durable", False), ("--memory", True))  # the sends' daemons: label, memory


def tags(n: int) -> dict[str, str]:
    """The 4 tags of the ``n``th tagged send: short values, a fresh ``corr``."""
    return {"corr": f"c-{n:024x}", "reply-to": "agent-7", "kind": "review", "prio": "2"}


def tagged_request(session: str, n: int) -> dict[str, Any]:
    return {**send_request(session), "tags": tags(n)}


def match_value(r: int) -> str:
    """The ``corr`` the matching wait of round ``r`` waits for."""
    return f"round-{r}"


# -- sends -------------------------------------------------------------------------


@dataclass
class Pair:
    """One figure on the two daemons: the plain one's, then the tagged one's."""

    plain: Any
    tagged: Any
    cpu_us: tuple[float, float]  # each daemon's CPU per send over the timed loop
    client_us: tuple[float, float]  # this process's CPU per send, for each


class Sides:
    """A connection to each daemon (the plain one first), sending to one session each."""

    def __init__(self, daemons: tuple[Daemon, Daemon], clients: list[LineClient]) -> None:
        self.daemons = daemons
        self.clients = clients
        self.sent = 0  # tagged sends so far: each gets a fresh corr

    @classmethod
    async def open(cls, daemons: tuple[Daemon, Daemon], session: str) -> Sides:
        clients = [await LineClient.connect(d.port, d.token) for d in daemons]
        for client in clients:
            await client.ok({"op": "start", "session": session, "exist_ok": True})
        return cls(daemons, clients)

    def request(self, k: int, session: str) -> dict[str, Any]:
        if k == 0:
            return send_request(session)
        self.sent += 1
        return tagged_request(session, self.sent)

    def cpu(self) -> list[float]:
        return [cpu_seconds(d.pid) for d in self.daemons]

    async def close(self) -> None:
        await close_all(self.clients)


async def round_trips(daemons: tuple[Daemon, Daemon], s: Sizes) -> Pair:
    """ns per send on each daemon, one at a time, alternating request by request."""
    sides = await Sides.open(daemons, "rt")
    try:
        times: tuple[list[int], list[int]] = ([], [])
        client = [0, 0]
        cpu0 = sides.cpu()
        for i in range(s.warmup + s.round_trips):
            if i == s.warmup:
                cpu0 = sides.cpu()
            for k, line in enumerate(sides.clients):
                c0, t0 = time.process_time_ns(), time.perf_counter_ns()
                answer = await line.call(sides.request(k, "rt"))
                t1, c1 = time.perf_counter_ns(), time.process_time_ns()
                if not answer.get("ok"):
                    raise BenchError(f"send failed: {answer}")
                if i >= s.warmup:
                    times[k].append(t1 - t0)
                    client[k] += c1 - c0
        cpu = [(c1 - c0) * 1e6 / s.round_trips for c0, c1 in zip(cpu0, sides.cpu(), strict=True)]
        mine = [c / 1e3 / s.round_trips for c in client]
        return Pair(times[0], times[1], (cpu[0], cpu[1]), (mine[0], mine[1]))
    finally:
        await sides.close()


async def pipelined(daemons: tuple[Daemon, Daemon], total: int, batch: int) -> Pair:
    """Sends/s on each daemon: a batch to the plain one, then one to the tagged one."""
    sides = await Sides.open(daemons, "pipe")
    try:

        async def one_batch(k: int, count: int) -> None:
            # encoding is the client's work, as in the pipelined row
            lines = [encode(sides.request(k, "pipe")) for _ in range(count)]
            await pipeline(sides.clients[k], lines, count)

        for k in (0, 1):
            await one_batch(k, batch)  # warm-up
        elapsed = [0.0, 0.0]
        client = [0.0, 0.0]
        cpu0 = sides.cpu()
        done = 0
        while done < total:
            count = min(batch, total - done)
            for k in (0, 1):
                c0, t0 = time.process_time(), time.perf_counter()
                await one_batch(k, count)
                elapsed[k] += time.perf_counter() - t0
                client[k] += time.process_time() - c0
            done += count
        cpu = [(c1 - c0) * 1e6 / total for c0, c1 in zip(cpu0, sides.cpu(), strict=True)]
        mine = [c * 1e6 / total for c in client]
        return Pair(total / elapsed[0], total / elapsed[1], (cpu[0], cpu[1]), (mine[0], mine[1]))
    finally:
        await sides.close()


def start_all(*daemons: Daemon) -> None:
    """Start daemons at once (each waits on its own child's announcement); the caller's
    ``with`` stops them, started or not."""
    with ThreadPoolExecutor(len(daemons)) as pool:
        for started in [pool.submit(daemon.start) for daemon in daemons]:
            started.result()


def send_pair(setup: Setup, rows: dict[str, Row], label: str, memory: bool) -> list[str]:
    """The round trip and pipelined rows of one kind of daemon, on one pair of fresh
    daemons alive side by side (plain, tagged); the notes' parts."""
    s, key = setup.sizes, "mem" if memory else "durable"
    total = s.pipelined if memory else s.pipelined_durable
    with (
        Daemon(setup.dir(f"tags-{key}-plain"), memory=memory) as plain,
        Daemon(setup.dir(f"tags-{key}-tagged"), memory=memory) as tagged,
    ):
        start_all(plain, tagged)
        rt = run_async(round_trips((plain, tagged), s), s.deadline_s)
        pipe = run_async(pipelined((plain, tagged), total, s.batch), s.deadline_s)
    row = rows[f"tag_rt_{key}"]
    row.reference, row.repl = (percentile(t, 0.5) / 1000 for t in (rt.plain, rt.tagged))
    row = rows[f"tag_pipe_{key}"]
    row.reference, row.repl = pipe.plain, pipe.tagged
    return [
        f"{label} {us(rt.tagged)} tagged, {us(rt.plain)} plain, {cpu_text(rt)}",
        f"{label} ({total:,} each): {cpu_text(pipe)}",
    ]


# -- memory -------------------------------------------------------------------------


async def firing_memory(daemon: Daemon, s: Sizes, *, tagged: bool) -> float:
    """RSS growth per firing for sessions each filled to its ring, plain or tagged."""
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await asyncio.sleep(s.settle_s)
        rss0 = rss_bytes(daemon.pid)
        names = [f"mem-{j}" for j in range(s.mem_sessions)]
        await start_sessions(control, names, s.batch)
        n = 0
        lines = []
        for name in names:
            for _ in range(s.mem_firings):
                n += 1
                lines.append(encode(tagged_request(name, n) if tagged else send_request(name)))
        await pipeline(control, lines, s.batch)
        await asyncio.sleep(s.settle_s)
        rss1 = rss_bytes(daemon.pid)
        recorded = (await stats(control))["daemon"]["firings"]
        if recorded != len(lines):
            raise BenchError(f"the daemon recorded {recorded} of {len(lines)} firings")
        return (rss1 - rss0) / len(lines)
    finally:
        await control.close()


def firing_bytes() -> str:
    """What one retained firing holds, as the ring keeps it, for the note.

    The tagged request line is decoded by the daemon's own decoder and recorded in a
    ring as a send records it, so the bytes are the ones the daemon keeps: a firing is
    one ``bytes`` (session/packed.py), tagged or plain. Each also costs its deque slot."""
    from repl_daemon.protocol import Send, decode_request
    from session.ring import Ring

    ts = "2026-12-01T10:00:00.123Z"  # as the daemon writes one
    send = decode_request(encode(tagged_request("mem", 1_000)))
    assert isinstance(send, Send)
    ring = Ring()
    ring.record(send.handler, send.text, None, ts, tags=send.tags)
    ring.record(send.handler, send.text, None, ts)
    tagged, plain = ring.image().items
    assert isinstance(tagged, bytes) and isinstance(plain, bytes)
    values = len(tagged) - len(plain)
    return (
        f"memory per firing, as the ring keeps it (sys.getsizeof): tagged packed "
        f"{sys.getsizeof(tagged)} bytes (one bytes object: the plain one's and the 4 values, "
        f"{values} bytes with their NULs; the keys are the ring's, once); plain packed "
        f"{sys.getsizeof(plain)} bytes; each also an 8-byte deque slot; RSS adds the "
        "allocator's rounding and free lists"
    )


# -- the matching wait ----------------------------------------------------------------


@dataclass(frozen=True)
class MatchPlan:
    port: int
    token: str
    session: str
    rounds: int
    deadline_s: float


def match_child(plan: MatchPlan, pipe: Connection) -> None:
    """The matching waiter's process: a request's wait each round, reported as
    bench/waiters.py's children report."""
    try:
        asyncio.run(_match_rounds(plan, pipe))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


async def _match_rounds(plan: MatchPlan, pipe: Connection) -> None:
    async with asyncio.timeout(plan.deadline_s):
        client = await LineClient.connect(plan.port, plan.token)
        pipe.send(("ready",))
        for r in range(plan.rounds):
            wanted = match_value(r)
            match = {"tags": {"corr": wanted}}
            client.write({"op": "wait", "sessions": [plan.session], "cursor": None, "match": match})
            t_held, answer = await client.timed_answer()
            batches = answer.get("batches") or []
            firings = batches[0]["firings"] if answer.get("ok") and len(batches) == 1 else []
            if len(firings) != 1 or firings[0]["tags"].get("corr") != wanted:
                raise BenchError(f"the matching wait for {wanted} answered {answer}")
            pipe.send(("round", t_held, firings[0]["seq"]))
        await client.close()


def matching_waker(
    daemon: Daemon, control: LineClient, session: str, rounds: int, looks: list[float]
) -> Waker:
    """The matching waiter, and its producer: ``NOISE`` firings that do not match (untimed),
    then the one that does. ``looks`` gets, each round, the evaluations each firing that
    did not match cost the session (its send's own included)."""
    plan = MatchPlan(daemon.port, daemon.token, session, rounds, 600)
    blocked = waiting_on(control, session)

    async def evaluations() -> int:
        return int((await stats(control, session))["sessions"][0]["evaluations"])

    async def fire(r: int) -> tuple[int, Any]:
        before = await evaluations()
        noise = [tagged_request(session, r * NOISE + j) for j in range(NOISE)]
        await pipeline(control, [encode(request) for request in noise], NOISE)
        await until(blocked, what="the matching wait to stay blocked", interval_s=0.0005)
        looks.append((await evaluations() - before) / NOISE)
        request = tagged_request(session, r * NOISE)
        request["tags"]["corr"] = match_value(r)
        t0 = time.perf_counter_ns()
        seq = (await control.ok(request))["seq"]
        return t0, seq

    return Waker("matching", ChildProcess(match_child, plan), blocked, fire)


def wake_rounds(s: Sizes) -> tuple[int, int]:
    """Warm-up rounds and timed rounds of the matching wake: 100 and 1,000 (2 and 20)."""
    return s.warmup // 10, max(20, s.wakes // 2)


async def wakes(daemon: Daemon, s: Sizes) -> tuple[list[int], list[int], list[float]]:
    """ns per wake of the plain wait and of the matching one, alternating round by round."""
    warm, timed = wake_rounds(s)
    rounds = warm + timed
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await start_sessions(control, ["wake-plain", "wake-match"], 2)
        looks: list[float] = []
        plain = plain_waker(daemon, control, "wake-plain", rounds)
        with children([plain]) as started:
            matching = matching_waker(daemon, control, "wake-match", rounds, looks)
            started.append(matching)
            await alternate(started, rounds)
        return plain.times[warm:], matching.times[warm:], looks[warm:]
    finally:
        await control.close()


# -- the group -------------------------------------------------------------------------


def tags_rows(s: Sizes) -> list[Row]:
    kinds = (("durable", "durable"), ("--memory", "mem"))
    sends = [
        Row(f"tag_rt_{key}", f"send with 4 tags, round trip p50, {label}, µs", RT_GOAL)
        for label, key in kinds
    ] + [
        Row(f"tag_pipe_{key}", f"send with 4 tags, pipelined sends/s, {label}", PIPE_GOAL)
        for label, key in kinds
    ]
    memory = Row(
        "tag_firing_mem",
        f"memory per retained firing with 4 tags ({s.mem_sessions:,} × {s.mem_firings}), bytes",
        MEM_GOAL,
    )
    p50, p99 = percentile_rows(
        "match_wake",
        f"matching wait's wake latency {{}}, after {NOISE} firings that do not match "
        "(settle 0), µs",
        Goal("report", 0, "report (× plain wait)"),
    )
    p50.goal = Goal("ratio_le", 1.5, "≤ 1.5 × plain wait")
    return [*sends, memory, p50, p99]


def cpu_text(pair: Pair) -> str:
    daemon, client = pair.cpu_us, pair.client_us
    return (
        f"CPU per send: daemon {daemon[1]:.1f} µs tagged, {daemon[0]:.1f} plain; "
        f"client {client[1]:.1f} µs tagged, {client[0]:.1f} plain"
    )


def us(times: list[int]) -> str:
    return " / ".join(number(percentile(times, f) / 1000) for f in (0.5, 0.99))


def tags_group(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    example = ", ".join(f"{k}={v}" for k, v in tags(1).items())
    setup.notes.append(
        f"tags: a tagged send carries 4 tags ({example}; corr fresh each send); the reference "
        "column is the plain figure, on a twin daemon alive beside it (driven alternately) "
        "or, for the wake, a plain wait beside the matching one"
    )
    notes = []
    for label, memory in KINDS:
        if not memory and setup.store_missing:
            durable = [rows["tag_rt_durable"], rows["tag_pipe_durable"]]
            setup.cannot_run(durable, "store missing")
            continue
        notes.append(send_pair(setup, rows, label, memory))
    if notes:
        rt_notes, pipe_notes = zip(*notes, strict=True)
        setup.notes.append("tagged send round trip p50 / p99, µs: " + "; ".join(rt_notes))
        setup.notes.append("tagged pipelined sends, " + "; ".join(pipe_notes))

    # the memory figure's two fresh daemons, and the wake's, started at once
    row = rows["tag_firing_mem"]
    with (
        Daemon(setup.dir("tags-mem-plain"), memory=True) as plain,
        Daemon(setup.dir("tags-mem-tagged"), memory=True) as tagged,
        Daemon(setup.dir("tags-wake"), memory=True, settle_ms=0) as daemon,
    ):
        start_all(plain, tagged, daemon)
        row.reference = run_async(firing_memory(plain, s, tagged=False), s.deadline_s)
        row.repl = run_async(firing_memory(tagged, s, tagged=True), s.deadline_s)
        plain_times, match_times, looks = run_async(wakes(daemon, s), s.deadline_s)
    setup.notes.append(firing_bytes())
    fill_percentiles(rows, "match_wake", "repl", match_times)
    fill_percentiles(rows, "match_wake", "reference", plain_times)
    setup.notes.append(
        f"matching wait: {len(match_times):,} timed rounds after {wake_rounds(s)[0]}; each firing "
        f"that did not match cost the session {max(looks):.2f} evaluations at most, "
        f"{sum(looks) / len(looks):.2f} on average (its send's own included: 2 is one look)"
    )


TAGS = Group("tags", tags_rows, tags_group)
