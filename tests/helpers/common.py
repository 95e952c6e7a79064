"""What every kind of test uses: a free port, waiting for an event (never for seconds), the
property tests' example counts, reading a child's pipe exactly.
"""

from __future__ import annotations

import array
import fcntl
import os
import socket
import subprocess
import termios
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def free_port() -> int:
    """A loopback port nobody listens on (at the moment of asking)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def examples(suite: int, variable: str) -> int:
    """How many examples a property test runs: ``suite`` in the suite (a few seconds' worth,
    far from the 60 s timeout under coverage on a loaded 2-core machine), or ``$variable``
    for a longer search."""
    return int(os.environ.get(variable, suite))


def eventually(check: Callable[[], bool], timeout: float = 15, what: str = "condition") -> None:
    """Poll ``check`` until it holds; a bounded wait, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def each_at_once(run: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``run`` of each item, as many at once as the machine has cores, in the items' order:
    for independent ``repl`` runs, each mostly an interpreter starting. What one raised is
    raised (the first in the items' order)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(run, items))


def read_line(proc: subprocess.Popen[bytes], timeout: float = 15) -> bytes:
    """One line from a child's stdout, read straight from the pipe (no read-ahead).

    Reading byte by byte takes exactly one line out of the pipe, so the
    child sees precisely what we have taken.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    got = b""
    deadline = time.monotonic() + timeout
    while not got.endswith(b"\n"):
        try:
            byte = os.read(fd, 1)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise AssertionError(f"no line from {proc.args!r} (got {got!r})") from None
            time.sleep(0.005)
            continue
        if not byte:
            raise AssertionError(f"{proc.args!r} closed stdout after {got!r}")
        got += byte
    return got


def unread(proc: subprocess.Popen[bytes]) -> int:
    """Bytes the child wrote to its stdout pipe that we have not read yet."""
    assert proc.stdout is not None
    count = array.array("i", [0])
    fcntl.ioctl(proc.stdout.fileno(), termios.FIONREAD, count, True)
    return count[0]
