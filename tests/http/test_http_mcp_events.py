"""One MCP session's recent events (``repl_cli.mcp.events``, docs/semantics.md M7), without a
daemon: what a ``Last-Event-ID`` resumes, and what is refused (``Gone``) because the bound
dropped an event the resume would owe, or because the id is none of the session's. And the
SDK's ``EventStore`` over them: a request's stream replayed up to its answer, and ended there.
"""

from __future__ import annotations

from typing import Any

import pytest
from mcp.server.streamable_http import GET_STREAM_KEY, EventMessage
from mcp.types import JSONRPCNotification, JSONRPCResponse

from repl_cli.mcp.events import EVENTS, Events, Gone, Store, dumped


def note(n: int) -> bytes:
    return dumped(JSONRPCNotification(jsonrpc="2.0", method="notifications/x", params={"n": n}))


def test_a_stream_resumes_with_what_came_on_it_after_the_id() -> None:
    events = Events()
    prime = events.record(GET_STREAM_KEY, None)
    first = events.record(GET_STREAM_KEY, note(1))
    events.record("7", note(2))  # a request's stream, between them
    third = events.record(GET_STREAM_KEY, note(3))
    stream, later = events.after(events.id_of(prime))
    assert stream == GET_STREAM_KEY and later == [first, third]
    assert events.after(events.id_of(third)) == (GET_STREAM_KEY, [])
    assert events.after(events.id_of(first))[1] == [third]
    assert events.where(events.id_of(first)) == (GET_STREAM_KEY, 0, first.n)


def test_an_id_of_no_event_of_the_session_is_refused() -> None:
    events, other = Events(), Events()
    mine = events.id_of(events.record(GET_STREAM_KEY, note(1)))
    theirs = other.id_of(other.record(GET_STREAM_KEY, note(1)))
    for wrong in (theirs, "", "nonsense", f"{events.tag}-0-9", f"{events.tag}-x-1", mine + "0"):
        with pytest.raises(Gone, match="is no event of this MCP session"):
            events.where(wrong)
    with pytest.raises(Gone, match="no longer kept"):
        events.where(f"{events.tag}-5-1")  # a stream it never had


def test_the_bound_drops_the_oldest_and_a_resume_it_owes_is_refused() -> None:
    events = Events(max_events=3)
    old = [events.record(GET_STREAM_KEY, note(n)) for n in range(3)]
    events.record(GET_STREAM_KEY, note(3))  # the first one goes
    assert [e.n for e in events.kept] == [2, 3, 4]
    events.after(events.id_of(old[0]))  # all after it is still there
    events.record(GET_STREAM_KEY, note(4))  # now old[1] is gone: a resume after old[0] owes it
    with pytest.raises(Gone, match=r"no longer kept .* its newest 3 events"):
        events.after(events.id_of(old[0]))
    assert [e.n for e in events.after(events.id_of(old[1]))[1]] == [3, 4, 5]


def test_other_streams_filling_the_bound_leave_a_quiet_stream_resumable() -> None:
    """The events of requests push the GET stream's out of the bound; nothing of the GET
    stream came after its last one, so it resumes, with nothing missed."""
    events = Events(max_events=4)
    last = events.record(GET_STREAM_KEY, note(0))
    for n in range(10):
        events.record(str(n), note(n))
    assert last not in events.kept
    assert events.after(events.id_of(last)) == (GET_STREAM_KEY, [])
    with pytest.raises(Gone, match="no longer kept"):  # a request's stream gone with its events
        events.where(f"{events.tag}-1-2")


def test_a_priming_event_dropped_owes_nothing() -> None:
    events = Events(max_events=2)
    first = events.record(GET_STREAM_KEY, note(1))
    events.record(GET_STREAM_KEY, None)  # a priming event, after it
    events.record("1", note(2))
    events.record("1", note(3))  # drops the first, then the priming event
    assert events.after(events.id_of(first)) == (GET_STREAM_KEY, [])


def test_the_bytes_bound_keeps_the_newest_event_whatever_its_size() -> None:
    events = Events(max_bytes=100)
    events.record(GET_STREAM_KEY, b"x" * 60)
    events.record(GET_STREAM_KEY, b"y" * 60)
    assert [len(e.data or b"") for e in events.kept] == [60]
    big = events.record(GET_STREAM_KEY, b"z" * 500)
    assert list(events.kept) == [big] and events.size == 500


@pytest.mark.anyio
async def test_the_sdks_store_replays_a_requests_stream_up_to_its_answer() -> None:
    events = Events()
    token = EVENTS.set(events)
    try:
        store = Store()
        prime = await store.store_event("3", None)
        progress = JSONRPCNotification(jsonrpc="2.0", method="notifications/progress")
        said = await store.store_event("3", progress)
        sent: list[EventMessage] = []

        async def send(message: Any) -> None:
            sent.append(message)

        # no answer yet: the stream goes on (its id, for the SDK to send what comes)
        assert await store.replay_events_after(prime, send) == "3"
        assert [m.event_id for m in sent] == [said]
        answer = JSONRPCResponse(jsonrpc="2.0", id=3, result={})
        await store.store_event("3", answer)
        sent.clear()
        assert await store.replay_events_after(prime, send) is None  # it ended
        assert [m.message for m in sent] == [progress, answer]
        assert await store.replay_events_after("gone", send) is None
        sent.clear()
        first = await store.store_event("4", progress)
        await store.store_event("4", None)  # a priming event (a resumed stream's): no data
        assert await store.replay_events_after(first, send) == "4"
        assert sent == []
    finally:
        EVENTS.reset(token)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
