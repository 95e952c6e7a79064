"""Request and reply: ``repl request`` sends and waits for the answer, ``repl reply`` answers."""

from __future__ import annotations

import click

from repl_cli.api import REQUEST_TIMEOUT
from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions
from repl_cli.cli.deliver import Batch, Printer, deliver
from repl_cli.cli.errors import OK, TIMED_OUT
from repl_cli.cli.options import (
    firing_format,
    firing_formats,
    handler_option,
    reconnect_option,
    tag_option,
    tags_of,
)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("text", required=False)
@click.option(
    "--reply-to",
    "reply_to",
    required=True,
    metavar="MINE",
    shell_complete=complete_sessions,
    help="The session the reply is to come to (yours); it must exist.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=REQUEST_TIMEOUT,
    show_default=True,
    metavar="SECS",
    help="Give up after SECS (exit status 2).",
)
@handler_option("What the request is recorded as.")
@tag_option
@reconnect_option
@firing_formats
@click.pass_obj
def request(
    repl: Repl,
    session: str,
    text: str | None,
    reply_to: str,
    timeout: float,
    handler: str,
    tag_words: tuple[str, ...],
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Send TEXT to SESSION and wait for its reply in session MINE; print it as wait does.

    TEXT is tagged reply-to=MINE and corr= a fresh id; the reply is the
    firing of MINE tagged with that corr (`repl reply` sends one), found
    even when it came before the wait began. Nothing is acknowledged.
    Exit status 2: --timeout passed with no reply.
    """
    from repl_cli.cli import sending

    tags = tags_of(tag_words)  # the request's own tags are refused by the API (``ask``)
    if text is None or text == "-":
        text = sending.stdin_text()
    repl.reconnect = reconnect
    fmt = firing_format(seq, full, as_json, ts=ts)
    answer = repl.request(
        session, text, reply_to=reply_to, timeout=timeout, handler=handler, tags=tags
    )
    if answer is None:
        return TIMED_OUT
    deliver(Printer(repl.client, fmt, None), [Batch(reply_to, answer.seq, 0, [answer])])
    return OK


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("seq", type=click.IntRange(min=1))
@click.argument("text", required=False)
@handler_option("What the reply is recorded as.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: seq, duplicate.")
@click.pass_obj
def reply(
    repl: Repl, session: str, seq: int, text: str | None, handler: str, as_json: bool
) -> None:
    """Answer a request, firing SEQ of SESSION: send TEXT where it asks for the answer.

    The reply carries the request's corr tag, which its requester waits for.
    TEXT `-` or none reads stdin. Exit status 1 when the firing has no
    reply-to tag (it was not sent with `repl request`).
    """
    from repl_cli.cli import sending

    if text is None or text == "-":
        text = sending.stdin_text()
    output.sent(repl.reply(session, seq, text, handler=handler), as_json)
