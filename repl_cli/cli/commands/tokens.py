"""Who may write what: ``repl token`` (add, list, revoke scoped tokens) and ``repl webhook``."""

from __future__ import annotations

import click

from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import ReplGroup, command
from repl_cli.cli.complete import complete_sessions, complete_tokens
from repl_cli.cli.options import handler_option
from session.rules import WEBHOOK_HANDLER


@click.group(cls=ReplGroup)
def token() -> None:
    """Scoped tokens: one per program, each limited to some sessions and some rights.

    Only the root token (the `token` file in the daemon's home) manages them.
    A program uses its token through REPL_TOKEN (the token itself) or
    --token-file FILE.
    """


@token.command("add")
@click.argument("name")
@click.option(
    "--sessions",
    "patterns",
    required=True,
    metavar="PATTERN[,PATTERN...]",
    help="The sessions it sees: globs over ids, as 'team-a.*' (quote them for the shell).",
)
@click.option(
    "--can",
    required=True,
    metavar="RIGHT[,RIGHT...]",
    help="read (read, wait, follow, ack, cursors, poll), send (send, one-shot scheduled "
    "sends), admin (start, stop, buffer, timers, webhooks).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object: token, name, sessions, can."
)
@click.pass_obj
def token_add(repl: Repl, name: str, patterns: str, can: str, as_json: bool) -> None:
    """Make a token NAME and print it, once: keep it, it cannot be shown again."""
    from session.errors import ReplError
    from session.scopes import check_new_token_name, parse_scope

    try:  # checked here too: a usage error says so before anything is asked
        check_new_token_name(name)
        scope = parse_scope(patterns, can)
    except ReplError as exc:
        raise click.UsageError(exc.message) from None
    made = repl.token_add(name, list(scope.patterns), sorted(scope.rights))
    if as_json:
        output.print_answer(made)
        return
    output.line(made.token)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_obj
def token_list(repl: Repl, as_json: bool) -> None:
    """List the scoped tokens: name, sessions, rights (never the token itself)."""
    output.listing(repl.token_list(), as_json, output.token_table)


@token.command("revoke")
@click.argument("name", shell_complete=complete_tokens)
@click.pass_obj
def token_revoke(repl: Repl, name: str) -> None:
    """Revoke token NAME at once: its connections are closed, its waits end (exit 77)."""
    repl.token_revoke(name)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False, allow_dash=True),
    metavar="FILE",
    help="The webhook's secret, read from FILE (- for stdin; one trailing newline dropped).",
)
@handler_option("What each delivery is recorded as (its result is the body).", WEBHOOK_HANDLER)
@click.option("--remove", is_flag=True, help="Take the session's webhook away.")
@click.pass_obj
def webhook(repl: Repl, session: str, secret_file: str | None, handler: str, remove: bool) -> None:
    """Let HTTP POST /hooks/ID record firings signed with a secret (as GitHub signs them).

    Needs a daemon started with --http. Each delivery with a valid
    X-Hub-Signature-256 becomes a firing whose result is the body; its
    delivery id (X-GitHub-Delivery) makes a redelivery record nothing.
    """
    if remove == (secret_file is not None):
        raise click.UsageError("give --secret-file FILE, or --remove")
    if remove:
        repl.webhook(session, None)
        return
    assert secret_file is not None
    try:
        with click.open_file(secret_file, encoding="utf-8") as f:
            secret = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"cannot read the secret from {secret_file}: {exc}") from None
    secret = secret.removesuffix("\n").removesuffix("\r")
    if not secret:
        raise click.UsageError(f"{secret_file} is empty: the secret must be 1-256 characters")
    repl.webhook(session, secret, handler=handler)
