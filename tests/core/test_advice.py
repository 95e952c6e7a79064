"""Each interface is told what to do in its own words (session/advice.py).

The daemon words its refusals for the CLI; HTTP names routes and body fields,
MCP names tools and their arguments. The fact and a scoped token's advice
are the same everywhere; the line protocol (the CLI) gets the message as it
is.
"""

from __future__ import annotations

import pytest

from session.advice import HINTS, PHRASES, advised, in_words
from session.errors import Code, no_such_session
from session.group import unseen_dead_letter
from session.scopes import make_scope, missing_session
from session.session import session_exists


def test_the_cli_gets_the_daemons_message_as_it_is() -> None:
    message = no_such_session("inbox").message
    assert in_words(message, "cli") == message
    assert advised(Code.NO_SUCH_SESSION, message, "cli") == message


def test_a_missing_session_is_started_by_each_interfaces_own_means() -> None:
    message = no_such_session("inbox").message
    assert advised(Code.NO_SUCH_SESSION, message, "http") == (
        'no session \'inbox\': start it with POST /sessions and the body {"id": "inbox"}'
    )
    assert advised(Code.NO_SUCH_SESSION, message, "mcp") == (
        "no session 'inbox': start it with the start tool (session \"inbox\")"
    )


def test_exist_ok_is_named_as_each_interface_spells_it() -> None:
    message = session_exists("inbox").message
    assert advised(Code.SESSION_EXISTS, message, "http").endswith(
        'or give "exist_ok": true in the body'
    )
    assert advised(Code.SESSION_EXISTS, message, "mcp").endswith("or give exist_ok true")


def test_a_scoped_tokens_advice_is_the_same_everywhere() -> None:
    message = missing_session(make_scope(["agent-8.*"], ["read"]), "inbox").message
    for interface in ("cli", "http", "mcp"):
        assert advised(Code.NO_SUCH_SESSION, message, interface) == (
            "no session 'inbox': this token sees only agent-8.*: check the id"
        )


@pytest.mark.parametrize("interface", ["http", "mcp"])
def test_a_hint_is_added_only_to_a_message_without_advice(interface: str) -> None:
    bare = advised(Code.CURSOR_AFTER_HEAD, "after 9 is after head 0", interface)  # type: ignore[arg-type]
    assert bare.startswith("after 9 is after head 0: read from the head or before it")
    # a message that says what to do itself (a command, a phrase put in this interface's
    # words) gets no hint; one that only says what happened ("...: closing the connection")
    # does
    said = advised(Code.SESSION_STOPPED, "x: run the command again", interface)  # type: ignore[arg-type]
    assert said.count(": ") == 1
    closing = "nothing received for 60 s: closing the connection"
    assert advised(Code.IDLE_TIMEOUT, closing, interface).startswith(closing + ": ")  # type: ignore[arg-type]
    # a code with no hint, and a code newer than this module, add nothing
    assert advised(Code.BAD_REQUEST, "ack names x", interface) == "ack names x"  # type: ignore[arg-type]
    assert advised("from_the_future", "something", interface) == "something"  # type: ignore[arg-type]


def test_no_advice_over_http_or_mcp_names_a_command_a_flag_or_an_upgrade() -> None:
    for interface, hints in HINTS.items():
        for code, hint in hints.items():
            assert "`repl" not in hint and "--" not in hint, (interface, code)
            if code is not Code.UNKNOWN_OP:  # a daemon older than the client: that one is true
                assert "upgrade" not in hint, (interface, code)
    for _phrase, http, mcp in PHRASES:
        assert "`repl" not in http + mcp and "--" not in http + mcp


def test_protocol_md_lists_every_interfaces_advice() -> None:
    from pathlib import Path

    from repl_cli.cli.errors import HINTS as CLI_HINTS

    table = Path(__file__).resolve().parents[2].joinpath("docs", "protocol.md").read_text()
    for code in Code:
        cli = CLI_HINTS.get(code, "")
        http, mcp = HINTS["http"].get(code, ""), HINTS["mcp"].get(code, "")
        if cli or http or mcp:
            row = " | ".join(cell.replace("|", "\\|") or "—" for cell in (cli, http, mcp))
            assert f"| `{code.value}` | {row} |" in table, code
    for _phrase, http, mcp in PHRASES:
        cells = [(words.strip() or "(left out)") for words in (http, mcp)]
        said = f"| {cells[0]} | {cells[1]} |".replace("\\g<id>", "ID").replace("\\1", "N")
        said = said.replace("\\g<name>", "NAME")
        assert said.replace("\\g<right>", "RIGHT") in table, said


def test_a_group_a_token_may_not_make_is_made_by_each_interfaces_own_means() -> None:
    message = unseen_dead_letter("jobs", "work").message
    assert advised(Code.FORBIDDEN, message, "http").endswith(
        "make the group first with a dead-letter session the token sees (PUT "
        '/sessions/jobs/groups/work with the body {"dead_letter": SESSION}), or with a token '
        "that sees 'jobs.dead'"
    )
    assert advised(Code.FORBIDDEN, message, "mcp").endswith(
        "make the group first with a dead-letter session the token sees (no tool makes a "
        "group: ask whoever runs the daemon), or with a token that sees 'jobs.dead'"
    )


def test_a_ring_limit_is_the_body_field_buffer_over_http() -> None:
    message = "limit -1 is outside 0 to 65,536"
    assert advised(Code.BAD_LIMIT, message, "http") == "buffer -1 is outside 0 to 65,536"
    assert advised(Code.BAD_LIMIT, message, "mcp") == message


def test_the_cli_words_that_leaked_to_http_and_mcp_are_put_their_way() -> None:
    forbidden = "this token has no send right on session 's': it needs a token with --can send"
    for interface in ("http", "mcp"):
        line = advised(Code.FORBIDDEN, forbidden, interface)  # type: ignore[arg-type]
        assert line.endswith("it needs a token with the send right"), line
    full = "session 's' holds 1,024 timers, its limit: cancel some first (`repl timers` lists them)"
    assert advised(Code.TOO_MANY, full, "mcp") == full.removesuffix(" (`repl timers` lists them)")


def test_an_unavailable_error_keeps_the_daemons_own_words_for_mcp() -> None:
    """The APIs raise a store's failure as ``Unavailable`` with the daemon's own message,
    which MCP words its way; the CLI adds its own hint, and exits 75."""
    from repl_cli.api.errors import Unavailable, from_wire
    from repl_cli.cli.errors import exit_status, line_of

    exc = from_wire("store_failed", "the store failed (disk full)")
    assert isinstance(exc, Unavailable) and exc.code == "store_failed"
    assert exc.message == "the store failed (disk full)"
    assert advised(exc.code, exc.message, "mcp").endswith(
        ": call the tool again once the daemon's store is back"
    )
    assert exit_status(exc) == 75
    assert line_of(exc) == (
        "the store failed (disk full): see the daemon's log and run the command again"
    )
