"""A pipe's receipt: whether the reader of a pipe or a socket has taken what was written.

rule S9: a firing is acknowledged only once it was delivered, and on a pipe
only once the reading process took it out of the pipe. So a line is written
on its own, and then we watch the pipe's unread byte count (``FIONREAD``,
which Linux answers on the write end too) until it is zero. Under ``repl
wait ID | head -n 1`` the first firing is taken and acknowledged, head exits,
the second stays in the pipe unread, and the pipe reports an error on our
end (no reader left): ``ReaderGone``, and the second is not acknowledged.

A Unix socket is such a pipe too: a Node.js parent (libuv) gives its child
a socketpair for each of its stdio "pipes". Its unsent count (``SIOCOUTQ``)
falls only as the peer reads, so we watch that; but a socket forgets what
its peer never read once the peer is gone, so a peer gone is ``ReaderGone``
whatever it read (duplicates, never loss).

A write that fails because the reader closed the pipe (``EPIPE``) is
``ReaderGone`` too; any other failure is the ``OSError`` itself, for the
writer to tell. ``Receipt`` is handed a descriptor and knows no stdout: the
CLI gives it its stdout (``repl_cli.cli.sink``), ``repl mcp`` the pipe it
speaks the protocol on (``repl_cli.mcp.stdio``).
"""

from __future__ import annotations

import array
import errno
import fcntl
import os
import select
import stat
import termios
from collections.abc import Iterator

# back off from 0.1 ms to 5 ms while the reader has not taken a line yet
_FIRST_PAUSE = 0.0001
_LONGEST_PAUSE = 0.005
#: what a write fails with once its reader is gone
GONE = (errno.EPIPE, errno.EBADF, errno.ECONNRESET)


class ReaderGone(Exception):
    """Whoever reads what we write went away: stop quietly, acknowledging nothing more."""


class Receipt:
    """A descriptor we write lines to, and whether its reader has taken them."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        mode = os.fstat(fd).st_mode
        self.pipe = stat.S_ISFIFO(mode)
        self.socket = stat.S_ISSOCK(mode)
        self._unread = array.array("i", [0])
        self._poller: select.poll | None = None

    def write(self, line: str) -> None:
        """Write one line (without its newline), not waiting for its reader; ``ReaderGone``
        when the reader closed it, any other failure as its ``OSError``."""
        data = (line + "\n").encode("utf-8", "surrogateescape")
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            if exc.errno in GONE:
                raise ReaderGone() from None
            raise

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
