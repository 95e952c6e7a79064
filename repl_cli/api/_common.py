"""What the blocking API and the async one share beside their one body of operations.

How a match may be given, a length as the wire takes it, which cursor a
wait reads after, which requests may be sent again, and where a reply goes:
plain functions, no I/O. ``repl_cli.api`` re-exports the public names.

One unit: every length the APIs take is in seconds (a float), as Python's own
are (``time.sleep``, anyio's timeouts, this API's ``timeout`` and
``reconnect``); ``to_ms`` makes the wire's milliseconds of it when a request
is built, nowhere else. A default is the rule's (``session.rules``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from msgspec import UNSET, UnsetType

from repl_cli.api.errors import NotFound
from repl_daemon import protocol as p
from session.firing import Firing
from session.rules import DEFAULT_LEASE_MS
from session.tags import CORR, REPLY_TO, Match

#: what a match may be given as: a ``Match``, or the tags that must hold (a value None:
#: the tag is there, whatever its value)
MatchLike = Match | Mapping[str, str | None]

R = TypeVar("R", bound=p.Response)


def resendable(request: p.Request) -> bool:
    """Whether ``request`` may be sent again when its answer was lost (the connection broke
    after it was written: it may have been carried out). A send or a schedule with a dedup
    key may (the repeat records nothing and answers the first's seq, or timer, marked
    duplicate); one without a key may not (it would be recorded twice), nor anything else
    that changes what it finds (start, stop, poll, buffer, done, release, extend, group,
    cancel, webhook, token add and revoke, shutdown): its caller is told, and decides."""
    if isinstance(request, p.Send | p.Schedule):
        return request.key is not None
    if isinstance(request, p.Token):
        return request.action == "list"
    return p.VERB_OF[type(request)].repeatable


def log_note(message: str) -> None:
    """Where the APIs tell an outage: the ``repl`` logger (the CLI tells it on stderr)."""
    import logging  # here: the CLI, which tells on stderr, need not load it on every run

    logging.getLogger("repl").warning("%s", message)


def as_match(match: MatchLike | None) -> Match | None:
    """``match`` as the wire takes it; None for none."""
    if match is None or isinstance(match, Match):
        return match
    return Match(dict(match))


#: how long ``request`` waits for its reply unless told, in seconds
REQUEST_TIMEOUT = 30.0


def to_ms(seconds: float) -> int:
    """A length the API takes (seconds) as the wire takes it: whole milliseconds."""
    return round(seconds * 1000)


def lease_ms(lease: float | None) -> int:
    """A claim's lease (seconds; None: the rule's) as the wire takes it."""
    return DEFAULT_LEASE_MS if lease is None else to_ms(lease)


def wait_cursor(
    cursor: str | UnsetType | None, match: MatchLike | None, default: str
) -> str | None:
    """The cursor a wait reads after: the one given (None: none), else ``default``, or none
    for a matching wait (a matching reader given no cursor looks at the whole ring)."""
    if cursor is not UNSET:
        return cursor
    return None if match is not None else default


def reply_tags(firing: Firing, session: str) -> tuple[str, dict[str, str]]:
    """Where a reply to ``firing`` goes, and the tags it carries; ``NotFound`` when the firing
    was not sent as a request (it says nowhere)."""
    target = firing.tags.get(REPLY_TO)
    if target is None:
        raise NotFound(
            f"firing {firing.seq} of session {session!r} has no reply-to tag: it was not sent "
            "with `repl request` (send the answer with `repl send` instead)"
        )
    corr = firing.tags.get(CORR)
    return target, {} if corr is None else {CORR: corr}


def no_firing(session: str, seq: int, batch: p.Firings) -> NotFound:
    if batch.lost:
        return NotFound(
            f"firing {seq} of session {session!r} is no longer in its ring: it was dropped"
        )
    return NotFound(f"session {session!r} has no firing {seq}")
