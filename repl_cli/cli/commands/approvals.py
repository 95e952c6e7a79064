"""Approvals through the inbox (SPEC §19): ``approve``, ``deny`` and ``approvals``.

``repl mcp --follow ID --approvals SESSION`` records each of the agent's permission
prompts in SESSION; these give the verdict, or list what waits for one (and, with
``--all``, who answered what: the audit). Which verdict counts is
``session.approvals``'s, read from the session as the server reads it.
"""

from __future__ import annotations

import click

from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions
from session import approvals as ap

#: the columns of ``repl approvals``, and of its ``--all``
PENDING_COLUMNS = ("request", "tool", "description", "age")
AUDIT_COLUMNS = ("request", "tool", "description", "asked", "verdict", "by", "at")


def _verdict_command(name: str, behavior: str, doc: str) -> click.Command:
    @command(name, help=doc)
    @click.argument("session", shell_complete=complete_sessions)
    @click.argument("request_id", metavar="REQUEST_ID")
    @click.option("--reason", default="", metavar="TEXT", help="Why: kept with the verdict.")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object: the verdict.")
    @click.pass_obj
    def verdict(repl: Repl, session: str, request_id: str, reason: str, as_json: bool) -> None:
        given = repl.verdict(session, request_id, behavior, reason=reason)
        if as_json:
            output.print_json(given)
        else:
            output.line(f"{given.request_id}: {given.behavior} by {given.by} at {given.ts}")

    return verdict


approve = _verdict_command(
    "approve",
    ap.ALLOW,
    """Let the agent do what its prompt REQUEST_ID (in SESSION) asks.

    The verdict is recorded in SESSION as your token's; the `repl mcp
    --approvals SESSION` that recorded the prompt tells the agent. Only the
    first verdict by one of the prompt's approvers counts: exit 1 when it
    was answered already (saying by whom), or when your token is not an
    approver (your verdict is kept, and does not count).
    """,
)
deny = _verdict_command(
    "deny",
    ap.DENY,
    """Refuse what the agent's prompt REQUEST_ID (in SESSION) asks; as approve.""",
)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Every prompt the session holds, with the verdict that counts: who answered what.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.pass_obj
def approvals(repl: Repl, session: str, every: bool, as_json: bool) -> None:
    """List the agent's permission prompts in SESSION that wait for a verdict.

    Each: its request id (for `repl approve`/`deny`), the tool, what it
    does, and how long it has waited. A prompt the person at the agent's
    terminal answered there stays listed: Claude Code tells no one.
    """
    import time

    entries = repl.approvals(session)
    if not every:
        entries = [e for e in entries if e.verdict is None]
    if as_json:
        output.print_json(entries)
        return
    if every:
        output.table(AUDIT_COLUMNS, [_audit_row(e) for e in entries], whole=("request", "at"))
        return
    now = time.time()
    rows = [
        [e.prompt.request_id, e.prompt.tool, e.prompt.description, _age(e.prompt.ts, now)]
        for e in entries
    ]
    output.table(PENDING_COLUMNS, rows, whole=("request",))


def _audit_row(entry: ap.Answered) -> list[str]:
    prompt, counted = entry.prompt, entry.verdict
    if counted is None:
        return [prompt.request_id, prompt.tool, prompt.description, prompt.ts, "pending", "", ""]
    return [
        prompt.request_id,
        prompt.tool,
        prompt.description,
        prompt.ts,
        counted.behavior,
        str(counted.by),
        counted.ts,
    ]


def _age(ts: str, now: float) -> str:
    """How long ago ``ts`` (a firing's) was, as ``repl stats`` says an uptime."""
    from datetime import datetime

    then = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return output.duration(max(0.0, now - then))
