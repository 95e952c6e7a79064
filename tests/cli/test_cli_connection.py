"""The CLI's connection to the daemon: addresses, a connection that breaks, answers it cannot read.

A connection that breaks (the daemon killed, the connection reset) is one
line saying to check the daemon with ``repl ping``, and whatever was not
acknowledged comes again to the next reader. The breaks are made by a relay
between ``repl`` and a real daemon (``Relay``), so the test can cut the
connection at the exact step it wants and still look at the daemon's
cursors; a daemon that answers what this CLI cannot read is a fake
(``FakeDaemon``), since a real one never does.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    DaemonProc,
    InProcDaemon,
    Repl,
    assert_one_error_line,
    eventually,
    free_port,
    read_line,
    unread,
)


class Relay:
    """A TCP relay to a daemon; ``cut`` resets the client's side of every connection.

    One thread moves the bytes both ways with ``select`` and does the cut
    itself, since a socket closed by another thread while this one waits on
    it would not be reset until the wait ends.
    """

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.peer: dict[socket.socket, socket.socket] = {}
        self.clients: list[socket.socket] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._cut = threading.Event()
        self._done = threading.Event()
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Reset every connection's client side (an RST), and refuse new ones."""
        self._cut.set()
        self._wake_w.send(b"x")
        assert self._done.wait(10), "the relay did not cut"

    def close(self) -> None:
        self._stop = True
        self._wake_w.send(b"x")
        self.thread.join(10)
        for sock in [self.listener, self._wake_r, self._wake_w, *self.peer]:
            sock.close()

    def _run(self) -> None:
        while not self._stop:
            if self._cut.is_set() and not self._done.is_set():
                self._reset_all()
            watched = [self._wake_r, *self.peer]
            if not self._cut.is_set():
                watched.append(self.listener)
            ready, _, _ = select.select(watched, [], [], 1)
            for sock in ready:
                if sock is self._wake_r:
                    self._wake_r.recv(64)
                elif sock is self.listener:
                    client, _ = self.listener.accept()
                    server = socket.create_connection(("127.0.0.1", self.upstream))
                    self.peer[client], self.peer[server] = server, client
                    self.clients.append(client)
                elif sock in self.peer:
                    self._pump(sock)

    def _pump(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        other = self.peer[sock]
        if data:
            other.sendall(data)
            return
        for one in (sock, other):
            self.peer.pop(one, None)
            one.close()

    def _reset_all(self) -> None:
        for client in self.clients:
            server = self.peer.pop(client, None)
            if server is None:
                continue
            self.peer.pop(server, None)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            server.close()
        self.listener.close()  # a reconnect is refused at once, not left unanswered
        self._done.set()


@pytest.fixture
def relay(shared: InProcDaemon) -> Iterator[Relay]:
    r = Relay(shared.port)
    yield r
    r.close()


def through(repl: Repl, relay: Relay) -> Repl:
    """``repl`` that reaches its daemon through the relay."""
    relayed = Repl(repl.daemon)
    relayed.env["REPL_ADDR"] = relay.addr
    return relayed


BROKEN = "closed the connection (Connection reset by peer): check it with `repl ping`"


def test_a_reset_while_a_wait_blocks_is_one_line(repl: Repl, s: str, relay: Relay) -> None:
    with through(repl, relay).popen("wait", s, "--reconnect", "0") as proc:
        eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
        relay.cut()
        stdout, stderr = proc.communicate(timeout=15)
    assert (proc.returncode, stdout) == (75, b"")
    assert_one_error_line(stderr.decode())
    assert f"the daemon at {relay.addr} {BROKEN}" in stderr.decode()


def test_a_reset_between_printing_and_acking_loses_nothing(
    repl: Repl, s: str, relay: Relay
) -> None:
    repl.send(s, "one", "two")
    with through(repl, relay).popen("read", s) as proc:
        eventually(lambda: unread(proc) > 0, what="the first line")
        relay.cut()  # before the reader takes a line: the ack cannot get through
        assert read_line(proc) == b"on-message: one\n"
        assert read_line(proc) == b"on-message: two\n"
        stdout, stderr = proc.communicate(timeout=15)
    assert (proc.returncode, stdout) == (75, b"")
    assert_one_error_line(stderr.decode())
    # the CLI finds the reset before it writes the ack (it connects again, and the relay
    # refuses: no daemon at), or as it writes it (closed the connection)
    assert "closed the connection" in stderr.decode() or "no daemon at" in stderr.decode()
    assert repl.cursor(s, "read") == 0  # acknowledged nothing: the next reader gets both
    assert repl.ok("read", s) == "on-message: one\non-message: two\n"


def test_a_reader_that_leaves_after_a_reset_stops_quietly_and_loses_nothing(
    repl: Repl, s: str, relay: Relay
) -> None:
    repl.send(s, "one", "two")
    with through(repl, relay).popen("wait", s) as proc:
        assert read_line(proc) == b"on-message: one\n"
        eventually(lambda: unread(proc) > 0, what="the second line")
        relay.cut()
        assert proc.stdout is not None
        proc.stdout.close()  # the reader leaves: the first line's ack cannot get through
        assert proc.wait(15) == 0
        assert proc.stderr is not None
        assert proc.stderr.read() == b""
    assert repl.cursor(s, "wait") is None  # at least once: both come again
    assert repl.ok("wait", s, "--timeout", "5") == "on-message: one\non-message: two\n"


def test_a_daemon_killed_mid_wait_is_one_line_saying_to_check_it(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    s = repl.session("s")
    with repl.popen("wait", s, "--reconnect", "0") as proc:
        eventually(lambda: repl.waiters(s) == 1, what="the wait to block")
        daemon.kill()
        stdout, stderr = proc.communicate(timeout=15)
    assert (proc.returncode, stdout) == (75, b"")
    assert_one_error_line(stderr.decode())
    assert stderr.decode() == (
        f"repl: the daemon at {daemon.addr} closed the connection: "
        "check it with `repl ping` and run the command again\n"
    )


def test_a_host_name_reaches_the_daemon(repl: Repl) -> None:
    env = {**repl.env, "REPL_ADDR": f"localhost:{repl.daemon.port}"}
    done = repl.run("ping", env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"repl daemon 0.1.0 at localhost:{repl.daemon.port}, pid ")


def test_an_ipv6_address_with_no_daemon_is_one_line(repl: Repl) -> None:
    addr = f"[::1]:{free_port()}"
    done = repl.run("--addr", addr, "ping")
    assert done.returncode == 75
    assert_one_error_line(done.stderr)
    assert done.stderr.startswith(f"repl: no daemon at {addr} (")


class FakeDaemon:
    """Accepts one connection, takes any auth, and answers the next request with ``answer``."""

    def __init__(self, home: Path, answer: bytes) -> None:
        home.mkdir(parents=True, exist_ok=True)
        (home / "token").write_text("any\n")
        self.home = home
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn, conn.makefile("rb") as lines:
            lines.readline()  # auth
            conn.sendall(b'{"ok": true}\n')
            lines.readline()
            conn.sendall(self.answer)
            lines.readline()  # until the client goes

    def close(self) -> None:
        self.thread.join(10)
        self.listener.close()


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"[1, 2]\n", "an answer must be a JSON object"),
        (b'{"ok": true, "seq": "one"}\n', "Expected `int`, got `str` - at `$.seq`"),
    ],
)
def test_an_answer_this_cli_cannot_read_is_one_line_asking_about_versions(
    repl: Repl, tmp_path: Path, answer: bytes, why: str
) -> None:
    fake = FakeDaemon(tmp_path / "fake", answer)
    env = {**repl.env, "REPL_ADDR": f"127.0.0.1:{fake.port}", "REPL_HOME": str(fake.home)}
    try:
        done = repl.run("send", "s", "hello", env=env)
    finally:
        fake.close()
    assert done.returncode == 1
    assert_one_error_line(done.stderr)
    assert f"the daemon at 127.0.0.1:{fake.port} answered something this client cannot read (" in (
        done.stderr
    )
    assert why in done.stderr
    assert done.stderr.endswith("are the daemon and the CLI the same version?\n")


def test_an_answer_that_is_not_json_is_no_daemon_at_all(repl: Repl, tmp_path: Path) -> None:
    fake = FakeDaemon(tmp_path / "fake", b"<html>\n")
    env = {**repl.env, "REPL_ADDR": f"127.0.0.1:{fake.port}", "REPL_HOME": str(fake.home)}
    try:
        done = repl.run("send", "s", "hello", env=env)
    finally:
        fake.close()
    assert done.returncode == 1
    assert_one_error_line(done.stderr)
    assert done.stderr == (
        f"repl: what answers at 127.0.0.1:{fake.port} (from REPL_ADDR) is not a repl daemon "
        "(it answered b'<html>'): is the address right?\n"
    )
