"""A stdout that is a Unix socket is a pipe for rule S9 (docs/semantics.md S9).

A Node.js parent (libuv) gives a child a socketpair for each stdio "pipe", so
``repl wait`` run from such a program writes its firings into a socket. A
firing is acknowledged only once the reader has taken it out of the socket;
one whose reader left without taking it is not acknowledged.
"""

from __future__ import annotations

import array
import fcntl
import socket
import subprocess
import termios
from collections.abc import Iterator
from contextlib import contextmanager

from tests.helpers import Repl, eventually, repl_argv


def waiting(sock: socket.socket) -> int:
    """Bytes in ``sock`` that we have not read."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count, True)
    return count[0]


@contextmanager
def wait_into_a_socket(
    repl: Repl, s: str
) -> Iterator[tuple[subprocess.Popen[bytes], socket.socket]]:
    """``repl wait s`` writing into a socketpair, and our end of it."""
    ours, theirs = socket.socketpair()
    with theirs:
        child = subprocess.Popen(
            repl_argv("wait", s), stdout=theirs, stderr=subprocess.PIPE, env=repl.env
        )
    try:
        with ours:
            yield child, ours
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(15)
        assert child.stderr is not None
        child.stderr.close()


def test_a_wait_into_a_socket_acknowledges_once_the_reader_took_the_line(
    repl: Repl, s: str
) -> None:
    repl.send(s, "one")
    with wait_into_a_socket(repl, s) as (child, ours):
        eventually(lambda: waiting(ours) > 0, what="the line to be written")
        assert child.poll() is None and repl.cursor(s, "wait") is None  # written, not taken
        line = b""
        while not line.endswith(b"\n"):
            line += ours.recv(1)
        assert line == b"on-message: one\n"
        assert child.wait(15) == 0
        assert child.stderr is not None and child.stderr.read() == b""
    assert repl.cursor(s, "wait") == 1


def test_a_wait_whose_socket_reader_left_acknowledges_nothing(repl: Repl, s: str) -> None:
    repl.send(s, "one")
    with wait_into_a_socket(repl, s) as (child, ours):
        eventually(lambda: waiting(ours) > 0, what="the line to be written")
        ours.close()  # the reader is gone with the line unread
        assert child.wait(15) == 0  # it stops quietly
        assert child.stderr is not None and child.stderr.read() == b""
    assert repl.cursor(s, "wait") is None
