"""``read --last N`` and ``read --since WHEN``: the newest firings, as ``tail`` and
``journalctl`` show them. Both look without a cursor and acknowledge nothing.

The daemon answers both in one look (the wire's ``read`` with ``last`` and
``since``; the core's ``Session.read_recent``): ``--last N`` reads after the
head less N, at most N, and ``--since`` compares the firings' own times
(``ts``, UTC to the millisecond, which sort as text). Firings the ring
dropped are reported only when some of them may have been recorded after
the bound. What is left here is turning ``--since``'s words into a time.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from repl_cli.cli.deliver import Batch
from session.firing import ms_to_ts

if TYPE_CHECKING:
    from repl_cli.api.blocking import Repl


def since_ts(text: str, now: datetime | None = None) -> str | None:
    """``text`` (a time back: ``90s``, ``10m``, ``1h30m``, ``2d``; or an ISO 8601 time, UTC
    unless it names a zone) as a ``ts`` bound; None when it is neither. The durations and
    times are the ones timers take (``session.schedule``)."""
    from session.errors import BadTime
    from session.schedule import parse_duration, parse_time

    now = now or datetime.now(UTC)
    try:
        ms = round(now.timestamp() * 1000) - parse_duration(text.replace(" ", ""))
    except BadTime:
        try:
            ms = parse_time(text)
        except BadTime:
            return None
    return ms_to_ts(ms)


def recent(
    repl: Repl, session: str, last: int | None, since: str | None, most: int | None = None
) -> Batch:
    """The newest ``last`` firings (all with None), of those since ``since`` (any with None),
    the oldest ``most`` of them: one read, answered by the daemon in one look (the wire's
    ``last`` and ``since``)."""
    got = repl.read(session, last=last, since=since, max=most)
    return Batch(session, got.next, got.lost, got.firings)
