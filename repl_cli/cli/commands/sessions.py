"""The commands of sessions: start, stop, sessions, buffer, cursors and stats."""

from __future__ import annotations

import click

from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions
from session.rules import DEFAULT_LIMIT


@command()
@click.argument("session", required=False)
@click.option("--buffer", type=int, metavar="N", help=f"The ring limit (default {DEFAULT_LIMIT}).")
@click.option("--exist-ok", is_flag=True, help="An existing session is not an error.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: session, created.")
@click.pass_obj
def start(
    repl: Repl, session: str | None, buffer: int | None, exist_ok: bool, as_json: bool
) -> None:
    """Create a session and print its id (one is made up when none is given)."""
    started = repl.start(session, buffer=buffer, exist_ok=exist_ok)
    if as_json:
        output.print_answer(started)
        return
    output.line(started.session)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.pass_obj
def stop(repl: Repl, session: str) -> None:
    """Stop and remove a session; its waiters are told it stopped."""
    repl.stop(session)


@command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_obj
def sessions(repl: Repl, as_json: bool) -> None:
    """List sessions: id, head, retained, limit, cursors, waiters."""
    output.listing(repl.sessions(), as_json, output.session_table)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("limit", metavar="N", type=int)
@click.pass_obj
def buffer(repl: Repl, session: str, limit: int) -> None:
    """Set the ring limit to N (0 to 65,536); the oldest firings beyond it go."""
    repl.buffer(session, limit)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {name, seq, lag}.")
@click.pass_obj
def cursors(repl: Repl, session: str, as_json: bool) -> None:
    """List a session's cursors: name, seq, lag behind the head."""
    output.listing(repl.cursors(session), as_json, output.cursor_table)


@command()
@click.argument("session", required=False, shell_complete=complete_sessions)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: daemon and sessions.")
@click.pass_obj
def stats(repl: Repl, session: str | None, as_json: bool) -> None:
    """Counters: firings, lost, evaluations, waiters, connections."""
    got = repl.stats(session)
    if as_json:
        output.print_answer(got)
        return
    output.stats_tables(got, with_daemon=session is None)
