"""``read --last N`` and ``read --since WHEN``: the newest firings, as ``tail`` and
``journalctl`` show them. Both look without a cursor and acknowledge nothing.

``--last N`` reads after the head less N, at most N: exactly the newest N
the ring holds, however many arrive meanwhile. ``--since`` compares the
firings' own times (``ts``, UTC to the millisecond, which sort as text).
Firings the ring dropped are reported only when some of them may have
been recorded after the bound (the ring's oldest is already after it).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from repl_cli.deliver import Batch
from session.firing import ms_to_ts

if TYPE_CHECKING:
    from repl_cli.api import Repl


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


def recent(repl: Repl, session: str, last: int | None, since: str | None) -> Batch:
    """The newest ``last`` firings (all with None), of those since ``since`` (any with None)."""
    if since is None:
        assert last is not None
        head = repl.stats(session).sessions[0].head
        got = repl.read(session, after=max(0, head - last), max=last)
        return Batch(session, got.next, got.lost, got.firings)
    got = repl.read(session, after=0)
    firings = [f for f in got.firings if f.ts >= since]
    # the dropped ones are older than the oldest retained: in range only if that one is
    lost = got.lost if not got.firings or got.firings[0].ts >= since else 0
    if last is not None and len(firings) > last:
        firings, lost = firings[-last:], 0
    return Batch(session, got.next, lost, firings)
