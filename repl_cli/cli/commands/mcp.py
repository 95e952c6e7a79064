"""``repl mcp``: the MCP server on stdin/stdout (``repl_cli.mcp``, imported only here)."""

from __future__ import annotations

from collections.abc import Callable

import click

from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions
from repl_cli.cli.errors import CliError


@command("mcp")
@click.option(
    "--progress-every",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    metavar="SECS",
    help="While a wait blocks, tell a client that asked for progress this often.",
)
@click.option(
    "--follow",
    "follow",
    multiple=True,
    metavar="ID",
    shell_complete=complete_sessions,
    help="Push what arrives in this session to the client (repeatable).",
)
@click.option(
    "--cursor",
    metavar="NAME",
    help="Acknowledge what was pushed on this cursor [default: mcp].",
)
@click.option(
    "--allow-from",
    "allow_from",
    multiple=True,
    metavar="NAME[,NAME...]",
    help="Push only the firings these senders sent (token names, root, timer, webhook); "
    "the others are acknowledged unseen.",
)
@click.option(
    "--ack",
    "ack",
    type=click.Choice(["agent", "pipe"]),
    default=None,
    help="Who acknowledges what was pushed: the agent, with its ack tool or a reply "
    "[default]; or pipe: once the client took it and stayed connected 2 s more.",
)
@click.option(
    "--approvals",
    metavar="SESSION",
    shell_complete=complete_sessions,
    help="Relay the agent's permission prompts through SESSION: each is recorded there, "
    "and `repl approve`/`deny` answers it (Claude Code's claude/channel/permission).",
)
@click.option(
    "--approvers",
    "approvers",
    multiple=True,
    metavar="NAME[,NAME...]",
    help="Whose verdict counts (token names) [default: root].",
)
@click.pass_obj
def mcp_command(
    repl: Repl,
    progress_every: float,
    follow: tuple[str, ...],
    cursor: str | None,
    allow_from: tuple[str, ...],
    ack: str | None,
    approvals: str | None,
    approvers: tuple[str, ...],
) -> None:
    """Serve the Model Context Protocol on stdin/stdout: sessions as tools for an agent.

    An agent harness starts it as a child (for Claude Code: `claude mcp add
    repl -- repl mcp`). It connects to the daemon as every command does
    (--addr, --home, --token-file, REPL_TOKEN, TLS); logs go to stderr.
    Needs the mcp extra: pip install 'repl-inbox[mcp]'.

    With --follow ID it follows the session from its cursor (--cursor, default
    mcp) and pushes each new firing to the client: as a Claude Code channel
    message (notifications/claude/channel) and as an update of the resource
    repl://sessions/ID to a client subscribed to it. The agent acknowledges
    what it handled (its ack tool, or a reply); what it did not is pushed
    again by the next server. --ack pipe acknowledges instead once the
    client took a push out of the pipe and stayed connected 2 s more.

    With --approvals SESSION (and --follow) the agent's permission prompts
    are recorded in SESSION, and the first verdict by one of --approvers
    (`repl approve SESSION ID`, `repl deny`) is sent back to it.
    """
    try:
        from repl_cli.mcp import server as mcp_server
        from repl_cli.mcp import stdio as mcp_stdio
    except ImportError:
        raise CliError(
            "repl mcp needs the official MCP SDK: pip install 'repl-inbox[mcp]' "
            "(or pipx install --force '.[mcp]' in a checkout)"
        ) from None
    from session.names import check_cursor_name, check_session_id
    from session.scopes import check_token_name

    if not follow and (cursor is not None or allow_from or ack is not None):
        given = "--cursor" if cursor is not None else "--allow-from" if allow_from else "--ack"
        raise click.UsageError(f"{given} is for what --follow pushes: give --follow ID too")
    if (approvals is not None or approvers) and not follow:
        given = "--approvals" if approvals is not None else "--approvers"
        raise click.UsageError(f"{given} relays prompts over the channel: give --follow ID too")
    if approvers and approvals is None:
        raise click.UsageError("--approvers says whose verdict counts: give --approvals SESSION")
    client = repl.client
    settings = mcp_server.Settings(
        addr=client.addr,
        home=client.home,
        token_file=client.token_file,
        tls_ca=client.tls_ca,
        progress_every=progress_every,
        follow=tuple(dict.fromkeys(_checked(check_session_id, "--follow", s) for s in follow)),
        cursor=_checked(check_cursor_name, "--cursor", cursor or mcp_server.MCP_CURSOR),
        allow_from=_senders(allow_from, check_token_name) if allow_from else None,
        ack=mcp_server.Ack(ack or "agent"),
        approvals=None
        if approvals is None
        else _checked(check_session_id, "--approvals", approvals),
        approvers=tuple(sorted(_senders(approvers, check_token_name))) if approvers else ("root",),
    )
    mcp_stdio.serve(settings)


def _checked(check: Callable[[str], str], option: str, value: str) -> str:
    """``value`` as ``check`` accepts it; a usage error naming ``option`` when it does not."""
    from session.errors import ReplError

    try:
        return check(value)
    except ReplError as exc:
        raise click.BadParameter(exc.message, param_hint=option) from None


def _senders(given: tuple[str, ...], check: Callable[[str], str]) -> frozenset[str]:
    """The names of ``--allow-from``, each option one name or several, comma-separated."""
    names = [name.strip() for words in given for name in words.split(",")]
    return frozenset(_checked(check, "--allow-from", name) for name in names)
