"""Request and reply: ``repl request`` sends (to one or several) and waits for the answers,
``repl reply`` answers, ``repl gather`` waits for the replies to several corr ids."""

from __future__ import annotations

import click

from repl_cli.api import REQUEST_TIMEOUT
from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions
from repl_cli.cli.deliver import Batch, Printer, deliver
from repl_cli.cli.errors import OK, TIMED_OUT, stderr_note
from repl_cli.cli.options import (
    firing_format,
    firing_formats,
    handler_option,
    reconnect_option,
    tag_option,
    tags_of,
    timeout_option,
)


@command()
@click.argument("session", required=False, shell_complete=complete_sessions)
@click.argument("text", required=False)
@click.option(
    "--to",
    "to",
    multiple=True,
    metavar="ID",
    shell_complete=complete_sessions,
    help="Ask this session (repeatable: ask each, and wait for every reply); "
    "then the one argument is TEXT.",
)
@click.option(
    "--reply-to",
    "reply_to",
    required=True,
    metavar="MINE",
    shell_complete=complete_sessions,
    help="The session the reply is to come to (yours); it must exist.",
)
@click.option(
    "--key",
    metavar="KEY",
    help="Make the corr ids KEY.ID and send each once: run again with the same KEY, "
    "nothing is sent again and the same replies are found.",
)
@timeout_option(": print the replies that came", REQUEST_TIMEOUT)
@handler_option("What the request is recorded as.")
@tag_option
@reconnect_option
@firing_formats
@click.pass_obj
def request(
    repl: Repl,
    session: str | None,
    text: str | None,
    to: tuple[str, ...],
    reply_to: str,
    key: str | None,
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

    TEXT is tagged reply-to=MINE and corr= a fresh id (KEY.SESSION with
    --key); the reply is the firing of MINE tagged with that corr (`repl
    reply` sends one), found even when it came before the wait began.
    Nothing is acknowledged. With --to (repeatable) instead of SESSION, TEXT
    goes to each, and the replies are printed in the order named once every
    one has come. Exit status 2: --timeout passed first (the replies that
    came are printed; stderr names who did not answer).
    """
    from repl_cli.cli import sending

    if to:
        if text is not None:
            raise click.UsageError("with --to, the one argument is TEXT: name sessions by --to")
        sessions, text = list(dict.fromkeys(to)), session
    elif session is None:
        raise click.UsageError("name the session to ask (SESSION, or --to ID...)")
    else:
        sessions = [session]
    tags = tags_of(tag_words)  # the request's own tags are refused by the API (``ask``)
    if text is None or text == "-":
        text = sending.stdin_text()
    repl.reconnect = reconnect
    fmt = firing_format(seq, full, as_json, ts=ts)
    replies = repl.request_all(
        sessions,
        text,
        reply_to=reply_to,
        timeout=timeout,
        handler=handler,
        tags=tags,
        key=key,
    )
    came = [firing for firing in replies.values() if firing is not None]
    if came:
        last = max(firing.seq for firing in came)
        deliver(Printer(repl.client, fmt, None), [Batch(reply_to, last, 0, came)])
    silent = [s for s, firing in replies.items() if firing is None]
    if silent:
        stderr_note(f"no reply from {', '.join(silent)} within {output.duration(timeout)}")
        return TIMED_OUT
    return OK


@command()
@click.argument("session", metavar="MINE", shell_complete=complete_sessions)
@click.argument("corrs", nargs=-1, required=True, metavar="CORR...")
@timeout_option(": print what came, name what did not")
@reconnect_option
@firing_formats
@click.pass_obj
def gather(
    repl: Repl,
    session: str,
    corrs: tuple[str, ...],
    timeout: float | None,
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Wait until MINE holds a reply for every CORR; print one a CORR, in the order given.

    A reply is a firing of MINE tagged corr=CORR (`repl reply` sends one);
    those that came before count, and of several with one CORR the first
    (by seq) is the one. Nothing is acknowledged: run again, it prints the
    same. Exit status 2: --timeout passed first (the replies that came are
    printed; stderr names the CORRs that did not).
    """
    repl.reconnect = reconnect
    fmt = firing_format(seq, full, as_json, ts=ts)
    gathered = repl.gather(session, list(corrs), timeout=timeout)
    if gathered.firings:
        last = max(firing.seq for firing in gathered.firings)
        deliver(Printer(repl.client, fmt, None), [Batch(session, last, 0, gathered.firings)])
    if gathered.missing:
        waited = "" if timeout is None else f" within {output.duration(timeout)}"
        stderr_note(f"no reply for {', '.join(gathered.missing)}{waited}")
        return TIMED_OUT
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
