"""What can go wrong in the CLI, and the one table from an error to an exit status.

Every failure the CLI reports is one line on stderr that says what happened
and what to do, and an exit status. The library raises its own typed errors
(``repl_cli.api.errors``): ``STATUS`` gives each class its exit status, the
only place an error meets one, and ``HINTS`` the CLI's advice for a wire
code whose message gives none (``line``). What only the CLI can get wrong
(stdin empty, a daemon already running, a stdout that fails) is a
``CliError``, which carries its own status. Nothing here may import anyio or
rich: ``repl read`` loads this module on every run.
"""

from __future__ import annotations

import sys

from repl_cli.api import errors as api
from session.errors import Code

OK = 0
ERROR = 1
TIMED_OUT = 2  # `repl wait --timeout` passed with nothing printed
USAGE = 64  # EX_USAGE from sysexits.h
FORBIDDEN = 77  # EX_NOPERM: a token refused, or a right the token lacks (rules K1-K5)
UNAVAILABLE = 75  # EX_TEMPFAIL: the daemon or its store is away, or shutting down; try again
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C

#: the exit status of each of the library's errors: that of the first class here the error
#: is an instance of (``AnswerLost`` is an ``Unavailable``; ``Error``, last, any other).
#: The bad_* codes (``BadInput``) are arguments the daemon found invalid: usage errors,
#: like click's.
STATUS: dict[type[api.Error], int] = {
    api.Unavailable: UNAVAILABLE,
    api.BadInput: USAGE,
    api.Unauthorized: FORBIDDEN,
    api.Forbidden: FORBIDDEN,
    api.NotFound: ERROR,
    api.AlreadyExists: ERROR,
    api.AfterHead: ERROR,
    api.LeaseLost: ERROR,
    api.AlreadyAnswered: ERROR,
    api.TooMany: ERROR,
    api.TooLong: ERROR,
    api.ProtocolError: ERROR,
    api.Misconfigured: ERROR,
    api.Internal: ERROR,
    api.Error: ERROR,  # a code newer than this client
}

#: a hint appended to a daemon's message for its code, when the message does not already
#: say what to do (it names a command in backticks)
HINTS: dict[str, str] = {
    Code.CURSOR_AFTER_HEAD: "read from the head or before it (`repl sessions` shows it)",
    Code.ACK_AFTER_HEAD: "acknowledge a seq the session has recorded",
    Code.BAD_REQUEST: "the daemon does not understand this client: upgrade both",
    Code.UNKNOWN_OP: "the daemon is older than this client: upgrade it",
    Code.LINE_TOO_LONG: (
        "the text must fit in that with its JSON escaping (a quote or a newline takes "
        "2 bytes, a control character 6): send it in parts, for example with `--lines`"
    ),
    Code.IDLE_TIMEOUT: "run the command again",
    Code.SLOW_CONSUMER: "read the answers as they come, and run the command again",
    Code.NO_SUCH_TIMER: "`repl timers` lists the pending ones",
    Code.NO_SUCH_TOKEN: "`repl token list` lists them",
    Code.NO_SUCH_PROMPT: "`repl approvals SESSION --all` lists them",
    Code.TOKEN_EXISTS: "revoke it first, or choose another name",
    Code.SESSION_STOPPED: "it no longer exists: `repl start` it again to reuse the id",
    Code.TOO_MANY: "stop what you no longer need, or raise the daemon's limit",
    Code.STORE_FAILED: "see the daemon's log and run the command again",
    Code.INTERNAL: "a bug in repl; the daemon's log has the details",
}


def exit_status(exc: api.Error) -> int:
    """The exit status ``exc`` ends ``repl`` with (``STATUS``)."""
    return next(status for kind, status in STATUS.items() if isinstance(exc, kind))


def line_of(exc: api.Error) -> str:
    """The line ``exc`` is told in: its message, and the CLI's hint for its code unless the
    message says what to do already."""
    hint = HINTS.get(exc.code, "") if exc.code is not None else ""
    return f"{exc.message}: {hint}" if hint and "`" not in exc.message else exc.message


class CliError(Exception):
    """A failure of the CLI's own, to report as one line on stderr, ending with ``status``."""

    def __init__(self, message: str, status: int = ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def not_utf8_message(what: str, detail: str) -> str:
    """The one line for text that is not UTF-8, from stdin or an argument alike (exit 1)."""
    return (
        f"{what} is not UTF-8 text ({detail}), and repl sends text as UTF-8: convert it "
        "first, for example with `iconv -f LATIN1 -t UTF-8`"
    )


class WriteFailed(CliError):
    """Stdout failed for another reason than a reader gone (a full disk, a terminal gone):
    one line and status 1, acknowledging nothing more, as for a reader gone."""


class Interrupted(Exception):
    """Ctrl-C: stop quietly with status 130 (click would otherwise print a blank line)."""


def stderr_note(message: str) -> None:
    """One line ``repl: MESSAGE`` on stderr: an error, or an outage (the API logs those);
    nothing when stderr is closed (``2>&-``) or its reader left."""
    if sys.stderr is None:
        return
    try:
        sys.stderr.write(f"repl: {message}\n")
        sys.stderr.flush()
    except OSError:
        pass
