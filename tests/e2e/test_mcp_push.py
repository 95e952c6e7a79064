"""``repl mcp --follow``: what arrives in a session pushed to the client (docs/semantics.md
M4-M6).

Two kinds of client drive the real ``repl mcp`` against a real daemon:

- ``Harness`` is a channel harness as Claude Code is one: JSON-RPC lines written by
  hand on the server's stdin, its stdout read a line at a time straight from the pipe
  (so the server sees exactly what was taken). What is checked: one notification a
  firing, each with its own meta, its tag keys mapped to keys Claude Code keeps; in
  ``--ack agent`` (the default) nothing is acknowledged until the agent's ``ack`` or
  ``reply``, and the next server pushes what it did not acknowledge; in ``--ack pipe``
  a push is acknowledged once taken and held 2 s, a notification left unread is not,
  one whose reader left is not, and a health check (connect, initialize, list, hang
  up) consumes nothing in either mode; ``--allow-from``; a daemon restart while
  following; what the server declares, and its options.
- The SDK's own client (``ClientSession`` over ``stdio_client``) reads the sessions as
  resources, subscribes to one (``resources/subscribe``) and is told of each new
  firing, and stays in the 2026-07-28 protocol, where it is told only on a
  ``subscriptions/listen`` stream, and nothing is acknowledged without one.

Every wait is for an event (a line read with a deadline, ``anyio.fail_after``, the
daemon's state looked at until it holds, a process's exit), never for time to pass.
"""

from __future__ import annotations

import array
import fcntl
import json
import os
import socket
import subprocess
import sys
import termios
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from itertools import count
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.subscriptions import ResourceUpdated, listen
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.types import DiscoverResult, ResourceUpdatedNotification

from repl_cli.mcp.push import (
    META_KEY,
    allowed,
    channel_params,
    lost_params,
    meta_key,
    session_of,
    tag_of,
)
from session.firing import Firing
from tests.helpers import Client, DaemonProc, Repl, eventually, read_line, repl_argv, unread

#: the protocol version a harness of today asks for in its handshake
HANDSHAKE = "2025-06-18"
#: numbers for the servers' stderr logs, one each
LOGS = count(1)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """One daemon for the module, with the default settle time (a burst is one batch)."""
    d = DaemonProc(tmp_path_factory.mktemp("mcp-push") / "home", "--memory")
    yield d
    d.close_clients()
    d.stop()


class Harness:
    """``repl mcp ARGS`` as a channel harness runs it: lines in, lines out, by hand."""

    def __init__(
        self, d: DaemonProc, *args: str, env: dict[str, str] | None = None, stdout: Any = None
    ) -> None:
        self.log = d.home.parent / f"mcp-push-stderr-{next(LOGS)}.log"  # this server's alone
        with open(self.log, "ab") as errlog:
            self.proc = subprocess.Popen(
                repl_argv("mcp", *args),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if stdout is None else stdout,
                stderr=errlog,
                env={**d.env(), **(env or {})},
            )
        self.ids = count(1)
        #: notifications read while looking for a response, in the order they came
        self.pushed: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def line(self, timeout: float = 15) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(read_line(self.proc, timeout))
        return message

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response to a request (its result, or its error); notifications that come
        before it are kept for ``push``."""
        rid = next(self.ids)
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        while True:
            message = self.line()
            if message.get("id") == rid:
                return message
            self.pushed.append(message)

    def initialize(self) -> dict[str, Any]:
        """The handshake, as Claude Code makes it: the server's answer."""
        answer = self.request(
            "initialize",
            {
                "protocolVersion": HANDSHAKE,
                "capabilities": {},
                "clientInfo": {"name": "harness", "version": "1"},
            },
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        result: dict[str, Any] = answer["result"]
        return result

    def push(self, timeout: float = 15) -> dict[str, Any]:
        """The next notification the server pushed."""
        if self.pushed:
            return self.pushed.pop(0)
        message = self.line(timeout)
        assert "id" not in message, message
        return message

    def channel(self) -> dict[str, Any]:
        """The params of the next channel notification."""
        message = self.push()
        assert message["method"] == "notifications/claude/channel", message
        params: dict[str, Any] = message["params"]
        return params

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """A tool's structured result (the call insisted ok)."""
        answer = self.request("tools/call", {"name": tool, "arguments": arguments})
        result: dict[str, Any] = answer["result"]
        assert not result.get("isError"), result
        structured: dict[str, Any] = result["structuredContent"]
        return structured

    def close(self) -> str:
        """Close its stdin as a harness that is done does: it exits 0; its stderr."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            assert self.proc.wait(15) == 0
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.log.read_text()


class SocketHarness(Harness):
    """A harness whose child's stdout is a Unix socket, as a Node.js parent's is (libuv
    makes each stdio "pipe" a socketpair)."""

    def __init__(self, d: DaemonProc, *args: str) -> None:
        self.ours, theirs = socket.socketpair()
        with theirs:
            super().__init__(d, *args, stdout=theirs)

    def line(self, timeout: float = 15) -> dict[str, Any]:
        self.ours.settimeout(timeout)
        got = b""
        while not got.endswith(b"\n"):
            byte = self.ours.recv(1)  # one byte at a time: the server sees what we took
            assert byte, f"stdout closed after {got!r}"
            got += byte
        message: dict[str, Any] = json.loads(got)
        return message

    def unread(self) -> int:
        count = array.array("i", [0])
        fcntl.ioctl(self.ours.fileno(), termios.FIONREAD, count, True)
        return count[0]


@contextmanager
def harness(d: DaemonProc, *args: str, env: dict[str, str] | None = None) -> Iterator[Harness]:
    h = Harness(d, *args, env=env)
    try:
        yield h
    finally:
        if h.proc.poll() is None:
            h.proc.terminate()
            h.proc.wait(15)
        for pipe in (h.proc.stdin, h.proc.stdout):
            if pipe is not None:
                pipe.close()


def sender(repl: Repl, name: str, *sessions: str) -> Client:
    """A connection as a scoped token of its own, named ``name``, that may send to
    ``sessions``: what it sends is ``by`` ``name``."""
    (made,) = repl.ask(
        {"op": "token", "action": "add", "name": name, "sessions": list(sessions), "can": ["send"]}
    )
    client = repl.daemon.client(auth=False)
    client.ok({"op": "auth", "token": made["token"]})
    return client


def send(client: Client, session: str, text: str, **tags: str) -> int:
    seq: int = client.ok({"op": "send", "session": session, "text": text, "tags": tags})["seq"]
    return seq


# -- the harness's view -------------------------------------------------------------


def test_each_firing_is_pushed_with_its_own_meta_and_waits_for_the_agents_ack(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s = repl.session("push", "waiting already")
    with harness(daemon, "--follow", s) as h:
        hello = h.initialize()
        assert hello["capabilities"]["experimental"] == {"claude/channel": {}}
        assert hello["capabilities"]["resources"]["subscribe"] is True
        assert {"prompts", "completions", "logging"} <= set(hello["capabilities"])
        words = hello["instructions"]
        assert '<channel source="repl"' in words and f"sessions {s} is pushed" in words
        assert "call `ack` with its session and seq" in words and "allowed" not in words
        assert "256 unless" in words and "(`lost`)" in words
        first = h.channel()
        assert first["content"] == "waiting already"
        assert first["meta"]["seq"] == "1" and first["meta"]["by"] == "root"
        # a request and a plain message in one burst: a notification each, each its meta
        client = repl.daemon.client()
        mine = repl.session("alice.inbox")
        asked = send(client, s, "answer me", **{"reply-to": mine, "corr": "c-1"})
        plain = send(client, s, "just so")
        request, after = h.channel(), h.channel()
        assert request["content"] == "answer me" and after["content"] == "just so"
        meta = request["meta"]
        assert meta == {
            "session": s,
            "seq": str(asked),
            "handler": "on-message",
            "ts": meta["ts"],
            "by": "root",
            "tag_reply_to": mine,
            "tag_corr": "c-1",
        }
        assert meta["ts"].endswith("Z")
        assert after["meta"]["seq"] == str(plain) and "tag_reply_to" not in after["meta"]
        # taken out of the pipe is not handled: nothing moves until the agent says so
        eventually(lambda: repl.waiters(s) == 1, what="the follow to block again")
        assert repl.cursor(s, "mcp") is None
        assert h.call("ack", session=s, seq=1) == {"cursor": "mcp", "seq": 1}
        assert repl.cursor(s, "mcp") == 1  # the follow cursor: the ack's default here
        unknown = h.request("prompts/get", {"name": "x"})
        assert unknown["error"] == {
            "code": -32602,
            "message": "repl: the x prompt: no prompt 'x': the prompts are inbox and work",
        }
        assert h.close() == ""
    # a new MCP session (a harness restarted): what was not acknowledged comes again
    with harness(daemon, "--follow", s) as again:
        again.initialize()
        assert [again.channel()["meta"]["seq"] for _ in range(2)] == [str(asked), str(plain)]
        # a reply to a pushed firing acknowledges up to it
        replied = again.call("reply", session=s, seq=asked, text="done")
        assert replied["duplicate"] is False and repl.cursor(s, "mcp") == asked
        assert again.call("ack", session=s, seq=plain)["seq"] == plain
        assert again.close() == ""
    with harness(daemon, "--follow", s) as third:
        third.initialize()
        eventually(lambda: repl.waiters(s) == 1, what="the follow to wait: nothing to push")
        assert third.pushed == [] and unread(third.proc) == 0
        assert third.close() == ""


def test_tag_keys_arrive_distinct_and_as_keys_claude_code_keeps(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    s = repl.session("keys")
    tags = {"a.b": "1", "a_b": "2", "2fa": "3", "x-y": "4", "seq": "5", "by": "6"}
    with harness(daemon, "--follow", s) as h:
        h.initialize()
        client = repl.daemon.client()
        refused = client.call({"op": "send", "session": s, "text": "x", "tags": tags})
        assert refused["code"] == "bad_tag"  # by is the daemon's to say
        del tags["by"]
        send(client, s, "keyed", **tags)
        meta = h.channel()["meta"]
        assert all(META_KEY.match(key) for key in meta), meta
        assert {tag_of(k): v for k, v in meta.items() if tag_of(k) is not None} == tags
        assert meta["seq"] != "5"  # a tag cannot stand in for the firing's own
        assert h.close() == ""


@given(keys=st.lists(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,63}", fullmatch=True), max_size=8))
def test_the_meta_key_of_a_tag_is_kept_by_claude_code_and_read_back(keys: list[str]) -> None:
    written = [meta_key(key) for key in keys]
    assert all(META_KEY.fullmatch(key) for key in written)
    assert [tag_of(key) for key in written] == keys  # so no two tags share a key
    assert not any(key in ("session", "seq", "handler", "ts", "by", "lost") for key in written)


def test_in_pipe_mode_a_push_is_acknowledged_once_taken_and_held(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    s = repl.session("pipe", "a", "b")
    with harness(daemon, "--follow", s, "--ack", "pipe", "--cursor", "piped") as h:
        hello = h.initialize()
        assert "acknowledged for you once you have it" in hello["instructions"]
        assert [h.channel()["content"] for _ in range(2)] == ["a", "b"]
        eventually(lambda: repl.cursor(s, "piped") == 2, what="the pushes to be acknowledged")
        assert repl.cursor(s, "mcp") is None  # the cursor given, not the default
        repl.send(s, "c")
        assert h.channel()["content"] == "c"
        eventually(lambda: repl.cursor(s, "piped") == 3, what="c to be acknowledged")
        assert h.close() == ""


def test_in_pipe_mode_a_reader_that_leaves_within_the_hold_stops_the_acks(
    daemon: DaemonProc,
) -> None:
    """It took the push out of the pipe, then closed its end (its stdin still open): not
    there 2 s later, so nothing is acknowledged by this server any more."""
    repl = Repl(daemon)
    s = repl.session("pipe-left", "taken then left")
    with harness(daemon, "--follow", s, "--ack", "pipe") as h:
        h.initialize()
        assert h.channel()["content"] == "taken then left"
        assert h.proc.stdout is not None
        h.proc.stdout.close()
        h.proc.stdout = None
        warned = f"following {s}: the client left within 2 s of a push"
        eventually(lambda: warned in h.log.read_text(), what="the server to see it gone")
        assert repl.cursor(s, "mcp") is None
        assert warned in h.close()


@pytest.mark.parametrize("mode", ["agent", "pipe"])
def test_a_health_check_consumes_nothing(daemon: DaemonProc, mode: str) -> None:
    """``claude mcp list`` / ``claude mcp get``: connect, initialize, list the tools, hang
    up within a second; whatever was pushed meanwhile is not acknowledged."""
    repl = Repl(daemon)
    s = repl.session("health", "one", "two")
    for _ in range(2):
        with harness(daemon, "--follow", s, "--ack", mode) as h:
            h.initialize()
            assert h.request("tools/list")["result"]["tools"]
            eventually(lambda: len(h.pushed) + unread(h.proc) > 0, what="a push to be written")
            while unread(h.proc):
                h.pushed.append(h.line())  # taken out of the pipe, every line
            assert h.close() == ""  # hung up: the server exited
        assert repl.cursor(s, "mcp") is None
    with harness(daemon, "--follow", s, "--ack", mode) as h:  # the next session gets them
        h.initialize()
        assert [h.channel()["content"] for _ in range(2)] == ["one", "two"]
        assert h.close() == ""


def test_an_unread_notification_is_not_acknowledged_and_comes_again(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s = repl.session("unread")
    with harness(daemon, "--follow", s, "--ack", "pipe") as h:
        h.initialize()
        eventually(lambda: repl.waiters(s) == 1, what="the follow to block in its wait")
        repl.send(s, "hello")
        eventually(lambda: unread(h.proc) > 0, what="the push to be written")
        # written, not taken: the server holds it unacknowledged
        assert repl.cursor(s, "mcp") is None and repl.waiters(s) == 0
        h.proc.terminate()  # the harness dies with the push unread
        assert h.proc.wait(15) != 0
    assert repl.cursor(s, "mcp") is None
    with harness(daemon, "--follow", s, "--ack", "pipe") as again:
        again.initialize()
        assert again.channel()["content"] == "hello"  # duplicates, never loss
        eventually(lambda: repl.cursor(s, "mcp") == 1, what="the push to be acknowledged")
        again.close()


def test_a_reader_that_leaves_before_taking_a_push_leaves_it_unacknowledged(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s, t = repl.session("left"), repl.session("left")
    (made,) = repl.ask(
        {"op": "token", "action": "add", "name": "m-left", "sessions": [s, t], "can": ["read"]}
    )

    def connections() -> int:
        """The server's connections to the daemon: its token's, but for this look's own."""
        looking = Client(daemon.port, made["token"])
        try:
            count: int = looking.ok({"op": "stats"})["daemon"]["connections"]
            return count - 1
        finally:
            looking.close()

    args = ("--follow", s, "--follow", t, "--ack", "pipe")
    with harness(daemon, *args, env={"REPL_TOKEN": made["token"]}) as h:
        h.initialize()
        eventually(lambda: repl.waiters(t) == 1, what="t's follow to block in its wait")
        repl.send(s, "for nobody")
        eventually(lambda: unread(h.proc) > 0, what="the push to be written")
        assert connections() == 2  # its follows' (no tool was called)
        assert h.proc.stdout is not None
        h.proc.stdout.close()  # the reader is gone with the push in the pipe
        h.proc.stdout = None
        eventually(lambda: connections() == 1, what="s's follow to end, its reader gone")
        repl.send(t, "nor this")  # nothing more is written: t's follow ends too
        eventually(lambda: connections() == 0, what="t's follow to end")
        assert repl.cursor(s, "mcp") is None and repl.cursor(t, "mcp") is None
        assert h.close() == ""  # it goes on until its stdin closes, then exits 0


def test_a_push_written_after_the_reader_left_ends_the_follow_quietly(
    daemon: DaemonProc,
) -> None:
    """The reader closed its end before anything was pushed: the push's write fails
    (EPIPE), the follow ends, and the server goes on until its stdin closes."""
    repl = Repl(daemon)
    s = repl.session("gone-first")
    with harness(daemon, "--follow", s, "--ack", "pipe") as h:
        h.initialize()
        eventually(lambda: repl.waiters(s) == 1, what="the follow to block in its wait")
        assert h.proc.stdout is not None
        h.proc.stdout.close()
        h.proc.stdout = None
        repl.send(s, "into a closed pipe")
        eventually(lambda: repl.waiters(s) == 0, what="the follow to take it and end")
        assert h.proc.poll() is None  # still serving: its stdin is open
        assert h.close() == ""
    assert repl.cursor(s, "mcp") is None


def test_a_push_into_a_socket_is_acknowledged_once_read(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    s = repl.session("socket", "hello")
    h = SocketHarness(daemon, "--follow", s, "--ack", "pipe")
    try:
        h.initialize()
        eventually(lambda: h.unread() > 0, what="the push to be written")
        assert repl.cursor(s, "mcp") is None and repl.waiters(s) == 0  # written, not read
        assert h.channel()["content"] == "hello"
        eventually(lambda: repl.cursor(s, "mcp") == 1, what="the push to be acknowledged")
        assert h.close() == ""
    finally:
        if h.proc.poll() is None:
            h.proc.kill()
            h.proc.wait(15)
        if h.proc.stdin is not None:
            h.proc.stdin.close()
        h.ours.close()


@pytest.mark.parametrize("mode", ["agent", "pipe"])
def test_allow_from_pushes_the_allowed_senders_and_passes_the_others_unseen(
    daemon: DaemonProc, mode: str
) -> None:
    repl = Repl(daemon)
    s = repl.session("gate")
    alice, bob = sender(repl, f"alice-{mode}", s), sender(repl, f"bob-{mode}", s)
    send(bob, s, "spam")
    send(alice, s, "hi")
    gate = ("--allow-from", f"alice-{mode},carol", "--allow-from", "dave")
    with harness(daemon, "--follow", s, *gate, "--ack", mode) as h:
        hello = h.initialize()
        assert f"sent by alice-{mode}, carol, dave" in hello["instructions"]
        first = h.channel()
        assert first["content"] == "hi"  # bob's spam before it is left out
        assert first["meta"]["by"] == f"alice-{mode}" and first["meta"]["seq"] == "2"
        if mode == "agent":
            h.call("ack", session=s, seq=2)
        eventually(lambda: repl.cursor(s, "mcp") == 2, what="the push to be acknowledged")
        passed = send(bob, s, "more spam")
        # acknowledged unseen, everything told before it being acknowledged
        eventually(lambda: repl.cursor(s, "mcp") == passed, what="bob's firing passed")
        send(alice, s, "last")
        kept = send(bob, s, "spam after an unacknowledged push")
        after = h.channel()
        assert after["content"] == "last" and after["meta"]["by"] == f"alice-{mode}"
        if mode == "agent":
            eventually(lambda: repl.waiters(s) == 1, what="the follow to wait again")
            assert repl.cursor(s, "mcp") == passed  # "last" is not acknowledged: nor is kept
            h.call("ack", session=s, seq=kept - 1)  # the agent handled "last": kept goes too
        eventually(lambda: repl.cursor(s, "mcp") == kept, what="the spam after it passed")
        assert h.close() == ""


def test_a_daemon_restart_while_following(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home")  # the SQLite store: the session outlives the restart
    try:
        repl = Repl(d)
        s = repl.session("restart", "before")
        d.stop()
        # the daemon is not there when the server starts: it waits for it
        with harness(d, "--follow", s, "--ack", "pipe") as h:
            h.initialize()
            listing = h.request("resources/list")["error"]
            assert listing["code"] == -32603 and "no daemon at" in listing["message"]
            reading = h.request("resources/read", {"uri": f"repl://sessions/{s}"})["error"]
            assert reading["code"] == -32603 and "no daemon at" in reading["message"]
            eventually(lambda: "trying again" in h.log.read_text(), what="the follow's try")
            d.start(d.port)
            assert h.channel()["content"] == "before"
            eventually(lambda: repl.waiters(s) == 1, what="the follow to block in its wait")
            d.restart(crash=True)
            repl.send(s, "after")
            assert h.channel()["content"] == "after"  # not "before" again: told already
            eventually(lambda: repl.cursor(s, "mcp") == 2, what="the push to be acknowledged")
            said = h.close()
        assert f"repl: following {s}: no daemon at" in said
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


def test_a_session_that_cannot_be_followed_is_said_on_stderr_and_the_rest_goes_on(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s = repl.session("still")
    with harness(daemon, "--follow", "m-nosuch", "--follow", s) as h:
        h.initialize()
        stopped = "repl: following m-nosuch stopped: no session 'm-nosuch'"
        eventually(lambda: stopped in h.log.read_text(), what="the follow of m-nosuch to stop")
        repl.send(s, "still pushed")
        assert h.channel()["content"] == "still pushed"
        listed = h.request("tools/call", {"name": "sessions", "arguments": {}})
        assert not listed["result"].get("isError")
        assert h.close().count("\n") == 1  # that line, once


def test_the_options_of_the_push_are_checked(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    for args, words in (
        (("--cursor", "x"), "--cursor is for what --follow pushes"),
        (("--allow-from", "alice"), "--allow-from is for what --follow pushes"),
        (("--ack", "pipe"), "--ack is for what --follow pushes"),
        (("--follow", "s", "--ack", "never"), "'never' is not one of 'agent', 'pipe'"),
        (("--follow", "no/such"), "session id 'no/such'"),
        (("--follow", "s", "--allow-from", "al ice"), "token name 'al ice'"),
        (("--follow", "s", "--cursor", "has space"), "cursor name 'has space'"),
    ):
        done = repl.run("mcp", *args)
        assert done.returncode == 64 and words in done.stderr, (args, done.stderr)


def test_the_channel_params_of_a_firing_and_the_gate() -> None:
    def firing(seq: int, by: str | None, tags: dict[str, str] | None = None) -> Firing:
        return Firing(seq, "on-message", f"text {seq}", None, "T", tags or {}, by)

    raw = Firing(3, "on-hook", None, "the raw event", "T", {"reply-to": "me"}, "a")
    assert channel_params("s", raw, 4) == {
        "content": "the raw event",
        "meta": {
            "session": "s",
            "seq": "3",
            "handler": "on-hook",
            "ts": "T",
            "by": "a",
            "lost": "4",
            "tag_reply_to": "me",
        },
    }
    # a firing stored before senders were recorded: no by, whatever its tags say
    old = channel_params("s", firing(5, None, {"by": "mallory", "session": "x"}), 0)
    assert old["meta"] == {
        "session": "s",
        "seq": "5",
        "handler": "on-message",
        "ts": "T",
        "tag_by": "mallory",
        "tag_session": "x",
    }
    only_lost = lost_params("s", 3, 7)
    assert only_lost["meta"] == {"session": "s", "seq": "7", "lost": "3"}
    assert "3 firings" in only_lost["content"]
    assert allowed(firing(1, None), None) and allowed(firing(1, "a"), frozenset({"a"}))
    assert not allowed(firing(1, None), frozenset({"a"}))
    assert not allowed(firing(1, "b"), frozenset({"a"}))
    assert session_of("repl://sessions/s1") == "s1"
    assert session_of("repl://sessions/") is None and session_of("file:///x") is None
    assert tag_of("session") is None


def test_a_session_whose_ring_dropped_firings_is_told_so(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    (started,) = repl.ask({"op": "start", "buffer": 0})
    s = started["session"]
    repl.send(s, "gone", "too")
    with harness(daemon, "--follow", s) as h:
        h.initialize()
        told = h.channel()
        assert told["meta"] == {"session": s, "seq": "2", "lost": "2"}
        assert h.call("ack", session=s, seq=2)["seq"] == 2  # the loss acknowledged
        h.close()


# -- the SDK's client -------------------------------------------------------------


@asynccontextmanager
async def sdk_client(
    d: DaemonProc, *args: str, **kwargs: Any
) -> AsyncIterator[tuple[ClientSession, Path]]:
    """The SDK's session with ``repl mcp ARGS`` (not yet initialized), and its stderr's log."""
    environment = {"REPL_ADDR": d.addr, "REPL_HOME": str(d.home)}
    environment.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "repl_cli", "mcp", *args], env=environment
    )
    log = d.home.parent / "mcp-push-sdk.log"
    errlog = open(log, "a")  # noqa: ASYNC230, SIM115 - a log file
    try:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, **kwargs) as session,
        ):
            yield session, log
    finally:
        errlog.close()


@pytest.mark.anyio
# resources/subscribe is the handshake protocol's (the SDK warns that 2026-07-28 drops it)
@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_a_subscribed_client_is_told_of_each_new_firing(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    s = repl.session("sub", "one")
    uri = f"repl://sessions/{s}"
    updates, updated = anyio.create_memory_object_stream[str](10)

    async def handler(message: Any) -> None:
        if isinstance(message, ResourceUpdatedNotification):
            await updates.send(message.params.uri)

    async with (
        updates,
        updated,
        sdk_client(daemon, "--follow", s, "--ack", "pipe", message_handler=handler) as (client, _),
    ):
        with anyio.fail_after(20):
            hello = await client.initialize()
            resources = hello.capabilities.resources
            assert resources is not None and resources.subscribe is True
            templates = (await client.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["repl://sessions/{id}"]
            listed = {r.name: r for r in (await client.list_resources()).resources}
            assert listed[s].uri == uri and listed[s].mime_type == "application/json"
            # "one" was pushed on the channel before the subscription: no update for it
            await anyio.to_thread.run_sync(
                lambda: eventually(lambda: repl.cursor(s, "mcp") == 1, what="one's push")
            )
            await client.subscribe_resource(uri)
            with pytest.raises(MCPError, match="not followed by this server"):
                await client.subscribe_resource("repl://sessions/other")
            with pytest.raises(MCPError, match="is not a session"):
                await client.subscribe_resource("file:///etc/passwd")
            repl.send(s, "two")
            assert await updated.receive() == uri
            read = await client.read_resource(uri)
            body = json.loads(read.contents[0].text)  # type: ignore[union-attr]
            assert [f["result"] for f in body["firings"]] == ["one", "two"]
            assert body["next"] == 2 and body["firings"][1]["by"] == "root"
            await client.unsubscribe_resource(uri)
            repl.send(s, "three")  # pushed on the channel, no update for it: read it there
            await anyio.to_thread.run_sync(
                lambda: eventually(lambda: repl.cursor(s, "mcp") == 3, what="the push")
            )
            assert updated.statistics().current_buffer_used == 0


@pytest.mark.anyio
async def test_a_client_of_the_2026_era_is_told_on_its_listen_stream_or_not_at_all(
    daemon: DaemonProc,
) -> None:
    """A client that stays in the 2026-07-28 era (it adopts it without a probe, which
    a following server refuses) has no channel: it is told on a listen stream that asked
    for the session, and in ``--ack pipe`` nothing is acknowledged that no stream got."""
    repl = Repl(daemon)
    s = repl.session("listen", "before any stream")
    uri = f"repl://sessions/{s}"
    async with sdk_client(daemon, "--follow", s, "--ack", "pipe") as (client, _):
        with anyio.fail_after(20):
            with pytest.raises(MCPError, match="Method not found") as refused:
                await client.discover()
            assert refused.value.error.code == -32601
            client.adopt(DiscoverResult(supported_versions=["2026-07-28"], capabilities={}))
            # no listen stream: nothing told, nothing acknowledged
            await anyio.to_thread.run_sync(
                lambda: eventually(lambda: repl.waiters(s) == 0, what="the follow to hold it")
            )
            async with listen(client, tools_list_changed=True) as elsewhere:
                del elsewhere  # a stream that asked for something else is no path either
                assert repl.cursor(s, "mcp") is None
            async with listen(client, resource_subscriptions=[uri]) as events:
                assert await events.__anext__() == ResourceUpdated(uri)  # the held one
                await anyio.to_thread.run_sync(
                    lambda: eventually(lambda: repl.cursor(s, "mcp") == 1, what="its ack")
                )
                repl.send(s, "news")
                assert await events.__anext__() == ResourceUpdated(uri)
            got = json.loads((await client.read_resource(uri)).contents[0].text)  # type: ignore[union-attr]
            assert [f["result"] for f in got["firings"]] == ["before any stream", "news"]
    assert repl.cursor(s, "mcp") == 1  # news went on a stream that closed within 2 s


@pytest.mark.anyio
async def test_without_follow_the_sessions_are_resources_and_nothing_is_pushed(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s = repl.session("plain", "x")
    async with sdk_client(daemon) as (client, _):
        with anyio.fail_after(20):
            hello = await client.initialize()
            caps = hello.capabilities
            assert caps.experimental is None and caps.prompts and caps.tools
            assert caps.resources is not None and not caps.resources.subscribe
            assert "pushed" not in (hello.instructions or "")
            names = [r.name for r in (await client.list_resources()).resources]
            assert s in names
            got = json.loads((await client.read_resource(f"repl://sessions/{s}")).contents[0].text)  # type: ignore[union-attr]
            assert [f["result"] for f in got["firings"]] == ["x"]
            with pytest.raises(MCPError, match="no session 'm-none'") as missing:
                await client.read_resource("repl://sessions/m-none")
            assert missing.value.error.code == -32602
            with pytest.raises(MCPError, match="session id 'a b'") as bad:
                await client.read_resource("repl://sessions/a%20b")
            assert bad.value.error.code == -32602
            with (
                pytest.warns(MCPDeprecationWarning),
                pytest.raises(MCPError, match="Method not found"),
            ):
                await client.subscribe_resource(f"repl://sessions/{s}")
