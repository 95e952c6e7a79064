"""The hub in-process, without sockets: cancellation and the commit pipeline.

A wait cut off from outside (``move_on_after``, as a killed client or a
timeout does) must leave every cursor where it was (SPEC rule 10).
"""

from __future__ import annotations

import anyio
import pytest

from repl_daemon import protocol as p
from repl_daemon.hub import Hub
from repl_daemon.store import MemoryStore

pytestmark = pytest.mark.anyio


async def started(*ids: str) -> Hub:
    hub = Hub(MemoryStore(), settle=0)
    for session_id in ids:
        await hub.start(p.Start(session=session_id))
    return hub


def send(hub: Hub, session: str, text: str) -> int:
    hosted, sent = hub.send(p.Send(session=session, text=text))
    assert hub.changed(hosted) is None  # the memory store needs no commit
    return sent.seq


async def test_a_cancelled_wait_moves_no_cursor() -> None:
    hub = await started("a")
    send(hub, "a", "one")
    hub.ack(p.Ack(session="a", cursor="wait", seq=1))
    before = hub.cursors(p.Cursors(session="a")).cursors
    with anyio.move_on_after(0.05):
        await hub.wait(p.Wait(sessions=["a"]))
    assert hub.cursors(p.Cursors(session="a")).cursors == before
    assert hub.waiting == 0 and not hub.sessions["a"].waiters


async def test_a_wait_cancelled_after_its_wake_moves_no_cursor() -> None:
    hub = await started("a")
    hub.settle = 10  # the wake comes, then the settle is cut off
    async with anyio.create_task_group() as tg:
        tg.start_soon(hub.wait, p.Wait(sessions=["a"]))
        await anyio.wait_all_tasks_blocked()
        send(hub, "a", "one")
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert hub.cursors(p.Cursors(session="a")).cursors == []


async def test_a_firing_between_subscribe_and_sleep_is_not_missed() -> None:
    hub = await started("a")
    results: list[p.Woken] = []

    async def waiter() -> None:
        results.append(await hub.wait(p.Wait(sessions=["a"], timeout_ms=5000)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        send(hub, "a", "just in time")
    assert [f.result for f in results[0].batches[0].firings] == ["just in time"]


async def test_stopping_wakes_a_multi_session_wait_with_session_stopped() -> None:
    hub = await started("a", "b")
    errors: list[str] = []

    async def waiter() -> None:
        try:
            await hub.wait(p.Wait(sessions=["a", "b"]))
        except Exception as exc:
            errors.append(type(exc).__name__)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        await hub.stop(p.Stop(session="b"))
    assert errors == ["SessionStopped"]
    assert not hub.sessions["a"].waiters


async def test_evaluations_do_not_move_while_a_wait_blocks() -> None:
    hub = await started("a")
    async with anyio.create_task_group() as tg:
        tg.start_soon(hub.wait, p.Wait(sessions=["a"]))
        await anyio.wait_all_tasks_blocked()
        before = hub.sessions["a"].session.evaluations
        await anyio.sleep(0.2)
        assert hub.sessions["a"].session.evaluations == before
        tg.cancel_scope.cancel()


def test_utc_now_is_iso_8601_utc_with_milliseconds() -> None:
    import re
    from datetime import UTC, datetime

    from repl_daemon.hub import utc_now

    for _ in range(1000):
        before = datetime.now(UTC).replace(tzinfo=None)
        stamp = utc_now()
        after = datetime.now(UTC).replace(tzinfo=None)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp
        parsed = datetime.fromisoformat(stamp[:-1])
        assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= parsed <= after
