"""Waiters of two kinds, each in a child process, woken round by round alternately.

The tags and mcp groups (bench/matching.py, bench/mcp_agent.py) compare a
wait of one kind (a matching wait, a wait through ``repl mcp``) with the
plain wait of the wake row, on one daemon in one run. Measured one after
the other, the two figures would see the machine at different moments; so
both waiters are alive at once, each in a child process of its own (for the
reason bench/waiters.py gives), and the parent wakes one, then the other,
round after round: a child puts its next wait as soon as it has reported,
and blocks, costing nothing, while the other is woken.

A round of one ``Waker``: poll the daemon until its waiter, and every other
that has a round to go, is blocked (so that no child is still putting its
next wait, or doing its untimed work, while a send is timed), ``fire``
(which notes the time just before the send that should wake it,
and may do untimed work first), then read the child's report of when it
held the firing. The plain waiter is bench/waiters.py's own child; a kind
of waiter of another module is a ``ChildProcess`` of that module's
function, which reports as bench/waiters.py's children do: ``("ready",)``,
then ``("round", t_held_ns, position)`` a round.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from bench.clients import LineClient, until
from bench.measure import send_request, stats
from bench.procs import BenchError, Daemon
from bench.waiters import Plan, WaiterProcess


class ChildProcess(WaiterProcess):
    """A child running ``target(plan, pipe)`` (a module-level function, for spawn), read
    and stopped as bench/waiters.py's children are."""

    def __init__(self, target: Callable[[Any, Connection], None], plan: Any) -> None:
        self.plan = plan
        context = multiprocessing.get_context("spawn")
        self.pipe, child_end = context.Pipe()
        self.proc = context.Process(target=target, args=(plan, child_end), daemon=True)
        self.proc.start()
        child_end.close()


#: ``fire(round)``: the perf_counter_ns just before the waking send, and what the waiter
#: should then report (the firing's seq)
Fire = Callable[[int], Awaitable[tuple[int, Any]]]


@dataclass
class Waker:
    """One waiter's side: its child, how to tell it is blocked, how to wake it."""

    name: str
    child: WaiterProcess
    blocked: Callable[[], Awaitable[bool]]
    fire: Fire
    times: list[int] = field(default_factory=list)  # ns per round, from the send to held


def waiting_on(
    control: LineClient, session: str, waiters: int = 1
) -> Callable[[], Awaitable[bool]]:
    """A probe: whether ``session`` has ``waiters`` blocked waits (the stats row's count)."""

    async def blocked() -> bool:
        row = (await stats(control, session))["sessions"][0]
        return bool(row["waiters"] == waiters)

    return blocked


def send_fire(control: LineClient, session: str) -> Fire:
    """A ``fire`` that wakes with one plain ``send`` to ``session``."""
    request = send_request(session)

    async def fire(_round: int) -> tuple[int, Any]:
        t0 = time.perf_counter_ns()
        seq = (await control.ok(request))["seq"]
        return t0, seq

    return fire


def plain_waker(daemon: Daemon, control: LineClient, session: str, rounds: int) -> Waker:
    """The wake row's waiter (bench/waiters.py, kind "repl": one ``wait`` on cursor
    ``bench`` a round, acknowledging the last), woken by one plain ``send``."""
    plan = Plan("repl", daemon.port, daemon.token, session, 1, rounds, 600)
    child = WaiterProcess(plan)
    return Waker("plain", child, waiting_on(control, session), send_fire(control, session))


@contextmanager
def children(wakers: list[Waker]) -> Iterator[list[Waker]]:
    """Stop the wakers' children at the end: killed when something failed."""
    failed = True
    try:
        yield wakers
        failed = False
    finally:
        for waker in wakers:
            waker.child.close(kill=failed)


async def alternate(
    wakers: list[Waker], rounds: int, ready: Callable[[], None] | None = None
) -> None:
    """``rounds`` rounds, each waking every waker once in turn; fills each one's ``times``.
    ``ready`` is called once every child is connected, before the first round."""
    for waker in wakers:
        await waker.child.report(120)  # connected (an MCP client: initialized)
    if ready is not None:
        ready()
    for r in range(rounds):
        for j, waker in enumerate(wakers):
            # every waker blocked again, not only this one: the one woken just before may
            # still be putting its next wait (and an MCP server making its next look),
            # and a send timed meanwhile would time that work too, by the order of the
            # wakers (a waker after the plain one read 25-45 µs more, 2026-12-06)
            for i, other in enumerate(wakers):
                if i >= j or r < rounds - 1:  # a waker past its last round blocks no more
                    await until(
                        other.blocked, what=f"the {other.name} wait to block", interval_s=0.0005
                    )
            t0, position = await waker.fire(r)
            _kind, t_held, reported = await waker.child.report(60)
            if str(reported) != str(position):
                raise BenchError(
                    f"the {waker.name} waiter holds {reported}, the producer sent {position}"
                )
            waker.times.append(t_held - t0)
