"""What every route answers with: the constants, the JSON errors in HTTP's words
(``session.advice``), and the wire code's HTTP status."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
from starlette.responses import Response

from repl_daemon.protocol import MAX_LINE
from session.advice import advised
from session.errors import Code

#: the largest body a request may have (as a line of the protocol)
MAX_BODY = MAX_LINE
#: how much of a body nobody reads is read and dropped before the answer (``drain``)
MAX_DRAIN = 16 * MAX_BODY
#: how long a request's body may take to arrive in full
BODY_TIMEOUT = 30.0
#: a long poll's ``?timeout=`` when none is given, and the most it may be, in seconds: one
#: longer than an hour would outlive every proxy between, and the client may ask again
WAIT_TIMEOUT = 30.0
MAX_WAIT_TIMEOUT = 3600.0

#: the page's files (``GET /`` and ``/static/...``), shipped in the package
WEB = Path(__file__).parent.parent / "web"
#: the icon's type: an SVG, at /static/favicon.svg and at /favicon.ico
SVG = "image/svg+xml"
#: what a 404 of no route names, so the caller finds the right path
ROUTES = (
    "the routes are /sessions, /sessions/ID, /sessions/ID/firings, /sessions/ID/events, "
    "/sessions/ID/wait, /wait, /sessions/ID/gather, /sessions/ID/join, "
    "/sessions/ID/cursors/NAME, /sessions/ID/groups[/NAME[/claim]], "
    "/sessions/ID/claims[/CLAIM/done|release|extend], /sessions/ID/approvals[/REQUEST], "
    "/hooks/ID, /metrics, /healthz and "
    "the page at /"
)
#: the page loads nothing from anywhere else, and runs no script it did not ship
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

# a wire code's HTTP status; every other refusal is 400
STATUS: dict[str, int] = {
    Code.NO_SUCH_SESSION: 404,
    Code.LINE_TOO_LONG: 413,
    Code.IDLE_TIMEOUT: 408,
    Code.NO_SUCH_TIMER: 404,
    Code.NO_SUCH_WEBHOOK: 404,
    Code.NO_SUCH_PROMPT: 404,
    Code.SESSION_EXISTS: 409,
    Code.LEASE_LOST: 409,  # the claim conflicts with its group's state: nothing changed
    Code.ALREADY_ANSWERED: 409,  # the prompt has its verdict: the first that counts wins
    Code.SESSION_STOPPED: 410,
    Code.UNAUTHORIZED: 401,
    Code.FORBIDDEN: 403,
    Code.TOO_MANY: 429,
    Code.STORE_FAILED: 503,
    Code.SHUTTING_DOWN: 503,
    Code.INTERNAL: 500,
}

#: what a request with no token is told: which tokens are taken, and where the root's is,
#: without the daemon's path (the client is not authenticated)
NO_TOKEN = (
    "no token: give Authorization: Bearer TOKEN, with the daemon's root token (the `token` "
    "file in its state directory) or one made by `repl token add`"
)

encoder = msgspec.json.Encoder()


def error_response(
    code: str,
    message: str,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    own: bool = False,
) -> Response:
    status = STATUS.get(code, 400) if status is None else status
    body = error_body(code, message, own=own)
    return Response(body, status, headers=headers, media_type="application/json")


def error_body(code: str, message: str, *, own: bool = False) -> bytes:
    """An error as HTTP tells it: a refusal of the daemon's, its advice put in HTTP's words
    (``session.advice``); ``own``, one HTTP words itself (no route, the HTTP connections'
    limit, a request h11 cannot parse, a bug), as it is."""
    said = message if own else advised(code, message, "http")
    return encoder.encode({"code": code, "message": said})


def json_response(value: Any, status: int = 200) -> Response:
    return Response(encoder.encode(value), status, media_type="application/json")
