"""Writing to stdout so that a line counts as delivered only once the reader has it.

rule S9: the CLI acknowledges a firing only after it was written and
flushed, and when stdout is a pipe, only after the reading process took it
out of the pipe. So a line is written on its own, and then, on a pipe, we
watch the pipe's unread byte count (``FIONREAD``, which Linux answers on the
write end too) until it is zero. Under ``repl wait ID | head -n 1`` the
first firing is taken and acknowledged, head exits, the second stays in the
pipe unread, and the pipe reports an error on our end (no reader left):
``ReaderGone``, and the second is not acknowledged.

A Unix socket is such a pipe too: a Node.js parent (libuv) gives its child
a socketpair for each of its stdio "pipes". Its unsent count (``SIOCOUTQ``)
falls only as the peer reads, so we watch that; but a socket forgets what
its peer never read once the peer is gone, so a peer gone is ``ReaderGone``
whatever it read (duplicates, never loss).

A write that fails because the reader closed the pipe (``EPIPE``) is
``ReaderGone`` too, and so is a stdout closed from the start (``>&-``).
Python ignores SIGPIPE already, so we are not killed. Any other failure (a
full disk under ``> file``, a file size limit, a terminal that went away:
EIO) is ``WriteFailed``, one line; what was written before it still counts
as delivered. ``write_text`` is the
same for the plain lines of the other commands (a seq, a listing).
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import select
import stat
import sys
import termios
import time
from collections.abc import Iterator
from typing import TextIO

from repl_cli.cli.errors import ReaderGone, WriteFailed

# back off from 0.1 ms to 5 ms while the reader has not taken a line yet
_FIRST_PAUSE = 0.0001
_LONGEST_PAUSE = 0.005
# what a write to stdout fails with once its reader is gone
_GONE = (errno.EPIPE, errno.EBADF, errno.ECONNRESET)


def stdout() -> TextIO:
    """``sys.stdout``; ReaderGone when the process started with it closed (``>&-``).

    Then nobody can read what we print, and fd 1 may be another file of ours
    by now (the daemon's socket): it must not be written.
    """
    if sys.stdout is None:
        raise ReaderGone()
    return sys.stdout


def write_text(text: str) -> None:
    """Write ``text`` to stdout and flush it (a seq, a listing, a ping)."""
    out = stdout()
    try:
        out.write(text)
        out.flush()
    except OSError as exc:
        raise _failed(exc) from None


def _failed(exc: OSError) -> ReaderGone | WriteFailed:
    if exc.errno in _GONE:
        return ReaderGone()
    silence_stdout()  # what is still buffered must not fail again at exit
    return WriteFailed(f"cannot write to stdout ({exc.strerror or exc})")


class Sink:
    """Stdout for firings: ``put`` returns once the line is delivered.

    ``confirm`` False (nothing will be acknowledged: ``--peek``, ``--after``,
    ``poll``): a line is delivered once written; a pipe's reader need not
    take it first, so a reader that never reads does not keep us.
    """

    def __init__(self, fd: int | None = None, *, confirm: bool = True) -> None:
        self.fd = stdout().fileno() if fd is None else fd
        mode = os.fstat(self.fd).st_mode
        self.pipe = stat.S_ISFIFO(mode)
        self.socket = stat.S_ISSOCK(mode)
        self.confirm = confirm
        self._unread = array.array("i", [0])
        self._poller: select.poll | None = None

    def put(self, line: str) -> None:
        """Write one line (without its newline) and wait until it is delivered."""
        self.write(line)
        if self.confirm:
            for pause in pauses():
                if self.taken():
                    return
                time.sleep(pause)

    def write(self, line: str) -> None:
        """Write one line (without its newline), not waiting for its reader."""
        data = (line + "\n").encode("utf-8", "surrogateescape")
        view = memoryview(data)
        try:
            stdout().flush()  # anything echoed before goes first
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            raise _failed(exc) from None

    def taken(self) -> bool:
        """One look: whether the reader has taken every line written so far out of the pipe.
        True at once where that cannot be told (not a pipe, no FIONREAD): written and flushed
        must do; ``ReaderGone`` when the reader left with some of it untaken."""
        if self.socket:
            return self._socket_taken()
        if not self.pipe:
            return True
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, self._unread, True)
        except OSError:
            self.pipe = False  # no FIONREAD here: written and flushed must do
            return True
        if self._unread[0] == 0:
            return True
        if self._left():  # the reader is gone: did it take the line before it left?
            self._reader_left()
            return True
        return False

    def _socket_taken(self) -> bool:
        """``taken`` on a socket: nothing left unsent (unread, on a Unix socket), and the
        peer still there after that look (a peer that left took its unread bytes with it:
        the count fell to nothing without a read)."""
        try:
            fcntl.ioctl(self.fd, termios.TIOCOUTQ, self._unread, True)
        except OSError:
            self.socket = False  # no SIOCOUTQ here: written and flushed must do
            return True
        if self._left():
            raise ReaderGone()
        return self._unread[0] == 0

    def reader_there(self) -> bool:
        """One look: whether the reader of a pipe or a socket is still there (True for
        anything else, which cannot tell)."""
        return not ((self.pipe or self.socket) and self._left())

    def _left(self) -> bool:
        """Whether the reader is gone: POLLERR or POLLHUP on our end, always reported."""
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self.fd, 0)
        return bool(self._poller.poll(0))

    def _reader_left(self) -> None:
        """The pipe has no reader any more. Between the look at its unread bytes and the
        poll, the reader may have taken the line and left (``head -n 2`` taking the second):
        then it was delivered, and the next line finds the reader gone."""
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, self._unread, True)
        except OSError:
            raise ReaderGone() from None
        if self._unread[0]:
            raise ReaderGone()


def pauses() -> Iterator[float]:
    """The pauses between two looks at a pipe whose reader has not taken a line yet: 0.1 ms
    at first, doubling up to 5 ms (a reader that reads at once is seen at once, one that
    does not costs little)."""
    pause = _FIRST_PAUSE
    while True:
        yield pause
        pause = min(pause * 2, _LONGEST_PAUSE)


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the exit-time flush cannot fail on a closed pipe."""
    if sys.stdout is None:
        return  # closed from the start: nothing to flush, and fd 1 is not ours to take
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
