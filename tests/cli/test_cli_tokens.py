"""``repl token add/list/revoke``, ``REPL_TOKEN`` and ``--token-file`` (SPEC §11), and the
same through the Python API, sync and async.

What each prints, piped and as JSON; the usage errors the CLI catches itself (a bad
name, no pattern, an unknown right: exit 64, nothing made); what the daemon refuses
(a name in use, no such token: exit 1; a scoped token managing tokens: exit 77).
"""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path

import pytest

from repl_cli import aio, api
from tests.helpers import InProcDaemon, Repl

_names = count()


def name(prefix: str = "agent") -> str:
    return f"{prefix}-{next(_names)}"


def listed(repl: Repl) -> dict[str, dict[str, object]]:
    return {row["name"]: row for row in json.loads(repl.ok("token", "list", "--json"))}


def test_add_prints_the_token_once_and_list_shows_its_scope_never_the_token(repl: Repl) -> None:
    agent = name()
    token = repl.ok("token", "add", agent, "--sessions", "team-a.*, solo", "--can", "send,read")
    token = token.strip()
    assert token.startswith("repl_") and len(token) > 40 and "\n" not in token
    row = listed(repl)[agent]
    assert row == {"name": agent, "sessions": ["team-a.*", "solo"], "can": ["read", "send"]}
    piped = repl.ok("token", "list")
    assert piped.splitlines()[0] == "name\tsessions\tcan"
    assert f"{agent}\tteam-a.*,solo\tread,send" in piped.splitlines()
    assert token not in piped and token not in repl.ok("token", "list", "--json")


def test_add_json_and_a_token_that_works_from_the_environment_and_a_file(
    repl: Repl, tmp_path: Path
) -> None:
    agent = name()
    mine, other = repl.session("mine", "hello"), repl.session("other", "secret")
    made = json.loads(repl.ok("token", "add", agent, "--sessions", mine, "--can", "read", "--json"))
    assert made["name"] == agent and made["sessions"] == [mine] and made["can"] == ["read"]
    env = {**repl.env, "REPL_TOKEN": made["token"]}
    done = repl.run("read", mine, "--after", "0", env=env)
    assert (done.returncode, done.stdout) == (0, "on-message: hello\n")
    hidden = repl.run("read", other, "--after", "0", env=env)
    # the token is told of a session it does not see as of one that does not exist
    missing = repl.run("read", f"{other}x", "--after", "0", env=env)
    assert hidden.returncode == missing.returncode == 1
    assert hidden.stderr == missing.stderr.replace(f"{other}x", other)
    file = tmp_path / "token"
    file.write_text(made["token"] + "\n")
    via_file = repl.run("--token-file", str(file), "read", mine, "--after", "0")
    assert (via_file.returncode, via_file.stdout) == (0, "on-message: hello\n")
    # the file wins over the environment; an unreadable one is one line
    wrong = repl.run("--token-file", str(tmp_path / "nope"), "sessions", env=env)
    assert wrong.returncode == 1 and f"cannot read the token {tmp_path / 'nope'}" in wrong.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["bad name", "--sessions", "x", "--can", "read"], "token name 'bad name'"),
        (["_leading", "--sessions", "x", "--can", "read"], "token name '_leading'"),
        (["ok", "--sessions", " , ", "--can", "read"], "at least one pattern"),
        (["ok", "--sessions", "x", "--can", "read,write"], "write is not a right"),
        (["ok", "--sessions", "x"], "Missing option '--can'"),
    ],
)
def test_usage_errors_are_64_and_make_nothing(repl: Repl, args: list[str], says: str) -> None:
    before = listed(repl)
    line = repl.fails(64, "token", "add", *args)
    assert says in line
    assert listed(repl) == before


def test_a_name_in_use_and_an_unknown_name_are_exit_1(repl: Repl) -> None:
    agent = name()
    repl.ok("token", "add", agent, "--sessions", "x", "--can", "read")
    line = repl.fails(1, "token", "add", agent, "--sessions", "y", "--can", "send")
    assert f"a token named '{agent}' exists" in line
    assert listed(repl)[agent]["sessions"] == ["x"]  # the first one, unchanged
    assert repl.ok("token", "revoke", agent) == ""
    assert agent not in listed(repl)
    assert "`repl token list`" in repl.fails(1, "token", "revoke", agent)


def test_only_the_root_manages_tokens_or_shuts_the_daemon_down(repl: Repl) -> None:
    admin = repl.ok("token", "add", name(), "--sessions", "*", "--can", "read,send,admin").strip()
    env = {**repl.env, "REPL_TOKEN": admin}
    for args in (
        ["token", "list"],
        ["token", "add", name(), "--sessions", "*", "--can", "read"],
        ["token", "revoke", "anyone"],
    ):
        done = repl.run(*args, env=env)
        assert done.returncode == 77, (args, done.stderr)
        assert "only the root token" in done.stderr
    pong = repl.run("ping", env=env)
    assert pong.returncode == 0  # ping needs no right


def test_a_wrong_token_is_77_and_says_which_token_it_was(repl: Repl, s: str) -> None:
    done = repl.run("read", s, env={**repl.env, "REPL_TOKEN": "repl_not-a-token"})
    assert done.returncode == 77
    assert "wrong token" in done.stderr and "REPL_TOKEN" in done.stderr


def test_the_python_api_takes_a_token(repl: Repl, shared: InProcDaemon) -> None:
    home = str(shared.home)
    mine = repl.session("api", "one")
    with api.connect(repl.daemon.addr, home) as root:
        made = root.token_add(name("api"), [mine], ["read"])
        assert made.token.startswith("repl_")
        assert made.name in {t.name for t in root.token_list()}
    with api.connect(repl.daemon.addr, home, token=made.token) as scoped:
        assert [row.id for row in scoped.sessions()] == [mine]
        assert scoped.read(mine, after=0).firings[0].result == "one"
        with pytest.raises(api.Forbidden) as refused:
            scoped.send(mine, "x")
        assert refused.value.code == "forbidden"
    with api.connect(repl.daemon.addr, home) as root:
        root.token_revoke(made.name)
        assert made.name not in {t.name for t in root.token_list()}


@pytest.mark.anyio
async def test_the_async_api_takes_a_token(repl: Repl, shared: InProcDaemon) -> None:
    home = str(shared.home)
    mine = repl.session("aio", "one")
    async with aio.connect(repl.daemon.addr, home) as root:
        made = await root.token_add(name("aio"), [mine], ["read", "send"])
        assert made.name in {t.name for t in await root.token_list()}
    async with aio.connect(repl.daemon.addr, home, token=made.token) as scoped:
        assert (await scoped.send(mine, "two")).seq == 2
        with pytest.raises(api.Forbidden):
            await scoped.stop(mine)
    async with aio.connect(repl.daemon.addr, home) as root:
        await root.token_revoke(made.name)
    async with aio.connect(repl.daemon.addr, home, token=made.token) as revoked:
        with pytest.raises(api.Unauthorized) as gone:
            await revoked.ping()
        assert "given to the client" in gone.value.message
