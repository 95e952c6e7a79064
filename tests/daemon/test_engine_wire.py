"""Random requests over the wire: a refused request changes nothing, in any session.

The daemon runs in this process (its own event loop in a thread, through an
anyio blocking portal), so the test can look straight at every session's
snapshot and evaluation count between two requests, exactly as the engine
holds them. Hypothesis sends random sequences of every op, multi-session
waits with good and bad acks among them, bad ids, bad cursors, bad numbers
and lines that are no request at all; after every answer that is an error,
every session (and the set of sessions) must be exactly as before it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.backends.local.store import Store
from repl_daemon.config import Config, Limits
from repl_daemon.daemon import ensure_token, serve_engine
from repl_daemon.engine import Engine
from session.session import Snapshot
from tests.helpers import Client, examples

State = dict[str, tuple[Snapshot, int]]


class InProcess:
    """A daemon in this process: the engine built here, served from a portal's loop."""

    def __init__(self, home: Path, store: Store) -> None:
        self.home = home
        self._portal_cm = start_blocking_portal("asyncio")
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self.store = store
        token = ensure_token(home)
        self.token = token
        config = Config(home=home, port=0, settle=0.0, limits=Limits(idle_timeout=30.0))

        async def build() -> tuple[Engine, anyio.Event]:
            engine = Engine(LocalBackend(store), settle=0.0)
            await engine.load()
            return engine, anyio.Event()

        self.engine, self._stop = self.portal.call(build)
        serve = functools.partial(serve_engine, self.engine, config, token, stop=self._stop)
        self._served, self.port = self.portal.start_task(serve)

    def state(self) -> State:
        """Every session's snapshot and evaluation count, read in the daemon's own loop."""

        def read() -> State:
            committer = self.engine.committer
            assert isinstance(committer, LocalCommitter)
            return {
                sid: (h.session.snapshot(), h.session.evaluations)
                for sid, h in committer.sessions.items()
            }

        return self.portal.call(read)

    def close(self) -> None:
        self.portal.call(self._stop.set)
        self._served.result(timeout=10)
        self._portal_cm.__exit__(None, None, None)
        self.store.close()


@pytest.fixture(params=["memory", "sqlite"])
def inprocess(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[InProcess]:
    home = tmp_path / "home"
    home.mkdir()
    store: Store = MemoryStore() if request.param == "memory" else SqliteStore(home / "repl.db")
    daemon = InProcess(home, store)
    yield daemon
    daemon.close()


NAMES = ["a", "b", "c"]
IDS = st.sampled_from([*NAMES, *NAMES, "nope", "", "bad id", "x" * 70, "-dash"])
CURSORS = st.sampled_from(["read", "wait", "c1", "c2", "", "two words", "x" * 70])
SEQS = st.integers(-2, 12)
MAXES = st.none() | st.integers(-1, 4)


def request(draw: st.DrawFn) -> dict[str, Any] | bytes:
    op = draw(
        st.sampled_from(
            [
                *("start", "stop", "send", "send", "send", "read", "ack", "poll", "buffer"),
                *("cursors", "stats", "sessions", "wait", "wait", "wait", "ping", "line"),
                *("schedule", "schedule", "timers", "cancel"),
            ]
        )
    )
    sid = draw(IDS)
    if op == "line":
        return draw(
            st.sampled_from(
                [b"{", b"[]", b'{"op": "nope"}', b'{"op": "send"}', b'{"op": "ack", "seq": "x"}']
            )
        )
    if op == "start":
        return {
            "op": op,
            "session": sid,
            "buffer": draw(st.none() | st.integers(-1, 6) | st.just(70_000)),
            "exist_ok": draw(st.booleans()),
        }
    if op in ("stop", "cursors"):
        return {"op": op, "session": sid}
    if op == "send":
        req: dict[str, Any] = {"op": op, "session": sid, "text": draw(st.text(max_size=5))}
        if draw(st.booleans()):
            req["handler"] = draw(st.sampled_from(["on-message", "on-tick", "on-build", "", "a b"]))
        if draw(st.booleans()):
            req["key"] = draw(st.sampled_from(["k1", "k2", "", "x" * 300]))
        return req
    if op == "read":
        req = {"op": op, "session": sid, "max": draw(MAXES), "peek": draw(st.booleans())}
        if draw(st.booleans()):
            req["cursor"] = draw(CURSORS)
        if draw(st.booleans()):
            req["after"] = draw(SEQS)
        # the compound reads, alone or wrongly with the others (refused, changing nothing)
        if draw(st.integers(0, 3)) == 0:
            req["last"] = draw(SEQS)
        if draw(st.integers(0, 3)) == 0:
            req["since"] = draw(st.sampled_from(["2026-01-01T00:00:00Z", "yesterday", ""]))
        if draw(st.integers(0, 3)) == 0:
            req["seq"] = draw(SEQS)
        return req
    if op == "ack":
        return {"op": op, "session": sid, "cursor": draw(CURSORS), "seq": draw(SEQS)}
    if op == "poll":
        return {"op": op, "session": sid, "max": draw(MAXES)}
    if op == "buffer":
        return {"op": op, "session": sid, "limit": draw(st.integers(-1, 6) | st.just(70_000))}
    if op == "stats":
        return {"op": op, "session": draw(st.none() | IDS)}
    if op == "schedule":
        # never a time that comes due while the test runs: a firing would change the state
        # between two requests; the times that fire are tests/daemon/test_timer_ops.py's
        req = {"op": op, "session": sid, "text": draw(st.text(max_size=5))}
        when = draw(st.sampled_from(["in", "at", "every", "in+at", "none", "at+every"]))
        if "in" in when:
            req["in"] = draw(st.sampled_from(["1h", "90m", "5 m", "", "0s", "1h30", "-1s"]))
        if "at" in when:
            req["at"] = draw(st.sampled_from(["2099-01-01T00:00:00Z", "tomorrow", "2099-13-01"]))
        if "every" in when:
            req["every"] = draw(st.sampled_from(["1h", "999ms", "x", "2h"]))
        if draw(st.booleans()):
            req["handler"] = draw(st.sampled_from(["on-message", "on-tick", "", "a b"]))
        if draw(st.booleans()):
            req["key"] = draw(st.sampled_from(["k1", "k2", "", "x" * 300]))
        return req
    if op == "cancel":
        return {"op": op, "session": sid, "timer": draw(st.sampled_from(["t-nope", "", "a b"]))}
    if op == "timers":
        return {"op": op, "session": draw(st.none() | IDS)}
    if op == "wait" and draw(st.booleans()):
        # well formed but for its acks: one bad ack among good ones must be refused whole
        sessions = draw(st.lists(st.sampled_from(NAMES), min_size=2, max_size=3, unique=True))
        acks = {name: draw(st.integers(-1, 3)) for name in sessions}
        return {"op": op, "sessions": sessions, "ack": acks, "timeout_ms": 0}
    if op == "wait":
        sessions = draw(st.lists(st.sampled_from(NAMES) | IDS, min_size=1, max_size=3))
        on = st.sampled_from(sessions) if draw(st.integers(0, 4)) else IDS
        acks = draw(st.dictionaries(on, SEQS, max_size=3))
        return {
            "op": op,
            "sessions": sessions,
            "cursor": draw(CURSORS),
            "ack": acks,
            "max": draw(st.none() | st.none() | MAXES),
            "timeout_ms": draw(st.sampled_from([0, 0, 0, -5])),
        }
    return {"op": op}


requests = st.lists(st.composite(request)(), min_size=5, max_size=40)


FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


# 60 scripts a store in the suite (some 3 s); ENGINE_WIRE_EXAMPLES=N for more
@settings(max_examples=examples(60, "ENGINE_WIRE_EXAMPLES"), suppress_health_check=FIXTURES)
@given(script=requests)
def test_a_refused_request_changes_no_session(
    inprocess: InProcess, script: list[dict[str, Any] | bytes]
) -> None:
    refused_requests_change_nothing(inprocess, script)


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=examples(300, "ENGINE_WIRE_EXAMPLES"), suppress_health_check=FIXTURES)
@given(script=requests)
def test_a_refused_request_changes_no_session_over_a_long_search(
    inprocess: InProcess, script: list[dict[str, Any] | bytes]
) -> None:
    refused_requests_change_nothing(inprocess, script)


def refused_requests_change_nothing(
    inprocess: InProcess, script: list[dict[str, Any] | bytes]
) -> None:
    client = Client(inprocess.port, inprocess.token)
    try:
        for name in NAMES:  # each example starts from the same three sessions
            client.call({"op": "stop", "session": name})
            client.ok({"op": "start", "session": name, "buffer": 4})
            client.ok({"op": "send", "session": name, "text": "first"})
        refused = 0
        for req in script:
            before = inprocess.state()
            if isinstance(req, bytes):
                client.send_raw(req + b"\n")
                answer = client.recv()
            else:
                answer = client.call(req)
            assert isinstance(answer.get("ok"), bool), (req, answer)
            if not answer["ok"]:
                refused += 1
                assert inprocess.state() == before, (req, answer)
        # the connection is still usable after every refusal
        assert client.ok({"op": "ping"})["version"]
    finally:
        client.close()


def test_the_partial_ack_of_the_issue_is_refused_whole(inprocess: InProcess) -> None:
    """Reproduced over the wire before the fix: cursor ``wait`` of ``a`` moved to 1."""
    client = Client(inprocess.port, inprocess.token)
    try:
        for name in ("a", "b"):
            client.ok({"op": "start", "session": name})
            client.ok({"op": "send", "session": name, "text": "one"})
        answer = client.call({"op": "wait", "sessions": ["a", "b"], "ack": {"a": 1, "b": -1}})
        assert answer["code"] == "bad_seq", answer
        for name in ("a", "b"):
            assert client.ok({"op": "cursors", "session": name})["cursors"] == []
        assert json.dumps(answer).count("negative") == 1
    finally:
        client.close()
