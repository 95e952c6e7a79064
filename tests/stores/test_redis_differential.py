"""The Redis scripts agree with the core: the same operations, the same answers, the same state.

Redis applies every operation itself (``repl_daemon.stores.redis_scripts``),
so each rule of the core that a script restates (the read after N of rule
3, the ring's bound, monotonic acks, the LRU of cursors, the dedup window,
the evaluation count) is checked here against ``session/``: hypothesis runs
random sequences of operations through a core ``Session`` and through the
shared committer on a real redis-server, and requires every answer (value or
error, message included) and the final state to be equal. The bounds are
made small (3 cursors, 4 dedup keys) so that random runs reach them; the
scripts are handed whatever the core has, so they agree for any bound.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repl_daemon.engine.shared import SharedCommitter
from repl_daemon.stores import redis as redis_store
from repl_daemon.stores.redis import RedisStore, session_keys
from session import session as core_session
from session.delta import CursorState
from session.errors import ReplError, StoreFailed
from session.firing import Firing
from session.ops import (
    Ack,
    CursorTable,
    Describe,
    Op,
    Poll,
    ReadAfter,
    ReadCursor,
    Record,
    SetLimit,
)
from session.session import Session, Snapshot
from tests.helpers import RedisProc, require_redis

TS = "2026-12-01T06:00:00.000Z"


class Quiet:
    """A listener that hears nothing: the differential test has no waiters."""

    def changed(self, session_id: str) -> None:
        pass

    def stopped(self, session_id: str) -> None:
        pass

    def link(self, error: StoreFailed | None) -> None:
        pass


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    require_redis()
    server = RedisProc(Path(tempfile.mkdtemp()) / "redis")
    yield server.url
    server.stop()


@pytest.fixture(autouse=True)
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 cursors and 4 dedup keys, in the core and in what the store hands its scripts."""
    for module in (core_session, redis_store):
        monkeypatch.setattr(module, "MAX_CURSORS", 3)
        monkeypatch.setattr(module, "MAX_KEYS", 4)


names = st.sampled_from(["c1", "c2", "c3", "c4", "read", "", "a b"])
counts = st.none() | st.integers(-1, 4)
seqs = st.integers(-1, 12)
records = st.builds(
    Record,
    handler=st.sampled_from(["on-message", "on-message", "on-tick", "", "a b"]),
    text=st.text(max_size=6),
    ts=st.just(TS),
    key=st.sampled_from([None, "k1", "k2", "k3", "k4", "k5", "k6", ""]),
)
# sends, cursor reads and acks weigh more: the bounds are reached only by many of them
kinds = {
    "record": records,
    "after": st.builds(ReadAfter, after=seqs, max=counts),
    "cursor": st.builds(ReadCursor, cursor=names, max=counts, touch=st.booleans()),
    "ack": st.builds(Ack, cursor=names, seq=seqs),
    "poll": st.builds(Poll, max=counts),
    "limit": st.builds(SetLimit, limit=st.sampled_from([-1, 0, 1, 2, 3, 5, 70_000])),
    "table": st.just(CursorTable()),
    "describe": st.just(Describe()),
}
weights = ["record"] * 4 + ["cursor"] * 3 + ["ack"] * 3 + ["after", "poll", "limit"]
ops = st.sampled_from([*weights, "table", "describe"]).flatmap(lambda kind: kinds[kind])


def answer_of(run: Any) -> Any:
    """A value, or the error's wire code and message."""
    try:
        return ("ok", run())
    except ReplError as exc:
        return ("error", exc.code.value, exc.message)


async def redis_answer(committer: SharedCommitter, op: Op[Any]) -> Any:
    try:
        return ("ok", await committer.execute("s", op).result())
    except ReplError as exc:
        return ("error", exc.code.value, exc.message)


async def stored(store: RedisStore) -> tuple[Snapshot, int]:
    """The session as Redis holds it, in the core's snapshot form."""
    client = store.client
    meta_key, ring_key, cursors_key, keys_key, order_key, _ = session_keys("s")
    meta = await client.hgetall(meta_key)
    entries = await client.xrange(ring_key)
    firings = [redis_store._firing(entry) for entry in entries]
    cursors = []
    for name, value in (await client.hgetall(cursors_key)).items():
        seq, _, use = value.decode().partition(":")
        cursors.append(CursorState(name.decode(), int(seq), int(use)))
    cursors.sort(key=lambda c: c.last_use)
    order = await client.lrange(order_key, 0, -1)
    keys = [(k.decode(), int(await client.hget(keys_key, k))) for k in order]
    snapshot = Snapshot(
        "s", int(meta[b"limit"]), int(meta[b"head"]), firings, cursors, int(meta[b"uses"]), keys
    )
    return snapshot, int(meta[b"evals"])


async def run_both(url: str, limit: int, script: list[Op[Any]]) -> None:
    core = Session("s", limit)
    store = RedisStore(url)
    committer = SharedCommitter(store, Quiet())
    await committer.load()
    try:
        await store.client.delete(*session_keys("s")[:5])
        assert (await committer.start("s", limit, False).result()) == ("s", True)
        for step, op in enumerate(script):
            expected = answer_of(lambda op=op: op.run(core, None))
            got = await redis_answer(committer, op)
            assert got == expected, (step, op)
        snapshot, evaluations = await stored(store)
        assert snapshot == core.snapshot()
        assert evaluations == core.evaluations
    finally:
        await store.close()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(limit=st.integers(0, 4), script=st.lists(ops, min_size=15, max_size=60))
def test_redis_answers_as_the_core_does(redis_url: str, limit: int, script: list[Op[Any]]) -> None:
    anyio.run(run_both, redis_url, limit, script)


def test_a_long_run_reaches_every_bound(redis_url: str) -> None:
    """More than 4 keys, more than 3 cursors, limits lowered and raised, in one run."""
    script: list[Op[Any]] = []
    for n in range(60):
        script.append(Record("on-message", f"m{n}", TS, key=f"k{n % 7}"))
        script.append(ReadCursor(f"c{n % 5}"))
        script.append(Ack(f"c{(n + 2) % 5}", n // 2))
        if n % 9 == 0:
            script.append(SetLimit(n % 4))
        if n % 11 == 0:
            script.append(Poll(max=2))
    script += [ReadAfter(0), CursorTable(), Describe()]
    anyio.run(run_both, redis_url, 3, script)


def test_firing_text_comes_back_exactly(redis_url: str) -> None:
    texts = ["", "a\nb", "é ☃ \U0001f600", "\x00 nul", "x" * 5000, '{"json": true}']
    script: list[Op[Any]] = [Record("on-message", t, TS) for t in texts]
    script += [Record("on-tick", t, TS) for t in texts]
    script.append(ReadAfter(0))
    anyio.run(run_both, redis_url, 20, script)
    assert Firing(1, "on-message", "", None, TS).result == ""
