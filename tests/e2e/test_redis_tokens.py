"""Scoped tokens on daemons sharing a Redis store (SPEC §11 on §7): one set of tokens.

Two daemon processes on one redis-server, each with its own home (so its
own root token): a token made through one works at once through the other
(which has never seen it and finds it in Redis), with the same scope; either
lists the tokens made through the other; and a revocation through one ends
the token's wait blocked on the other (exit 77, one line) and closes its
connections there, while another token's wait there goes on, and the token
is refused everywhere after. The revocation is checked on a Redis Cluster
too (only it: the cluster's daemons cost the suite's time).

The daemons serve the whole module, on a store emptied before they start;
each test has its own token names and session ids.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    Client,
    RedisClusterProcs,
    RedisProc,
    Repl,
    SharedDaemons,
    assert_one_error_line,
    eventually,
    read_line,
    repl_argv,
)


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, redis_single: RedisProc
) -> Iterator[SharedDaemons]:
    """Two daemons on the session's redis-server, emptied first (other modules use it)."""
    redis_single.flush()
    daemons = SharedDaemons(tmp_path_factory.mktemp("redis-tokens"), redis_single.url, 2)
    yield daemons
    daemons.close()


@pytest.fixture
def one(pair: SharedDaemons) -> Repl:
    """``repl`` with daemon 1's root token."""
    return Repl(pair.daemons[0])


@pytest.fixture
def two(pair: SharedDaemons) -> Repl:
    """``repl`` with daemon 2's root token (another home, another root token)."""
    return Repl(pair.daemons[1])


def run(repl: Repl, token: str, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    """``repl ARGS`` with ``token`` in REPL_TOKEN, insisted on ``status`` (one error line when
    it is not 0)."""
    done = repl.run(*args, env={**repl.env, "REPL_TOKEN": token})
    assert done.returncode == status, (args, done.returncode, done.stdout, done.stderr)
    if status:
        assert done.stdout == ""
        assert_one_error_line(done.stderr)
    else:
        assert done.stderr == "", (args, done.stderr)
    return done


def popen(repl: Repl, token: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        repl_argv(*args),
        env={**repl.env, "REPL_TOKEN": token},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def add_token(repl: Repl, name: str, patterns: str, can: str) -> str:
    made = json.loads(repl.ok("token", "add", name, "--sessions", patterns, "--can", can, "--json"))
    token: str = made["token"]
    return token


def listed(repl: Repl) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(repl.ok("token", "list", "--json"))
    return rows


def test_a_token_made_on_one_daemon_works_at_once_on_the_other(one: Repl, two: Repl) -> None:
    assert one.daemon.token != two.daemon.token
    one.ask({"op": "start", "session": "at-once.a1"}, {"op": "start", "session": "elsewhere.1"})
    one.send("elsewhere.1", "not for the agent")
    token = add_token(one, "at-once", "at-once.*", "read,send,admin")
    # daemon 2 has never seen it: it finds it in Redis, with its scope
    assert run(two, token, "send", "at-once.a1", "through two").stdout == "1\n"
    assert run(two, token, "start", "at-once.a2").stdout == "at-once.a2\n"
    ids = [row["id"] for row in json.loads(run(two, token, "sessions", "--json").stdout)]
    assert ids == ["at-once.a1", "at-once.a2"]
    hidden = run(two, token, "read", "elsewhere.1", status=1).stderr
    missing = run(two, token, "read", "elsewhere.404", status=1).stderr
    assert hidden == missing.replace("elsewhere.404", "elsewhere.1")
    run(two, token, "start", "elsewhere.2", status=77)
    # and it is the same token on both
    assert run(one, token, "read", "at-once.a1").stdout == "on-message: through two\n"
    assert run(one, token, "send", "at-once.a2", "through one").stdout == "1\n"
    assert run(two, token, "read", "at-once.a2").stdout == "on-message: through one\n"
    run(two, token, "token", "list", status=77)
    run(two, "repl_not-a-token", "sessions", status=77)


def test_either_daemon_lists_the_tokens_made_through_the_other(one: Repl, two: Repl) -> None:
    add_token(one, "listed-one", "listed.*", "read")
    add_token(two, "listed-two", "listed.*,more.*", "send,read")
    for repl in (one, two):
        mine = [row for row in listed(repl) if row["name"].startswith("listed-")]
        assert mine == [
            {"name": "listed-one", "sessions": ["listed.*"], "can": ["read"]},
            {"name": "listed-two", "sessions": ["listed.*", "more.*"], "can": ["read", "send"]},
        ]
        assert "listed-one" in repl.ok("token", "list")
    assert "exists" in two.fails(
        1, "token", "add", "listed-one", "--sessions", "x", "--can", "read"
    )
    two.ok("token", "revoke", "listed-one")
    assert "listed-one" not in {row["name"] for row in listed(one)}
    assert "no token" in one.fails(1, "token", "revoke", "listed-one")


def test_a_revocation_on_one_daemon_ends_a_wait_blocked_on_the_other(one: Repl, two: Repl) -> None:
    revocation_ends_a_wait_blocked_on_the_other(one, two)


def test_on_a_cluster_too(tmp_path: Path, redis_cluster: RedisClusterProcs) -> None:
    """The revocation travels on a Redis Cluster as well (a channel there is the cluster's),
    and a token made through one daemon is found through the other's slot lookups."""
    redis_cluster.flush()
    daemons = SharedDaemons(tmp_path, redis_cluster.url, 2)
    try:
        revocation_ends_a_wait_blocked_on_the_other(
            Repl(daemons.daemons[0]), Repl(daemons.daemons[1])
        )
    finally:
        daemons.close()


def revocation_ends_a_wait_blocked_on_the_other(one: Repl, two: Repl) -> None:
    """A token made through ``one`` waits through ``two``; revoked through ``one``, its wait
    ends 77 in one line, another token's wait goes on, and it is refused on both after."""
    one.ask({"op": "start", "session": "revoked.1"})
    doomed = add_token(one, "revoked-doomed", "revoked.*", "read,send")
    spared = add_token(one, "revoked-spared", "revoked.*", "read,send")
    waiting = popen(two, doomed, "wait", "revoked.1")
    staying = popen(two, spared, "wait", "revoked.1", "--cursor", "spared")
    procs = [waiting, staying]
    idle = Client(two.daemon.port, doomed)  # the token's connection to daemon 2, doing nothing
    try:
        assert idle.ok({"op": "cursors", "session": "revoked.1"})["cursors"] == []
        eventually(lambda: two.waiters("revoked.1") == 2, what="two waits blocked on daemon 2")
        one.ok("token", "revoke", "revoked-doomed")
        assert waiting.wait(15) == 77
        assert waiting.stdout is not None and waiting.stdout.read() == b""
        assert waiting.stderr is not None
        stderr = waiting.stderr.read().decode()
        assert_one_error_line(stderr)
        assert "revoked" in stderr
        assert idle.recv()["code"] == "unauthorized"  # told, then closed
        assert idle.closed()
        eventually(lambda: two.waiters("revoked.1") == 1, what="the spared wait alone")
        assert staying.poll() is None
        assert run(one, spared, "send", "revoked.1", "through one").stdout == "1\n"
        assert read_line(staying) == b"on-message: through one\n"
        assert staying.wait(15) == 0
    finally:
        idle.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    # refused everywhere now: by the daemon that held it, and by the one that revoked it
    for repl in (two, one):
        assert "REPL_TOKEN" in run(repl, doomed, "read", "revoked.1", status=77).stderr
    assert run(two, spared, "read", "revoked.1", "--after", "0").stdout == (
        "on-message: through one\n"
    )
