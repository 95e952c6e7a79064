"""Shell completion of what the daemon holds: session ids, cursors, timers, token names.

Completing, click runs no callback, so each completer makes its own client
from the options parsed so far, with a short timeout, and never fails the
shell's line. ``repl completion`` prints the shell's side.
"""

from __future__ import annotations

from collections.abc import Callable

import click

from repl_cli.cli.client import Client
from repl_cli.cli.command import GLOBAL_OPTIONS, client_for
from repl_daemon import protocol as p


def _completing_client(ctx: click.Context) -> Client:
    """The client of a completion: completing, click runs no callback, so it is made from
    the options parsed so far (a command's own over the group's), with a short timeout."""
    given = {name: ctx.params.get(name) for name in GLOBAL_OPTIONS}
    client = client_for(ctx, given)
    client.timeout = 0.5
    return client


def _completed(
    ctx: click.Context, incomplete: str, ask: Callable[[Client], list[str]]
) -> list[str]:
    """What ``ask`` lists that starts with ``incomplete``; nothing when the daemon is away
    or slow, never an error in the shell."""
    client = _completing_client(ctx)
    try:
        names = ask(client)
    except Exception:  # completion must never break the shell's line
        return []
    finally:
        client.close()
    return [name for name in names if name.startswith(incomplete)]


def complete_sessions(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a session id: the daemon's sessions."""

    def ask(client: Client) -> list[str]:
        return [row.id for row in client.call(p.Sessions(), p.SessionList).sessions]

    return _completed(ctx, incomplete, ask)


def complete_cursors(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a cursor name: the cursors of the session given before it."""
    session = ctx.params.get("session") or (ctx.params.get("sessions") or [None])[0]
    if not session:
        return []

    def ask(client: Client) -> list[str]:
        listed = client.call(p.Cursors(session=session), p.CursorList)
        return [cursor.name for cursor in listed.cursors]

    return _completed(ctx, incomplete, ask)


def complete_timers(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a timer id: the pending timers of the session given before it."""
    session = ctx.params.get("session")

    def ask(client: Client) -> list[str]:
        return [t.timer for t in client.call(p.Timers(session=session), p.TimerList).timers]

    return _completed(ctx, incomplete, ask)


def complete_tokens(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a token's name (the root token's only: others list nothing)."""

    def ask(client: Client) -> list[str]:
        return [t.name for t in client.call(p.Token(action="list"), p.TokenList).tokens]

    return _completed(ctx, incomplete, ask)
