"""Reading a request: its body (bounded, drained), the numbers and words of its query,
its JSON bodies; each refusal a ``ReplError`` naming the query or body field."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, TypeVar

import anyio
import msgspec
from starlette.requests import ClientDisconnect

from repl_daemon.http.answers import BODY_TIMEOUT, MAX_BODY, MAX_DRAIN, MAX_WAIT_TIMEOUT
from session.errors import (
    BadRequest,
    BadTime,
    IdleTimeout,
    LineTooLong,
    ReplError,
)
from session.ops import check_match
from session.schedule import parse_duration
from session.tags import Match, parse_match, parse_tags

if TYPE_CHECKING:
    from starlette.requests import Request


async def drain(request: Request) -> None:
    """Read and drop what is left of a request's body that nobody reads (a refused one, or
    a GET's), at most ``MAX_DRAIN`` bytes for at most 2 s, before the answer: a connection
    closed with bytes unread is reset by the kernel, and the client, still sending, would
    lose the answer. Past those bounds it may (as with nginx's lingering close)."""

    declared = request.headers.get("content-length", "") or request.headers.get(
        "transfer-encoding", ""
    )  # a chunked body declares no length: it is drained all the same
    if request.method in ("GET", "HEAD") and not declared:
        return
    size = 0
    with anyio.move_on_after(2):
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_DRAIN:
                    return
        except (ClientDisconnect, RuntimeError):  # gone, or read already
            return


async def read_body(request: Request) -> bytes:
    """The request's body, refused with 413 past ``MAX_BODY`` before more is read."""
    declared = request.headers.get("content-length")
    too_large = LineTooLong(f"the body is over {MAX_BODY:,} bytes")  # the hint: in parts
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise too_large
    chunks = []
    size = 0

    with anyio.move_on_after(BODY_TIMEOUT) as scope:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > MAX_BODY:
                    raise too_large
                chunks.append(chunk)
        except ClientDisconnect:  # gone before its body was in: nothing to record, or log
            raise BadRequest("the client went away before its body arrived") from None
    if scope.cancelled_caught:
        raise IdleTimeout(f"the body did not arrive within {BODY_TIMEOUT:g} s")
    return b"".join(chunks)


#: a seq as HTTP takes it: ASCII digits, at most 19 (seqs stop at 2**63 - 1)
SEQ = re.compile(r"[0-9]{1,19}")
NUMBER = re.compile(r"-?[0-9]{1,19}")
SECONDS = re.compile(r"[0-9]{1,7}(\.[0-9]{1,6})?")


def shown(value: str, most: int = 40) -> str:
    """``value`` as an error message shows it: quoted, and cut short when long."""
    return repr(value if len(value) <= most else value[:most] + "…")


def query_number(request: Request, name: str, default: int | None) -> int | None:
    """A whole number of the query (ASCII digits, a minus at most), or ``BadRequest``."""
    value = request.query_params.get(name)
    if value is None:
        return default
    if not NUMBER.fullmatch(value):
        raise BadRequest(f"?{name}={shown(value)} is not a whole number")
    return int(value)


def query_seconds(request: Request, name: str, default: float) -> float:
    """A number of seconds of the query (``30``, ``2.5``), from 0 to ``MAX_WAIT_TIMEOUT``."""
    value = request.query_params.get(name)
    if value is None:
        return default
    if not SECONDS.fullmatch(value) or float(value) > MAX_WAIT_TIMEOUT:
        raise BadRequest(
            f"?{name}={shown(value)} is not a number of seconds from 0 to {MAX_WAIT_TIMEOUT:g}"
        )
    return float(value)


def query_duration(request: Request, name: str, default_ms: int) -> int:
    """A lease's or a delay's length in ms, as seconds (``90``, ``2.5``, as ``?timeout=``)
    or as a duration (``90s``, ``5m``, ``1h30m``, as the CLI's ``--lease``); its bounds
    are the core's to check. ``bad_time`` when it is neither."""

    value = request.query_params.get(name)
    if value is None:
        return default_ms
    if SECONDS.fullmatch(value):
        return round(float(value) * 1000)
    try:
        return parse_duration(value)
    except ReplError:
        raise BadTime(
            f"?{name}={shown(value)} is not a number of seconds (90, 2.5) or a duration "
            "(90s, 5m, 1h30m)"
        ) from None


def query_flag(request: Request, name: str) -> bool:
    """A yes or no of the query: ``true``/``1`` or ``false``/``0`` (absent: no)."""
    value = request.query_params.get(name)
    if value is None or value in ("false", "0"):
        return False
    if value in ("true", "1"):
        return True
    raise BadRequest(f"?{name}={shown(value)} is not true or false")


def tags_of(request: Request) -> dict[str, str]:
    """A send's ``?tag=KEY=VALUE`` words (repeatable) as its tags; ``BadTag`` when not."""
    return parse_tags(request.query_params.getlist("tag"))


def acks_of(request: Request) -> dict[str, int]:
    """A wait's ``?ack=ID:SEQ`` words (once for each session) as its acks."""
    acks: dict[str, int] = {}
    for given in request.query_params.getlist("ack"):
        session_id, colon, seq = given.rpartition(":")
        if not colon or not session_id or not SEQ.fullmatch(seq):
            raise BadRequest(f"?ack={shown(given)} is not ID:SEQ, a session and a seq")
        if session_id in acks:
            raise BadRequest(f"?ack= names session {shown(session_id)} twice")
        acks[session_id] = int(seq)
    return acks


def match_of(request: Request) -> Match | None:
    """A reader's ``?match=KEY=VALUE`` / ``?match=KEY`` (repeatable: all must hold) and
    ``?handler=NAME``, or None when it gives neither."""
    query = request.query_params
    twice = "?match={} is given twice: which value should it have?"
    match = parse_match(query.getlist("match"), query.get("handler"), twice)
    check_match(match)  # the handler's name too
    return match


class StartBody(msgspec.Struct, kw_only=True):
    """``POST /sessions``'s body, every field optional; unknown ones are ignored, as the
    line protocol ignores them."""

    id: str | None = None
    buffer: int | None = None
    exist_ok: bool = False


Body = TypeVar("Body", bound=msgspec.Struct)
#: what msgspec says of a field a body that forbids unknown ones does not have
UNKNOWN_FIELD = re.compile(r"Object contains unknown field `(.*)`")


def decode(body: bytes, kind: type[Body], shape: str) -> Body:
    """A JSON body as ``kind`` (an empty one: its defaults), or ``BadRequest`` with msgspec's
    path to what is wrong and the shape it should have."""
    if not body.strip():
        body = b"{}"
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        unknown = UNKNOWN_FIELD.match(str(exc))
        if unknown is not None:  # a misspelt field, most likely: named, with the right ones
            raise BadRequest(f"the body has no field {unknown[1]!r}: send {shape}") from None
        raise BadRequest(f"bad body: {exc}; send {shape}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not JSON ({exc}): send {shape}") from None
