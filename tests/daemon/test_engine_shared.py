"""The shared committer in-process, on a real redis-server: the defects the engine rework fixed.

Each test here failed before the rework: the per-session lock table grew by
one entry for every id a client named (valid or not), and a start whose
change Redis had taken was answered ``store_failed`` when the separate
update of the session set failed after it.
"""

from __future__ import annotations

import anyio
import pytest
import redis

from repl_daemon import protocol as p
from repl_daemon.engine import Engine, open_engine
from repl_daemon.engine.shared import SharedCommitter
from repl_daemon.stores.redis import RedisStore, session_keys
from session.errors import BadSessionId, NoSuchSession, ReplError, StoreFailed
from tests.helpers import RedisProc

pytestmark = pytest.mark.anyio


async def call(engine: Engine, req: p.AnyRequest) -> p.Response:
    return await engine.handle(req).result()


async def test_naming_ids_leaves_no_lock_behind(redis_server: RedisProc) -> None:
    store = RedisStore(redis_server.url)
    try:
        engine = open_engine(store, settle=0)
        committer = engine.committer
        assert isinstance(committer, SharedCommitter)
        await call(engine, p.Start(session="real"))
        await call(engine, p.Send(session="real", text="one"))
        for n in range(50):
            for session_id, error in (
                (f"missing-{n}", NoSuchSession),
                (f"bad id {n}", BadSessionId),
            ):
                for req in (
                    p.Send(session=session_id, text="x"),
                    p.Read(session=session_id),
                    p.Ack(session=session_id, seq=0),
                    p.Stats(session=session_id),
                ):
                    with pytest.raises(error):
                        await call(engine, req)
        woken = await call(engine, p.Wait(sessions=["real"], timeout_ms=0))
        assert isinstance(woken, p.Woken) and woken.batches
        assert committer._locks == {} and committer._queues == {}
    finally:
        store.close()


async def test_a_change_redis_refused_is_not_half_written(redis_server: RedisProc) -> None:
    """A user that may not SADD: the start fails whole, so nothing is answered wrongly.

    Before the rework the session's keys were written by the script and the
    set was updated after it, so this start was answered ``store_failed``
    although its session existed in Redis.
    """
    admin = redis.Redis(port=redis_server.port)
    admin.execute_command("ACL", "SETUSER", "nosadd", "on", ">pw", "~*", "&*", "+@all", "-sadd")
    store = RedisStore(f"redis://nosadd:pw@127.0.0.1:{redis_server.port}/0")
    try:
        engine = open_engine(store, settle=0)
        with pytest.raises(StoreFailed, match="sadd"):
            await call(engine, p.Start(session="x"))
        assert admin.exists(*session_keys("x")[:5]) == 0
        with pytest.raises(NoSuchSession):
            await call(engine, p.Send(session="x", text="lost?"))
    finally:
        store.close()
        admin.close()


async def test_every_refusal_is_a_repl_error(redis_server: RedisProc) -> None:
    store = RedisStore(redis_server.url)
    try:
        engine = open_engine(store, settle=0)
        await call(engine, p.Start(session="a"))
        with anyio.fail_after(5):
            for req in (
                p.Wait(sessions=["a"], ack={"a": -1}),
                p.Wait(sessions=["a", "nope"], timeout_ms=0),
                p.Ack(session="a", seq=9),
            ):
                with pytest.raises(ReplError):
                    await call(engine, req)
        listed = await call(engine, p.Cursors(session="a"))
        assert isinstance(listed, p.CursorList) and listed.cursors == []
    finally:
        store.close()
