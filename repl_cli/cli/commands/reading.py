"""The commands that read: ``read``, ``wait``, ``follow``, ``poll``, ``ack``.

Each prints through a ``Printer`` (``repl_cli.cli.deliver``) and acknowledges
only what the reader took (rule S9). These are the commands monitors run
again and again: keep this module's imports to what they need.
"""

from __future__ import annotations

import click

from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.complete import complete_cursors, complete_sessions
from repl_cli.cli.deliver import Batch, Printer, at_most, deliver, follow
from repl_cli.cli.errors import OK, TIMED_OUT
from repl_cli.cli.options import (
    firing_format,
    firing_formats,
    match_of,
    match_options,
    reconnect_option,
    timeout_option,
)
from session.rules import ACK_CURSOR, FOLLOW_CURSOR, MAX_WAIT_SESSIONS, READ_CURSOR, WAIT_CURSOR


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--cursor",
    metavar="NAME",
    shell_complete=complete_cursors,
    help=f"Read after this cursor [default: {READ_CURSOR}].",
)
@click.option(
    "--after", type=click.IntRange(min=0), metavar="N", help="Read after seq N, no cursor."
)
@click.option(
    "--last", type=click.IntRange(min=1), metavar="N", help="The newest N firings; no cursor."
)
@click.option(
    "--since",
    metavar="WHEN",
    help="Firings recorded since WHEN: a time back (90s, 10m, 2h, 1d) or an ISO time "
    "(2026-12-01T08:00, UTC unless it names a zone); no cursor.",
)
@click.option("--max", "max_", type=click.IntRange(min=1), metavar="N", help="At most N firings.")
@click.option("--peek", is_flag=True, help="Do not acknowledge.")
@match_options
@firing_formats
@click.pass_obj
def read(
    repl: Repl,
    session: str,
    cursor: str | None,
    after: int | None,
    last: int | None,
    since: str | None,
    max_: int | None,
    peek: bool,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> None:
    """Print the firings after the cursor, then acknowledge them.

    --after, --last and --since look without a cursor and acknowledge nothing,
    and so does --match (or --handler) without --cursor: it looks at the whole
    ring, so a reply that came before you asked is found.
    """
    chosen = [name for name, v in (("--cursor", cursor), ("--after", after)) if v is not None]
    if len(chosen) > 1:
        raise click.UsageError("give --cursor or --after, not both")
    if chosen and (last is not None or since is not None):
        raise click.UsageError(f"--last and --since read without a cursor: leave out {chosen[0]}")
    if last is not None and max_ is not None:
        raise click.UsageError("give --last or --max, not both")
    match = match_of(match_words, handler_filter)
    if match is not None and (last is not None or since is not None):
        raise click.UsageError(
            "--match reads by cursor, --after or the whole ring: not --last or --since"
        )
    fmt = firing_format(seq, full, as_json, ts=ts)
    if last is not None or since is not None:
        from repl_cli.cli.recent import recent

        bound = None if since is None else parse_since(since)
        deliver(Printer(repl.client, fmt, None), [recent(repl, session, last, bound, max_)])
        return
    got = repl.read(session, cursor=cursor, after=after, max=max_, peek=peek, match=match)
    ack_cursor = None if peek or after is not None else cursor or READ_CURSOR
    if match is not None and cursor is None:
        ack_cursor = None  # a matching reader without a cursor acknowledges nothing
    deliver(
        Printer(repl.client, fmt, ack_cursor), [Batch(session, got.next, got.lost, got.firings)]
    )
    if match is not None and ack_cursor is not None and not got.firings and got.next:
        # a matching reader that found nothing still looked at everything up to next
        repl.ack(session, got.next, cursor=ack_cursor)


def parse_since(text: str) -> str:
    """``--since``'s bound as a firing's ``ts`` reads (UTC, ms); a usage error if it is none."""
    from repl_cli.cli.recent import since_ts

    bound = since_ts(text)
    if bound is None:
        raise click.UsageError(
            f"--since {text!r} is neither a time back (90s, 10m, 2h, 1d) "
            "nor an ISO time (2026-12-01T08:00)"
        )
    return bound


@command()
@click.argument(
    "sessions", nargs=-1, required=True, metavar="ID...", shell_complete=complete_sessions
)
@click.option(
    "--cursor",
    metavar="NAME",
    shell_complete=complete_cursors,
    help=f"Wait after this cursor [default: {WAIT_CURSOR}; with --match, none].",
)
@timeout_option()
@click.option("--peek", is_flag=True, help="Do not acknowledge.")
@click.option(
    "--max",
    "most",
    type=click.IntRange(min=1),
    metavar="N",
    help="Print at most N firings, the oldest; the rest stay for the next wait.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    metavar="N",
    help="Wait until N firings are printed (in one batch or several), then exit.",
)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="Return only once every session named has firings (a join, not the first of them).",
)
@match_options
@reconnect_option
@firing_formats
@click.pass_obj
def wait(
    repl: Repl,
    sessions: tuple[str, ...],
    cursor: str | None,
    timeout: float | None,
    peek: bool,
    most: int | None,
    count: int | None,
    every: bool,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Block until firings exist after the cursor, print them, acknowledge, exit.

    With several sessions, it returns with those that have firings and puts
    each line's session id first; with --all, only once every one of them
    has (each with --match, if given), printing each session's batch in the
    order named and acknowledging them together. Exit status 2: --timeout
    passed, nothing came (with --all: not all came, and nothing is printed
    or acknowledged).
    A daemon restart or a store outage meanwhile is ridden out (--reconnect).
    With --match it returns only firings that match; without --cursor it then
    looks at the whole ring (a firing that came before the wait is found at
    once) and acknowledges nothing.
    """
    import time
    from functools import partial

    _check_wait(len(sessions), peek=peek, most=most, count=count, every=every)
    match = match_of(match_words, handler_filter)
    if cursor is None and match is None:
        cursor = WAIT_CURSOR
    ids = list(dict.fromkeys(sessions))  # each once, where first named, as the daemon does
    fmt = firing_format(seq, full, as_json, several=len(ids) > 1, ts=ts)
    printer = Printer(repl.client, fmt, None if peek else cursor)
    repl.reconnect = reconnect
    repl.watch = printer.watch
    deadline = None if timeout is None else time.monotonic() + timeout
    printed = 0
    after: dict[str, int] = {}  # a cursorless --count goes on after what it printed
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        bound = most if count is None else count - printed
        woken = repl.wait(
            ids,
            cursor=cursor,
            timeout=left,
            max=bound,
            match=match,
            after=after.get(ids[0]) if cursor is None and len(ids) == 1 else None,
            all=every,
        )
        if woken.timed_out:
            return OK if printed else TIMED_OUT
        batches = [Batch(b.session, b.next, b.lost, b.firings) for b in woken.batches]
        if len(batches) > 1 and bound is not None and not every:
            # the daemon bounds each session's batch; the whole is bounded here (a join
            # keeps every session's: --max bounds each)
            batches = at_most(batches, bound)
        taken = printer.show(batches)
        # printed: the ack is tried again across an outage too (acks are idempotent); a
        # join's acks go in one request, all or nothing
        acked = printer.ack_together if every else printer.ack
        repl.again().run(partial(acked, taken))
        printed += sum(len(b.firings) for b in batches)
        after.update((b.session, b.next) for b in batches)
        if count is None or printed >= count:
            return OK


def _check_wait(
    named: int, *, peek: bool, most: int | None, count: int | None, every: bool
) -> None:
    """``wait``'s options that exclude each other, refused before anything is asked."""
    if peek and count is not None:
        raise click.UsageError("--count waits for new firings: a --peek would see the same again")
    if most is not None and count is not None:
        raise click.UsageError(
            "--max returns at once with at most N; --count waits for N: not both"
        )
    if every and count is not None:
        raise click.UsageError("--all returns once each session has firings; --count: not both")
    if named > MAX_WAIT_SESSIONS:  # as the daemon counts them (rule 14)
        raise click.UsageError(
            f"{named:,} sessions named: one wait takes at most {MAX_WAIT_SESSIONS:,}"
        )


@command("follow")
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--cursor",
    metavar="NAME",
    shell_complete=complete_cursors,
    help=f"Follow this cursor [default: {FOLLOW_CURSOR}; with --match, none].",
)
@click.option("--from-now", is_flag=True, help="First acknowledge everything recorded so far.")
@click.option(
    "--count", type=click.IntRange(min=1), metavar="N", help="Stop after N firings (exit 0)."
)
@match_options
@reconnect_option
@firing_formats
@click.pass_obj
def follow_command(
    repl: Repl,
    session: str,
    cursor: str | None,
    from_now: bool,
    count: int | None,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> None:
    """Stream firings until interrupted, acknowledging each batch once printed.

    A daemon restart or a store outage is ridden out (--reconnect): it goes
    on from the cursor, so nothing is lost and nothing unprinted acknowledged.
    With --match, only firings that match; without --cursor it then follows
    them from the whole ring on and acknowledges nothing.
    """
    fmt = firing_format(seq, full, as_json, ts=ts)
    repl.reconnect = reconnect
    match = match_of(match_words, handler_filter)
    if cursor is None and match is None:
        cursor = FOLLOW_CURSOR
    start: int | None = None
    if from_now:
        if cursor is None:
            start = repl.again().run(lambda: repl.stats(session).sessions[0].head)
        else:
            chosen = cursor

            def skip() -> None:
                repl.ack(session, repl.stats(session).sessions[0].head, cursor=chosen)

            repl.again().run(skip)
    follow(Printer(repl.client, fmt, cursor), repl, session, cursor, count, match, start)


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.option("--max", "max_", type=click.IntRange(min=1), metavar="N", help="At most N firings.")
@firing_formats
@click.pass_obj
def poll(
    repl: Repl,
    session: str,
    max_: int | None,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> None:
    """Print the firings after cursor `poll`, which the daemon acknowledges at once.

    At most once: what is not printed (a closed pipe) is not seen again.
    """
    fmt = firing_format(seq, full, as_json, ts=ts)
    got = repl.poll(session, max=max_)
    deliver(Printer(repl.client, fmt, None), [Batch(session, got.next, got.lost, got.firings)])


@command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("seq", type=click.IntRange(min=0))
@click.option(
    "--cursor",
    default=ACK_CURSOR,
    show_default=True,
    metavar="NAME",
    shell_complete=complete_cursors,
    help="The cursor to move.",
)
@click.pass_obj
def ack(repl: Repl, session: str, seq: int, cursor: str) -> None:
    """Acknowledge up to SEQ by hand (after --peek); a cursor never moves back."""
    repl.ack(session, seq, cursor=cursor)
