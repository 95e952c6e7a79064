"""The commands of groups and claims (SPEC §16): ``claim``, ``done``, ``release``, ``extend``,
``group``, ``groups``, ``claims``, and ``join`` (SPEC §18: wait until a group's work is
finished).

What ``repl claim`` prints, and giving back what it could not, are
``repl_cli.cli.claiming``'s.
"""

from __future__ import annotations

import click

from repl_cli.api.errors import Error
from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_sessions
from repl_cli.cli.errors import OK, TIMED_OUT, stderr_note
from repl_cli.cli.options import (
    DURATION,
    F,
    claim_match_options,
    firing_format,
    firing_formats,
    lease_option,
    match_of,
    reconnect_option,
    timeout_option,
)
from repl_daemon import protocol as p
from session.rules import DEFAULT_GROUP, DEFAULT_MAX_ATTEMPTS


def group_option(command: F) -> F:
    return click.option(
        "--group",
        default=DEFAULT_GROUP,
        show_default=True,
        metavar="NAME",
        help="The group (a named consumer of the session; made by its first claim).",
    )(command)


@command()
@click.argument("session", shell_complete=complete_sessions)
@group_option
@lease_option(
    "How long the firing is yours (1s to 24h): no other claimer gets it meanwhile; "
    "then it is offered again, unless you `repl extend` it."
)
@timeout_option(", having taken nothing")
@click.option(
    "--from-now",
    is_flag=True,
    help="A group this claim makes starts after the newest firing (not at the oldest).",
)
@claim_match_options
@reconnect_option
@firing_formats
@click.pass_obj
def claim(
    repl: Repl,
    session: str,
    group: str,
    lease: float,
    timeout: float | None,
    from_now: bool,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Take the next firing of a group that no other claimer holds, under a lease.

    Blocks until the group has one (oldest first), prints the claim on a line
    of its own (the token `done`, `release` and `extend` take), then the
    firing as `wait` prints it; with --json the first line is {"claim",
    "seq", "attempt", "lease_until", "lost"}. Every firing of the session
    goes to one claimer of the group at a time; readers and other groups
    see every firing as before. Exit status 2: --timeout passed, nothing
    taken. A claimer that cannot write the firing (its reader gone, a full
    disk, a terminal gone) gives it back at once.
    """
    from repl_cli.cli.claiming import deliver_claim
    from repl_cli.cli.sink import Sink

    match = match_of(match_words, handler_filter)
    fmt = firing_format(seq, full, as_json, ts=ts)
    sink = Sink(confirm=True)
    repl.reconnect = reconnect
    # no watch on the pipe while blocked (as `wait` has): the answer may be on its way when
    # the reader leaves, and a claim the daemon answered must be given back, which only
    # its token allows; so the claim goes on, and what it takes and cannot write it gives
    # back (deliver_claim)
    claimed = repl.claim(
        session,
        group=group,
        lease=lease,
        timeout=timeout,
        match=match,
        from_now=from_now,
    )
    if claimed.timed_out or claimed.claim is None:
        return TIMED_OUT
    token = claimed.claim
    deliver_claim(sink, claimed, session, fmt, lambda: repl.release(session, token))
    return OK


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("claim_token", metavar="CLAIM")
@click.option(
    "--next",
    "take_next",
    is_flag=True,
    help="Then take the next firing of CLAIM's group, in the same request, "
    "and print it as `claim` prints it.",
)
@lease_option("With --next: how long the next firing is yours (1s to 24h).")
@timeout_option(" (with --next), the done made and nothing taken")
@firing_formats
@click.pass_obj
def done(
    repl: Repl,
    session: str,
    claim_token: str,
    take_next: bool,
    lease: float,
    timeout: float | None,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Finish a claim: its firing is never offered to its group again.

    With --next, then take the next firing of CLAIM's group as `repl claim
    --group` takes it, in the same request (the daemon writes the done and
    the claim at once): blocks until there is one, prints the claim and the
    firing as `claim` prints them; exit status 2 when --timeout passed with
    nothing taken (the done stands). A worker's loop is `repl done --next`
    on the claim it printed.

    Exit status 1 (lease_lost) when CLAIM is no longer the live lease (it ran
    out and another claimer took the firing, or it is done): nothing changes,
    and --next takes nothing.
    """
    if not take_next:
        repl.done(session, claim_token)
        return OK
    from repl_cli.cli.claiming import deliver_claim
    from repl_cli.cli.sink import Sink

    fmt = firing_format(seq, full, as_json, ts=ts)
    sink = Sink(confirm=True)
    claimed = repl.done(session, claim_token, next=True, lease=lease, timeout=timeout)
    if claimed.timed_out or claimed.claim is None:
        return TIMED_OUT
    token = claimed.claim
    deliver_claim(sink, claimed, session, fmt, lambda: repl.release(session, token))
    return OK


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("claim_token", metavar="CLAIM")
@click.option(
    "--delay",
    type=DURATION,
    default=0.0,
    metavar="DURATION",
    help="Claimable again only after DURATION (up to 24h) [default: at once].",
)
@click.pass_obj
def release(repl: Repl, session: str, claim_token: str, delay: float) -> None:
    """Give a claim's firing back to its group, to be claimed again.

    Its last attempt given back goes to the group's dead-letter session
    instead (said on stderr, naming that session). Exit status 1 (lease_lost)
    when CLAIM is no longer the live lease: nothing changes.
    """
    if repl.release(session, claim_token, delay=delay):
        where = dead_letter_of(repl, session, claim_token)
        stderr_note(f"that was its last attempt: the firing goes to {where}")


def dead_letter_of(repl: Repl, session: str, claim_token: str) -> str:
    """Where the last attempt of ``claim_token``'s firing went, for ``repl release``'s note:
    the daemon's answer says only that it died, so this asks for the group's settings (one
    more round trip, on a last attempt only); should that fail, the release stands and the
    note says where to look."""
    from session.errors import ReplError
    from session.group import parse_token

    try:
        group = parse_token(claim_token)[0]
        named = [g.dead_letter for g in repl.groups(session) if g.name == group]
    except (Error, ReplError):
        named = []
    if named and named[0]:
        return f"the dead-letter session {named[0]}"
    return f"the group's dead-letter session (`repl groups {session}` names it)"


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("claim_token", metavar="CLAIM")
@lease_option("Keep it this long from now (1s to 24h).")
@click.pass_obj
def extend(repl: Repl, session: str, claim_token: str, lease: float) -> None:
    """Keep a claim's firing longer (a heartbeat); prints when the lease ends now.

    Exit status 1 (lease_lost) when CLAIM is no longer the live lease.
    """
    extended = repl.extend(session, claim_token, lease=lease)
    output.line(extended.lease_until)


@command("group")
@click.argument("session", shell_complete=complete_sessions)
@click.argument("name")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1, max=1000),
    metavar="N",
    help="Claims a firing is given before it goes to the dead-letter session "
    f"[default: {DEFAULT_MAX_ATTEMPTS}].",
)
@click.option(
    "--dead-letter",
    metavar="SESSION",
    help="Where a firing's last attempt goes [default: ID.dead, made when first needed].",
)
@click.option(
    "--from-now",
    is_flag=True,
    help="A new group starts after the newest firing (not at the oldest).",
)
@click.option("--json", "as_json", is_flag=True, help="The group as a JSON object.")
@click.pass_obj
def group_command(
    repl: Repl,
    session: str,
    name: str,
    max_attempts: int | None,
    dead_letter: str | None,
    from_now: bool,
    as_json: bool,
) -> None:
    """Create a group, or set its attempts and dead-letter session; print it."""
    from repl_cli.cli.claiming import group_table

    info = repl.group(
        session, name, max_attempts=max_attempts, dead_letter=dead_letter, from_now=from_now
    )
    if as_json:
        output.print_json(info)
        return
    group_table([info])


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="A JSON list of {name, done, ready, held, delayed, dead, max_attempts, dead_letter}.",
)
@click.pass_obj
def groups(repl: Repl, session: str, as_json: bool) -> None:
    """List a session's groups: what is done, ready, held, delayed and dead in each."""
    from repl_cli.cli.claiming import group_table

    output.listing(repl.groups(session), as_json, group_table)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.option("--group", metavar="NAME", help="Of this group only [default: every group].")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="A JSON list of {group, seq, attempt, lease_until, lease_until_ms}.",
)
@click.pass_obj
def claims(repl: Repl, session: str, group: str | None, as_json: bool) -> None:
    """List the firings held under a lease: group, seq, attempt, when the lease ends."""
    from repl_cli.cli.claiming import claim_table

    output.listing(repl.claims(session, group=group), as_json, claim_table)


@command()
@click.argument("session", shell_complete=complete_sessions)
@group_option
@click.option(
    "--upto",
    type=click.IntRange(min=0),
    metavar="SEQ",
    help="Wait for the firings up to SEQ [default: the newest when the join starts].",
)
@timeout_option(", printing what is left")
@reconnect_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: upto, done, dead, ready, held, delayed, timed_out.",
)
@click.pass_obj
def join(
    repl: Repl,
    session: str,
    group: str,
    upto: int | None,
    timeout: float | None,
    reconnect: float,
    as_json: bool,
) -> int:
    """Wait until the group has finished every firing of SESSION up to SEQ.

    Finished is done, or dead (its last attempt given back or run out: a
    dead letter). Prints one line: how many are done, how many of those are
    dead, and, when --timeout passed first (exit status 2), what is left:
    ready (no claimer has it), held (under a lease), delayed (given back for
    later). It takes nothing and moves nothing; it is woken by the group's
    own changes, not by looking again and again.
    """
    repl.reconnect = reconnect
    joined = repl.join(session, group=group, upto=upto, timeout=timeout)
    if as_json:
        output.print_answer(joined)
    else:
        output.line(joined_line(joined))
    return TIMED_OUT if joined.timed_out else OK


def joined_line(joined: p.Joined) -> str:
    """``join``'s line: ``3 of 3 done (1 dead)``, then what is left when there is some."""
    dead = f" ({joined.dead} dead)" if joined.dead else ""
    said = f"{joined.done} of {joined.upto} done{dead}"
    if joined.ready or joined.held or joined.delayed:
        said += f"; left: {joined.ready} ready, {joined.held} held, {joined.delayed} delayed"
    return said
