"""What a session's keys hold, read back: a firing's stream entry (its ``by`` one string
a sender), a timer's definition, the figures and cursors ``DESCRIBE`` answers."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from session.firing import NO_TAGS, CursorInfo, Firing
from session.schedule import Timer
from session.session import Summary
from session.tags import Tags

read_tags = msgspec.json.Decoder(Tags)


@functools.lru_cache(maxsize=1024)
def sender(raw: bytes) -> str | None:
    """A firing's ``by`` as an entry (or a wake) keeps it: one string for every firing of a
    sender, as a ring keeps it (a few senders send a session's firings); None for none."""
    return raw.decode() or None


def firing_of(entry: Any) -> Firing:
    """A firing as its stream entry keeps it."""
    raw_id, fields = entry  # from a script the fields are flat; redis-py's XRANGE makes a dict
    seq = int(raw_id.split(b"-", 1)[0])
    values = (
        fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=True))
    )
    result = values.get(b"r")
    event = values.get(b"e")
    tags = values.get(b"g")
    by = values.get(b"b")
    return Firing(
        seq,
        values[b"h"].decode(),
        None if result is None else result.decode(),
        None if event is None else event.decode(),
        values[b"t"].decode(),
        NO_TAGS if tags is None else read_tags.decode(tags),
        None if by is None else sender(by),
    )


class Definition(msgspec.Struct, omit_defaults=True):
    """A timer as the ``timers`` hash keeps it (its id is the field, its due time in ``due``)."""

    every: int | None
    handler: str
    text: str
    key: str | None
    field: str  # "r": the text is the result (a handler every session has), "e": the event
    #: its firings' tags as the JSON text their entries keep (``FIRE`` copies it); None: no
    #: tags, and no field, so a plain timer's definition is as it was before tags
    tags: str | None = None


definition_bytes = msgspec.json.Encoder().encode
_read_definition = msgspec.json.Decoder(Definition)


def timer_of(session_id: str, timer_id: str, due: Any, raw: bytes) -> Timer:
    definition = _read_definition.decode(raw)
    return Timer(
        id=timer_id,
        session=session_id,
        due_ms=int(float(due)),
        every_ms=definition.every,
        handler=definition.handler,
        text=definition.text,
        key=definition.key,
        tags=None if definition.tags is None else read_tags.decode(definition.tags),
    )


def score(value: Any) -> int | None:
    """A sorted set's score as a script answers it ('' for none)."""
    return int(float(value)) if value not in (b"", "", None) else None


def description(session_id: str, answer: list[Any]) -> tuple[Summary, list[CursorInfo]]:
    head, limit, evals, retained, flat = answer
    rows = []
    for i in range(0, len(flat), 2):
        seq, _, use = flat[i + 1].decode().partition(":")
        rows.append((int(use), flat[i].decode(), int(seq)))
    rows.sort(reverse=True)
    head = int(head)
    cursors = [CursorInfo(name, seq, max(0, head - seq)) for _, name, seq in rows]
    summary = Summary(
        id=session_id,
        head=head,
        retained=int(retained),
        limit=int(limit),
        cursors=len(cursors),
        recorded=head,
        lost=head - int(retained),
        evaluations=int(evals or 0),
        lag=max((c.lag for c in cursors), default=0),
    )
    return summary, cursors
