"""Every failure the library raises: one class a meaning, each with its wire code.

The daemon refuses with a wire code (``session.errors.Code``); ``from_wire``
turns it into its class through ``BY_CODE``, the one place a code meets a
class. The client finds some failures itself (nothing answers at the address,
a token it cannot read, a request too long to send): their ``code`` is None,
or the code the daemon would have answered. A wait that times out is no
failure (its answer says ``timed_out``).

No exit status and no front end's words here: the CLI maps each class to an
exit status in one table (``repl_cli.cli.errors.STATUS``) and adds its hints;
the MCP server words each error its way (``repl_cli.mcp.tools.error_line``).
"""

from __future__ import annotations

from session.errors import Code


class Error(Exception):
    """Every failure: ``message`` says what happened, ``code`` is its wire code, or None."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


class Unavailable(Error):
    """The daemon or its store is away, went away or is shutting down: try again later."""


class AnswerLost(Unavailable):
    """The connection ended after the request was written: it may have been carried out."""


class NotFound(Error):
    """No such session (or it was stopped), timer, webhook, token, firing to reply to or
    permission prompt."""


class AlreadyExists(Error):
    """A session or a token of that name exists already."""


class BadInput(Error):
    """An argument is malformed: an id, a name, a seq, a limit, a time, a tag, an address."""


class AfterHead(Error):
    """A read or an acknowledgement after the newest seq the session has recorded."""


class LeaseLost(Error):
    """The claim is no longer the live lease: it ran out and another took it, or it is done."""


class AlreadyAnswered(Error):
    """The approval request has its verdict already: the first that counts wins."""


class Unauthorized(Error):
    """The daemon refused the token."""


class Forbidden(Error):
    """The token lacks the right this needs, or does not see the session."""


class TooMany(Error):
    """One of the daemon's limits is reached (sessions, timers, groups...)."""


class TooLong(Error):
    """A request over the daemon's line limit (1 MiB, with its text's JSON escaping)."""


class ProtocolError(Error):
    """The daemon and this client did not understand each other (one is older, say)."""


class Misconfigured(Error):
    """A token unread, a certificate refused, TLS on one end only, no daemon but another server."""


class Internal(Error):
    """A bug in the daemon: its log has the details."""


#: the class of each wire code; a code newer than this client is a plain ``Error``
BY_CODE: dict[str, type[Error]] = {
    Code.BAD_SESSION_ID: BadInput,
    Code.BAD_CURSOR_NAME: BadInput,
    Code.BAD_LIMIT: BadInput,
    Code.BAD_SEQ: BadInput,
    Code.BAD_MAX: BadInput,
    Code.BAD_HANDLER: BadInput,
    Code.BAD_KEY: BadInput,
    Code.BAD_TIME: BadInput,
    Code.BAD_TAG: BadInput,
    Code.BAD_CLAIM: BadInput,
    Code.BAD_GROUP_NAME: BadInput,
    Code.CURSOR_AFTER_HEAD: AfterHead,
    Code.ACK_AFTER_HEAD: AfterHead,
    Code.LEASE_LOST: LeaseLost,
    Code.NO_SUCH_PROMPT: NotFound,
    Code.ALREADY_ANSWERED: AlreadyAnswered,
    Code.BAD_REQUEST: ProtocolError,
    Code.UNKNOWN_OP: ProtocolError,
    Code.LINE_TOO_LONG: TooLong,
    Code.UNAUTHORIZED: Unauthorized,
    Code.FORBIDDEN: Forbidden,
    Code.IDLE_TIMEOUT: Unavailable,
    Code.SLOW_CONSUMER: Unavailable,
    Code.STORE_FAILED: Unavailable,
    Code.SHUTTING_DOWN: Unavailable,
    Code.NO_SUCH_SESSION: NotFound,
    Code.NO_SUCH_TIMER: NotFound,
    Code.NO_SUCH_WEBHOOK: NotFound,
    Code.NO_SUCH_TOKEN: NotFound,
    Code.SESSION_STOPPED: NotFound,
    Code.TOKEN_EXISTS: AlreadyExists,
    Code.SESSION_EXISTS: AlreadyExists,
    Code.TOO_MANY: TooMany,
    Code.INTERNAL: Internal,
}


def from_wire(code: str, message: str) -> Error:
    """The error for a daemon's error answer: its code's class, with the daemon's message."""
    return BY_CODE.get(code, Error)(message, code)
