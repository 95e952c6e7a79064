"""The commands of timers: ``every`` (a recurring one), ``timers``, ``cancel``.

A one-shot timer is ``repl send --in`` or ``--at`` (``repl_cli.cli.commands.send``).
"""

from __future__ import annotations

import click

from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions, complete_timers
from repl_cli.cli.options import handler_option, tag_option, tags_of
from session.rules import TICK_HANDLER


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("interval", metavar="INTERVAL")
@click.argument("text", required=False, default="")
@handler_option("What each firing is recorded as (on-tick's result is TEXT).", TICK_HANDLER)
@click.option("--key", metavar="KEY", help="A dedup key: a retry with it makes no second timer.")
@click.option("--in", "in_", metavar="DURATION", help="The first firing after DURATION.")
@click.option("--at", metavar="TIME", help="The first firing at TIME (RFC 3339).")
@tag_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: timer, due, every_ms, duplicate, seq.",
)
@click.pass_obj
def every(
    repl: Repl,
    session: str,
    interval: str,
    text: str,
    handler: str,
    key: str | None,
    in_: str | None,
    at: str | None,
    tag_words: tuple[str, ...],
    as_json: bool,
) -> None:
    """Record a firing every INTERVAL (at least 1s); prints the timer's id.

    The first is one INTERVAL from now, unless --in or --at says when.
    Periods missed while the daemon was down fire once when it is back.
    """
    if in_ is not None and at is not None:
        raise click.UsageError("give either --in or --at, not both")
    tags = tags_of(tag_words)
    scheduled = repl.schedule(
        session, text, in_=in_, at=at, every=interval, handler=handler, key=key, tags=tags
    )
    output.timer_set(scheduled, as_json)


@command()
@click.argument("session", required=False, shell_complete=complete_sessions)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_obj
def timers(repl: Repl, session: str | None, as_json: bool) -> None:
    """List pending timers, soonest first: timer, session, due, every, handler, text."""
    output.listing(repl.timers(session), as_json, output.timer_table)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("timer", shell_complete=complete_timers)
@click.pass_obj
def cancel(repl: Repl, session: str, timer: str) -> None:
    """Cancel a pending timer; exit 1 when the session has no such timer."""
    repl.cancel(session, timer)
