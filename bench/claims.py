"""The ``claims`` group (issue 41, SPEC §16): jobs through groups and claims, a claimer's
wake, idle claimers.

- jobs a second: a session pre-filled with ``jobs`` firings (its ring set large
  enough with ``buffer``, so none is dropped), then ``WORKERS`` workers, each an
  asyncio task on a connection of its own in this process, each looping ``claim``
  (group ``work``, lease 60 s, ``timeout_ms`` 0: a claim that finds nothing ready
  answers at once, and the worker stops) then ``done`` with its token, one request
  at a time, until every job is done; from the first claim to the last worker
  stopped. The reference is Redis Streams' consumer group doing the same: a stream
  pre-filled with as many entries, a group ``g`` created at its start, the same
  number of workers (redis.asyncio, one connection each) looping ``XREADGROUP
  GROUP g wN COUNT 1 STREAMS s >`` then ``XACK`` until a read comes back empty.
  Two rows: ``--memory`` against redis-server without persistence, and the
  daemon's durable SQLite store (a claim and a done each answered once committed)
  against redis-server with ``appendonly yes``, ``appendfsync always`` (bench/procs.py
  starts both as the other rows do). Each kind first drains a warm-up batch the
  same way, untimed. Afterwards every job must have been claimed once (attempt 1,
  no seq twice), the group must report every firing done and none held (Redis: no
  entry pending), or the figure fails. A third row, ``done --next``: the durable
  daemon again, each worker claiming once and then looping ``done_next`` (the done
  and the next claim in one request, one commit) on the claim it holds until one
  finds nothing; against the same Redis ``appendfsync always`` figure of this run.
  Workers are tasks, not processes: a note gives the CPU per job of the server
  (/proc) and of this client process over the timed drain, so a client that bounds
  a figure shows there (on 2 cores, worker processes would take the server's core,
  not add one).
- a blocked claimer's wake: one ``--memory`` daemon, settle 0 (the wake row's kind),
  with a claimer and a waiter each in a child process of its own, woken
  alternately round by round by one plain ``send`` each (bench/paired_wakes.py):
  the claimer blocked in ``claim`` on its session (no timeout), the waiter in
  ``wait`` on a cursor on another session (the wake row's waiter,
  bench/waiters.py); each from just before the send to the answer in hand (the
  claimer then finishes the job with ``done``, untimed, before it claims again).
  The p50 is the row; the p99 and the same pair on a durable daemon are in a note.
- idle claimers: ``idle_claimers`` connections blocked in ``claim`` on one empty
  session (one group: a queue with that many idle workers) of a ``--memory``
  daemon; once the daemon counts them all among its waiters, its CPU (/proc) and
  its evaluations (``stats``) over the idle window, both of which should not move.
  Then one send, which should wake one claimer (a note gives the evaluations it
  cost: a wake that looked at every claimer would show here), and one more send
  each for the others: every claimer must take exactly one job (so each was
  really blocked).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from bench.clients import LineClient, close_all, connect_many, encode, redis_client, until
from bench.measure import (
    PAYLOAD,
    Group,
    Setup,
    Sizes,
    on_daemon,
    on_redis,
    percentile,
    pipeline,
    send_request,
    start_sessions,
    stats,
)
from bench.paired_wakes import (
    ChildProcess,
    Waker,
    alternate,
    children,
    plain_waker,
    send_fire,
    waiting_on,
)
from bench.procs import BenchError, Daemon, RedisServer, cpu_seconds
from bench.table import Goal, Row, number

WORKERS = 4
GROUP = "work"
LEASE_MS = 60_000
LIMIT = 65_536  # the largest ring ``buffer`` sets: every job stays in it
KINDS = (("--memory", "mem", True), ("durable", "durable", False))  # label, key, memory


def job_counts(s: Sizes) -> tuple[int, int, int]:
    """Warm-up jobs, and timed jobs in memory and durable: 1,000, 20,000 and 5,000
    (250, 400 and 125 quick); Redis's ``appendfsync always`` does a few hundred a second."""
    return s.batch, s.pipelined // 5, s.pipelined_durable // 4


def wake_rounds(s: Sizes) -> tuple[int, int]:
    """Warm-up rounds and timed rounds of the wakes: 100 and 1,000 (2 and 20 quick)."""
    return s.warmup // 10, max(20, s.wakes // 2)


# -- jobs a second --------------------------------------------------------------------


@dataclass
class Drain:
    """One timed drain: jobs a second, and CPU µs a job of the server and of this client."""

    rate: float
    server_us: float
    client_us: float


async def timed(
    pid: int, jobs: int, workers: list[Any], work: Any, check: Any
) -> tuple[Drain, list[Any]]:
    """Run ``work(worker)`` on every worker at once; the rate over ``jobs`` and the CPU."""
    server0, client0 = cpu_seconds(pid), time.process_time()
    t0 = time.perf_counter()
    results = await asyncio.gather(*(work(w) for w in workers))
    elapsed = time.perf_counter() - t0
    server, client = cpu_seconds(pid) - server0, time.process_time() - client0
    check(results)
    return Drain(jobs / elapsed, server * 1e6 / jobs, client * 1e6 / jobs), results


async def repl_drain(
    daemon: Daemon, warm: int, jobs: int, batch: int, take_next: bool = False
) -> Drain:
    session = "jobs"
    control = await LineClient.connect(daemon.port, daemon.token)
    workers: list[LineClient] = []
    try:
        await control.ok({"op": "start", "session": session})
        await control.ok({"op": "buffer", "session": session, "limit": LIMIT})
        workers = [await LineClient.connect(daemon.port, daemon.token) for _ in range(WORKERS)]
        claim: dict[str, Any] = {"op": "claim", "session": session, "group": GROUP}
        claim |= {"lease_ms": LEASE_MS, "timeout_ms": 0}

        async def work(client: LineClient) -> list[int]:
            seqs: list[int] = []
            while True:
                answer = await client.call(claim)
                if answer.get("timed_out"):
                    return seqs
                if not answer.get("ok") or answer.get("attempt") != 1:
                    raise BenchError(f"a claim answered {answer}")
                done = {"op": "done", "session": session, "claim": answer["claim"]}
                finished = await client.call(done)
                if not finished.get("ok") or finished.get("seq") != answer["seq"]:
                    raise BenchError(f"done of {answer['claim']} answered {finished}")
                seqs.append(answer["seq"])

        async def work_next(client: LineClient) -> list[int]:
            """One claim, then ``done_next`` on the claim held until one finds nothing."""
            seqs: list[int] = []
            answer = await client.call(claim)
            while not answer.get("timed_out"):
                if not answer.get("ok") or answer.get("attempt") != 1:
                    raise BenchError(f"a claim answered {answer}")
                seqs.append(answer["seq"])
                following = {"op": "done_next", "session": session, "claim": answer["claim"]}
                answer = await client.call(following | {"lease_ms": LEASE_MS, "timeout_ms": 0})
            if not answer.get("ok"):
                raise BenchError(f"a done --next answered {answer}")
            return seqs

        head = 0
        drain = Drain(0, 0, 0)
        for count in (warm, jobs):
            await pipeline(control, [encode(send_request(session))] * count, batch)
            expected = set(range(head + 1, head + count + 1))
            head += count

            def check(results: list[list[int]], expected: set[int] = expected) -> None:
                seqs = [seq for each in results for seq in each]
                if len(seqs) != len(expected) or set(seqs) != expected:
                    raise BenchError(f"{len(seqs)} jobs done of {len(expected)}, or some twice")

            drain, _ = await timed(
                daemon.pid, count, workers, work_next if take_next else work, check
            )
        groups = (await control.ok({"op": "groups", "session": session}))["groups"]
        work_group = next(g for g in groups if g["name"] == GROUP)
        if work_group["done"] != head or work_group["held"] or work_group["ready"]:
            raise BenchError(f"after {head} jobs done the group says {work_group}")
        return drain
    finally:
        await close_all([control, *workers])


async def redis_drain(redis: RedisServer, warm: int, jobs: int, batch: int) -> Drain:
    stream, group = "jobs", "g"
    control = redis_client(redis.port)
    workers: list[Any] = []
    try:
        await control.xgroup_create(stream, group, id="0", mkstream=True)
        workers = [redis_client(redis.port) for _ in range(WORKERS)]
        names = {id(w): f"w{i}" for i, w in enumerate(workers)}

        async def work(client: Any) -> list[bytes]:
            ids: list[bytes] = []
            while True:
                reply = await client.xreadgroup(group, names[id(client)], {stream: ">"}, count=1)
                if not reply:
                    return ids
                entry_id = reply[0][1][0][0]
                if await client.xack(stream, group, entry_id) != 1:
                    raise BenchError(f"XACK of {entry_id!r} acknowledged nothing")
                ids.append(entry_id)

        drain = Drain(0, 0, 0)
        for count in (warm, jobs):
            for first in range(0, count, batch):
                async with control.pipeline(transaction=False) as pipe:
                    for _ in range(min(batch, count - first)):
                        pipe.xadd(stream, {"text": PAYLOAD})
                    await pipe.execute()

            def check(results: list[list[bytes]], count: int = count) -> None:
                ids = [entry for each in results for entry in each]
                if len(ids) != count or len(set(ids)) != count:
                    raise BenchError(f"{len(ids)} entries acknowledged of {count}, or some twice")

            drain, _ = await timed(redis.pid, count, workers, work, check)
        pending = await control.xpending(stream, group)
        if pending["pending"]:
            raise BenchError(f"entries still pending after the drain: {pending}")
        return drain
    finally:
        await asyncio.gather(*(w.aclose() for w in workers), return_exceptions=True)
        await control.aclose()


# -- a blocked claimer's wake ---------------------------------------------------------


@dataclass(frozen=True)
class ClaimPlan:
    port: int
    token: str
    session: str
    rounds: int
    deadline_s: float


def claim_child(plan: ClaimPlan, pipe: Connection) -> None:
    """The claimer's process: a blocked claim each round, reported as bench/waiters.py's
    children report; the job is done (untimed) before the report."""
    try:
        asyncio.run(_claim_rounds(plan, pipe))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


async def _claim_rounds(plan: ClaimPlan, pipe: Connection) -> None:
    async with asyncio.timeout(plan.deadline_s):
        client = await LineClient.connect(plan.port, plan.token)
        pipe.send(("ready",))
        claim = {"op": "claim", "session": plan.session, "group": GROUP, "lease_ms": LEASE_MS}
        line = encode(claim)
        for _round in range(plan.rounds):
            client.write_raw(line)
            t_held, answer = await client.timed_answer()
            if not answer.get("ok") or not answer.get("claim") or answer.get("attempt") != 1:
                raise BenchError(f"a blocked claim answered {answer}")
            await client.ok({"op": "done", "session": plan.session, "claim": answer["claim"]})
            pipe.send(("round", t_held, answer["seq"]))
        await client.close()


async def wakes(daemon: Daemon, s: Sizes) -> tuple[list[int], list[int]]:
    """ns per wake of the blocked claim and of the blocked wait, alternating round by round."""
    warm, timed_rounds = wake_rounds(s)
    rounds = warm + timed_rounds
    control = await LineClient.connect(daemon.port, daemon.token)
    try:
        await start_sessions(control, ["wake-wait", "wake-claim"], 2)
        plain = plain_waker(daemon, control, "wake-wait", rounds)
        with children([plain]) as started:
            plan = ClaimPlan(daemon.port, daemon.token, "wake-claim", rounds, 600)
            blocked, fire = waiting_on(control, "wake-claim"), send_fire(control, "wake-claim")
            claimer = Waker("claim", ChildProcess(claim_child, plan), blocked, fire)
            started.append(claimer)
            await alternate(started, rounds)
        return claimer.times[warm:], plain.times[warm:]
    finally:
        await control.close()


# -- idle claimers ---------------------------------------------------------------------


@dataclass
class IdleClaims:
    cpu_percent: float
    evaluations: int
    one_wake_evaluations: int  # what the first send and the one claim it woke cost
    all_wake_evaluations: int  # the sends that woke the others, and their claims


async def idle_claims(daemon: Daemon, s: Sizes) -> IdleClaims:
    count, session = s.idle_sessions, "idle-claims"
    control = await LineClient.connect(daemon.port, daemon.token)
    claimers: list[LineClient] = []
    try:
        await control.ok({"op": "start", "session": session})
        auth = encode({"op": "auth", "token": daemon.token})
        claim = encode({"op": "claim", "session": session, "group": GROUP, "lease_ms": LEASE_MS})

        async def open_claimer(_i: int) -> LineClient:
            client = await LineClient.connect(daemon.port)
            client.write_raw(auth + claim)
            answer = await client.answer()
            if not answer.get("ok"):
                raise BenchError(f"auth failed: {answer}")
            return client

        claimers = await connect_many(count, open_claimer)

        async def evaluations() -> int:
            return int((await stats(control))["daemon"]["evaluations"])

        async def blocked(n: int) -> bool:
            return bool((await stats(control))["daemon"]["waiters"] == n)

        await until(lambda: blocked(count), what=f"{count:,} blocked claims", deadline_s=120)
        await asyncio.sleep(s.settle_s)  # let the accept burst settle before measuring
        evaluations0 = await evaluations()
        cpu0, t0 = cpu_seconds(daemon.pid), time.monotonic()
        await asyncio.sleep(s.idle_window_s)
        cpu1, t1 = cpu_seconds(daemon.pid), time.monotonic()
        evaluations1 = await evaluations()

        answers = {asyncio.ensure_future(c.answer()): c for c in claimers}
        await control.ok(send_request(session))
        first, _ = await asyncio.wait(answers, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        await until(lambda: blocked(count - 1), what="the other claims to stay blocked")
        evaluations2 = await evaluations()
        await pipeline(control, [encode(send_request(session))] * (count - 1), s.batch)
        taken = await asyncio.wait_for(asyncio.gather(*answers), 60)
        evaluations3 = await evaluations()
        seqs = sorted(a.get("seq", 0) for a in taken if a.get("ok") and a.get("claim"))
        if len(first) != 1 or seqs != list(range(1, count + 1)):
            raise BenchError(f"{len(seqs)} of {count} claimers took a job, {len(first)} first")
        return IdleClaims(
            100 * (cpu1 - cpu0) / (t1 - t0),
            evaluations1 - evaluations0,
            evaluations2 - evaluations1,
            evaluations3 - evaluations2,
        )
    finally:
        await close_all([control, *claimers])


# -- the group -------------------------------------------------------------------------


def claims_rows(s: Sizes) -> list[Row]:
    _warm, *jobs = job_counts(s)
    redis = "Redis XREADGROUP COUNT 1 + XACK"
    goals = {
        "mem": Goal("ratio_ge", 0.8, f"≥ 0.8 × {redis}"),
        "durable": Goal("ratio_ge", 0.5, f"≥ 0.5 × {redis}, appendfsync always"),
    }
    idle = f"{s.idle_sessions:,} idle claims on one session"
    window = f"{s.idle_window_s:g} s"
    return [
        *(
            Row(
                f"claims_{key}",
                f"claim then done, jobs/s, {WORKERS} workers, {n:,} jobs, {label}",
                goals[key],
            )
            for (label, key, _memory), n in zip(KINDS, jobs, strict=True)
        ),
        Row(
            "claims_next_durable",
            f"done --next, jobs/s, {WORKERS} workers, {jobs[1]:,} jobs, durable",
            Goal("ratio_ge", 1.0, f"≥ 1.0 × {redis}, appendfsync always"),
        ),
        Row(
            "claim_wake_p50",
            "blocked claim's wake latency p50 (settle 0), µs",
            Goal("ratio_le", 1.2, "≤ 1.2 × a blocked wait's"),
        ),
        Row(
            "claim_idle_cpu",
            f"{idle}: daemon CPU over {window}, % of a core",
            Goal("abs_eq", 0, "= 0 %"),
        ),
        Row("claim_idle_evals", f"{idle}: evaluations over {window}", Goal("abs_eq", 0, "= 0")),
    ]


def us(times: list[int]) -> str:
    return " / ".join(number(percentile(times, f) / 1000) for f in (0.5, 0.99))


def cpu_text(drain: Drain) -> str:
    return f"{number(drain.rate)}/s (server {drain.server_us:.0f} µs, client {drain.client_us:.0f})"


def claims_group(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    warm, *jobs = job_counts(s)
    drains = []
    for (label, key, memory), count in zip(KINDS, jobs, strict=True):
        row = rows[f"claims_{key}"]
        if not memory and setup.store_missing:
            setup.cannot_run([row, rows["claims_next_durable"]], "store missing")
            continue
        mine = on_daemon(
            setup,
            f"claims-{key}-daemon",
            partial(repl_drain, warm=warm, jobs=count, batch=s.batch),
            memory=memory,
        )
        row.repl = mine.rate
        ref = on_redis(
            setup,
            f"claims-{key}-redis",
            partial(redis_drain, warm=warm, jobs=count, batch=s.batch),
            durable=not memory,
        )
        text = f"{label}: repl {cpu_text(mine)}"
        if ref is not None:
            row.reference = ref.rate
            text += f", Redis {cpu_text(ref)}"
        drains.append(text)
        if not memory:  # the worker's loop of done --next, against the same Redis figure
            next_row = rows["claims_next_durable"]
            mine = on_daemon(
                setup,
                "claims-next-durable-daemon",
                partial(repl_drain, warm=warm, jobs=count, batch=s.batch, take_next=True),
                memory=False,
            )
            next_row.repl = mine.rate
            next_row.reference = row.reference
            drains.append(f"durable done --next: repl {cpu_text(mine)}")
    setup.notes.append(
        f"claims: jobs/s with CPU per job over the drain, {WORKERS} workers as asyncio tasks "
        f"in one client process (after {warm:,} untimed): " + "; ".join(drains)
    )

    claim_times, wait_times = on_daemon(
        setup, "claims-wake-daemon", lambda d: wakes(d, s), memory=True, settle_ms=0
    )
    row = rows["claim_wake_p50"]
    row.repl = percentile(claim_times, 0.5) / 1000
    row.reference = percentile(wait_times, 0.5) / 1000
    p99 = percentile(claim_times, 0.99) / percentile(wait_times, 0.99)
    wake_note = (
        f"claim wake: {len(claim_times):,} rounds after {wake_rounds(s)[0]}, p50 / p99 µs: "
        f"--memory claim {us(claim_times)}, wait {us(wait_times)} (p99 {p99:.2f} ×)"
    )
    if not setup.store_missing:
        claim_d, wait_d = on_daemon(
            setup, "claims-wake-durable", lambda d: wakes(d, s), memory=False, settle_ms=0
        )
        p99_d = percentile(claim_d, 0.99) / percentile(wait_d, 0.99)
        p50_d = percentile(claim_d, 0.5) / percentile(wait_d, 0.5)
        wake_note += (
            f"; durable claim {us(claim_d)}, wait {us(wait_d)} "
            f"(p50 {p50_d:.2f} ×, p99 {p99_d:.2f} ×)"
        )
    setup.notes.append(wake_note)

    idle = on_daemon(
        setup,
        "claims-idle-daemon",
        lambda d: idle_claims(d, s),
        memory=True,
        max_connections=s.idle_sessions + 100,
    )
    rows["claim_idle_cpu"].repl = idle.cpu_percent
    rows["claim_idle_evals"].repl = idle.evaluations
    setup.notes.append(
        f"idle claims: daemon CPU {idle.cpu_percent:.2f} % of a core; then one send woke one "
        f"of the {s.idle_sessions:,} for {idle.one_wake_evaluations} evaluations (its send's "
        f"and its claim's included), and {s.idle_sessions - 1:,} more sends the others for "
        f"{idle.all_wake_evaluations:,}"
    )


CLAIMS = Group("claims", claims_rows, claims_group)
