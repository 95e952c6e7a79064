"""``read --last N`` and ``read --since WHEN``: the newest firings, as ``tail`` and
``journalctl`` show them. Both look without a cursor and acknowledge nothing.

``--last N`` reads after the head less N, at most N: exactly the newest N
the ring holds, however many arrive meanwhile. ``--since`` compares the
firings' own times (``ts``, UTC to the millisecond, which sort as text).
Firings the ring dropped are reported only when some of them may have
been recorded after the bound (the ring's oldest is already after it).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from repl_cli.deliver import Batch

if TYPE_CHECKING:
    from repl_cli.api import Repl

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def since_ts(text: str, now: datetime | None = None) -> str | None:
    """``text`` (``90s``, ``10m``, ``1h30m``, ``2d``, or an ISO 8601 time) as a ``ts`` bound."""
    now = now or datetime.now(UTC)
    compact = text.replace(" ", "")
    parts = _AGO.findall(compact)
    if parts and "".join(n + u for n, u in parts) == compact:  # 90s, 10m, 1h30m, 2d
        when = now - timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))
    else:
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


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
