"""``repl send``: record a firing, now or later (``--in``, ``--at``), or a line of stdin each.

Reading stdin and pipelining ``--lines`` are ``repl_cli.cli.sending``'s.
"""

from __future__ import annotations

import click

from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions
from repl_cli.cli.options import handler_option, tag_option, tags_of


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("text", required=False)
@handler_option("What produced it; a handler the session lacks makes an unhandled firing.")
@click.option("--key", metavar="KEY", help="A dedup key: a retry with it records nothing.")
@click.option("--lines", is_flag=True, help="Each line of stdin is its own firing.")
@click.option(
    "--in",
    "in_",
    metavar="DURATION",
    help="Record it later, after DURATION (250ms, 90s, 5m, 1h30m); prints the timer's id.",
)
@click.option(
    "--at",
    metavar="TIME",
    help="Record it at TIME (RFC 3339, e.g. 2026-12-01T05:00:00Z); prints the timer's id.",
)
@tag_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object a firing: seq, duplicate (with --in or --at: timer, due, every_ms, "
    "duplicate, seq).",
)
@click.pass_obj
def send(
    repl: Repl,
    session: str,
    text: str | None,
    handler: str,
    key: str | None,
    lines: bool,
    in_: str | None,
    at: str | None,
    tag_words: tuple[str, ...],
    as_json: bool,
) -> None:
    """Record a firing; prints its seq (`SEQ duplicate` for a deduplicated send).

    TEXT `-` or none reads stdin, less one trailing newline (empty stdin is
    refused: `repl send ID ''` sends an empty text). A request may be at most
    1 MiB (1,048,576 bytes) with the text's JSON escaping; a longer one is
    refused before it is sent (exit 1): send it in parts, e.g. with --lines.
    With --in or --at it is recorded later, once, even across a restart of
    the daemon: prints the timer's id (`repl timers` lists it, `repl cancel`
    cancels it).
    """
    from repl_cli.cli import sending  # only send reads stdin: read and wait need not load it

    later = in_ is not None or at is not None
    tags = tags_of(tag_words)
    if in_ is not None and at is not None:
        raise click.UsageError("give either --in or --at, not both")
    if lines:
        if text not in (None, "-"):
            raise click.UsageError("--lines reads stdin: give no TEXT (or -)")
        if key is not None:
            raise click.UsageError("--key names one firing: it cannot go with --lines")
        if later:
            raise click.UsageError("--in and --at schedule one firing: they cannot go with --lines")
        sending.send_lines(repl.client, session, handler, as_json, tags)
        return
    if text is None or text == "-":
        text = sending.stdin_text()
    if later:
        scheduled = repl.schedule(
            session, text, in_=in_, at=at, handler=handler, key=key, tags=tags
        )
        output.timer_set(scheduled, as_json)
        return
    output.sent(repl.send(session, text, handler=handler, key=key, tags=tags), as_json)
