"""Tokens with scopes (rules K1-K5): which sessions a token sees, and what it may do to them.

Pure: the daemon makes a token's random secret and keeps its record in the
store; what a record allows is decided here, and only here.

- A scope is a list of glob patterns over session ids (``team-a.*``,
  ``agent-7``; ``*`` and ``?`` and ``[...]`` as in ``fnmatch``, matched
  case-sensitively) and a set of rights: ``read`` (read, wait, follow, ack,
  cursors, poll, and the claims of groups), ``send`` (send, a one-shot scheduled
  send) and ``admin`` (start, stop, buffer, recurring timers, listing and
  cancelling timers, webhooks, a group's settings).
- For a scoped token a session outside its patterns does not exist: the
  engine answers as for a missing session (``hidden``), so neither its
  existence nor its figures leak.
- A right the token lacks on a session it sees is ``forbidden``.
- Only the root token (the ``token`` file) manages tokens and shuts the
  daemon down.

A token is kept only as the SHA-256 of its secret (``digest``): the secret
is 32 random bytes, so a fast hash is enough (nothing to guess by brute
force), and a stolen store reveals no token.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

import msgspec

from session.errors import (
    BadRequest,
    Forbidden,
    NoSuchSession,
    NoSuchToken,
    ReplError,
    TokenExists,
    TooMany,
)
from session.rules import ADMIN, READ, SEND
from session.tags import ROOT, TIMER, WEBHOOK

RIGHTS = frozenset({READ, SEND, ADMIN})

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_PATTERNS = 64
#: the most scoped tokens a store keeps (each daemon holds all of them in memory)
MAX_TOKENS = 1024


def schedule_right(recurring: bool) -> str:
    """A scheduled send is a send; a recurring timer keeps firing, so it is the admin's."""
    return ADMIN if recurring else SEND


class Scope(msgspec.Struct, frozen=True):
    """The sessions a token sees (``patterns``) and its ``rights`` on them."""

    patterns: tuple[str, ...]
    rights: frozenset[str]

    def covers(self, session_id: str) -> bool:
        """Whether the token sees ``session_id`` at all."""
        return any(fnmatch.fnmatchcase(session_id, pattern) for pattern in self.patterns)

    def allows(self, session_id: str, right: str) -> bool:
        return right in self.rights and self.covers(session_id)


class TokenRecord(msgspec.Struct, frozen=True):
    """A scoped token as the store keeps it: never its secret, only its digest."""

    name: str
    digest: str
    scope: Scope


def check_token_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise BadRequest(
            f"token name {name!r} is not 1-64 of A-Z a-z 0-9 . _ - starting with a letter or digit"
        )
    return name


def check_new_token_name(name: str) -> str:
    """A name a new token may have: not one of the senders the daemon names itself, so
    that a firing's ``by`` says who sent it without doubt (a token of such a name made
    before ``by`` existed can still be revoked)."""
    check_token_name(name)
    if name in (ROOT, TIMER, WEBHOOK):
        raise BadRequest(
            f"token name {name!r} is the daemon's own word for a firing's sender: choose another"
        )
    return name


def parse_scope(patterns: str, rights: str) -> Scope:
    """``--sessions`` and ``--can`` as the CLI takes them (comma-separated), checked."""
    return make_scope(patterns.split(","), rights.split(","))


def make_scope(patterns: Sequence[str], rights: Sequence[str]) -> Scope:
    """A scope from its patterns and rights as lists (the wire's ``token`` op), checked."""
    globs = tuple(dict.fromkeys(p.strip() for p in patterns if p.strip()))
    if not globs:
        raise BadRequest("--sessions needs at least one pattern, for example 'team-a.*'")
    if len(globs) > MAX_PATTERNS:
        raise BadRequest(f"--sessions takes at most {MAX_PATTERNS} patterns")
    for glob in globs:
        if len(glob) > 128 or not glob.isprintable() or " " in glob:
            raise BadRequest(f"session pattern {glob!r} is not 1-128 printable characters")
    can = frozenset(r.strip() for r in rights if r.strip())
    unknown = sorted(can - RIGHTS)
    if not can or unknown:
        what = f"{', '.join(unknown)} is not a right" if unknown else "--can needs a right"
        raise BadRequest(f"{what}: the rights are read, send and admin")
    return Scope(globs, can)


def digest(secret: str) -> str:
    """What the store keeps of a token: the SHA-256 of its secret, in hex."""
    import hashlib  # here: loading OpenSSL costs every `repl` run ms, and only the daemon hashes

    return hashlib.sha256(secret.encode()).hexdigest()


def forbidden(right: str, session_id: str | None = None) -> Forbidden:
    where = f" on session {session_id!r}" if session_id is not None else ""
    if right == "root":
        return Forbidden("only the root token (the daemon's token file) may do this")
    return Forbidden(f"this token has no {right} right{where}: it needs a token with --can {right}")


def no_such_token(name: str) -> NoSuchToken:
    return NoSuchToken(f"no token named {name!r}")


def token_exists(name: str) -> TokenExists:
    return TokenExists(f"a token named {name!r} exists")


def too_many_tokens() -> TooMany:
    return TooMany(f"the store keeps {MAX_TOKENS:,} tokens, its limit: revoke some first")


def missing_session(scope: Scope, session_id: str) -> NoSuchSession:
    """The refusal of a session a scoped token does not see, missing or hidden alike: its
    advice depends on the token and the id alone, never on whether the session exists.
    Only a token that may start that id is told to start it."""
    if scope.allows(session_id, ADMIN):
        return NoSuchSession(
            f"no session {session_id!r}: start it with `repl start {session_id}`", session_id
        )
    if scope.covers(session_id):
        advice = (
            "this token cannot start it (it lacks the admin right): ask whoever runs the daemon"
        )
    else:
        advice = f"this token sees only {', '.join(scope.patterns)}: check the id"
    return NoSuchSession(f"no session {session_id!r}: {advice}", session_id)


def scoped_refusal(scope: Scope, exc: ReplError) -> ReplError:
    """``exc`` as a scoped token is told it: a missing session with the token's advice."""
    if isinstance(exc, NoSuchSession) and exc.session is not None:
        return missing_session(scope, exc.session)
    return exc
