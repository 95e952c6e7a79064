"""What to do about an error, in the words of the interface it is met in.

The core and the engine word a refusal for the line protocol's main client,
the CLI: ``start it with `repl start inbox```, ``pass --exist-ok``, ``run
the command again``, and the CLI adds a hint of its own for some codes
(``repl_cli.cli.errors.HINTS``). A program over HTTP has no flags, and an agent
over MCP calls tools, not commands: each is told the same thing in its own
words. ``in_words`` rewrites a daemon's message for an interface (each CLI
phrase that has another wording there), and ``HINTS`` holds, for each code,
the advice an interface adds when the message gives none. docs/protocol.md's
table of codes lists the three side by side.

What stays the same everywhere: the fact (``no session 'inbox'``), a scoped
token's own advice (``this token sees only agent-8.*: check the id``), and
advice about managing tokens, which only the CLI does (``repl token add``).
"""

from __future__ import annotations

import re
from typing import Literal

from session.errors import Code

Interface = Literal["cli", "http", "mcp"]

#: a CLI phrase in a daemon's message, and the same advice over HTTP and over MCP
PHRASES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"start it with `repl start (?P<id>[^`]+)`"),
        r'start it with POST /sessions and the body {"id": "\g<id>"}',
        r'start it with the start tool (session "\g<id>")',
    ),
    (
        re.compile(r"pass --exist-ok"),
        'give "exist_ok": true in the body',
        "give exist_ok true",
    ),
    (
        re.compile(r"run the command again"),
        "send the request again",
        "call the tool again",
    ),
    (
        re.compile(r"\blimit (-?[\d,]+) is outside"),
        r"buffer \1 is outside",
        r"limit \1 is outside",
    ),
    (
        re.compile(r" \(`repl timers` lists them\)"),  # neither lists timers
        "",
        "",
    ),
    (
        re.compile(r"it needs a token with --can (?P<right>\w+)"),
        r"it needs a token with the \g<right> right",
        r"it needs a token with the \g<right> right",
    ),
    (
        # a group a scoped token may not make (``session.group.unseen_dead_letter``); MCP has
        # no tool that makes a group
        re.compile(r"\(`repl group (?P<id>\S+) (?P<name>\S+) --dead-letter SESSION`\)"),
        r'(PUT /sessions/\g<id>/groups/\g<name> with the body {"dead_letter": SESSION})',
        "(no tool makes a group: ask whoever runs the daemon)",
    ),
    (
        re.compile(r"schedule needs in, at or every"),
        "schedule needs in, at or every",
        "schedule needs delay, at or every",
    ),
)

#: for each code, the advice an interface adds to a message that gives none ("" adds
#: nothing: the message says it all). The CLI's own is ``repl_cli.cli.errors.HINTS``.
HINTS: dict[Interface, dict[Code, str]] = {
    "http": {
        Code.CURSOR_AFTER_HEAD: "read from the head or before it (GET /sessions shows it)",
        Code.ACK_AFTER_HEAD: "acknowledge a seq the session has recorded",
        Code.LINE_TOO_LONG: "send the text in parts",
        Code.IDLE_TIMEOUT: "send the request again",
        Code.SLOW_CONSUMER: "read the responses as they come, and send the request again",
        Code.NO_SUCH_PROMPT: "GET /sessions/ID/approvals?all=true lists them",
        Code.SESSION_STOPPED: "it no longer exists: POST /sessions starts it again",
        Code.TOO_MANY: "stop what you no longer need, or raise the daemon's limit",
        Code.STORE_FAILED: "see the daemon's log and send the request again",
        Code.INTERNAL: "a bug in repl; the daemon's log has the details",
    },
    "mcp": {
        Code.CURSOR_AFTER_HEAD: "read from the head or before it (the sessions tool shows it)",
        Code.ACK_AFTER_HEAD: "acknowledge a seq the session has recorded",
        Code.UNKNOWN_OP: "the daemon is older than this server: upgrade it",
        Code.LINE_TOO_LONG: "send the text in parts",
        Code.IDLE_TIMEOUT: "call the tool again",
        Code.SLOW_CONSUMER: "call the tool again",
        Code.NO_SUCH_PROMPT: "the approvals tool (all true) lists them",
        Code.SESSION_STOPPED: "it no longer exists: the start tool starts it again",
        Code.TOO_MANY: "stop what you no longer need, or raise the daemon's limit",
        Code.STORE_FAILED: "call the tool again once the daemon's store is back",
        Code.INTERNAL: "a bug in repl; the daemon's log has the details",
    },
}


def in_words(message: str, interface: Interface) -> str:
    """``message`` (a daemon's, worded for the CLI) with each phrase in ``interface``'s."""
    if interface == "cli":
        return message
    column = 1 if interface == "http" else 2
    for phrase, *words in PHRASES:
        message = phrase.sub(words[column - 1], message)
    return message


def advised(code: str, message: str, interface: Interface) -> str:
    """The whole line for ``interface``: the message in its words, and its hint for
    ``code`` unless the message already says what to do (it names a command, a route or a
    tool: ``said_what_to_do``), as the CLI adds its own (``repl_cli.cli.errors``)."""
    line = in_words(message, interface)
    if interface == "cli":
        return line
    try:
        hint = HINTS[interface].get(Code(code), "")
    except ValueError:  # a code newer than this module
        hint = ""
    if hint and not said_what_to_do(message):
        line = f"{line}: {hint}"
    return line


def said_what_to_do(message: str) -> bool:
    """Whether a daemon's message gives its own advice: a command in backticks, as the
    CLI's own hints go by, or one of the phrases that each interface words its way."""
    return "`" in message or any(phrase.search(message) for phrase, *_ in PHRASES)
