"""A push's receipt over /mcp (``repl_cli.mcp.http.Receipt``, docs/semantics.md M6, M7), in
this process, with GET streams opened by hand on an MCP session's ``Slot``: yes when the
stream it was written on, or one that resumed it, is open and has been for the hold; no when
a fresh GET stream took its place, when the session ended, or when nothing resumed a cut
stream in time. The hold and the time a cut stream is waited for are made short, so each
case ends soon; what is checked is each answer, never how long it took.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from repl_cli.mcp import http as mcp_http
from repl_cli.mcp.http import Receipt, Slot, Stream

pytestmark = pytest.mark.anyio

HOLD = 0.05


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def nowhere(message: Any) -> None:
    """An ASGI ``send`` that takes everything."""


async def never() -> Any:
    await anyio.sleep_forever()


async def opened(slot: Slot, after: int | None = None) -> Stream:
    """A GET stream of ``slot``, answered 200 (``after``: resuming after that event)."""
    stream = Stream(slot, nowhere, never, None, after, prime=True)
    await stream.sent({"type": "http.response.start", "status": 200, "headers": []})
    return stream


def cut(slot: Slot, stream: Stream) -> None:
    stream.open = False
    slot.set(None)


async def written(slot: Slot) -> Receipt:
    receipt = await slot.notify("notifications/x", {})
    assert isinstance(receipt, Receipt)
    return receipt


async def test_a_stream_that_stayed_open_has_it() -> None:
    slot = Slot(HOLD)
    await opened(slot)
    receipt = await written(slot)
    with anyio.fail_after(5):
        assert await receipt() is True


async def test_a_cut_stream_resumed_has_it_once_the_resumed_one_held() -> None:
    slot = Slot(HOLD)
    first = await opened(slot)
    receipt = await written(slot)
    cut(slot, first)
    answers: list[bool] = []
    async with anyio.create_task_group() as tg:

        async def ask() -> None:
            answers.append(await receipt())

        tg.start_soon(ask)
        await anyio.wait_all_tasks_blocked()
        resumed = await opened(slot, after=slot.events.last)
        assert resumed.generation == first.generation
    assert answers == [True]


async def test_a_fresh_get_stream_is_no_resume() -> None:
    slot = Slot(HOLD)
    first = await opened(slot)
    receipt = await written(slot)
    cut(slot, first)
    fresh = await opened(slot)
    assert fresh.generation != first.generation
    with anyio.fail_after(5):
        assert await receipt() is False


async def test_a_cut_stream_not_resumed_in_time_or_a_session_ended_has_it_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(mcp_http, "RESUME_S", HOLD)
    slot = Slot(HOLD)
    first = await opened(slot)
    receipt = await written(slot)
    cut(slot, first)
    with anyio.fail_after(5):
        assert await receipt() is False
    slot.end()
    with anyio.fail_after(5):
        assert await receipt() is False
        assert await slot.notify("notifications/x", {}) is None  # the session ended


async def test_a_push_waits_for_a_stream_and_a_session_that_ends_takes_none() -> None:
    slot = Slot(HOLD)
    got: list[object] = []
    async with anyio.create_task_group() as tg:

        async def push() -> None:
            got.append(await slot.notify("notifications/x", {}))

        tg.start_soon(push)
        await anyio.wait_all_tasks_blocked()
        assert got == []  # no GET stream yet: held
        slot.end()
    assert got == [None]


async def test_a_superseded_stream_tells_the_sdk_its_client_is_gone() -> None:
    slot = Slot(HOLD)
    stream = await opened(slot)
    answers: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def listen() -> None:
            answers.append(await stream.received())

        tg.start_soon(listen)
        await anyio.wait_all_tasks_blocked()
        stream.supersede()
    assert answers == [{"type": "http.disconnect"}]
    assert await stream.received() == {"type": "http.disconnect"}  # and so on
    assert not stream.still_open()
