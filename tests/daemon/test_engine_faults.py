"""The engine over a store that fails: a change that cannot be written is undone, and said so.

The store is the real SQLite store behind a switch (``Flaky``) that makes
its writes, or its reads of one session, fail while the test says so, as a
full disk or a vanished file would. After a failed write the engine reloads
the sessions of the batch from the store, so what it serves is what the
file holds; when even that reload fails, it keeps what it has and writes
the whole session again with the next batch. Either way the caller was told
``store_failed``, and what the daemon serves next is what the file holds.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Collection
from pathlib import Path

import anyio
import msgspec
import pytest

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local import committer as local
from repl_daemon.backends.local.committer import LocalCommitter
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.engine import Engine
from session.delta import Delta
from session.errors import StoreFailed, TooMany
from session.ring import Image
from session.scopes import TokenRecord
from session.session import Session, Snapshot

pytestmark = pytest.mark.anyio


class Flaky:
    """The SQLite store, with writes and reloads that fail while ``writes`` / ``reloads`` say."""

    durable = True

    def __init__(self, path: Path) -> None:
        self.inner = SqliteStore(path)
        self.name = self.inner.name
        self.writes = True
        self.reloads = True
        self.images = True

    def load(self) -> list[Snapshot]:
        return list(self.inner.load())

    def load_sessions(self, session_ids: Collection[str]) -> dict[str, Snapshot | None]:
        if not self.reloads:
            raise StoreFailed(f"cannot read {self.inner.path}: the disk is gone")
        return self.inner.load_sessions(session_ids)

    def write(self, batch: list[Delta]) -> None:
        if not self.writes:
            raise StoreFailed(f"cannot write {self.inner.path}: the disk is full")
        self.inner.write(batch)

    def keep_images(self, images: list[tuple[str, Image]]) -> int:
        if not self.images:
            raise StoreFailed(f"cannot write {self.inner.path}: the disk is full")
        return self.inner.keep_images(images)

    def load_tokens(self) -> list[TokenRecord]:
        return self.inner.load_tokens()

    def put_token(self, record: TokenRecord) -> None:
        if not self.writes:
            raise StoreFailed(f"cannot write {self.inner.path}: the disk is full")
        self.inner.put_token(record)

    def drop_token(self, name: str) -> None:
        if not self.writes:
            raise StoreFailed(f"cannot write {self.inner.path}: the disk is full")
        self.inner.drop_token(name)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def store(tmp_path: Path) -> Flaky:
    return Flaky(tmp_path / "repl.db")


@contextlib.asynccontextmanager
async def running(store: Flaky) -> AsyncIterator[Engine]:
    """An engine over ``store`` with its committer at work; the store closed at the end."""
    engine = Engine(LocalBackend(store), settle=0)
    await engine.load()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            yield engine
            tg.cancel_scope.cancel()
    finally:
        store.close()


async def call(engine: Engine, req: p.Request) -> p.Response:
    return await engine.handle(req).result()


def served(engine: Engine) -> dict[str, Snapshot]:
    committer = engine.committer
    assert isinstance(committer, LocalCommitter)
    return {sid: h.session.snapshot() for sid, h in committer.sessions.items()}


def on_file(path: Path) -> dict[str, Snapshot]:
    """What a daemon started on the file now would load (a folded ring brought in)."""
    reopened = SqliteStore(path)
    try:
        return {s.id: unfolded(s) for s in reopened.load()}
    finally:
        reopened.close()


def unfolded(snapshot: Snapshot) -> Snapshot:
    if snapshot.fold is None:
        return snapshot
    firings = snapshot.fold.unfold().firings()
    return msgspec.structs.replace(snapshot, fold=None, firings=firings)


def results(snapshot: Snapshot) -> list[str | None]:
    return [f.result for f in snapshot.firings]


async def test_a_stop_that_cannot_be_written_is_undone(store: Flaky) -> None:
    async with running(store) as engine:
        await call(engine, p.Start(session="a"))
        await call(engine, p.Send(session="a", text="one"))
        store.writes = False
        with pytest.raises(StoreFailed, match="the disk is full"):
            await call(engine, p.Stop(session="a"))
        assert results(served(engine)["a"]) == ["one"]  # back, as the file holds it
        store.writes = True
        sent = await call(engine, p.Send(session="a", text="two"))
        assert isinstance(sent, p.Sent) and sent.seq == 2
    assert results(on_file(store.inner.path)["a"]) == ["one", "two"]


async def test_a_start_and_its_stop_in_one_failed_batch_leave_no_session(store: Flaky) -> None:
    async with running(store) as engine:
        store.writes = False
        started = engine.handle(p.Start(session="b"))
        stopped = engine.handle(p.Stop(session="b"))  # in the same batch as the start
        for outcome in (started, stopped):
            with pytest.raises(StoreFailed):
                await outcome.result()
        assert served(engine) == {}
        store.writes = True
        again = await call(engine, p.Start(session="b"))
        assert isinstance(again, p.Started) and again.created
    assert list(on_file(store.inner.path)) == ["b"]


async def test_a_failed_write_whose_reload_fails_too_is_written_whole_with_the_next(
    store: Flaky,
) -> None:
    async with running(store) as engine:
        await call(engine, p.Start(session="a"))
        await call(engine, p.Send(session="a", text="one"))
        store.writes = store.reloads = False
        with pytest.raises(StoreFailed, match="the disk is full"):
            await call(engine, p.Send(session="a", text="two"))
        # nothing to go back to: the session goes on as it is, to be written whole
        assert results(served(engine)["a"]) == ["one", "two"]
        store.writes = store.reloads = True
        await call(engine, p.Send(session="a", text="three"))
        assert store.inner.load_sessions(["a"])["a"] == served(engine)["a"]
    assert results(on_file(store.inner.path)["a"]) == ["one", "two", "three"]


async def test_a_waits_ack_that_cannot_be_made_durable_fails_and_moves_no_cursor(
    store: Flaky,
) -> None:
    async with running(store) as engine:
        await call(engine, p.Start(session="a"))
        await call(engine, p.Send(session="a", text="one"))
        await call(engine, p.Send(session="a", text="two"))
        store.writes = False
        with pytest.raises(StoreFailed, match="the disk is full"):
            await call(engine, p.Wait(sessions=["a"], ack={"a": 1}, timeout_ms=0))
        assert served(engine)["a"].cursors == []
        store.writes = True
        woken = await call(engine, p.Wait(sessions=["a"], timeout_ms=0))
        assert isinstance(woken, p.Woken)
        assert [f.result for f in woken.batches[0].firings] == ["one", "two"]


async def test_a_token_change_that_cannot_be_written_changes_nothing(store: Flaky) -> None:
    """A token add or revoke the store refuses is ``store_failed``, and the tokens are as
    before: the added one does not work, the revoked one still does (SPEC §11)."""
    async with running(store) as engine:
        kept = await call(engine, p.Token(action="add", name="kept", sessions=["*"], can=["read"]))
        assert isinstance(kept, p.TokenMade)
        store.writes = False
        with pytest.raises(StoreFailed, match="the disk is full"):
            await call(engine, p.Token(action="add", name="new", sessions=["*"], can=["read"]))
        with pytest.raises(StoreFailed, match="the disk is full"):
            await call(engine, p.Token(action="revoke", name="kept"))
        listed = await call(engine, p.Token(action="list"))
        assert isinstance(listed, p.TokenList) and [t.name for t in listed.tokens] == ["kept"]
        assert await engine.authenticate(kept.token, b"root").result() is not None
        store.writes = True
        made = await call(engine, p.Token(action="add", name="new", sessions=["*"], can=["read"]))
        assert isinstance(made, p.TokenMade)
    reopened = SqliteStore(store.inner.path)
    try:
        assert [t.name for t in reopened.load_tokens()] == ["kept", "new"]
    finally:
        reopened.close()


async def test_past_the_most_tokens_an_add_is_too_many(
    store: Flaky, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "MAX_TOKENS", 2)
    async with running(store) as engine:
        for name in ("a", "b"):
            await call(engine, p.Token(action="add", name=name, sessions=["*"], can=["read"]))
        with pytest.raises(TooMany, match="tokens, its limit"):
            await call(engine, p.Token(action="add", name="c", sessions=["*"], can=["read"]))


def images_on_file(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        found = [row[0] for row in conn.execute("SELECT session FROM rings ORDER BY session")]
    conn.close()
    return found


async def test_a_clean_stop_whose_images_cannot_be_written_still_loses_nothing(
    store: Flaky, caplog: pytest.LogCaptureFixture
) -> None:
    """The images are a copy: when they cannot be written the stop says so and goes on,
    and the next start reads the log."""
    async with running(store) as engine:
        for sid in ("a", "b"):
            await call(engine, p.Start(session=sid))
            await call(engine, p.Send(session=sid, text=f"{sid} one"))
        store.images = False
        with caplog.at_level(logging.WARNING, logger="repl.daemon"):
            await engine.shutdown()
        expected = served(engine)
    assert "the rings' images were not kept: cannot write" in caplog.text
    assert images_on_file(store.inner.path) == []
    loaded = {sid: Session.restore(s).snapshot() for sid, s in on_file(store.inner.path).items()}
    assert loaded == expected


async def test_a_stop_while_the_store_fails_keeps_no_images(store: Flaky) -> None:
    """A daemon whose last commit failed may hold rings the file does not: none is kept."""
    async with running(store) as engine:
        await call(engine, p.Start(session="a"))
        store.writes = False
        with pytest.raises(StoreFailed):
            await call(engine, p.Send(session="a", text="never stored"))
        await engine.shutdown()
    assert images_on_file(store.inner.path) == []
    store.writes = True


async def test_a_clean_stop_keeps_the_image_of_every_ring_it_wrote(store: Flaky) -> None:
    async with running(store) as engine:
        for sid in ("a", "b", "c"):
            await call(engine, p.Start(session=sid))
            await call(engine, p.Send(session=sid, text=f"{sid} one"))
        await engine.shutdown()
        expected = served(engine)
    assert images_on_file(store.inner.path) == ["a", "b", "c"]
    loaded = {sid: Session.restore(s).snapshot() for sid, s in on_file(store.inner.path).items()}
    assert loaded == expected


def texts(answer: p.Response) -> list[str | None]:
    assert isinstance(answer, p.Firings)
    return [f.result if f.event is None else f.event for f in answer.firings]


async def test_a_folded_ring_that_cannot_be_read_fails_its_ops_and_changes_nothing(
    store: Flaky,
) -> None:
    """After a clean stop the rings come back folded. One whose image was damaged and whose
    rows were put aside by hand: a send, a read and an ack on it are ``store_failed`` and
    change nothing, a timer due on it stays due, and the other ring is served. With its rows
    back the same timer fires, the send is stored, and nothing was lost."""
    async with running(store) as engine:
        for sid in ("a", "b"):
            await call(engine, p.Start(session=sid))
            await call(engine, p.Send(session=sid, text=f"{sid} one"))
        await call(engine, p.Schedule(session="a", text="due", in_="1h"))
        await engine.shutdown()
    db = store.inner.path
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE rings SET image = substr(image, 2) WHERE session = 'a'")
        conn.execute("CREATE TABLE aside AS SELECT * FROM log WHERE session = 'a'")
        conn.execute("DELETE FROM log WHERE session = 'a'")
    conn.close()
    store = Flaky(db)
    async with running(store) as engine:
        committer = engine.committer
        assert isinstance(committer, LocalCommitter)
        a = committer.sessions["a"].session
        for request in (
            p.Send(session="a", text="a two"),
            p.Read(session="a", after=0),
            p.Ack(session="a", cursor="read", seq=1),
        ):
            with pytest.raises(StoreFailed, match=r"session 'a' holds 0 firing\(s\) where"):
                await call(engine, request)
        assert a.ring.is_folded and a.head == 1 and a.cursor_states() == []
        assert texts(await call(engine, p.Read(session="b", after=0))) == ["b one"]
        later = committer.clock.now_ms() + 2 * 3_600_000
        assert not await committer.fire(later)
        assert [t.text for t in a.timer_list()] == ["due"] and a.head == 1
        with sqlite3.connect(db) as conn:
            conn.execute("INSERT INTO log SELECT * FROM aside")
        conn.close()
        assert await committer.fire(later)
        await call(engine, p.Send(session="a", text="a two"))
        assert texts(await call(engine, p.Read(session="a", after=0))) == [
            "a one",
            "due",
            "a two",
        ]
        assert a.timer_list() == []


async def test_a_clean_stop_keeps_the_images_of_rings_left_folded(store: Flaky) -> None:
    """A ring nothing looked into since the start keeps the image it came from; a stop writes
    the images of the rings that were brought in and changed, and the next start has every
    ring exactly as it was served."""
    async with running(store) as engine:
        for sid in ("a", "b", "c"):
            await call(engine, p.Start(session=sid))
            await call(engine, p.Send(session=sid, text=f"{sid} one"))
        await engine.shutdown()
    for turn in range(2):
        store = Flaky(store.inner.path)
        async with running(store) as engine:
            await call(engine, p.Send(session="b", text=f"b turn {turn}"))
            await engine.shutdown()
            committer = engine.committer
            assert isinstance(committer, LocalCommitter)
            assert [sid for sid, h in committer.sessions.items() if h.session.ring.is_folded] == [
                "a",
                "c",
            ]
            expected = served(engine)
        assert images_on_file(store.inner.path) == ["a", "b", "c"]
        loaded = {
            sid: Session.restore(s).snapshot() for sid, s in on_file(store.inner.path).items()
        }
        assert loaded == expected
