"""Writing to stdout so that a line counts as delivered only once the reader has it.

rule S9: the CLI acknowledges a firing only after it was written and
flushed, and when stdout is a pipe (or a socket), only after the reading
process took it out of it: ``repl_cli.api.receipt`` looks, and says
``ReaderGone`` when the reader went away. A stdout closed from the start
(``>&-``) is ``ReaderGone`` too. Python ignores SIGPIPE already, so we are
not killed. Any other failure (a full disk under ``> file``, a file size
limit, a terminal that went away: EIO) is ``WriteFailed``, one line; what
was written before it still counts as delivered. ``write_text`` is the same
for the plain lines of the other commands (a seq, a listing).
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from repl_cli.api.receipt import GONE, ReaderGone, Receipt, pauses
from repl_cli.cli.errors import WriteFailed


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
    if exc.errno in GONE:
        return ReaderGone()
    silence_stdout()  # what is still buffered must not fail again at exit
    return WriteFailed(f"cannot write to stdout ({exc.strerror or exc})")


class Sink(Receipt):
    """Stdout for firings: ``put`` returns once the line is delivered.

    ``confirm`` False (nothing will be acknowledged: ``--peek``, ``--after``,
    ``poll``): a line is delivered once written; a pipe's reader need not
    take it first, so a reader that never reads does not keep us.
    """

    def __init__(self, fd: int | None = None, *, confirm: bool = True) -> None:
        super().__init__(stdout().fileno() if fd is None else fd)
        self.confirm = confirm

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
        try:
            stdout().flush()  # anything echoed before goes first
            super().write(line)
        except OSError as exc:
            raise _failed(exc) from None


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
