"""What every store of deltas must do, checked against real files (SQLite).

A store is handed :class:`Delta` batches and must give back, through
``load`` and ``load_sessions``, exactly what the core's ``Session.snapshot()``
holds: seqs, the ring (bound included), cursors with their last use, dedup
keys in order, limits and the cursor-use clock. The deltas here are the
core's own (``Session.take_delta``, through ``Mirror`` in tests/helpers/stores.py,
proven against a model in tests/core/test_session_delta.py); the last tests
drive the real engine.

To hold another store to the same contract, add it to ``STORES``. The Redis
store is no store of deltas (Redis applies each operation itself): its
contract is to agree with the core, tests/stores/test_redis_differential.py.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.backends.local.sqlite import write as sqlite_write
from repl_daemon.backends.local.store import Store
from repl_daemon.engine import Engine, Outcome
from session.delta import Delta, Webhook
from session.errors import StoreFailed
from session.firing import Firing
from session.rules import MAX_KEYS, READ
from session.schedule import Timer
from session.scopes import Scope, TokenRecord
from session.session import Session, Snapshot
from tests.helpers import TS, Mirror, counted

OpenStore = Callable[[], Store]

STORES: dict[str, Callable[[Path], Store]] = {
    "sqlite": lambda home: SqliteStore(home / "repl.db"),
}


@pytest.fixture(autouse=True, scope="module")
def compact_at_once() -> Iterator[None]:
    """The SQLite store compacts its log as soon as it holds more than twice its live
    rows, so every test here (and every example of the random ones) goes through it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite_write, "COMPACT_SLACK", 0)
        yield


@pytest.fixture(params=sorted(STORES))
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens the store on the test's home; every store opened is closed at the end."""
    opened: list[Store] = []

    def factory() -> Store:
        store = STORES[request.param](tmp_path)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()


def reopen(store: Store, open_store: OpenStore) -> Store:
    """Close the store and open it again: what a restarted daemon would see."""
    store.close()
    return open_store()


def loaded(store: Store) -> dict[str, Snapshot]:
    return {snap.id: snap for snap in store.load()}


def test_timers_load_back_as_added_moved_and_gone(open_store: OpenStore) -> None:
    """A session's pending timers: added, moved by a firing, fired for good, cancelled."""
    store = open_store()
    a = Mirror("a")
    for name, due, every in (("once", 100, None), ("tick", 100, 1000), ("later", 9000, None)):
        a.session.schedule(
            Timer(id=name, session="a", due_ms=due, every_ms=every, handler="on-tick", text=name)
        )
    store.write([a.delta()])
    assert loaded(store)["a"] == a.snapshot()
    a.session.fire_timers(["once", "tick"], 2500, "2026-12-01T00:00:02.500Z")
    a.session.cancel_timer("later")
    store.write([a.delta()])
    store = reopen(store, open_store)
    assert loaded(store) == {"a": a.snapshot()}
    assert [(t.id, t.due_ms) for t in loaded(store)["a"].timers] == [("tick", 3100)]
    assert store.load_sessions(["a"])["a"] == a.snapshot()


def test_a_webhook_loads_back_as_set_and_taken_away(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    a.session.set_webhook(Webhook("secret", "on-ci"))
    store.write([a.delta()])
    store = reopen(store, open_store)
    assert loaded(store)["a"].webhook == Webhook("secret", "on-ci")
    a.session.set_webhook(Webhook("rotated"))
    store.write([a.delta()])
    assert store.load_sessions(["a"])["a"] == a.snapshot()
    a.session.set_webhook(None)
    store.write([a.delta()])
    store = reopen(store, open_store)
    assert loaded(store) == {"a": a.snapshot()}


def test_a_new_session_loads_back_as_the_core_holds_it(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    a.record("one")
    a.record("two", key="k2")
    a.record("raw", handler="on-build")  # unhandled: keeps the event, no result
    a.session.ack("read", 2)
    a.session.read("follow")
    store.write([a.delta()])
    store = reopen(store, open_store)
    assert loaded(store) == {"a": a.snapshot()}
    assert store.load_sessions(["a"])["a"] == a.snapshot()


def test_later_batches_add_to_what_is_stored(open_store: OpenStore) -> None:
    store = open_store()
    a, b = Mirror("a"), Mirror("b", limit=3)
    for round_ in range(5):
        for i in range(round_ + 1):
            a.record(f"a{round_}.{i}", key=f"a-{round_}-{i}")
            b.record(f"b{round_}.{i}")
        a.session.ack("read", a.session.head - 1)
        store.write([a.delta(), b.delta()])
        assert loaded(store) == {"a": a.snapshot(), "b": b.snapshot()}
    store = reopen(store, open_store)
    assert loaded(store) == {"a": a.snapshot(), "b": b.snapshot()}


def test_a_session_with_nothing_changed_but_its_cursors(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    a.record("one")
    store.write([a.delta()])
    a.session.read("peeker")  # a read is a use of the cursor: its last use moves
    store.write([a.delta()])
    assert store.load_sessions(["a"])["a"] == a.snapshot()


def test_texts_come_back_byte_for_byte(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    texts = ["", "nul\x00inside", "line\nbreak", "ünïcødé ✓ 🎉", "x" * (1 << 20), '\r\t\\"']
    for text in texts:
        a.record(text)
    a.record("event text", handler="webhook")
    store.write([a.delta()])
    store = reopen(store, open_store)
    firings = loaded(store)["a"].firings
    assert [f.result for f in firings[:-1]] == texts
    assert (firings[-1].result, firings[-1].event) == (None, "event text")


def test_tagged_firings_come_back_exactly(open_store: OpenStore) -> None:
    """Tags as the ring packs them (and one it keeps as itself, a NUL in a value) come back
    key for key, in their order, value for value, sender and all."""
    store = open_store()
    a = Mirror("a")
    sends = [
        {"reply-to": "agent-7", "corr": "c-1", "kind": "review"},
        {"kind": "review", "corr": "c-2", "reply-to": "agent-7"},  # the same keys, reordered
        {"empty": "", "unicode": "ünïcødé ✓ 🎉", "nl": "a\nb"},
        {f"k{n}": "v" * n for n in range(16)},
        {"nul": "x\x00y"},
        {},
    ]
    for n, tags in enumerate(sends):
        a.session.record("on-message", f"m{n}", TS, tags=tags, by="agent" if n % 2 else None)
    a.session.record("on-build", "unhandled", TS, tags={"k": "v"}, by="root")
    store.write([a.delta()])
    store = reopen(store, open_store)
    firings = loaded(store)["a"].firings
    assert firings == a.session.read_after(0).firings
    assert [list(f.tags.items()) for f in firings[:-1]] == [list(t.items()) for t in sends]
    assert (firings[-1].event, firings[-1].tags, firings[-1].by) == (
        "unhandled",
        {"k": "v"},
        "root",
    )


def test_only_the_newest_limit_firings_stay(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a", limit=4)
    for i in range(10):
        a.record(f"m{i}")
        if i % 3 == 0:
            store.write([a.delta()])
    store.write([a.delta()])
    snap = store.load_sessions(["a"])["a"]
    assert snap is not None and [f.seq for f in snap.firings] == [7, 8, 9, 10]
    assert snap == a.snapshot()


def test_more_firings_in_one_batch_than_the_ring_holds(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a", limit=3)
    a.record("first")
    store.write([a.delta()])
    for i in range(50):
        a.record(f"m{i}")
    store.write([a.delta()])
    assert store.load_sessions(["a"])["a"] == a.snapshot()


def test_a_lowered_limit_trims_and_a_raised_one_does_not_bring_firings_back(
    open_store: OpenStore,
) -> None:
    store = open_store()
    a = Mirror("a", limit=8)
    for i in range(8):
        a.record(f"m{i}")
    store.write([a.delta()])
    a.session.set_limit(2)
    store.write([a.delta()])
    assert [f.seq for f in loaded(store)["a"].firings] == [7, 8]
    # raised again: the ring holds 2, then grows by what comes; 1-6 stay gone
    a.session.set_limit(8)
    a.record("m8")
    store.write([a.delta()])
    store = reopen(store, open_store)
    assert loaded(store)["a"] == a.snapshot()
    assert [f.seq for f in loaded(store)["a"].firings] == [7, 8, 9]
    # lowered and raised again between two writes: the trim must still happen
    a.session.set_limit(1)
    a.session.set_limit(8)
    a.record("m9")
    store.write([a.delta()])
    assert [f.seq for f in loaded(store)["a"].firings] == [9, 10]
    assert loaded(store)["a"] == a.snapshot()


def test_limit_zero_keeps_no_firing_but_the_head_moves(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a", limit=0)
    for i in range(5):
        a.record(f"m{i}", key=f"k{i}")
    store.write([a.delta()])
    store = reopen(store, open_store)
    snap = loaded(store)["a"]
    assert (snap.head, snap.firings) == (5, [])
    assert snap == a.snapshot()


def test_dedup_keys_stay_capped_at_the_newest_1024_in_order(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a", limit=16)
    for i in range(600):
        a.record(f"m{i}", key=f"k{i}")
    store.write([a.delta()])
    for i in range(600, 1100):
        a.record(f"m{i}", key=f"k{i}")
    # k0 has left the core's 1,024 keys: taken again it is new, and the newest
    assert a.record("again", key="k0") == 1101
    store.write([a.delta()])
    keys = loaded(store)["a"].keys
    assert len(keys) == MAX_KEYS
    assert keys[0] == ("k77", 78) and keys[-2:] == [("k1099", 1100), ("k0", 1101)]
    assert keys == a.snapshot().keys


def test_more_than_1024_keys_in_one_batch(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a", limit=4)
    a.record("first", key="k-first")
    store.write([a.delta()])
    for i in range(MAX_KEYS + 300):
        a.record(f"m{i}", key=f"k{i}")
    a.record("again", key="k5")  # left the core's keys inside this very batch
    store.write([a.delta()])
    store = reopen(store, open_store)
    assert loaded(store)["a"].keys == a.snapshot().keys


def test_cursors_keep_their_positions_last_uses_and_lru_order(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    for i in range(20):
        a.record(f"m{i}")
    for i in range(16):
        a.session.ack(f"c{i}", i)
    a.session.read("c0")  # now c1 is the least recently used
    store.write([a.delta()])
    store = reopen(store, open_store)
    snap = loaded(store)["a"]
    assert snap.cursors == a.snapshot().cursors
    assert snap.uses == a.session.uses == 17
    # the restored core evicts the same cursor the original one would
    restored = Session.restore(snap)
    restored.ack("c16", 3)
    a.session.ack("c16", 3)
    assert [c.name for c in restored.cursor_table()] == [c.name for c in a.session.cursor_table()]
    assert "c1" not in {c.name for c in restored.cursor_table()}


def test_an_evicted_cursor_is_gone_from_the_store(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    a.record("m")
    for i in range(16):
        a.session.ack(f"c{i}", 1)
    store.write([a.delta()])
    a.session.ack("new", 0)
    store.write([a.delta()])
    names = {c.name for c in loaded(store)["a"].cursors}
    assert "c0" not in names and "new" in names and len(names) == 16


def test_the_use_clock_survives_without_cursors(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    a.record("m")
    a.session.ack("x", 1)
    a.session.ack("x", 1)
    store.write([a.delta()])
    assert loaded(store)["a"].uses == 2


def test_gone_deletes_the_whole_session(open_store: OpenStore) -> None:
    store = open_store()
    a, b = Mirror("a"), Mirror("b")
    for m in (a, b):
        m.record("m", key="k")
        m.session.ack("read", 1)
    store.write([a.delta(), b.delta()])
    store.write([Delta("a", gone=True)])
    store = reopen(store, open_store)
    assert loaded(store) == {"b": b.snapshot()}
    assert store.load_sessions(["a"])["a"] is None


def test_reset_replaces_whatever_was_under_the_id(open_store: OpenStore) -> None:
    store = open_store()
    old = Mirror("a")
    for i in range(10):
        old.record(f"old{i}", key=f"k{i}")
    old.session.ack("read", 5)
    store.write([old.delta()])
    # stopped and started again before the next batch: one gone, one reset
    new = Mirror("a", limit=4)
    new.record("new")
    store.write([Delta("a", gone=True), new.delta()])
    assert store.load_sessions(["a"])["a"] == new.snapshot()
    # a reset alone does the same
    newer = Mirror("a", limit=2)
    store.write([newer.delta()])
    store = reopen(store, open_store)
    assert loaded(store) == {"a": newer.snapshot()}


def test_an_unknown_session_loads_as_none(open_store: OpenStore) -> None:
    store = open_store()
    assert store.load_sessions(["nope"])["nope"] is None
    assert list(store.load()) == []


def test_a_failed_batch_writes_nothing_and_the_store_goes_on(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    a.record("kept")
    store.write([a.delta()])
    before = loaded(store)
    a.record("lost")
    good = a.delta()
    # a change to a session the store never had, and not a reset: refused
    bad = Delta("ghost", limit=4, head=1, retained=0)
    with pytest.raises(StoreFailed):
        store.write([good, bad])
    assert loaded(store) == before
    store.write([good])
    assert loaded(store) == {"a": a.snapshot()}


def test_a_delta_that_would_leave_a_hole_in_the_ring_is_refused(open_store: OpenStore) -> None:
    store = open_store()
    a = Mirror("a")
    a.record("one")
    store.write([a.delta()])
    a.record("two")
    a.record("three")
    skipped = a.session.ring.events_after(2).firings  # seq 2 never handed over
    delta = Delta("a", limit=256, head=3, uses=0, retained=3, firings=skipped, cursors=[])
    with pytest.raises(StoreFailed, match="do not continue"):
        store.write([delta])
    assert [f.seq for f in loaded(store)["a"].firings] == [1]


@pytest.mark.parametrize(
    ("seqs", "head"),
    [
        ([3], 3),  # one firing after a hole
        ([2, 2], 3),  # two, the second a twin: the head not reached
        ([3, 3], 3),  # two ending at the head, the first not after the stored head
        ([2, 4], 4),  # two whose ends are right, a hole between them
        ([2, 4, 4], 4),  # three whose ends are right, a twin and a hole between
        ([1, 2], 2),  # two starting at the stored head itself
    ],
)
def test_new_firings_that_do_not_follow_the_stored_head_one_by_one_are_refused(
    open_store: OpenStore, seqs: list[int], head: int
) -> None:
    """The check every delta passes, one new firing or a few (the store takes a short cut
    for one or two whose ends are where they must be): anything else is refused whole."""
    store = open_store()
    a = Mirror("a")
    a.record("one")
    store.write([a.delta()])
    firings = [
        Firing(seq, "on-message", f"m{seq}", None, "2026-12-02T09:00:00.000Z") for seq in seqs
    ]
    delta = Delta("a", limit=256, head=head, retained=head, firings=firings)
    with pytest.raises(StoreFailed, match="do not continue"):
        store.write([delta])
    assert [f.seq for f in loaded(store)["a"].firings] == [1]
    follows = [Firing(2, "on-message", "m2", None, "2026-12-02T09:00:00.000Z")]
    store.write([Delta("a", limit=256, head=2, retained=2, firings=follows)])
    assert [f.seq for f in loaded(store)["a"].firings] == [1, 2]


def test_the_memory_store_keeps_nothing() -> None:
    store = MemoryStore()
    a = Mirror("a")
    a.record("m")
    store.write([a.delta()])
    assert list(store.load()) == [] and store.load_sessions(["a"])["a"] is None
    assert store.load_sessions(["a", "b"]) == {"a": None, "b": None}
    assert not store.durable
    token = TokenRecord("t", "d" * 64, Scope(("a*",), frozenset({READ})))
    store.put_token(token)
    store.drop_token("t")
    assert store.load_tokens() == []
    store.close()


# -- the engine's own deltas ----------------------------------------------------

Op = tuple[str, int, int]
ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["send", "send", "send", "keyed", "ack", "read", "buffer", "restart", "gap"]
        ),
        st.integers(0, 2),  # which session
        st.integers(0, 40),  # a free parameter
    ),
    max_size=60,
)


async def run_engine(store: Store, script: list[Op]) -> dict[str, Snapshot]:
    """Drive the engine through ``script``; commits come in groups, as under load.

    The local committer on every local store: what is checked here is that a
    store keeps the deltas it is handed.
    """
    engine = Engine(LocalBackend(store), settle=0)
    committer = engine.committer
    assert isinstance(committer, LocalCommitter)
    names = ["s0", "s1", "s2"]

    async def call(req: p.Request) -> p.Response:
        return await engine.handle(req).result()

    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        for name in names:
            await call(p.Start(session=name, buffer=5))
        pending: list[Outcome[p.Response]] = []
        for op, which, n in script:
            name = names[which]
            if op == "gap":  # let the committer write what is pending
                for outcome in pending:
                    await outcome.result()
                pending.clear()
                continue
            if op == "restart":
                await call(p.Stop(session=name))
                await call(p.Start(session=name, buffer=n % 7))
                continue
            visible = committer.sessions[name].visible
            req: p.Request
            if op in ("send", "keyed"):
                key = f"k{n % 9}" if op == "keyed" else None
                req = p.Send(session=name, text=f"t{n}", key=key)
            elif op == "ack":
                req = p.Ack(session=name, cursor=f"c{n % 20}", seq=min(n, visible))
            elif op == "read":
                req = p.Read(session=name, cursor=f"c{n % 20}")
            else:
                req = p.Buffer(session=name, limit=n % 9)
            pending.append(engine.handle(req))
        await committer.commit_now()
        for outcome in pending:
            await outcome.result()
        tg.cancel_scope.cancel()
    return {name: hosted.session.snapshot() for name, hosted in committer.sessions.items()}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(script=ops)
def test_what_the_engine_writes_loads_back_as_its_sessions(script: list[Op]) -> None:
    for name, make in STORES.items():
        with tempfile.TemporaryDirectory(prefix=f"store-{name}-") as home:
            store = make(Path(home))
            try:
                expected = anyio.run(run_engine, store, script)
                if isinstance(store, SqliteStore):  # the counts compaction goes by, recounted
                    assert store._conn is not None
                    assert counted(store._conn) == store._counts
            finally:
                store.close()
            store = make(Path(home))
            try:
                assert loaded(store) == expected
            finally:
                store.close()


def test_a_long_random_run_through_the_engine(tmp_path: Path) -> None:
    rng = random.Random(5)
    kinds = ["send", "send", "keyed", "ack", "read", "buffer", "gap", "gap"]
    script: list[Op] = [
        (rng.choice(kinds), rng.randrange(3), rng.randrange(41)) for _ in range(400)
    ]
    for name, make in STORES.items():
        home = tmp_path / name
        home.mkdir()
        store = make(home)
        try:
            expected = anyio.run(run_engine, store, script)
        finally:
            store.close()
        store = make(home)
        try:
            assert loaded(store) == expected
        finally:
            store.close()
