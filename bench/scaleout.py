"""Several daemons sharing sessions through Redis: the scale-out tables of ``python -m bench``.

Two tables with the same rows: the daemons on one redis-server, then on a
3-primary Redis Cluster started for the group (three ``redis-server
--cluster-enabled yes`` on free loopback ports, joined by ``redis-cli
--cluster create``, ready once every node says ``cluster_state:ok``).
Daemons (``--store redis://...`` or ``redis+cluster://...``, ``--settle-ms
0``, each with its own home and token) are started one at a time, A, then
B, then C, so each figure is taken with exactly the daemons it names.

Every reference is measured in the same run, on the same Redis:

- pipelined sends/s of one daemon against redis-py's own pipelined XADD
  (``RedisCluster``'s on the cluster) from as many connections, as deep;
- the daemons' CPU per send: /proc utime + stime of every daemon over the
  load, divided by the sends answered ok, against an absolute bound;
- Redis commands per send, per read and per wait cycle: ``INFO
  commandstats`` deltas over the load, summed over the nodes, commands run
  inside a script included (the figure that predicts what Redis must do);
- the wake with waiter and sender on one daemon, and across daemons
  (waiter on B, sender on A), against XREAD BLOCK on the same Redis;
- three daemons on one session (contended): sends/s, refused sends (any
  answer that is not ok) and retries (script runs beyond the sends answered
  ok); after every load each session's head must equal the sends answered
  ok, or the group fails, so a lost or doubled seq cannot hide. That load
  starts only once the wakes' subscriptions have lingered out
  (``repl_daemon.backends.redis.wakes.LINGER``): a subscription's end runs one
  ``LOOKED`` script, which would otherwise read as a retry;
- two and three daemons on a session each (uncontended), against one.

A refused send is counted, not retried, and not in the sends per second;
what it answered is in a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from bench.clients import LineClient, close_all, encode, redis_client, redis_info
from bench.measure import (
    PAYLOAD,
    PERCENTILES,
    RING,
    Setup,
    Sizes,
    on_daemon,
    percentiles_us,
    run_async,
    send_request,
    stats,
    xadd_each,
)
from bench.procs import (
    HOST,
    BenchError,
    Daemon,
    RedisClusterNodes,
    RedisServer,
    cpu_seconds,
)
from bench.table import COLUMNS as MAIN_COLUMNS
from bench.table import Goal, Row, grid
from bench.waiters import redis_rounds, repl_rounds
from repl_daemon.backends.redis.wakes import LINGER

# the main table's columns but the floor, which has no meaning here
COLUMNS = MAIN_COLUMNS[:-1]
NO_REDIS = "no redis-server"
NO_CLI = "no redis-cli"
# the two tables, in print order: key, title
TABLES = (
    ("redis", "one Redis"),
    ("cluster", "a 3-primary Redis Cluster"),
)
# Redis's names for a script run (commandstats), and for the benchmark's own INFO calls
SCRIPT_COMMANDS = ("eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro")
OWN_COMMANDS = ("info",)

CPU_GOAL = Goal("abs_le", 30.0, "≤ 30 µs")
ZERO = Goal("abs_eq", 0.0, "= 0")
PER_DAEMON = Goal("report", 0.0, "report (× 1 daemon)")
PER_XREAD = Goal("report", 0.0, "report (× XREAD BLOCK)")


def blank_rows(s: Sizes, cluster: bool) -> list[Row]:
    """One table's rows: the same figures on one Redis and on the cluster."""
    client = "RedisCluster" if cluster else "redis-py"
    load = f"{s.scale_clients} clients × {s.scale_batch} in flight"
    per_xadd = Goal("report", 0.0, f"report (× {client} XADD)")
    return [
        Row(
            "rate_1",
            f"pipelined sends/s, 1 daemon, {load}, one session",
            Goal("ratio_ge", 0.8, f"≥ 0.8 × {client} pipelined XADD"),
        ),
        Row("cpu_1", "daemon CPU per send, µs, 1 daemon", CPU_GOAL),
        Row("redis_cpu_1", "redis-server CPU per send, µs, 1 daemon", per_xadd),
        Row("cmds_send", "Redis commands per send (inside scripts too)", per_xadd),
        Row("cmds_read", "Redis commands per read (cursor, max 10)", Goal("report", 0.0, "report")),
        Row("cmds_wait", "Redis commands per wait cycle (waiter on B, send via A)", PER_XREAD),
        *(
            Row(f"wake_1_{name}", f"wake {name}, µs, 1 daemon: waiter and sender on A", PER_XREAD)
            for name, _ in PERCENTILES
        ),
        Row(
            "wake_2_p50",
            "cross-daemon wake p50, µs: waiter on B, send via A",
            Goal("ratio_le", 2.0, "≤ 2 × XREAD BLOCK"),
        ),
        Row("wake_2_p99", "cross-daemon wake p99, µs: waiter on B, send via A", PER_XREAD),
        Row("rate_c3", "pipelined sends/s, 3 daemons, one contended session", PER_DAEMON),
        Row("refused_c3", "sends refused (answered not ok), 3 daemons, one session", ZERO),
        Row("retries_c3", "retries (scripts run beyond sends answered), 3 daemons", ZERO),
        Row("cpu_c3", "daemons' CPU per send, µs, 3 daemons, one session", CPU_GOAL),
        Row("rate_e2", "pipelined sends/s, 2 daemons, a session each", PER_DAEMON),
        Row("rate_e3", "pipelined sends/s, 3 daemons, a session each", PER_DAEMON),
        Row("cpu_e2", "daemons' CPU per send, µs, 2 daemons, a session each", CPU_GOAL),
        Row("cpu_e3", "daemons' CPU per send, µs, 3 daemons, a session each", CPU_GOAL),
        Row("refused_rest", "sends refused in the other loads above", ZERO),
    ]


def blank_tables(s: Sizes) -> dict[str, list[Row]]:
    return {key: blank_rows(s, cluster=key == "cluster") for key, _ in TABLES}


def render(rows: list[Row]) -> str:
    return grid(COLUMNS, [row.cells()[:-1] for row in rows])


def render_all(tables: dict[str, list[Row]]) -> str:
    """Both tables, each under its title."""
    parts = []
    for key, title in TABLES:
        parts.append(
            f"scale-out on {title}: daemons sharing sessions through it (persistence off, settle 0)"
        )
        parts.append("")
        parts.append(render(tables[key]))
        parts.append("")
    return "\n".join(parts)


def mark_missing(rows: Sequence[Row], why: str) -> None:
    for row in rows:
        if row.repl is None and row.missing is None:
            row.missing = why


# -- the Redis the daemons share, and what the benchmark reads of it -------------------


@dataclass
class Target:
    """One Redis or a cluster: the daemons' ``--store``, its processes, how to reach them."""

    key: str
    title: str
    url: str
    nodes: list[RedisServer]
    cluster: bool

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def cpu(self) -> float:
        """CPU seconds of every redis-server of the target so far."""
        return sum(cpu_seconds(node.pid) for node in self.nodes)

    def reference_client(self) -> Any:
        """redis-py as an application would use it: ``RedisCluster`` for a cluster."""
        if self.cluster:
            from redis.asyncio.cluster import ClusterNode, RedisCluster

            return RedisCluster(startup_nodes=[ClusterNode(HOST, p) for p in self.ports])
        return redis_client(self.ports[0])

    async def node_port(self, key: str) -> int:
        """The port of the node that holds ``key``."""
        if not self.cluster:
            return self.ports[0]
        client = self.reference_client()
        try:
            await client.initialize()
            port: int = client.get_node_from_key(key).port
            return port
        finally:
            await client.aclose()


class Commands:
    """``INFO commandstats`` of every node, on one control connection each.

    ``snapshot`` is the calls so far by command name, the benchmark's own
    ``INFO`` left out; the difference of two is what ran in between,
    commands run inside a script included (Redis counts them too).
    """

    def __init__(self, target: Target) -> None:
        self.clients = [redis_client(port) for port in target.ports]

    async def __aenter__(self) -> Self:
        await self.snapshot()  # connected: its hand-shake is before any window
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)

    async def snapshot(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for client in self.clients:
            for name, fields in (await redis_info(client, "commandstats")).items():
                command = name.removeprefix("cmdstat_")
                if command not in OWN_COMMANDS:
                    total[command] += int(fields["calls"])
        return total


def scripts(commands: Counter[str]) -> int:
    return sum(commands[name] for name in SCRIPT_COMMANDS)


def per_op(commands: Counter[str], ops: int) -> dict[str, float]:
    return {name: count / ops for name, count in commands.items() if count}


def breakdown(commands: dict[str, float]) -> str:
    """``evalsha 1.00, hincrby 2.00, ...``: the largest first."""
    ordered = sorted(commands.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{name} {value:.2f}" for name, value in ordered if value >= 0.005)


# -- pipelined sends -----------------------------------------------------------------


@dataclass
class Load:
    sent: int  # answered ok
    refused: int  # answered anything else
    seconds: float
    daemon_cpu: float
    redis_cpu: float
    commands: Counter[str]
    errors: Counter[str]

    @property
    def rate(self) -> float:
        return self.sent / self.seconds

    def cpu_us(self) -> float | None:
        return self.daemon_cpu / self.sent * 1e6 if self.sent else None

    def redis_cpu_us(self) -> float | None:
        return self.redis_cpu / self.sent * 1e6 if self.sent else None

    @property
    def retries(self) -> int:
        """Script runs beyond one per send answered ok (a send is one script)."""
        return scripts(self.commands) - self.sent


async def _client_sends(
    client: LineClient, session: str, count: int, batch: int, errors: Counter[str]
) -> int:
    """``count`` sends in batches of ``batch``; returns those answered ok, counts the rest."""
    line = encode(send_request(session))
    answered = ok = 0
    while answered < count:
        chunk = min(batch, count - answered)
        client.write_raw(line * chunk)
        for _ in range(chunk):
            answer = await client.answer()
            if answer.get("ok"):
                ok += 1
            else:
                errors[f"{answer.get('code')}: {answer.get('message')}"] += 1
        answered += chunk
    return ok


async def repl_load(target: Target, daemons: list[Daemon], sessions: list[str], s: Sizes) -> Load:
    """One client per entry of ``sessions``: client i on daemons[i % n], sending to sessions[i]."""
    clients: list[LineClient] = []
    errors: Counter[str] = Counter()
    async with Commands(target) as commands:
        try:
            for i in range(len(sessions)):
                daemon = daemons[i % len(daemons)]
                clients.append(await LineClient.connect(daemon.port, daemon.token))
            for name in dict.fromkeys(sessions):
                await clients[0].ok({"op": "start", "session": name, "exist_ok": True})
            heads = {name: await _head(clients[0], name) for name in dict.fromkeys(sessions)}
            pairs = list(zip(clients, sessions, strict=True))
            warm = await asyncio.gather(*(_client_sends(c, n, 10, 10, errors) for c, n in pairs))
            per = s.scale_sends // len(sessions)
            pids = [d.pid for d in daemons]
            before = await commands.snapshot()
            cpu0, redis0 = sum(map(cpu_seconds, pids)), target.cpu()
            t0 = asyncio.get_running_loop().time()
            done = await asyncio.gather(
                *(_client_sends(c, n, per, s.scale_batch, errors) for c, n in pairs)
            )
            seconds = asyncio.get_running_loop().time() - t0
            cpu1, redis1 = sum(map(cpu_seconds, pids)), target.cpu()
            after = await commands.snapshot()
            # every send answered ok took one seq, none twice: the heads add up
            for name, (w, d) in zip(sessions, zip(warm, done, strict=True), strict=True):
                heads[name] += w + d
            for name, expected in heads.items():
                head = await _head(clients[-1], name)
                if head != expected:
                    raise BenchError(
                        f"session {name} has head {head} after {expected} sends answered ok"
                    )
            sent = sum(done)
            return Load(
                sent,
                per * len(sessions) - sent,
                seconds,
                cpu1 - cpu0,
                redis1 - redis0,
                after - before,
                errors,
            )
        finally:
            await close_all(clients)


async def _head(client: LineClient, session: str) -> int:
    head: int = (await stats(client, session))["sessions"][0]["head"]
    return head


async def redis_load(target: Target, keys: list[str], s: Sizes) -> Load:
    """The same load as pipelined XADDs from as many redis-py clients (one per key), no daemon."""
    clients = [target.reference_client() for _ in keys]

    async def each(count: int) -> None:
        """``count`` XADDs from every client to its key, all clients at once."""
        entries = [[k] * count for k in keys]
        await asyncio.gather(
            *(xadd_each(c, e, s.scale_batch) for c, e in zip(clients, entries, strict=True))
        )

    async with Commands(target) as commands:
        try:
            await each(10)
            per = s.scale_redis_sends // len(keys)
            before = await commands.snapshot()
            redis0 = target.cpu()
            t0 = asyncio.get_running_loop().time()
            await each(per)
            seconds = asyncio.get_running_loop().time() - t0
            redis1 = target.cpu()
            after = await commands.snapshot()
            return Load(
                per * len(keys), 0, seconds, 0.0, redis1 - redis0, after - before, Counter()
            )
        finally:
            await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)


# -- reads and waits -------------------------------------------------------------------


@dataclass
class Reads:
    count: int
    seconds: float
    daemon_cpu: float
    commands: Counter[str]


async def repl_reads(target: Target, daemon: Daemon, session: str, s: Sizes) -> Reads:
    """Pipelined reads of up to 10 firings on the default cursor, from one client."""
    line = encode({"op": "read", "session": session, "max": 10})
    client = await LineClient.connect(daemon.port, daemon.token)
    async with Commands(target) as commands:
        try:

            async def reads(count: int) -> None:
                for first in range(0, count, s.scale_batch):
                    chunk = min(s.scale_batch, count - first)
                    client.write_raw(line * chunk)
                    for _ in range(chunk):
                        answer = await client.answer()
                        if not answer.get("ok"):
                            raise BenchError(f"a read answered {answer}")

            await reads(10)
            before = await commands.snapshot()
            cpu0 = cpu_seconds(daemon.pid)
            t0 = asyncio.get_running_loop().time()
            await reads(s.scale_reads)
            seconds = asyncio.get_running_loop().time() - t0
            cpu1 = cpu_seconds(daemon.pid)
            after = await commands.snapshot()
            return Reads(s.scale_reads, seconds, cpu1 - cpu0, after - before)
        finally:
            await client.close()


@dataclass
class CrossWakes:
    times: list[int]
    # the waits' own commands per cycle: the readiness polls' and the sends' taken out
    per_cycle: dict[str, float]


async def cross_wakes(
    target: Target,
    sender: Daemon,
    waiter: Daemon,
    session: str,
    rounds: int,
    per_send: dict[str, float],
) -> CrossWakes:
    """Wakes with the waiter on ``waiter`` and the sends through ``sender``, and their commands.

    The readiness polls (``stats`` on the waiter's daemon) and the sends run
    commands too: a poll's are measured first, alone, a send's come from the
    pipelined load, and both are taken out of the rounds' commands.
    """
    probe = await LineClient.connect(waiter.port, waiter.token)
    async with Commands(target) as commands:
        try:
            await probe.ok({"op": "start", "session": session, "exist_ok": True})
            await stats(probe, session)
            before = await commands.snapshot()
            samples = 20
            for _ in range(samples):
                await stats(probe, session)
            per_poll = per_op(await commands.snapshot() - before, samples)
            polls: list[int] = []
            before = await commands.snapshot()
            times = await repl_rounds(sender, session, 1, rounds, on=waiter, polls=polls)
            during = await commands.snapshot() - before
        finally:
            await probe.close()
    names = set(during) | set(per_poll) | set(per_send)
    per_cycle = {
        name: (during[name] - len(polls) * per_poll.get(name, 0.0)) / rounds
        - per_send.get(name, 0.0)
        for name in names
    }
    return CrossWakes(times, per_cycle)


async def xread_wakes(target: Target, key: str, rounds: int) -> tuple[list[int], dict[str, float]]:
    """XREAD BLOCK wakes on the node holding ``key``, and the waiter's commands per cycle."""
    port = await target.node_port(key)
    async with Commands(target) as commands:
        before = await commands.snapshot()
        times = await redis_rounds(port, key, 1, rounds)
        during = await commands.snapshot() - before
    during["xadd"] -= rounds  # the sender's
    return times, per_op(+during, rounds)


# -- one table ---------------------------------------------------------------------------


def _fill_wake(rows: dict[str, Row], prefix: str, times: list[int]) -> None:
    for name, value in percentiles_us(times):
        rows[f"{prefix}_{name}"].repl = value


def measure(setup: Setup, target: Target, rows: dict[str, Row]) -> None:
    """Every row of one table: the daemons on ``target``, then the references on it."""
    s = setup.sizes
    warm = max(2, s.scale_wakes // 20)
    rounds = warm + s.scale_wakes
    clients = range(s.scale_clients)
    errors: Counter[str] = Counter()

    def run(coro: Awaitable[Any]) -> Any:
        return run_async(coro, s.deadline_s)

    with contextlib.ExitStack() as stack:
        daemons: list[Daemon] = []

        def add(name: str) -> Daemon:
            daemon = Daemon(
                setup.dir(f"scale-{target.key}-daemon-{name}"), memory=False, store=target.url
            )
            # the ExitStack stops the daemons before the redis-servers they use
            daemons.append(stack.enter_context(daemon.start()))
            return daemon

        a = add("A")
        _fill_wake(rows, "wake_1", run(repl_rounds(a, "wake-1", 1, rounds))[warm:])
        one: Load = run(repl_load(target, daemons, ["one-1" for _ in clients], s))
        errors += one.errors
        rows["rate_1"].repl = one.rate
        rows["cpu_1"].repl = one.cpu_us()
        rows["redis_cpu_1"].repl = one.redis_cpu_us()
        send = per_op(one.commands, max(one.sent, 1))
        rows["cmds_send"].repl = sum(send.values())
        reads: Reads = run(repl_reads(target, a, "one-1", s))
        read = per_op(reads.commands, reads.count)
        rows["cmds_read"].repl = sum(read.values())

        b = add("B")
        cross: CrossWakes = run(cross_wakes(target, a, b, "wake-2", rounds, send))
        _fill_wake(rows, "wake_2", cross.times[warm:])
        waiters_left = time.monotonic()
        rows["cmds_wait"].repl = sum(cross.per_cycle.values())
        each2: Load = run(repl_load(target, daemons, [f"each-2-{i % 2}" for i in clients], s))
        errors += each2.errors

        add("C")
        # B's subscription to the cross wakes' session ends LINGER after its last waiter
        # left, with a LOOKED script (the looks it answered from published firings): let
        # it end before the load whose every script is counted (it once read 1 retry)
        time.sleep(max(0.0, LINGER + 0.5 - (time.monotonic() - waiters_left)))
        shared: Load = run(repl_load(target, daemons, ["shared-3" for _ in clients], s))
        errors += shared.errors
        rows["rate_c3"].repl = shared.rate
        rows["refused_c3"].repl = shared.refused
        rows["retries_c3"].repl = shared.retries
        rows["cpu_c3"].repl = shared.cpu_us()
        each3: Load = run(repl_load(target, daemons, [f"each-3-{i % 3}" for i in clients], s))
        errors += each3.errors
        for key, load in (("rate_e2", each2), ("rate_e3", each3)):
            rows[key].repl = load.rate
        rows["cpu_e2"].repl = each2.cpu_us()
        rows["cpu_e3"].repl = each3.cpu_us()
        rows["refused_rest"].repl = one.refused + each2.refused + each3.refused
        for key in ("rate_c3", "rate_e2", "rate_e3"):
            rows[key].reference = one.rate

        # the references, on the same Redis, the daemons idle
        xtimes, xread = run(xread_wakes(target, "xwake", rounds))
        for prefix in ("wake_1", "wake_2"):
            for name, value in percentiles_us(xtimes[warm:]):
                rows[f"{prefix}_{name}"].reference = value
        rows["cmds_wait"].reference = sum(xread.values())
        alone: Load = run(redis_load(target, ["xone"] * s.scale_clients, s))
        rows["rate_1"].reference = alone.rate
        rows["redis_cpu_1"].reference = alone.redis_cpu_us()
        rows["cmds_send"].reference = sum(per_op(alone.commands, alone.sent).values())

    where = f"scale-out ({target.title})"
    setup.notes.append(f"{where}: Redis commands per send: {breakdown(send)}")
    setup.notes.append(
        f"{where}: Redis commands per read: {breakdown(read)}; "
        f"{reads.count / reads.seconds:,.0f} reads/s from one client, "
        f"{reads.daemon_cpu / reads.count * 1e6:.1f} µs of daemon CPU a read"
    )
    setup.notes.append(
        f"{where}: Redis commands per wait cycle (the waits' own, without the readiness "
        f"polls' and the sends'): {breakdown(cross.per_cycle)}"
    )
    for message, count in errors.most_common(3):
        setup.notes.append(f"{where}: {count:,} sends answered {message}")


# -- the group -----------------------------------------------------------------------


def redis_benchmark(exe: str, port: int, s: Sizes) -> str | None:
    """redis-benchmark's XADD rate with the same connections and pipeline depth, if installed."""
    found = shutil.which("redis-benchmark") or str(Path(exe).with_name("redis-benchmark"))
    if not Path(found).exists():
        return None
    argv = [found, "-h", HOST, "-p", str(port), "-c", str(s.scale_clients)]
    argv += ["-n", str(s.scale_redis_sends * 2), "-P", str(s.scale_batch), "-q"]
    argv += ["XADD", "bench-rb", "MAXLEN", str(RING), "*", "text", PAYLOAD]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    found_rate = re.search(r"([\d.]+) requests per second", done.stdout)
    if found_rate is None:
        return None
    return (
        f"scale-out: redis-benchmark (a C client), {s.scale_clients} connections, "
        f"pipeline {s.scale_batch}: XADD MAXLEN {RING} {float(found_rate.group(1)):,.0f}/s"
    )


def find_redis_cli(exe: str) -> str | None:
    beside = Path(exe).with_name("redis-cli")
    return str(beside) if beside.exists() else shutil.which("redis-cli")


def context_wakes(setup: Setup) -> None:
    """The wake on one daemon without Redis (--memory, SQLite), for context: a note."""
    s = setup.sizes
    warm = max(2, s.scale_wakes // 20)

    def one_wake(daemon: Daemon) -> Awaitable[list[int]]:
        return repl_rounds(daemon, "wake", 1, warm + s.scale_wakes)

    found = []
    stores: list[tuple[str, bool]] = [("--memory", True)]
    if not setup.store_missing:
        stores.append(("SQLite", False))
    for label, memory in stores:
        times = on_daemon(setup, f"scale-{label.strip('-').lower()}", one_wake, memory=memory)
        p50, p99 = (value for _, value in percentiles_us(times[warm:]))
        found.append(f"{label} {p50:,.0f} / {p99:,.0f} µs")
    setup.notes.append(
        "scale-out, for context: the wake p50 / p99 on one daemon without Redis: "
        + ", ".join(found)
    )


def scaleout(setup: Setup, _rows: dict[str, Any]) -> None:
    tables: dict[str, dict[str, Row]] = setup.scale
    context_wakes(setup)
    if setup.redis_exe is None:
        for rows in tables.values():
            mark_missing(list(rows.values()), NO_REDIS)
        return
    exe = setup.redis_exe
    cores = os.cpu_count()
    setup.notes.append(
        f"scale-out: this machine has {cores} cores, shared by the daemons, the "
        "redis-server(s) and the benchmark's own clients, so sends/s and the N-daemon "
        "ratios are bounded by them; the daemons' CPU per send and the Redis commands per "
        "op are the figures that predict scaling on bigger machines"
    )
    with RedisServer(exe, setup.dir("scale-redis"), durable=False) as redis:
        redis.start()
        measure(setup, Target("redis", "one Redis", redis.url, [redis], False), tables["redis"])
        note = redis_benchmark(exe, redis.port, setup.sizes)
        if note:
            setup.notes.append(note)
    cli = find_redis_cli(exe)
    if cli is None:
        mark_missing(list(tables["cluster"].values()), NO_CLI)
        setup.notes.append("scale-out: no redis-cli beside redis-server: no cluster table")
        return
    with RedisClusterNodes(exe, cli, setup.dir("scale-cluster")) as cluster:
        cluster.start()
        target = Target("cluster", "a 3-primary Redis Cluster", cluster.url, cluster.nodes, True)
        measure(setup, target, tables["cluster"])
