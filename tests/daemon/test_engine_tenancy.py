"""A scoped token's groups stay inside its patterns (SPEC §11, §16), on every store.

A group writes its dead letters into another session: its dead-letter session.
A token that could name that session, or make a group whose default one
(``ID.dead``) it does not see, would start and write sessions outside its
patterns, another tenant's. So a scoped token's ``group`` naming a dead-letter
session outside its patterns is ``forbidden``, and so is a claim or a ``group``
of a token that would make a group with a default dead-letter session it does
not see; nothing is configured, made or started. A group that exists, made by
whoever sees its dead-letter session, is claimed by any token that may read
the session, and its last attempts go where its maker said.

Each store runs the rule its own way (memory and SQLite the core's step, Redis
and a Redis Cluster the group scripts), so each is run here through the engine,
as every front end reaches it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from repl_daemon import protocol as p
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.backends.local.sqlite import SqliteStore
from repl_daemon.backends.redis import RedisBackend
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.engine import Engine
from session.errors import BadRequest, Forbidden, NoSuchSession, ReplError
from session.scopes import TokenRecord, make_scope
from tests.helpers import RedisClusterProcs, RedisProc, store_url

pytestmark = pytest.mark.anyio

STORES = ("memory", "sqlite", "redis", "redis-cluster")


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the engine keeps its sessions: a path, or a Redis URL (an emptied server)."""
    if request.param in ("memory", "sqlite"):
        return request.param if request.param == "memory" else str(tmp_path / "repl.db")
    fixture = "redis_single" if request.param == "redis" else "redis_cluster"
    server: RedisProc | RedisClusterProcs = request.getfixturevalue(fixture)
    server.flush()
    return store_url(server)


@asynccontextmanager
async def engine_on(store: str) -> AsyncIterator[Engine]:
    if store == "memory":
        engine = Engine(LocalBackend(MemoryStore()), settle=0)
    elif store.startswith("redis"):
        engine = Engine(RedisBackend(RedisStore(store)), settle=0)
    else:
        engine = Engine(LocalBackend(SqliteStore(Path(store))), settle=0)
    await engine.load()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(engine.run)
            yield engine
            tg.cancel_scope.cancel()
    finally:
        await engine.committer.close()
        await engine.backend.close()


def token(name: str, patterns: list[str], rights: list[str]) -> TokenRecord:
    """A scoped token as the store would hold it (the engine takes the record)."""
    return TokenRecord(name, f"digest-of-{name}", make_scope(patterns, rights))


async def ask(engine: Engine, req: p.Request, who: TokenRecord | None = None) -> p.Response:
    return await engine.handle(req, who).result()


async def refused(engine: Engine, req: p.Request, who: TokenRecord) -> ReplError:
    try:
        answer = await ask(engine, req, who)
    except ReplError as exc:
        return exc
    raise AssertionError(f"{req} was answered {answer}")


async def ids(engine: Engine) -> list[str]:
    listed = await ask(engine, p.Sessions())
    assert isinstance(listed, p.SessionList)
    return sorted(s.id for s in listed.sessions)


async def groups(engine: Engine, session: str) -> list[p.GroupInfo]:
    listed = await ask(engine, p.Groups(session=session))
    assert isinstance(listed, p.GroupList)
    return listed.groups


async def firings(engine: Engine, session: str) -> list[tuple[str | None, dict[str, str]]]:
    read = await ask(engine, p.Read(session=session, after=0))
    assert isinstance(read, p.Firings)
    return [(f.result, f.tags) for f in read.firings]


async def dead_letters(engine: Engine, session: str) -> list[tuple[str | None, dict[str, str]]]:
    """The firings of dead-letter session ``session`` once its first is there: a shared
    store records a dead letter just after the step that made it (its outbox)."""
    with anyio.fail_after(30):
        while True:
            try:
                found = await firings(engine, session)
            except NoSuchSession:
                found = []
            if found:
                return found
            await anyio.sleep(0.01)


async def test_a_token_names_no_dead_letter_session_outside_its_patterns(store: str) -> None:
    """The issue's probe: an admin of team-a.* pointed its group's dead letters at
    team-b.secret (or at a new id, then started) and wrote its own text there."""
    async with engine_on(store) as engine:
        for session in ("team-a.x", "team-b.secret"):
            await ask(engine, p.Start(session=session))
        await ask(engine, p.Send(session="team-a.x", text="into B"))
        agent = token("agent-a", ["team-a.*"], ["read", "send", "admin"])
        for elsewhere in ("team-b.secret", "team-b.new"):
            for made in (False, True):
                group = "work" if made else "new"
                exc = await refused(
                    engine,
                    p.Group(session="team-a.x", group=group, max_attempts=1, dead_letter=elsewhere),
                    agent,
                )
                assert isinstance(exc, Forbidden)
                assert exc.message == (
                    "a scoped token names as a group's dead-letter session only a session its "
                    "patterns cover: give one that matches team-a.*"
                )
            if elsewhere == "team-b.secret":  # the second time round, a group exists
                await ask(engine, p.Group(session="team-a.x", group="work"), agent)
        assert [
            (g.name, g.max_attempts, g.dead_letter) for g in await groups(engine, "team-a.x")
        ] == [("work", 5, "team-a.x.dead")]  # nothing configured by the refusals
        # its own patterns' dead-letter session: configured, and the last attempt lands there
        await ask(
            engine,
            p.Group(session="team-a.x", group="work", max_attempts=1, dead_letter="team-a.dlq"),
            agent,
        )
        claimed = await ask(engine, p.Claim(session="team-a.x", timeout_ms=0), agent)
        assert isinstance(claimed, p.Claimed) and claimed.claim is not None
        released = await ask(engine, p.Release(session="team-a.x", claim=claimed.claim), agent)
        assert isinstance(released, p.Released) and released.dead
        ((text, tags),) = await dead_letters(engine, "team-a.dlq")
        assert await ids(engine) == ["team-a.dlq", "team-a.x", "team-b.secret"]
        assert await firings(engine, "team-b.secret") == []
        assert text == "into B" and tags["dead.session"] == "team-a.x"


async def test_a_token_that_cannot_see_id_dead_makes_no_group_there(store: str) -> None:
    """A read token on exactly team-c.inbox started team-c.inbox.dead by exhausting a job's
    attempts: its first claim made the group, with that default dead-letter session. Now
    that claim is refused and makes nothing; a group its admin made is claimed as ever,
    and its last attempt goes where the admin (who sees it) said: the default."""
    async with engine_on(store) as engine:
        await ask(engine, p.Start(session="team-c.inbox"))
        await ask(engine, p.Send(session="team-c.inbox", text="job"))
        worker = token("worker-c", ["team-c.inbox"], ["read"])
        says = (
            "session 'team-c.inbox' has no group 'work', and a new group would send its dead "
            "letters to 'team-c.inbox.dead', which this token does not see: make the group "
            "first with a dead-letter session the token sees (`repl group team-c.inbox work "
            "--dead-letter SESSION`), or with a token that sees 'team-c.inbox.dead'"
        )
        for req in (
            p.Claim(session="team-c.inbox", timeout_ms=0),
            p.Claim(session="team-c.inbox"),  # one that would block: refused at once too
        ):
            exc = await refused(engine, req, worker)
            assert isinstance(exc, Forbidden) and exc.message == says
        admin = token("admin-c", ["team-c.inbox"], ["admin"])
        exc = await refused(engine, p.Group(session="team-c.inbox", group="work"), admin)
        assert isinstance(exc, Forbidden) and exc.message == says
        assert await groups(engine, "team-c.inbox") == []
        assert await ids(engine) == ["team-c.inbox"]
        # made by the root, who sees team-c.inbox.dead: the worker claims it
        await ask(engine, p.Group(session="team-c.inbox", group="work", max_attempts=1))
        claimed = await ask(engine, p.Claim(session="team-c.inbox", timeout_ms=0), worker)
        assert isinstance(claimed, p.Claimed) and claimed.claim == "work:1:1"
        released = await ask(engine, p.Release(session="team-c.inbox", claim="work:1:1"), worker)
        assert isinstance(released, p.Released) and released.dead
        assert [text for text, _ in await dead_letters(engine, "team-c.inbox.dead")] == ["job"]
        assert await ids(engine) == ["team-c.inbox", "team-c.inbox.dead"]


@pytest.mark.parametrize("store", ["memory"])
async def test_done_next_is_checked_whole_before_anything_changes(store: str) -> None:
    """A scoped token's done --next on a session it does not see is no such session, and
    a negative timeout bad_request: neither finishes the claim."""
    async with engine_on(store) as engine:
        await ask(engine, p.Start(session="team-n.inbox"))
        await ask(engine, p.Send(session="team-n.inbox", text="job"))
        claimed = await ask(engine, p.Claim(session="team-n.inbox", timeout_ms=0))
        assert isinstance(claimed, p.Claimed) and claimed.claim == "work:1:1"
        other = token("worker-o", ["team-o.*"], ["read"])
        exc = await refused(engine, p.FinishNext(session="team-n.inbox", claim="work:1:1"), other)
        assert isinstance(exc, NoSuchSession)
        negative = p.FinishNext(session="team-n.inbox", claim="work:1:1", timeout_ms=-1)
        mine = token("worker-n", ["team-n.*"], ["read"])
        assert isinstance(await refused(engine, negative, mine), BadRequest)
        assert (await groups(engine, "team-n.inbox"))[0].held == 1  # still held: no done
