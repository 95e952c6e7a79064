"""The tools of groups and claims of ``repl mcp`` (SPEC §16), driven by the official SDK's
own stdio client as an agent harness drives them (``tests/e2e/test_mcp.py``'s ``agent``).

What is checked: the four tools are listed with schemas and descriptions that tell a
worker what it needs (the claim token, the attempt, the lease); two claims at once get
different firings and each is finished with ``done``; a stale ``done`` (its firing was
given back and claimed again) is a tool error naming ``lease_lost`` and changes
nothing; a claim that times out says so and takes nothing (the next one gets the firing,
attempt 1); one the client gave up on takes nothing either; ``release`` with a delay
holds the job back, and ``extend`` moves the lease on; a scoped worker's tools see only
its own sessions, and it makes no group whose dead-letter session it does not see.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import TextContent

from tests.helpers import DaemonProc, Repl, eventually

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """One event loop for the module, so the tests share one server."""
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("mcp-claims") / "home", "--memory", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


@asynccontextmanager
async def agent(d: DaemonProc, token: str | None = None) -> AsyncIterator[ClientSession]:
    """``repl mcp`` for daemon ``d``, as a harness starts it (``tests/e2e/test_mcp.py``'s
    ``agent``), and the SDK's session with it; with ``token`` (REPL_TOKEN), a scoped one's."""
    environment = {"REPL_ADDR": d.addr, "REPL_HOME": str(d.home)}
    if token is not None:
        environment["REPL_TOKEN"] = token
    environment.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "repl_cli", "mcp", "--progress-every", "0.5"],
        env=environment,
    )
    errlog = open(d.home.parent / "mcp-stderr.log", "a")  # noqa: ASYNC230, SIM115 - a log file
    try:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session
    finally:
        errlog.close()


async def call(client: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; the test fails on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    got: dict[str, Any] | None = result.structured_content
    assert got is not None
    return got


async def refused(client: ClientSession, tool: str, /, **arguments: Any) -> str:
    """A tool error's text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    (content,) = result.content
    assert isinstance(content, TextContent) and "Traceback" not in content.text
    return content.text


@pytest.fixture(scope="module")
async def worker(daemon: DaemonProc) -> AsyncIterator[ClientSession]:
    """One ``repl mcp``, a worker agent's."""
    async with agent(daemon) as session:
        yield session


def held(repl: Repl, session: str) -> list[tuple[int, int]]:
    """The held firings' (seq, attempt), as the daemon lists them."""
    (listed,) = repl.ask({"op": "claims", "session": session})
    return [(row["seq"], row["attempt"]) for row in listed["claims"]]


def counts(repl: Repl, session: str) -> list[dict[str, Any]]:
    (listed,) = repl.ask({"op": "groups", "session": session})
    rows: list[dict[str, Any]] = listed["groups"]
    return rows


async def test_the_claim_tools_are_listed_with_what_a_worker_needs(
    worker: ClientSession,
) -> None:
    listed = {tool.name: tool for tool in (await worker.list_tools()).tools}
    assert {"claim", "done", "release", "extend"} <= set(listed)
    for name in ("claim", "done", "release", "extend"):
        tool = listed[name]
        assert tool.description and len(tool.description) < 300
        assert tool.input_schema["type"] == "object" and tool.output_schema
        assert tool.annotations is not None and tool.annotations.open_world_hint is False
    claim = listed["claim"]
    assert claim.description is not None
    assert all(word in claim.description for word in ("claim token", "attempt", "timed_out"))
    assert {"session", "group", "lease_s", "timeout_s", "match"} <= set(
        claim.input_schema["properties"]
    )
    assert claim.input_schema["required"] == ["session"]
    assert {"claim", "seq", "attempt", "lease_until", "lost", "firing", "timed_out"} <= set(
        claim.output_schema["properties"] if claim.output_schema else {}
    )
    assert {"session", "claim", "delay_s"} <= set(listed["release"].input_schema["properties"])
    assert {"session", "claim", "lease_s"} <= set(listed["extend"].input_schema["properties"])
    # what a harness may call without asking: done and release change nothing more when
    # called again (the second is lease_lost); claim takes another job, and extend moves
    # the lease on again from now, so neither is idempotent; none destroys anything
    hints = {
        name: (listed[name].annotations.idempotent_hint, listed[name].annotations.read_only_hint)
        for name in ("claim", "done", "release", "extend")
        if listed[name].annotations is not None
    }
    assert hints == {
        "claim": (False, False),
        "done": (True, False),
        "release": (True, False),
        "extend": (False, False),
    }
    assert "lease_lost" in (listed["done"].description or "")


async def test_two_claims_get_different_firings_and_done_finishes_each(
    daemon: DaemonProc, worker: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("mc-two", "resize photo 1", "resize photo 2")
    taken: list[dict[str, Any]] = []

    async def take() -> None:
        taken.append(await call(worker, "claim", session=s, lease_s=30, timeout_s=10))

    async with anyio.create_task_group() as tg:  # two workers' claims, at once
        tg.start_soon(take)
        tg.start_soon(take)
    assert sorted((t["seq"], t["attempt"]) for t in taken) == [(1, 1), (2, 1)]
    by_seq = {t["seq"]: t for t in taken}
    assert [by_seq[seq]["firing"]["result"] for seq in (1, 2)] == [
        "resize photo 1",
        "resize photo 2",
    ]
    assert {t["claim"] for t in taken} == {"work:1:1", "work:2:1"}
    assert all(t["timed_out"] is False and t["lost"] == 0 and t["lease_until"] for t in taken)
    assert sorted(held(repl, s)) == [(1, 1), (2, 1)]
    for t in taken:
        assert await call(worker, "done", session=s, claim=t["claim"]) == {"seq": t["seq"]}
    assert held(repl, s) == []
    (row,) = counts(repl, s)
    assert (row["done"], row["ready"], row["held"]) == (2, 0, 0)


async def test_a_stale_done_is_an_error_naming_lease_lost_and_changes_nothing(
    daemon: DaemonProc, worker: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("mc-stale", "job")
    stale = await call(worker, "claim", session=s, timeout_s=5)
    assert await call(worker, "release", session=s, claim=stale["claim"]) == {"dead": False}
    live = await call(worker, "claim", session=s, timeout_s=5)
    assert (live["claim"], live["seq"], live["attempt"]) == ("work:1:2", 1, 2)
    before = (held(repl, s), counts(repl, s))
    for tool in ("done", "release", "extend"):
        text = await refused(worker, tool, session=s, claim=stale["claim"])
        assert text.startswith("repl: claim 'work:1:1' is no longer the live lease"), text
        assert text.endswith("(code lease_lost)"), text
    assert (held(repl, s), counts(repl, s)) == before
    assert await call(worker, "done", session=s, claim=live["claim"]) == {"seq": 1}
    again = await refused(worker, "done", session=s, claim=live["claim"])
    assert "(code lease_lost)" in again
    assert "(code bad_claim)" in await refused(worker, "done", session=s, claim="bogus")


async def test_a_claim_that_times_out_says_nothing_was_taken(
    daemon: DaemonProc, worker: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("mc-timeout")
    nothing = {
        "claim": None,
        "seq": None,
        "attempt": None,
        "lease_until": None,
        "lost": 0,
        "firing": None,
        "timed_out": True,
    }
    assert await call(worker, "claim", session=s, timeout_s=0) == nothing
    repl.send(s, "job")
    first = await call(worker, "claim", session=s, timeout_s=5)
    # the one job is held: another worker's claim times out, having taken nothing
    assert await call(worker, "claim", session=s, timeout_s=0.2) == nothing
    assert held(repl, s) == [(1, 1)]
    assert await call(worker, "done", session=s, claim=first["claim"]) == {"seq": 1}


async def test_a_claim_the_client_gave_up_on_takes_nothing(
    daemon: DaemonProc, worker: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("mc-gave-up")
    with pytest.raises(Exception, match=r"(?i)tim"):
        await worker.call_tool("claim", {"session": s, "timeout_s": 30}, read_timeout_seconds=1)
    await anyio.to_thread.run_sync(
        lambda: eventually(lambda: repl.waiters(s) == 0, what="the claim to be let go")
    )
    repl.send(s, "after")
    assert held(repl, s) == []
    taken = await call(worker, "claim", session=s, timeout_s=5)
    assert (taken["claim"], taken["seq"], taken["attempt"]) == ("work:1:1", 1, 1)


async def test_release_with_a_delay_and_extend(daemon: DaemonProc, worker: ClientSession) -> None:
    repl = Repl(daemon)
    s = repl.session("mc-later", "long job", "flaky job")
    long = await call(worker, "claim", session=s, lease_s=10, timeout_s=5)
    extended = await call(worker, "extend", session=s, claim=long["claim"], lease_s=600)
    assert set(extended) == {"lease_until", "lease_until_ms"}
    assert extended["lease_until"] > long["lease_until"]
    flaky = await call(worker, "claim", session=s, timeout_s=5)
    assert flaky["seq"] == 2
    assert await call(worker, "release", session=s, claim=flaky["claim"], delay_s=300) == {
        "dead": False
    }
    (row,) = counts(repl, s)
    assert (row["held"], row["delayed"], row["ready"]) == (1, 1, 0)
    assert (await call(worker, "claim", session=s, timeout_s=0))["timed_out"] is True
    assert "lease_s" in await refused(worker, "extend", session=s, claim=long["claim"], lease_s=0)
    assert await call(worker, "done", session=s, claim=long["claim"]) == {"seq": 1}


async def test_a_scoped_worker_claims_only_inside_its_patterns(daemon: DaemonProc) -> None:
    """A worker agent's token on exactly its inbox: every claim tool on another tenant's
    session (a held job there) is a tool error as for a session that does not exist, and
    changes nothing; its first claim would make a group whose dead letters go to
    mc-inbox.dead, which it does not see: refused, in the tools' words, making nothing.
    Once the group is made for it, it claims, and a job's last attempt goes there."""
    repl = Repl(daemon)
    mine, theirs = repl.session("mc-inbox", "job"), repl.session("mc-theirs", "their job")
    (held_there,) = repl.ask({"op": "claim", "session": theirs, "timeout_ms": 0})
    before = (held(repl, theirs), counts(repl, theirs))
    (made,) = repl.ask(
        {"op": "token", "action": "add", "name": "mc-worker", "sessions": [mine], "can": ["read"]}
    )
    async with agent(daemon, made["token"]) as session:
        for tool, arguments in (
            ("claim", {"timeout_s": 0}),
            ("done", {"claim": held_there["claim"]}),
            ("release", {"claim": held_there["claim"]}),
            ("extend", {"claim": held_there["claim"]}),
        ):
            text = await refused(session, tool, session=theirs, **arguments)
            assert text == (
                f"repl: no session '{theirs}': this token sees only {mine}: check the id "
                "(code no_such_session)"
            ), tool
        assert (held(repl, theirs), counts(repl, theirs)) == before
        text = await refused(session, "claim", session=mine, timeout_s=0)
        assert text == (
            f"repl: session '{mine}' has no group 'work', and a new group would send its dead "
            f"letters to '{mine}.dead', which this token does not see: make the group first "
            "with a dead-letter session the token sees (no tool makes a group: ask whoever "
            f"runs the daemon), or with a token that sees '{mine}.dead' (code forbidden)"
        )
        assert counts(repl, mine) == []
        repl.ask({"op": "group", "session": mine, "group": "work", "max_attempts": 1})
        taken = await call(session, "claim", session=mine, timeout_s=5)
        assert await call(session, "release", session=mine, claim=taken["claim"]) == {"dead": True}
    # recorded in the step that made it dead (a local store: tests/daemon/ for Redis)
    assert repl.ok("read", f"{mine}.dead", "--after", "0") == "on-message: job\n"


async def test_done_next_finishes_and_takes_the_next_job_in_one_call(
    daemon: DaemonProc, worker: ClientSession
) -> None:
    repl = Repl(daemon)
    s = repl.session("mc-next", "job 1", "job 2")
    listed = {tool.name: tool for tool in (await worker.list_tools()).tools}
    tool = listed["done_next"]
    assert {"session", "claim", "lease_s", "timeout_s"} <= set(tool.input_schema["properties"])
    assert "lease_lost" in (tool.description or "")
    first = await call(worker, "claim", session=s, timeout_s=5)
    following = await call(worker, "done_next", session=s, claim=first["claim"], timeout_s=5)
    assert (following["claim"], following["firing"]["result"]) == ("work:2:1", "job 2")
    nothing = await call(worker, "done_next", session=s, claim="work:2:1", timeout_s=0)
    assert (nothing["timed_out"], nothing["claim"]) == (True, None)
    (row,) = counts(repl, s)
    assert (row["done"], row["held"]) == (2, 0)
    text = await refused(worker, "done_next", session=s, claim="work:2:1", timeout_s=0)
    assert text.endswith("(code lease_lost)"), text
    assert held(repl, s) == []
