"""Scoped tokens end to end (SPEC §11, §5): real daemons, the real ``repl``, a token a program.

Two agents with their own tokens: each is answered for the other's sessions
exactly as for sessions that do not exist (same stderr, less the id, and the
same exit code), sees only its own in ``sessions``, ``stats`` and
``timers``, touches nothing of the other's, and is refused (77, one line)
what its rights do not allow, managing tokens above all. A revocation ends
the token's blocked ``wait`` and ``follow`` (77, one line) and closes its idle
connections, and nothing else;
tokens outlive a restart on SQLite, a revoked one stays revoked; and
``--token-file`` is read, or refused in one line.

One daemon serves the module; each test has its own token names and
session ids.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    Client,
    DaemonProc,
    Repl,
    assert_one_error_line,
    eventually,
    read_line,
    repl_argv,
)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """A SQLite daemon for the module's tests, settle 0."""
    home = tmp_path_factory.mktemp("tokens") / "home"
    d = DaemonProc(home, "--settle-ms", "0", "--idle-timeout", "30")
    yield d
    d.close_clients()
    d.stop()


@pytest.fixture
def repl(shared: DaemonProc) -> Repl:
    return Repl(shared)


class Agent:
    """``repl`` run by a program that has only its scoped token, in ``REPL_TOKEN``."""

    def __init__(self, repl: Repl, token: str) -> None:
        self.repl = repl
        self.token = token
        self.env = {**repl.env, "REPL_TOKEN": token}

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.repl.run(*args, env=self.env)

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert (done.returncode, done.stderr) == (0, ""), (args, done.returncode, done.stderr)
        return done.stdout

    def fails(self, status: int, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == status, (args, done.returncode, done.stdout, done.stderr)
        assert done.stdout == "", (args, done.stdout)
        assert_one_error_line(done.stderr)
        return done.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def popen(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            repl_argv(*args),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )


def add_token(repl: Repl, name: str, patterns: str, can: str) -> str:
    """``repl token add`` by the root; the token it printed (once)."""
    made = json.loads(repl.ok("token", "add", name, "--sessions", patterns, "--can", can, "--json"))
    assert made["name"] == name and made["sessions"] == patterns.split(",")
    assert made["can"] == sorted(can.split(","))
    token: str = made["token"]
    assert token and name not in token
    return token


def token_names(repl: Repl) -> set[str]:
    return {row["name"] for row in json.loads(repl.ok("token", "list", "--json"))}


def assert_hidden_like_missing(
    agent: Agent, commands: list[tuple[int, list[str]]], hidden: str, outside: str, inside: str
) -> None:
    """Each command (``{}`` for the id) on ``hidden``, a session the agent's token does not
    cover, answers exactly as on a session ``outside`` its patterns that was never
    started: the exit code, stdout, and stderr but for the id; and as on one ``inside``
    them that was never started (which the daemon looks for; not for a start, which would
    make it) but for the advice, which says what the token may do with an id of its
    patterns. The commands run side by side, to keep the test's time."""

    def ids(command: list[str]) -> tuple[str, ...]:
        return (hidden, outside) if command[0] == "start" else (hidden, outside, inside)

    runs = [(command, session) for _, command in commands for session in ids(command)]

    def run(command: list[str], session: str) -> subprocess.CompletedProcess[str]:
        return agent.run(*(arg.replace("{}", session) for arg in command))

    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = list(pool.map(run, *zip(*runs, strict=True)))
    done = {(" ".join(c), s): answer for (c, s), answer in zip(runs, answers, strict=True)}
    for status, command in commands:
        on_hidden = done[" ".join(command), hidden]
        assert on_hidden.returncode == status, (command, on_hidden.stderr)
        assert on_hidden.stdout == "", (command, on_hidden.stdout)
        assert_one_error_line(on_hidden.stderr)
        for session in ids(command)[1:]:
            answer = done[" ".join(command), session]
            seen = [on_hidden.returncode, on_hidden.stdout, on_hidden.stderr]
            expected = [answer.returncode, answer.stdout, answer.stderr.replace(session, hidden)]
            if session == inside and "no session" in answer.stderr:
                del seen[2], expected[2]  # the advice differs, by the id alone
            assert seen == expected, (command, session)


def state_of(repl: Repl, session: str) -> dict[str, Any]:
    """All a root sees of a session: its row, its ring, its cursors, its timers, its groups
    and the claims held."""
    (listed, ring, cursors, timers, groups, claims) = repl.ask(
        {"op": "sessions"},
        {"op": "read", "session": session, "after": 0},
        {"op": "cursors", "session": session},
        {"op": "timers", "session": session},
        {"op": "groups", "session": session},
        {"op": "claims", "session": session},
    )
    (row,) = [r for r in listed["sessions"] if r["id"] == session]
    return {
        "row": row,
        "firings": [(f["seq"], f["result"]) for f in ring["firings"]],
        "cursors": cursors["cursors"],
        "timers": timers["timers"],
        "groups": groups["groups"],
        "claims": claims["claims"],
    }


#: what the agent on team-a.* (read, send) is answered as for a missing session, and with
#: which exit code (stop needs admin: refused the same for either)
A_COMMANDS: list[tuple[int, list[str]]] = [
    (1, ["read", "{}"]),
    (1, ["wait", "{}", "--timeout", "10"]),
    (1, ["wait", "team-a.1", "{}", "--timeout", "10"]),
    (1, ["follow", "{}"]),
    (1, ["read", "{}", "--after", "5"]),
    (1, ["ack", "{}", "5"]),
    (1, ["poll", "{}"]),
    (1, ["cursors", "{}"]),
    (1, ["send", "{}", "hello"]),
    (1, ["send", "{}", "later", "--in", "1h"]),
    (1, ["stats", "{}"]),
    (77, ["stop", "{}"]),
    (1, ["claim", "{}", "--timeout", "10"]),
    (1, ["claim", "{}", "--group", "other", "--json", "--timeout", "10"]),
    (1, ["done", "{}", "work:1:1"]),
    (1, ["release", "{}", "work:1:1"]),
    (1, ["extend", "{}", "work:1:1"]),
    (1, ["groups", "{}"]),
    (1, ["claims", "{}", "--json"]),
    (77, ["group", "{}", "work"]),  # needs admin: refused the same for either
]

#: what the agent on team-b.* (read, send, admin) is answered as for a missing session: the
#: admin's commands (the others are as for the agent on team-a.*); a start outside its
#: patterns is refused, whether the session exists or not
B_COMMANDS: list[tuple[int, list[str]]] = [
    (1, ["stop", "{}"]),
    (1, ["buffer", "{}", "5"]),
    (1, ["timers", "{}"]),
    (1, ["every", "{}", "1h"]),
    (1, ["cancel", "{}", "t-0123456789ab"]),
    (1, ["webhook", "{}", "--remove"]),
    (77, ["start", "{}"]),
    (1, ["group", "{}", "work", "--max-attempts", "1"]),
    (1, ["group", "{}", "work", "--dead-letter", "team-b.dlq"]),
]


def test_two_agents_each_see_only_their_own_sessions(repl: Repl) -> None:
    for session in ("team-a.1", "team-b.1"):
        repl.ask(
            {"op": "start", "session": session},
            {"op": "send", "session": session, "text": f"first of {session}"},
            {"op": "ack", "session": session, "cursor": "seen", "seq": 1},
            {"op": "schedule", "session": session, "text": "later", "in": "1h"},
            {"op": "claim", "session": session, "timeout_ms": 0},  # work:1:1, held
        )
    a = Agent(repl, add_token(repl, "agent-a", "team-a.*", "read,send"))
    b = Agent(repl, add_token(repl, "agent-b", "team-b.*", "read,send,admin"))
    b_before, a_before = state_of(repl, "team-b.1"), state_of(repl, "team-a.1")

    assert_hidden_like_missing(a, A_COMMANDS, "team-b.1", "team-b.404", "team-a.404")
    assert_hidden_like_missing(b, B_COMMANDS, "team-a.1", "team-a.404", "team-b.404")
    # nothing of the other's session moved: no firing, no cursor, no timer, same limit
    assert state_of(repl, "team-b.1") == b_before
    assert state_of(repl, "team-a.1") == a_before

    # the listings hold the token's own sessions only
    assert [row["id"] for row in a.json("sessions")] == ["team-a.1"]
    assert [row["id"] for row in b.json("sessions")] == ["team-b.1"]
    assert [row["id"] for row in a.json("stats")["sessions"]] == ["team-a.1"]
    assert [t["session"] for t in b.json("timers")] == ["team-b.1"]
    assert "team-b" not in a.ok("stats")
    assert "team-a" not in b.ok("timers")
    # and no count of the other's session reaches it
    figures = a.json("stats")["daemon"]
    assert b.ok("send", "team-b.1", "more") == "2\n"
    again = a.json("stats")["daemon"]
    for figure in ("sessions", "firings", "lost", "evaluations", "waiters"):
        assert again[figure] == figures[figure], figure
    assert figures["sessions"] == 1

    # its own session works
    assert a.ok("send", "team-a.1", "from a") == "2\n"
    assert a.ok("read", "team-a.1") == "on-message: first of team-a.1\non-message: from a\n"
    assert a.ok("wait", "team-a.1", "--timeout", "10") == (
        "on-message: first of team-a.1\non-message: from a\n"
    )
    assert a.ok("ack", "team-a.1", "2", "--cursor", "seen") == ""
    assert {c["name"]: c["seq"] for c in a.json("cursors", "team-a.1")} == {
        "seen": 2,
        "read": 2,
        "wait": 2,
    }
    assert a.ok("poll", "team-a.1") == "on-message: first of team-a.1\non-message: from a\n"
    assert a.json("stats", "team-a.1")["sessions"][0]["head"] == 2
    assert b.ok("buffer", "team-b.1", "9") == ""
    assert [t["session"] for t in b.json("timers", "team-b.1")] == ["team-b.1"]


def ids(repl: Repl) -> list[str]:
    (listed,) = repl.ask({"op": "sessions"})
    return sorted(row["id"] for row in listed["sessions"])


def test_a_token_writes_into_no_other_tenants_session_through_a_group(repl: Repl) -> None:
    """The issue's probe, as a user runs it: an admin of dl-a.* pointed its group's dead
    letters at dl-b.secret (or a new id, which was then started), then released its job's
    last attempt: its text landed in the other tenant's session. Now each `repl group` is
    refused (77, one line) and configures nothing; its own dead-letter session works."""
    repl.ask({"op": "start", "session": "dl-b.secret"})
    agent = Agent(repl, add_token(repl, "dl-agent-a", "dl-a.*", "read,send,admin"))
    assert agent.ok("start", "dl-a.x") == "dl-a.x\n"
    for elsewhere in ("dl-b.secret", "dl-b.new"):
        says = agent.fails(
            77, "group", "dl-a.x", "work", "--max-attempts", "1", "--dead-letter", elsewhere
        )
        assert "dead-letter session only a session its patterns cover" in says
        assert "give one that matches dl-a.*" in says
    assert agent.json("groups", "dl-a.x") == []
    agent.ok("group", "dl-a.x", "work", "--max-attempts", "1", "--dead-letter", "dl-a.dlq")
    assert agent.ok("send", "dl-a.x", "into B") == "1\n"
    claim = agent.ok("claim", "dl-a.x", "--timeout", "10").splitlines()[0]
    released = agent.run("release", "dl-a.x", claim)
    assert released.returncode == 0
    assert "goes to the dead-letter session dl-a.dlq" in released.stderr
    eventually(lambda: "dl-a.dlq" in ids(repl), what="the dead letter")
    assert "dl-b.new" not in ids(repl)
    assert repl.ok("read", "dl-b.secret", "--after", "0") == ""
    assert repl.ok("read", "dl-a.dlq", "--after", "0") == "on-message: into B\n"


def test_a_worker_that_cannot_see_the_default_dead_letter_session_makes_no_group(
    repl: Repl,
) -> None:
    """A read token on exactly dl-c.inbox started dl-c.inbox.dead, outside its patterns, by
    exhausting a job's attempts: its first claim made the group. Now that claim is refused
    (77, one line saying what to do) and starts nothing; once an admin who sees
    dl-c.inbox.dead made the group, the worker claims from it, and a job's last attempt
    goes where that admin said."""
    repl.ask(
        {"op": "start", "session": "dl-c.inbox"},
        {"op": "send", "session": "dl-c.inbox", "text": "job"},
    )
    worker = Agent(repl, add_token(repl, "dl-worker-c", "dl-c.inbox", "read"))
    says = worker.fails(77, "claim", "dl-c.inbox", "--timeout", "10")
    assert says == (
        "repl: session 'dl-c.inbox' has no group 'work', and a new group would send its dead "
        "letters to 'dl-c.inbox.dead', which this token does not see: make the group first "
        "with a dead-letter session the token sees (`repl group dl-c.inbox work "
        "--dead-letter SESSION`), or with a token that sees 'dl-c.inbox.dead'\n"
    )
    assert repl.ok("groups", "dl-c.inbox", "--json") == "[]\n"
    assert "dl-c.inbox.dead" not in ids(repl)
    repl.ok("group", "dl-c.inbox", "work", "--max-attempts", "1")  # the root sees it
    claim = worker.ok("claim", "dl-c.inbox", "--timeout", "10").splitlines()[0]
    assert claim == "work:1:1"
    assert worker.run("release", "dl-c.inbox", claim).returncode == 0
    eventually(lambda: "dl-c.inbox.dead" in ids(repl), what="the dead letter")
    assert repl.ok("read", "dl-c.inbox.dead", "--after", "0") == "on-message: job\n"


def test_a_right_the_token_lacks_is_77_in_one_line(repl: Repl) -> None:
    repl.ask({"op": "start", "session": "rights.1"})
    reader = Agent(repl, add_token(repl, "rights-reader", "rights.*", "read"))
    sender = Agent(repl, add_token(repl, "rights-sender", "rights.*", "send"))
    for args in (
        ["start", "rights.2"],
        ["stop", "rights.1"],
        ["buffer", "rights.1", "5"],
        ["timers"],
        ["every", "rights.1", "1h"],
        ["send", "rights.1", "x"],
    ):
        assert "right" in reader.fails(77, *args), args
    for args in (
        ["read", "rights.1"],
        ["wait", "rights.1", "--timeout", "10"],
        ["poll", "rights.1"],
    ):
        assert "read right" in sender.fails(77, *args), args
    assert sender.ok("send", "rights.1", "sent") == "1\n"
    assert reader.ok("read", "rights.1") == "on-message: sent\n"
    (listed,) = repl.ask({"op": "sessions"})  # nothing was started by the reader
    assert [row["id"] for row in listed["sessions"] if row["id"].startswith("rights.")] == [
        "rights.1"
    ]


def test_only_the_root_token_manages_tokens(repl: Repl) -> None:
    admin = Agent(repl, add_token(repl, "mgmt-admin", "mgmt.*", "read,send,admin"))
    # the text form prints the token alone, once; no listing shows it again
    printed = repl.ok("token", "add", "mgmt-other", "--sessions", "mgmt.*", "--can", "read")
    assert printed.count("\n") == 1
    other = printed.strip()
    assert other and " " not in other
    assert other not in repl.ok("token", "list") + repl.ok("token", "list", "--json")
    assert "root" in admin.fails(77, "token", "list", "--json")
    assert "root" in admin.fails(77, "shutdown")
    for agent in (admin, Agent(repl, other)):
        assert "root" in agent.fails(77, "token", "list")
        agent.fails(77, "token", "add", "mgmt-new", "--sessions", "*", "--can", "admin")
        agent.fails(77, "token", "revoke", "mgmt-other")
    names = token_names(repl)
    assert {"mgmt-admin", "mgmt-other"} <= names and "mgmt-new" not in names
    assert Agent(repl, other).ok("sessions") == "id\thead\tretained\tlimit\tcursors\twaiters\n"
    repl.ask({"op": "ping"})  # the daemon is still there


def test_revocation_ends_a_blocked_wait_and_a_follow_and_nothing_else(repl: Repl) -> None:
    repl.ask({"op": "start", "session": "rev.empty"}, {"op": "start", "session": "rev.fed"})
    doomed = Agent(repl, add_token(repl, "rev-doomed", "rev.*", "read,send"))
    spared = Agent(repl, add_token(repl, "rev-spared", "rev.*", "read,send"))
    waiting = doomed.popen("wait", "rev.empty")
    staying = spared.popen("wait", "rev.empty", "--cursor", "spared")
    following = doomed.popen("follow", "rev.fed")
    procs = [waiting, staying, following]
    idle = Client(repl.daemon.port, doomed.token)  # a connection of the token doing nothing
    try:
        assert idle.ok({"op": "read", "session": "rev.fed", "after": 0})["firings"] == []
        eventually(lambda: repl.waiters("rev.fed") == 1, what="the follow blocked")
        # the follow streams before the revocation (a reader acknowledges what it printed once
        # it is taken from the pipe, and waits again)
        assert doomed.ok("send", "rev.fed", "before") == "1\n"
        assert read_line(following) == b"on-message: before\n"
        eventually(lambda: repl.cursor("rev.fed", "follow") == 1, what="the follow's ack")
        eventually(lambda: repl.waiters("rev.fed") == 1, what="the follow blocked again")
        eventually(lambda: repl.waiters("rev.empty") == 2, what="both waits blocked")

        assert repl.ok("token", "revoke", "rev-doomed") == ""

        for proc in (waiting, following):
            assert proc.wait(15) == 77, proc.args
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.read() == b""
            stderr = proc.stderr.read().decode()
            assert_one_error_line(stderr)
            assert "revoked" in stderr
        assert idle.recv()["code"] == "unauthorized"  # told, then closed
        assert idle.closed()
        eventually(lambda: repl.waiters("rev.empty") == 1, what="the spared wait alone")
        assert staying.poll() is None  # the other token's wait still waits
        assert spared.ok("send", "rev.empty", "after") == "1\n"
        assert read_line(staying) == b"on-message: after\n"
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

    # afterwards the token is refused, on every command, as a wrong token
    for args in (["read", "rev.fed"], ["sessions"], ["wait", "rev.empty", "--timeout", "10"]):
        assert "REPL_TOKEN" in doomed.fails(77, *args), args
    assert "rev-doomed" not in token_names(repl)
    assert spared.ok("read", "rev.fed") == "on-message: before\n"
    # a revoked token's name is free again, for a new token: the old one stays refused
    fresh = add_token(repl, "rev-doomed", "rev.*", "read")
    assert fresh != doomed.token
    assert Agent(repl, fresh).ok("read", "rev.empty", "--after", "0") == "on-message: after\n"
    doomed.fails(77, "read", "rev.fed")
    assert "no token" in repl.fails(1, "token", "revoke", "rev-never")


def test_tokens_outlive_a_restart_and_a_revoked_one_stays_revoked(
    durable_daemon: DaemonProc,
) -> None:
    repl = Repl(durable_daemon)
    repl.ask({"op": "start", "session": "keep.1"})
    kept = Agent(repl, add_token(repl, "kept", "keep.*", "read,send"))
    gone = Agent(repl, add_token(repl, "gone", "keep.*", "read,send"))
    assert kept.ok("send", "keep.1", "before") == "1\n"
    gone.ok("read", "keep.1", "--after", "0")
    repl.ok("token", "revoke", "gone")

    assert "stopped the daemon" in repl.ok("shutdown")
    assert durable_daemon.proc is not None and durable_daemon.proc.wait(10) == 0
    assert durable_daemon.proc.stdout is not None
    durable_daemon.proc.stdout.close()
    durable_daemon.start(durable_daemon.port)

    assert kept.ok("read", "keep.1", "--after", "0") == "on-message: before\n"
    assert kept.ok("send", "keep.1", "after") == "2\n"
    assert [row["id"] for row in kept.json("sessions")] == ["keep.1"]
    kept.fails(77, "stop", "keep.1")  # its scope came back as it was
    assert "REPL_TOKEN" in gone.fails(77, "read", "keep.1")
    listed = json.loads(repl.ok("token", "list", "--json"))
    assert listed == [{"name": "kept", "sessions": ["keep.*"], "can": ["read", "send"]}]


def test_token_file_is_used_and_an_unreadable_one_is_one_line(repl: Repl, tmp_path: Path) -> None:
    repl.ask({"op": "start", "session": "file.1"})
    repl.send("file.1", "by root")
    token = add_token(repl, "file-agent", "file.*", "read")
    path = tmp_path / "agent.token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    assert repl.ok("--token-file", str(path), "read", "file.1") == "on-message: by root\n"
    assert "root" in repl.fails(77, "--token-file", str(path), "token", "list")
    repl.fails(77, "--token-file", str(path), "send", "file.1", "x")
    # the file given on the command line wins over REPL_TOKEN
    wrong = Agent(repl, "repl_not-a-token")
    assert wrong.ok("--token-file", str(path), "read", "file.1", "--after", "0") == (
        "on-message: by root\n"
    )
    assert "REPL_TOKEN" in wrong.fails(77, "read", "file.1")

    repl.send("file.1", "second")
    for name, content in (("missing", None), ("empty", b""), ("binary", b"\xff\xfe\n")):
        bad = tmp_path / name
        if content is not None:
            bad.write_bytes(content)
        stderr = repl.fails(1, "--token-file", str(bad), "read", "file.1")
        assert str(bad) in stderr, stderr
    wrong_file = tmp_path / "wrong.token"
    wrong_file.write_text("repl_not-a-token\n")
    stderr = repl.fails(77, "--token-file", str(wrong_file), "read", "file.1")
    assert str(wrong_file) in stderr and "--token-file" in stderr
    assert repl.cursor("file.1", "read") == 1  # the refused reads acknowledged nothing
