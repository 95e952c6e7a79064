"""Every error repl can report, one class per meaning, each with a wire code.

The core raises the first group; the daemon raises the second. Both travel
over the wire as ``{"ok": false, "code": ..., "message": ...}``; the library
raises each code as one of its classes and the CLI maps each class to one exit
status (``repl_cli.cli.errors.STATUS``). An operation that raises one of these
has changed nothing. A store raises only ``StoreFailed``.

The last two classes never reach the wire: they stop a daemon from starting
(a bad option, an address it cannot bind), and their message is the one line
the user reads.
"""

from __future__ import annotations

import enum


class Code(enum.StrEnum):
    """The stable wire codes. Never rename one: clients match on them."""

    # the core
    BAD_SESSION_ID = "bad_session_id"
    BAD_CURSOR_NAME = "bad_cursor_name"
    BAD_LIMIT = "bad_limit"
    BAD_SEQ = "bad_seq"
    BAD_MAX = "bad_max"
    BAD_HANDLER = "bad_handler"
    BAD_KEY = "bad_key"
    BAD_TIME = "bad_time"
    BAD_TAG = "bad_tag"
    CURSOR_AFTER_HEAD = "cursor_after_head"
    ACK_AFTER_HEAD = "ack_after_head"
    LEASE_LOST = "lease_lost"
    BAD_CLAIM = "bad_claim"
    BAD_GROUP_NAME = "bad_group_name"
    NO_SUCH_PROMPT = "no_such_prompt"
    ALREADY_ANSWERED = "already_answered"
    # the daemon
    BAD_REQUEST = "bad_request"
    UNKNOWN_OP = "unknown_op"
    LINE_TOO_LONG = "line_too_long"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    IDLE_TIMEOUT = "idle_timeout"
    SLOW_CONSUMER = "slow_consumer"
    NO_SUCH_SESSION = "no_such_session"
    NO_SUCH_TIMER = "no_such_timer"
    NO_SUCH_WEBHOOK = "no_such_webhook"
    NO_SUCH_TOKEN = "no_such_token"
    TOKEN_EXISTS = "token_exists"
    SESSION_EXISTS = "session_exists"
    SESSION_STOPPED = "session_stopped"
    TOO_MANY = "too_many"
    STORE_FAILED = "store_failed"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"


class ReplError(Exception):
    """Base of every error repl reports; ``code`` is its wire code."""

    code: Code = Code.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadSessionId(ReplError):
    """A session id is not 1-64 of ``[A-Za-z0-9._-]`` starting with a letter or digit."""

    code = Code.BAD_SESSION_ID


class BadCursorName(ReplError):
    """A cursor name is not 1-64 printable characters without whitespace."""

    code = Code.BAD_CURSOR_NAME


class BadLimit(ReplError):
    """A ring limit is outside 0-65,536."""

    code = Code.BAD_LIMIT


class BadSeq(ReplError):
    """A seq is negative."""

    code = Code.BAD_SEQ


class BadMax(ReplError):
    """A ``max`` is below 1."""

    code = Code.BAD_MAX


class BadHandler(ReplError):
    """A handler name is empty, too long or contains whitespace."""

    code = Code.BAD_HANDLER


class BadKey(ReplError):
    """A dedup key is empty or longer than 256 characters."""

    code = Code.BAD_KEY


class BadTag(ReplError):
    """A tag or a match is not one: its key's form, its value's length, too many of them."""

    code = Code.BAD_TAG


class BadGroupName(ReplError):
    """A group's name is not 1-64 printable characters without whitespace."""

    code = Code.BAD_GROUP_NAME


class BadClaim(ReplError):
    """A claim token is not one (``done``, ``release``, ``extend``): it is used as a claim
    printed it."""

    code = Code.BAD_CLAIM


class BadTime(ReplError):
    """A duration, an interval or a time of a scheduled firing does not parse, or an
    interval is under the shortest."""

    code = Code.BAD_TIME


class CursorAfterHead(ReplError):
    """A read starts after the newest seq the session has recorded."""

    code = Code.CURSOR_AFTER_HEAD


class AckAfterHead(ReplError):
    """An ack names a seq the session has not recorded yet."""

    code = Code.ACK_AFTER_HEAD


class LeaseLost(ReplError):
    """A done, release or extend named a claim that is no longer the live lease (it ran
    out, another attempt holds the firing, or it is done); nothing changed."""

    code = Code.LEASE_LOST


class NoSuchPrompt(ReplError):
    """The session holds no permission prompt of that request id (SPEC §19): none was
    recorded, or the ring let it go."""

    code = Code.NO_SUCH_PROMPT


class AlreadyAnswered(ReplError):
    """The permission prompt has its verdict already: the first that counts wins, and a
    verdict on it is refused (SPEC §19)."""

    code = Code.ALREADY_ANSWERED


class BadRequest(ReplError):
    """A line is not a well-formed request (bad JSON, wrong type, missing field)."""

    code = Code.BAD_REQUEST


class UnknownOp(ReplError):
    """A request names an op the daemon does not have."""

    code = Code.UNKNOWN_OP


class LineTooLong(ReplError):
    """A request line is longer than the daemon's limit; the connection closes."""

    code = Code.LINE_TOO_LONG


class Unauthorized(ReplError):
    """The first request was not an ``auth`` with a token the daemon knows, or the
    connection's token was revoked."""

    code = Code.UNAUTHORIZED


class Forbidden(ReplError):
    """The token may see the session, but lacks the right the op needs, or what it asks
    would start or write a session outside its patterns (rules K1-K6)."""

    code = Code.FORBIDDEN


class IdleTimeout(ReplError):
    """A connection sent nothing, or half a line, for too long; it is closed."""

    code = Code.IDLE_TIMEOUT


class SlowConsumer(ReplError):
    """A client took none of its unsent answers, past the bound, for too long; it is closed."""

    code = Code.SLOW_CONSUMER


class NoSuchSession(ReplError):
    """No session has that id; ``session`` is the id, when the error names one."""

    code = Code.NO_SUCH_SESSION

    def __init__(self, message: str, session: str | None = None) -> None:
        super().__init__(message)
        self.session = session


def no_such_session(session_id: str) -> NoSuchSession:
    """The one refusal of an id no session has, in every store (a scoped token's own
    advice replaces the hint: ``session.scopes.missing_session``)."""
    return NoSuchSession(
        f"no session {session_id!r}: start it with `repl start {session_id}`", session_id
    )


class NoSuchTimer(ReplError):
    """The session has no pending timer with that id (it fired, was cancelled, or never was)."""

    code = Code.NO_SUCH_TIMER


class NoSuchWebhook(ReplError):
    """A webhook was delivered to a session that has no webhook secret. No longer answered
    (HTTP answers it as a wrong signature, so as not to tell which sessions have one); the
    code stays, as every code does."""

    code = Code.NO_SUCH_WEBHOOK


class NoSuchToken(ReplError):
    """``token revoke`` named a token that does not exist (rules K1-K5)."""

    code = Code.NO_SUCH_TOKEN


class TokenExists(ReplError):
    """``token add`` named a token that already exists."""

    code = Code.TOKEN_EXISTS


class SessionExists(ReplError):
    """``start`` named a session that already exists."""

    code = Code.SESSION_EXISTS


class SessionStopped(ReplError):
    """The session was stopped while the request waited on it."""

    code = Code.SESSION_STOPPED


class TooMany(ReplError):
    """A configured limit (connections, sessions, waiters) is reached."""

    code = Code.TOO_MANY


class StoreFailed(ReplError):
    """The store could not make a change durable; the change did not happen."""

    code = Code.STORE_FAILED


class ShuttingDown(ReplError):
    """The daemon is stopping; ask again once it is back."""

    code = Code.SHUTTING_DOWN


class Internal(ReplError):
    """A bug in repl; the request changed nothing that was acknowledged."""

    code = Code.INTERNAL


BY_CODE: dict[str, type[ReplError]] = {
    cls.code.value: cls
    for cls in (
        BadSessionId,
        BadCursorName,
        BadClaim,
        BadGroupName,
        BadLimit,
        BadSeq,
        BadMax,
        BadHandler,
        BadKey,
        BadTime,
        BadTag,
        CursorAfterHead,
        AckAfterHead,
        LeaseLost,
        NoSuchPrompt,
        AlreadyAnswered,
        BadRequest,
        UnknownOp,
        LineTooLong,
        Unauthorized,
        Forbidden,
        IdleTimeout,
        SlowConsumer,
        NoSuchSession,
        NoSuchTimer,
        NoSuchWebhook,
        NoSuchToken,
        TokenExists,
        SessionExists,
        SessionStopped,
        TooMany,
        StoreFailed,
        ShuttingDown,
        Internal,
    )
}


# -- start-up errors: never on the wire ---------------------------------------


class ConfigError(Exception):
    """The daemon cannot start as configured; the message says what to do."""


class CannotListen(ConfigError):
    """The daemon's address cannot be bound (in use, not local, no permission)."""
