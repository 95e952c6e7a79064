"""Scopes of tokens (SPEC §11), in the core: which sessions a pattern covers, which right each
op needs, parsing ``--sessions`` and ``--can``, and what the store keeps of a token.

Hypothesis checks the globs against a plain model of them (a regular expression built by
hand from ``*``, ``?`` and literal characters).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repl_daemon import protocol as p
from session.errors import BadRequest, Code, Forbidden, NoSuchSession, no_such_session
from session.rules import ADMIN, READ, SEND
from session.scopes import (
    MAX_TOKENS,
    Scope,
    check_token_name,
    digest,
    forbidden,
    make_scope,
    missing_session,
    no_such_token,
    parse_scope,
    schedule_right,
    scoped_refusal,
    token_exists,
    too_many_tokens,
)


def test_every_op_of_the_protocol_has_its_right() -> None:
    rights = {verb.op: verb.right for verb in p.VERBS}
    assert set(rights) == set(p.OPS)
    assert {rights[op] for op in ("read", "wait", "ack", "cursors", "poll")} == {READ}
    assert rights["send"] == SEND and schedule_right(False) == SEND
    assert schedule_right(True) == ADMIN
    assert {rights[op] for op in ("start", "stop", "buffer", "timers", "cancel", "webhook")} == {
        ADMIN
    }
    assert rights["shutdown"] is None and rights["token"] is None  # the root's only


def test_a_scope_covers_its_patterns_and_allows_its_rights() -> None:
    scope = parse_scope("team-a.*, agent-7", "read,send")
    assert scope == Scope(("team-a.*", "agent-7"), frozenset({READ, SEND}))
    assert scope.covers("team-a.inbox") and scope.covers("agent-7")
    assert not scope.covers("team-b.inbox") and not scope.covers("agent-70")
    assert not scope.covers("Team-a.inbox")  # case matters, as session ids are compared
    assert scope.allows("team-a.x", SEND) and not scope.allows("team-a.x", ADMIN)
    assert not scope.allows("team-b.x", READ)


@pytest.mark.parametrize(
    ("patterns", "rights", "says"),
    [
        ("", "read", "at least one pattern"),
        (" , ", "read", "at least one pattern"),
        ("a b", "read", "not 1-128 printable"),
        ("x" * 129, "read", "not 1-128 printable"),
        ("a", "", "needs a right"),
        ("a", "read,write", "write is not a right"),
        (",".join(f"a{i}" for i in range(65)), "read", "at most 64"),
    ],
)
def test_a_scope_that_does_not_parse_is_one_line(patterns: str, rights: str, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        parse_scope(patterns, rights)


def test_token_names_digests_and_the_forbidden_error() -> None:
    assert check_token_name("agent-7") == "agent-7"
    with pytest.raises(BadRequest):
        check_token_name("no spaces")
    assert digest("secret") == digest("secret") != digest("secreT")
    assert len(digest("x")) == 64 and "secret" not in digest("secret")
    error = forbidden(SEND, "team-a.x")
    assert isinstance(error, Forbidden) and error.code is Code.FORBIDDEN
    assert error.message == (
        "this token has no send right on session 'team-a.x': it needs a token with --can send"
    )
    assert "root token" in forbidden("root").message


def _model(pattern: str) -> re.Pattern[str]:
    """The glob as a regular expression, by hand: ``*`` any run, ``?`` one character."""
    out = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(out, re.DOTALL)


ids = st.text(alphabet="ab.-*?", min_size=1, max_size=8)


@given(pattern=ids, session=st.text(alphabet="ab.-", min_size=1, max_size=8))
def test_globs_agree_with_a_plain_model(pattern: str, session: str) -> None:
    scope = Scope((pattern,), frozenset({READ}))
    assert scope.covers(session) == bool(_model(pattern).fullmatch(session))


def test_token_refusals_say_what_and_carry_their_codes() -> None:
    assert no_such_token("a").code is Code.NO_SUCH_TOKEN
    assert no_such_token("a").message == "no token named 'a'"
    assert token_exists("a").code is Code.TOKEN_EXISTS
    assert (
        too_many_tokens().code is Code.TOO_MANY and f"{MAX_TOKENS:,}" in too_many_tokens().message
    )
    assert make_scope(["a", " a ", "b"], ["read"]).patterns == ("a", "b")  # once each, in order


def test_a_scoped_token_is_told_of_a_missing_session_by_what_it_may_do() -> None:
    """The advice depends on the token and the id, never on whether the session exists."""
    readers = Scope(("team-a.*",), frozenset({READ}))
    admins = Scope(("team-a.*",), frozenset({READ, ADMIN}))
    missing = no_such_session("team-a.x")
    assert missing.session == "team-a.x" and missing.code is Code.NO_SUCH_SESSION
    assert "start it with `repl start team-a.x`" in missing.message
    # the token that may start it is told to, as the root is
    assert scoped_refusal(admins, missing).message == missing.message
    covered = scoped_refusal(readers, missing)
    assert isinstance(covered, NoSuchSession) and covered.session == "team-a.x"
    assert "repl start" not in covered.message and "lacks the admin right" in covered.message
    outside = scoped_refusal(admins, no_such_session("team-b.y"))
    assert outside.message == "no session 'team-b.y': this token sees only team-a.*: check the id"
    assert outside.message == missing_session(admins, "team-b.y").message
    # an error that names no session, or is another error, is told as it is
    vanished = NoSuchSession("session 'team-a.x' is gone")
    assert scoped_refusal(readers, vanished) is vanished
    other = Forbidden("no")
    assert scoped_refusal(readers, other) is other
