"""What can go wrong in the CLI, and the one table from error to exit status.

Every failure the CLI reports is a ``CliError``: a one-line message that
says what happened and what to do, and the exit status it ends with. Errors
from the daemon arrive as wire codes (``session.errors.Code``);
``from_wire`` turns each into a ``CliError`` through ``WIRE``, the only
place a code meets an exit status. Nothing here may import anyio or rich:
``repl read`` loads this module on every run.
"""

from __future__ import annotations

from session.errors import Code

OK = 0
ERROR = 1
TIMED_OUT = 2  # `repl wait --timeout` passed with nothing printed
USAGE = 64  # EX_USAGE from sysexits.h
FORBIDDEN = 77  # EX_NOPERM: a token refused, or a right the token lacks (rules K1-K5)
UNAVAILABLE = 75  # EX_TEMPFAIL: the daemon or its store is away, or shutting down; try again
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class CliError(Exception):
    """A failure to report as one line on stderr, ending with ``status``."""

    def __init__(
        self, message: str, status: int = ERROR, code: str | None = None, said: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        #: the daemon's error code (``no_such_session``...) when the daemon refused
        self.code = code
        #: the daemon's own message, before the CLI's hint (what MCP words its way)
        self.said = message if said is None else said


def unavailable(message: str) -> CliError:
    """The daemon or its store cannot be reached, or is shutting down: exit 75, try again."""
    return CliError(message, UNAVAILABLE)


class AnswerLost(CliError):
    """Exit 75: the connection closed or broke before a request's answer came, so the request
    may or may not have been carried out (the client API sends again only what a repeat
    cannot change: ``repl_cli.api._common.resendable``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, UNAVAILABLE)


def not_utf8_message(what: str, detail: str) -> str:
    """The one line for text that is not UTF-8, from stdin or an argument alike (exit 1)."""
    return (
        f"{what} is not UTF-8 text ({detail}), and repl sends text as UTF-8: convert it "
        "first, for example with `iconv -f LATIN1 -t UTF-8`"
    )


class ReaderGone(Exception):
    """Whoever reads our stdout went away: stop quietly, acknowledging nothing more."""


class WriteFailed(CliError):
    """Stdout failed for another reason than a reader gone (a full disk, a terminal gone):
    one line and status 1, acknowledging nothing more, as for a reader gone."""


class Interrupted(Exception):
    """Ctrl-C: stop quietly with status 130 (click would otherwise print a blank line)."""


# A wire code's exit status, and a hint appended when the daemon's message
# does not already say what to do. The bad_* codes are arguments the daemon
# found invalid (an id, a cursor name, a limit): usage errors, like click's.
WIRE: dict[str, tuple[int, str]] = {
    Code.BAD_SESSION_ID: (USAGE, ""),
    Code.BAD_CURSOR_NAME: (USAGE, ""),
    Code.BAD_LIMIT: (USAGE, ""),
    Code.BAD_SEQ: (USAGE, ""),
    Code.BAD_MAX: (USAGE, ""),
    Code.BAD_HANDLER: (USAGE, ""),
    Code.BAD_KEY: (USAGE, ""),
    Code.BAD_TIME: (USAGE, ""),
    Code.BAD_TAG: (USAGE, ""),
    Code.BAD_CLAIM: (USAGE, ""),
    Code.BAD_GROUP_NAME: (USAGE, ""),
    Code.LEASE_LOST: (ERROR, ""),
    Code.CURSOR_AFTER_HEAD: (ERROR, "read from the head or before it (`repl sessions` shows it)"),
    Code.ACK_AFTER_HEAD: (ERROR, "acknowledge a seq the session has recorded"),
    Code.BAD_REQUEST: (ERROR, "the daemon does not understand this client: upgrade both"),
    Code.UNKNOWN_OP: (ERROR, "the daemon is older than this client: upgrade it"),
    Code.LINE_TOO_LONG: (
        ERROR,
        "the text must fit in that with its JSON escaping (a quote or a newline takes "
        "2 bytes, a control character 6): send it in parts, for example with `--lines`",
    ),
    Code.UNAUTHORIZED: (FORBIDDEN, ""),
    Code.FORBIDDEN: (FORBIDDEN, ""),
    Code.IDLE_TIMEOUT: (UNAVAILABLE, "run the command again"),
    Code.SLOW_CONSUMER: (UNAVAILABLE, "read the answers as they come, and run the command again"),
    Code.NO_SUCH_SESSION: (ERROR, ""),
    Code.NO_SUCH_TIMER: (ERROR, "`repl timers` lists the pending ones"),
    Code.NO_SUCH_WEBHOOK: (ERROR, ""),
    Code.NO_SUCH_TOKEN: (ERROR, "`repl token list` lists them"),
    Code.TOKEN_EXISTS: (ERROR, "revoke it first, or choose another name"),
    Code.SESSION_EXISTS: (ERROR, ""),
    Code.SESSION_STOPPED: (ERROR, "it no longer exists: `repl start` it again to reuse the id"),
    Code.TOO_MANY: (ERROR, "stop what you no longer need, or raise the daemon's limit"),
    Code.STORE_FAILED: (UNAVAILABLE, "see the daemon's log and run the command again"),
    Code.SHUTTING_DOWN: (UNAVAILABLE, ""),
    Code.INTERNAL: (ERROR, "a bug in repl; the daemon's log has the details"),
}


def from_wire(code: str, message: str) -> CliError:
    """The CliError for a daemon's error answer; an unknown code is a plain error."""
    status, hint = WIRE.get(code, (ERROR, ""))
    line = f"{message}: {hint}" if hint and "`" not in message else message
    return CliError(line, status, code, said=message)
