"""Blocked waiters in a process of their own, for the wake and fan-out figures.

A wake is timed from the producer's send to the moment the waiter holds the
firing. If the producer and its waiters shared one event loop, that loop
would also be reading the producer's own answer, and whichever of the two
answers the server wrote first would be taken first: the figure would
measure the client's ordering as much as the server. So the waiters run in
a child process (``multiprocessing``, spawn) with their own loop; both
processes read ``time.perf_counter_ns`` (CLOCK_MONOTONIC, one clock for the
whole machine), and the child reports when its last waiter had the firing.

A round: the child puts one wait on each of its connections (acknowledging
what the previous round delivered), the parent polls the server until all
of them are blocked, sends one firing, and reads the child's report.
``repl_rounds`` and ``redis_rounds`` are the parent's side, for the wake
and fan-out rows (bench/waits.py), the scale-out wakes (bench/scaleout.py)
and the HTTP rows (bench/http_api.py), whose waiters can also be open event
streams (``GET /sessions/{id}/events``): a stream needs no request a round,
it waits again by itself once it has sent an event; or HTTP long polls
(``GET /sessions/{id}/wait``), a request a round with its ``ack`` as the TCP
wait's, each on a keep-alive connection of its own.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from bench.clients import (
    EventStream,
    HttpClient,
    LineClient,
    close_all,
    connect_many,
    encode,
    redis_client,
    redis_connection,
    redis_info,
    until,
)
from bench.measure import PAYLOAD, RING, send_request, stats
from bench.procs import BenchError, Daemon, raise_nofile

T = TypeVar("T")


@dataclass(frozen=True)
class Plan:
    """What the child does: ``kind`` is "repl", "sse" or "longpoll" (``port`` is the HTTP
    one for both) or "redis"."""

    kind: str
    port: int
    token: str | None
    session: str
    waiters: int
    rounds: int
    deadline_s: float


def child_main(plan: Plan, pipe: Connection) -> None:
    """The child process: report ("ready",), then ("round", t_last_ns, position) per round."""
    raise_nofile(plan.waiters + 1_000)
    try:
        asyncio.run(_child(plan, pipe))
    except BaseException as exc:
        pipe.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


async def _child(plan: Plan, pipe: Connection) -> None:
    async with asyncio.timeout(plan.deadline_s):
        if plan.kind == "repl":
            await _repl_rounds(plan, pipe)
        elif plan.kind == "sse":
            await _sse_rounds(plan, pipe)
        elif plan.kind == "longpoll":
            await _longpoll_rounds(plan, pipe)
        else:
            await _redis_rounds(plan, pipe)


async def parked(reads: list[Coroutine[Any, Any, T]]) -> asyncio.Future[list[T]]:
    """The reads of a round, each started and parked on its socket: what they gather.

    A child starts its reads before it puts its waits, so that once the server
    counts them all blocked the child has nothing left to do: reads started
    after, 1,000 of them, ran while the next kind of waiter was timed (a
    fan-out woken right after another kind's read 25-35 % slower, 2026-12-06).
    """
    reading = asyncio.gather(*reads)
    await asyncio.sleep(0)  # each read's first step: up to its wait on the socket
    return reading


async def _repl_rounds(plan: Plan, pipe: Connection) -> None:
    async def open_one(_i: int) -> LineClient:
        return await LineClient.connect(plan.port, plan.token)

    clients: list[LineClient] = await connect_many(plan.waiters, open_one)
    pipe.send(("ready",))
    acked = 0
    for _round in range(plan.rounds):
        wait: dict[str, Any] = {"op": "wait", "sessions": [plan.session], "cursor": "bench"}
        if acked:
            wait["ack"] = {plan.session: acked}
        line = encode(wait)
        reading = await parked([c.timed_answer() for c in clients])
        for client in clients:
            client.write_raw(line)
        answers = await reading
        positions = set()
        for _t, answer in answers:
            batches = answer.get("batches") or []
            if not answer.get("ok") or not batches:
                raise BenchError(f"a wait answered {answer}")
            positions.add(batches[0]["next"])
        if len(positions) != 1:
            raise BenchError(f"waiters disagree on the position: {sorted(positions)}")
        acked = positions.pop()
        pipe.send(("round", max(t for t, _a in answers), acked))
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


async def _sse_rounds(plan: Plan, pipe: Connection) -> None:
    """Event streams from the head: each round, the one firing the round's send made."""
    token = plan.token
    assert token is not None

    async def open_one(_i: int) -> EventStream:
        return await EventStream.open(plan.port, token, plan.session)

    streams: list[EventStream] = await connect_many(plan.waiters, open_one)
    pipe.send(("ready",))
    for _round in range(plan.rounds):
        events = await asyncio.gather(*(stream.firing() for stream in streams))
        seqs = {firing["seq"] for _t, firing in events}
        if len(seqs) != 1:
            raise BenchError(f"event streams disagree on the firing: {sorted(seqs)}")
        pipe.send(("round", max(t for t, _f in events), seqs.pop()))
    await asyncio.gather(*(stream.close() for stream in streams), return_exceptions=True)


async def _longpoll_rounds(plan: Plan, pipe: Connection) -> None:
    """HTTP long polls: each round a ``GET .../wait`` on every connection, acknowledging
    what the previous round delivered, as the TCP waits of ``_repl_rounds`` do."""
    token = plan.token
    assert token is not None

    async def open_one(_i: int) -> HttpClient:
        return await HttpClient.connect(plan.port, token)

    clients: list[HttpClient] = await connect_many(plan.waiters, open_one)
    pipe.send(("ready",))
    acked = 0

    async def timed_poll(client: HttpClient, path: str) -> tuple[int, Any]:
        status, answer = await client.request("GET", path)
        if status != 200:
            raise BenchError(f"GET {path} answered {status} {answer}")
        return time.perf_counter_ns(), answer

    for _round in range(plan.rounds):
        path = f"/sessions/{plan.session}/wait?cursor=bench&timeout=600"
        if acked:
            path += f"&ack={acked}"
        answers = await asyncio.gather(*(timed_poll(c, path) for c in clients))
        positions = set()
        for _t, answer in answers:
            if answer.get("timed_out") or not answer.get("firings"):
                raise BenchError(f"a long poll answered {answer}")
            positions.add(answer["next"])
        if len(positions) != 1:
            raise BenchError(f"long polls disagree on the position: {sorted(positions)}")
        acked = positions.pop()
        pipe.send(("round", max(t for t, _a in answers), acked))
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def _last_id(reply: Any) -> Any:
    """The newest entry id in an XREAD reply (RESP3 map or RESP2 list)."""
    streams = list(reply.values()) if isinstance(reply, dict) else [s[1] for s in reply]
    if not streams or not streams[0]:
        raise BenchError(f"XREAD BLOCK answered {reply!r}")
    return streams[0][-1][0]


async def _redis_rounds(plan: Plan, pipe: Connection) -> None:
    async def open_one(_i: int) -> Any:
        return await redis_connection(plan.port)

    conns: list[Any] = await connect_many(plan.waiters, open_one)
    pipe.send(("ready",))
    last: Any = "0-0"

    async def timed_read(conn: Any) -> tuple[int, Any]:
        reply = await conn.read_response()
        return time.perf_counter_ns(), reply

    for _round in range(plan.rounds):
        reading = await parked([timed_read(c) for c in conns])
        for conn in conns:
            await conn.send_command("XREAD", "BLOCK", 0, "STREAMS", plan.session, last)
        replies = await reading
        ids = {_last_id(reply) for _t, reply in replies}
        if len(ids) != 1:
            raise BenchError(f"blocked XREADs disagree on the entry: {sorted(ids)}")
        last = ids.pop()
        pipe.send(("round", max(t for t, _r in replies), str(last)))
    await asyncio.gather(*(c.disconnect() for c in conns), return_exceptions=True)


class WaiterProcess:
    """The parent's handle on the child: start it, read its reports, stop it."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        context = multiprocessing.get_context("spawn")
        self.pipe, child_end = context.Pipe()
        self.proc = context.Process(target=child_main, args=(plan, child_end), daemon=True)
        self.proc.start()
        child_end.close()

    async def report(self, deadline_s: float) -> tuple[Any, ...]:
        """The child's next report; BenchError when it failed or is silent past the deadline."""
        ready = await asyncio.to_thread(self.pipe.poll, deadline_s)
        if not ready:
            raise BenchError(f"the waiter process said nothing for {deadline_s:g} s")
        try:
            message: tuple[Any, ...] = self.pipe.recv()
        except EOFError:
            raise BenchError("the waiter process exited") from None
        if message[0] == "error":
            raise BenchError(f"the waiter process failed: {message[1]}")
        return message

    def close(self, *, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
        self.pipe.close()


# -- the parent's side ---------------------------------------------------------


async def timed_rounds(
    plan: Plan,
    blocked: Callable[[], Awaitable[bool]],
    fire: Callable[[], Awaitable[Any]],
) -> list[int]:
    """Per round, nanoseconds from just before ``fire`` to the child's last waiter holding it."""
    child = WaiterProcess(plan)
    failed = True
    try:
        await child.report(120)  # connected
        times: list[int] = []
        for _round in range(plan.rounds):
            await until(blocked, what=f"{plan.waiters:,} blocked waits", interval_s=0.0005)
            t0 = time.perf_counter_ns()
            position = await fire()
            _kind, t_last, reported = await child.report(60)
            if str(reported) != str(position):
                raise BenchError(f"the waiters hold {reported}, the producer sent {position}")
            times.append(t_last - t0)
        failed = False
        return times
    finally:
        child.close(kill=failed)


async def repl_rounds(
    daemon: Daemon,
    session: str,
    waiters: int,
    rounds: int,
    *,
    on: Daemon | None = None,
    polls: list[int] | None = None,
    kind: str = "repl",
) -> list[int]:
    """Wakes of ``waiters`` blocked on one session, each round by one send through ``daemon``.

    The waiters block on ``on`` when it is given (a daemon sharing the
    session through Redis), which is then polled for their readiness on a
    connection of its own; otherwise on ``daemon``, polled on the sender's
    connection. The session may exist already. ``polls``, when given, gets
    one entry per readiness poll (a ``stats`` request), so that what the
    polls cost can be told apart from what the waits cost. ``kind`` "sse":
    the waiters are event streams on the daemon's HTTP port (the send is
    still a ``send`` of the line protocol); a stream counts among its
    session's ``waiters`` while it waits, as a blocked ``wait`` does.
    ``kind`` "longpoll": the waiters are HTTP long polls, which count the same.
    """
    control = await LineClient.connect(daemon.port, daemon.token)
    connections = [control]
    try:
        target, probe = daemon, control
        if on is not None:
            target, probe = on, await LineClient.connect(on.port, on.token)
            connections.append(probe)
        await control.ok({"op": "start", "session": session, "exist_ok": True})
        send = send_request(session)

        async def blocked() -> bool:
            if polls is not None:
                polls.append(1)
            row = (await stats(probe, session))["sessions"][0]
            return bool(row["waiters"] == waiters)

        async def fire() -> int:
            seq: int = (await control.ok(send))["seq"]
            return seq

        port = target.http_port if kind in ("sse", "longpoll") else target.port
        plan = Plan(kind, port, target.token, session, waiters, rounds, 600)
        return await timed_rounds(plan, blocked, fire)
    finally:
        await close_all(connections)


async def redis_rounds(port: int, key: str, waiters: int, rounds: int) -> list[int]:
    """The same with XREAD BLOCK waiters and XADD (readiness: INFO clients blocked_clients).

    Each interval includes its own client's work: for Redis, redis.asyncio's
    command path before the XADD leaves (with redis-py's default
    socket_timeout every command is sent through asyncio.wait_for) and the
    RESP parsing of the XREAD reply; for repl, JSON encoding and decoding.
    The Redis client's share is the larger one, so it makes the reference
    slower; it does not make repl faster.
    """
    control = redis_client(port)
    try:

        async def blocked() -> bool:
            clients = await redis_info(control, "clients")
            return bool(clients["blocked_clients"] == waiters)

        async def fire() -> str:
            entry = await control.xadd(key, {"text": PAYLOAD}, maxlen=RING, approximate=False)
            return str(entry)

        plan = Plan("redis", port, None, key, waiters, rounds, 600)
        return await timed_rounds(plan, blocked, fire)
    finally:
        await control.aclose()
