"""What ``repl claim`` prints, and what it does when nobody takes it (SPEC §16).

A claim's firing is delivered as ``wait`` delivers one (rule S9): written, and on a
pipe taken out of it by the reader, before the claim counts as handed on. First
comes the claim: its token alone on a line (what ``done``, ``release`` and
``extend`` take), or in ``--json`` one object ``{"claim", "seq", "attempt",
"lease_until", "lost"}``; then the firing as ``wait`` prints it. A claimer that
cannot write what it took gives the firing back at once, whatever stopped the
write (the reader left, stdout closed, a full disk, a terminal gone: EIO),
so the next claimer has it without waiting out the lease.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

from repl_cli.api.errors import Error
from repl_cli.cli.output import JSON, FiringFormat, answer_fields, json_line, table
from repl_cli.cli.sink import Sink
from repl_daemon import protocol as p
from session.firing import GroupInfo

#: the claim's line in ``--json``: the answer less the firing (printed after it), its
#: ``lease_until_ms`` and ``timed_out``
CLAIM_FIELDS = ("claim", "seq", "attempt", "lease_until", "lost")


def deliver_claim(
    sink: Sink,
    claimed: p.Claimed,
    session: str,
    fmt: FiringFormat,
    give_back: Callable[[], object],
) -> None:
    """Print ``claimed`` (the claim, then its firing) to ``sink``; should anything stop
    that part-way (a reader gone, any other write error, Ctrl-C), ``give_back()`` the
    firing before the exception goes on."""
    assert claimed.claim is not None and claimed.firing is not None
    head = json_line(answer_fields(claimed, CLAIM_FIELDS)) if fmt.style == JSON else claimed.claim
    batch = fmt.lines(session, claimed.seq, claimed.lost, [claimed.firing])
    try:
        for text in [head, *(text for text, _ in batch)]:
            sink.put(text)
    except BaseException:
        # whatever the failure, the firing was not delivered: a full disk (WriteFailed) keeps
        # the job from every other claimer for the whole lease as surely as a closed pipe
        with contextlib.suppress(Error):  # else it comes back when its lease runs out
            give_back()
        raise


GROUP_COLUMNS = ("group", "done", "ready", "held", "delayed", "dead", "attempts", "dead letters")
CLAIM_COLUMNS = ("group", "seq", "attempt", "lease until")


def group_table(groups: Sequence[GroupInfo]) -> None:
    """``repl groups ID``: one row a group, by name."""
    rows = [
        [g.name, g.done, g.ready, g.held, g.delayed, g.dead, g.max_attempts, g.dead_letter]
        for g in groups
    ]
    table(GROUP_COLUMNS, rows)


def claim_table(claims: Sequence[p.LeaseInfo]) -> None:
    """``repl claims ID``: one row a held firing, by group then seq."""
    table(CLAIM_COLUMNS, [[c.group, c.seq, c.attempt, c.lease_until] for c in claims])
