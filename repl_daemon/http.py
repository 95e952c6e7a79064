"""HTTP beside the line protocol (rules H1-H7): the same engine, the same state, one event loop.

``repl daemon --http HOST:PORT`` serves a Starlette app with uvicorn in the
daemon's own loop. Every route is a thin translation to a request of the
line protocol (``repl_daemon.protocol``) handled by the one ``Engine``, so
the checks, the errors and the durability are the same: a send is answered
once durable, a read touches no cursor, and an event stream is a wait like
any other (``wait`` with ``after``), blocked with no work until its session
has a new firing; a client that goes away ends its wait at once.

- ``POST /sessions/{id}/firings``: the body is the text (UTF-8, at most
  1 MiB); ``?handler=NAME``; ``?tag=KEY=VALUE`` (repeatable) its tags;
  ``Idempotency-Key`` is the dedup key. 201, or 200 for a duplicate.
- ``GET /sessions/{id}/firings?after=N&max=M``: ``{next, lost, firings}``;
  ``?match=KEY=VALUE`` / ``?match=KEY`` (repeatable) and ``?handler=NAME``
  keep only the firings that match, and without ``after`` look at the whole
  ring.
- ``GET /sessions/{id}/events``: Server-Sent Events (sse-starlette): ``event:
  firing``, ``id:`` the seq, ``data:`` the firing's JSON; ``event: lost``
  before a gap; from ``Last-Event-ID`` or ``?after=N``, else from the head;
  a comment line every 15 s; with a match, only the firings that match.
- The consumer's routes, so that a program in any language runs the loop
  ``repl wait`` runs: ``POST /sessions`` (start), ``DELETE /sessions/{id}``
  (stop), ``GET /sessions/{id}/wait`` (a long poll: ``?ack=SEQ`` first, then
  blocked like any wait until firings exist after the cursor or
  ``?timeout=`` passes; it acknowledges nothing it returns, and a client
  that goes away releases it at once), ``POST /sessions/{id}/cursors/{name}``
  (ack).
- ``POST /hooks/{id}``: a webhook's delivery, signed as GitHub signs it (no
  token: it carries its own secret); one 401 for a wrong signature, no
  webhook and no session alike. Its firing carries the tags ``event`` (the
  ``X-GitHub-Event`` header) and ``delivery`` (the delivery id).
- ``GET /sessions``, ``GET /metrics`` (Prometheus, prometheus_client), and
  ``GET /healthz`` (no token; 503 when the store fails).
- ``GET /`` and ``/static/...``: the page (``web/``); ``GET /favicon.ico`` its
  icon, which a browser asks for by itself (no token for any of them).

Every data route needs ``Authorization: Bearer TOKEN``: the daemon's root
token or a scoped one (rules K1-K5), checked by the engine as the line
protocol's ``auth`` is; without it, or with a wrong or revoked one, 401. A
scoped token sees only its sessions (``/sessions`` lists those, any other
answers 404 as a missing one), a right it lacks is 403, and ``/metrics``
(the whole daemon's figures) is the root's. A revocation ends the token's
blocked requests (a long poll: 401) and event streams at once (``event:
error``, code ``unauthorized``). Errors are JSON ``{"code",
"message"}`` with the wire code of ``session.errors``; a missing session is
404, a body over 1 MiB 413, a request the daemon cannot take 400. So are the
refusals the libraries would make in plain text: no route (404) or a method
its route does not serve (405) are ``unknown_op``, as an unknown op is over
the line protocol; a request uvicorn cannot parse is 400 ``bad_request``; a
connection past ``--max-connections`` 503 ``too_many``; a failure of the
daemon's own 500 ``internal``.

The extra ``repl[http]`` brings Starlette, uvicorn and sse-starlette; without
it ``--http`` stops the daemon at start with the ``pip install`` to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import re
import secrets
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import msgspec
from anyio.abc import TaskStatus

from repl_daemon import protocol as p
from repl_daemon.config import DEFAULTS
from repl_daemon.engine.engine import REVOKED
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.wait import Wait
from repl_daemon.protocol import MAX_LINE
from session.advice import advised
from session.errors import (
    BadRequest,
    BadSessionId,
    Code,
    ConfigError,
    IdleTimeout,
    LineTooLong,
    NoSuchSession,
    ReplError,
    Unauthorized,
)
from session.firing import Firing
from session.ops import check_match
from session.rules import DEFAULT_HANDLER, WAIT_CURSOR
from session.scopes import ADMIN, READ, TokenRecord, forbidden, scoped_refusal
from session.tags import Match, parse_match, parse_tags

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.types import Receive, Scope, Send

    from repl_daemon.engine import Engine
    from repl_daemon.engine.committer import Totals

log = logging.getLogger("repl.daemon")

#: the largest body a request may have (as a line of the protocol)
MAX_BODY = MAX_LINE
#: how much of a body nobody reads is read and dropped before the answer (``_drain``)
MAX_DRAIN = 16 * MAX_BODY
#: an event stream sends a comment line at least this often, so proxies keep it open
HEARTBEAT = 15.0
#: how long a request's body may take to arrive in full
BODY_TIMEOUT = 30.0
#: a long poll's ``?timeout=`` when none is given, and the most it may be, in seconds: one
#: longer than an hour would outlive every proxy between, and the client may ask again
WAIT_TIMEOUT = 30.0
MAX_WAIT_TIMEOUT = 3600.0

#: the page's files (``GET /`` and ``/static/...``), shipped in the package
WEB = Path(__file__).with_name("web")
#: the icon's type: an SVG, at /static/favicon.svg and at /favicon.ico
SVG = "image/svg+xml"
#: what a 404 of no route names, so the caller finds the right path
ROUTES = (
    "the routes are /sessions, /sessions/ID, /sessions/ID/firings, /sessions/ID/events, "
    "/sessions/ID/wait, /sessions/ID/cursors/NAME, /hooks/ID, /metrics, /healthz and the "
    "page at /"
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

INSTALL_HINT = (
    "--http needs Starlette, uvicorn, sse-starlette and prometheus_client: "
    "pip install 'repl-inbox[http]'"
)

# a wire code's HTTP status; every other refusal is 400
STATUS: dict[str, int] = {
    Code.NO_SUCH_SESSION: 404,
    Code.LINE_TOO_LONG: 413,
    Code.IDLE_TIMEOUT: 408,
    Code.NO_SUCH_TIMER: 404,
    Code.NO_SUCH_WEBHOOK: 404,
    Code.SESSION_EXISTS: 409,
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

_json = msgspec.json.Encoder()


def check_installed() -> None:
    """``ConfigError`` with the ``pip install`` to run when the ``http`` extra is missing."""
    try:
        import prometheus_client  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None


def error_response(
    code: str, message: str, status: int | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    from starlette.responses import Response

    status = STATUS.get(code, 400) if status is None else status
    return Response(
        error_body(code, message), status, headers=headers, media_type="application/json"
    )


def error_body(code: str, message: str) -> bytes:
    """An error as HTTP tells it: its advice in HTTP's words (``session.advice``)."""
    return _json.encode({"code": code, "message": advised(code, message, "http")})


def json_response(value: Any, status: int = 200) -> Response:
    from starlette.responses import Response

    return Response(_json.encode(value), status, media_type="application/json")


class Api:
    """The routes, over one engine and the daemon's root token."""

    def __init__(self, engine: Engine, token: str) -> None:
        self.engine = engine
        self._token = token.encode()
        #: what a delivery to no webhook is signed against, so that it costs what a real
        #: one does: a secret of this process's alone, never stored, never told
        self._nobodys_secret = secrets.token_bytes(32)
        self.streams = _Streams()

    # -- plumbing ---------------------------------------------------------------

    async def authenticate(self, request: Request) -> TokenRecord | None:
        """The request's token: None for the root; ``Unauthorized`` for none or a wrong one."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized(NO_TOKEN)
        return await self.engine.authenticate(given.strip(), self._token).result()

    async def call(self, req: p.AnyRequest, request: Request) -> p.Response:
        """``req`` handled by the engine with the request's token; a blocked one (a wait)
        holds the token, and its revocation answers it ``unauthorized``."""
        return await self.answer(self.handle(req, request), request)

    def handle(self, req: p.AnyRequest, request: Request) -> Outcome[p.Response]:
        """``req`` given to the engine with the request's token: refused at once, or its
        outcome (for a wait, the job that blocks: ``answer`` awaits it)."""
        return self.engine.handle(req, request.state.token)

    async def answer(self, outcome: Outcome[p.Response], request: Request) -> p.Response:
        """``outcome``'s answer; a revocation of the request's token ends a blocked one."""
        engine = self.engine
        token: TokenRecord | None = request.state.token
        if token is None or outcome.job is None:
            return await outcome.result()
        held = _Held()
        engine.hold(token, held)
        try:
            with anyio.CancelScope() as held.scope:
                return await outcome.result()
        finally:
            engine.release(token, held)
        raise held.error or Unauthorized(REVOKED)

    def guarded(
        self, route: Callable[[Request], Awaitable[Response]], *, open: bool = False
    ) -> _Endpoint:
        """``route`` behind the token (unless ``open``), its refusals as JSON errors."""

        errors = self.engine.counts.errors

        async def endpoint(request: Request) -> Response:
            request.state.token = None
            if not open:
                try:
                    request.state.token = await self.authenticate(request)
                except ReplError as exc:  # a wrong token, or the store that keeps tokens away
                    errors[exc.code.value] += 1
                    await _drain(request)
                    challenge = {"WWW-Authenticate": "Bearer"}
                    headers = challenge if exc.code is Code.UNAUTHORIZED else None
                    return error_response(exc.code.value, exc.message, headers=headers)
            try:
                response = await route(request)
                await _drain(request)  # a body the route did not want (a GET's): see _drain
                return response
            except ReplError as exc:
                errors[exc.code.value] += 1
                if exc.code is not Code.LINE_TOO_LONG:  # that one is refused unread, on purpose
                    await _drain(request)
                if request.state.token is not None:  # a missing session with its own advice
                    exc = scoped_refusal(request.state.token.scope, exc)
                return error_response(exc.code.value, exc.message)

        return _Endpoint(endpoint)

    # -- the routes -------------------------------------------------------------

    async def send(self, request: Request) -> Response:
        body = await _body(request)
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8 text") from None
        handler = request.query_params.get("handler", DEFAULT_HANDLER)
        tags = _tags(request)
        key = request.headers.get("idempotency-key")
        sent = await self.call(
            p.Send(
                session=request.path_params["id"], text=text, handler=handler, key=key, tags=tags
            ),
            request,
        )
        assert isinstance(sent, p.Sent)
        return json_response(
            {"seq": sent.seq, "duplicate": sent.duplicate}, 200 if sent.duplicate else 201
        )

    async def firings(self, request: Request) -> Response:
        return await (self.send(request) if request.method == "POST" else self.read(request))

    async def read(self, request: Request) -> Response:
        """``?after=N``, or the compound reads ``?last=N``, ``?since=TIME``, ``?seq=S`` (the
        wire's ``read``, one look each); ``?max``, ``?match``."""
        match = _match(request)
        last, seq = _number(request, "last", None), _number(request, "seq", None)
        since = request.query_params.get("since")
        compound = last is not None or seq is not None or since is not None
        # a matching read given no ``after`` looks at the whole ring (an early reply is found)
        after = _number(request, "after", None if match or compound else 0)
        most = _number(request, "max", None)
        asked = p.Read(
            session=request.path_params["id"],
            after=after,
            max=most,
            match=match,
            last=last,
            since=since,
            seq=seq,
        )
        read = await self.call(asked, request)
        assert isinstance(read, p.Firings)
        return json_response({"next": read.next, "lost": read.lost, "firings": read.firings})

    async def sessions(self, request: Request) -> Response:
        """The protocol's listing, and each session's ``lag`` (the page shows it)."""
        engine = self.engine
        rows = await engine.summaries(request.state.token).result()
        return json_response(
            [
                {
                    "id": s.id,
                    "head": s.head,
                    "retained": s.retained,
                    "limit": s.limit,
                    "cursors": s.cursors,
                    "waiters": engine.waiters_of(s.id),
                    "lag": s.lag,
                }
                for s in rows
            ]
        )

    async def sessions_root(self, request: Request) -> Response:
        return await (self.start(request) if request.method == "POST" else self.sessions(request))

    async def start(self, request: Request) -> Response:
        """``POST /sessions``: start a session, as ``repl start`` does. The body (JSON, or
        none) may name its ``id``, its ``buffer`` and ``exist_ok``."""
        self.engine.check_right(request.state.token, ADMIN)
        body = await _body(request)
        asked = _decode(body, _StartBody, '{"id": ID, "buffer": N, "exist_ok": true}')
        started = await self.call(
            p.Start(session=asked.id, buffer=asked.buffer, exist_ok=asked.exist_ok), request
        )
        assert isinstance(started, p.Started)
        return json_response(
            {"session": started.session, "created": started.created},
            201 if started.created else 200,
        )

    async def stop(self, request: Request) -> Response:
        """``DELETE /sessions/{id}``: stop it, as ``repl stop`` does; its waiters are told."""
        from starlette.responses import Response

        session_id = request.path_params["id"]
        self.engine.check_right(request.state.token, ADMIN, session_id)
        await self.call(p.Stop(session=session_id), request)
        return Response(status_code=204)

    async def ack(self, request: Request) -> Response:
        """``POST /sessions/{id}/cursors/{name}`` with ``{"seq": N}``: acknowledge."""
        session_id = request.path_params["id"]
        self.engine.check_right(request.state.token, READ, session_id)
        asked = _decode(await _body(request), _AckBody, '{"seq": N}')
        acked = await self.call(
            p.Ack(session=session_id, seq=asked.seq, cursor=request.path_params["name"]), request
        )
        assert isinstance(acked, p.Acked)
        return json_response({"cursor": acked.cursor, "seq": acked.seq})

    async def wait(self, request: Request) -> Response:
        """``GET /sessions/{id}/wait``: a long poll, the consumer's ``repl wait``.

        ``?ack=SEQ`` is acknowledged on the cursor first; then it answers as soon as
        firings exist after the cursor (``?cursor=``, default ``wait``; with a match
        and no cursor, the whole ring; ``?after=N``: after a seq, through no cursor),
        or at ``?timeout=`` with ``timed_out``. It acknowledges nothing of what it
        returns: the next call's ``ack`` does. Blocked, it is the engine's wait, which
        does no work; a client that hangs up releases it at once, having moved nothing.
        """
        session_id = request.path_params["id"]
        self.engine.check_right(request.state.token, READ, session_id)
        query = request.query_params
        match = _match(request)
        cursor = query.get("cursor")
        after = _number(request, "after", None)
        ack = _number(request, "ack", None)
        if after is not None and cursor is not None:
            raise BadRequest("give either ?cursor= or ?after=, not both")
        if cursor is None and after is None and match is None:
            cursor = WAIT_CURSOR
        if ack is not None and cursor is None:
            raise BadRequest(
                "?ack= needs a cursor: a wait with ?after=, or matching with no ?cursor=, "
                "acknowledges nothing"
            )
        timeout = _seconds(request, "timeout", WAIT_TIMEOUT)
        req = p.Wait(
            sessions=[session_id],
            cursor=cursor,
            timeout_ms=round(timeout * 1000),
            max=_number(request, "max", None),
            ack={} if ack is None else {session_id: ack},
            after=after,
            match=match,
        )
        job = self.handle(req, request).job
        assert isinstance(job, Wait)  # a wait is the engine's job, started here
        waited = await self._unless_gone(job, request)
        if waited is None:  # nobody to answer: the wait is released, nothing moved
            from starlette.responses import Response

            return Response(status_code=204)
        assert isinstance(waited, p.Woken)
        if waited.batches:
            (batch,) = waited.batches
            return json_response(
                {
                    "next": batch.next,
                    "lost": batch.lost,
                    "firings": batch.firings,
                    "timed_out": False,
                }
            )
        here = job.position(session_id)
        assert here is not None  # a wait times out only once it has looked
        return json_response({"next": here, "lost": 0, "firings": [], "timed_out": True})

    async def _unless_gone(self, job: Wait, request: Request) -> p.Response | None:
        """The wait's answer, or None once the client has hung up (the wait is then
        cancelled, having moved nothing).

        The wait is driven by its own callback (``_Poll``), which this request awaits,
        so its answer goes out in the first pass of the event loop after the wake;
        the loss of the connection (``_Line``, told by the protocol) ends the wait.
        This request's task is never cancelled for it. A revocation of the request's
        token answers it ``unauthorized``, as it answers a wait of the line protocol.
        """
        await _drain(request)  # a body (a GET's, unasked): read before the answer
        poll = _Poll(self.engine, request.state.token, job)
        job.start(poll.answered)
        line = _line(request.scope)
        line.listen(poll.hung_up)
        try:
            return await poll.result()
        except _Gone:
            return None
        finally:
            line.stop()

    async def page(self, request: Request) -> Response:
        """The page (``GET /``): plain HTML shipped in the package; it holds no data until
        the token is given."""
        from starlette.responses import FileResponse

        return FileResponse(WEB / "index.html", headers=PAGE_HEADERS)

    async def favicon(self, request: Request) -> Response:
        """``/favicon.ico``, which a browser asks for by itself: the page's icon (an SVG, which
        a browser takes by its type whatever the name)."""
        from starlette.responses import FileResponse

        return FileResponse(WEB / "favicon.svg", headers=PAGE_HEADERS, media_type=SVG)

    async def refused(self, request: Request, exc: Exception) -> Response:
        """Starlette's own refusals as the daemon's JSON: no route is 404 and a method its
        route does not serve 405 (with ``Allow``), both ``unknown_op``, as an op the daemon
        does not know is over the line protocol; a page file that is not there is a 404 of
        the same kind."""
        from starlette.exceptions import HTTPException

        assert isinstance(exc, HTTPException)
        path = _shown(request.url.path)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette joins a set: in order, the same every time
            allowed = ", ".join(sorted(headers.get("Allow", "").replace(" ", "").split(",")))
            headers["Allow"] = allowed
            message = f"{request.method} is not served on {path}: it takes {allowed}"
        elif exc.status_code == 404:
            message = f"no route {request.method} {path}: {ROUTES}"
        else:  # the page's files refuse nothing else, but a status is kept as it came
            message = exc.detail
        code = Code.UNKNOWN_OP if exc.status_code in (404, 405) else Code.BAD_REQUEST
        self.engine.counts.errors[code.value] += 1
        return error_response(code, message, exc.status_code, headers)

    async def failed(self, request: Request, exc: Exception) -> Response:
        """A failure of the daemon's own (a bug): 500 ``internal``, as JSON; uvicorn logs the
        traceback."""
        self.engine.counts.errors[Code.INTERNAL.value] += 1
        return error_response(
            Code.INTERNAL,
            "the daemon failed on this request: its log (daemon.log in its state directory) "
            "says why",
        )

    async def healthz(self, request: Request) -> Response:
        problem = await self.engine.health()
        if problem is None:
            return json_response({"ok": True})
        return error_response(Code.STORE_FAILED, problem, 503)

    async def hook(self, request: Request) -> Response:
        """A webhook's delivery: recorded only with a valid ``X-Hub-Signature-256``.

        The signature is GitHub's: ``sha256=`` and the HMAC-SHA256 of the raw
        body with the session's secret, compared in constant time. The
        delivery id (``X-GitHub-Delivery``, else ``Idempotency-Key``) is the
        dedup key, so a redelivery records nothing.

        The route needs no token, so its answer must not tell anyone who can
        reach the port which sessions exist or have a webhook: a wrong or
        missing signature, a session without a webhook, one that does not
        exist and an id that is not one are the same 401, byte for byte, after
        the same work (the body read, an HMAC made and compared: with a secret
        nobody has when there is no webhook).
        """
        session_id = request.path_params["id"]
        try:
            webhook = await self.engine.webhook_of(session_id).result()
        except (NoSuchSession, BadSessionId):
            webhook = None
        body = await _body(request)  # a body over 1 MiB is 413 whichever it is
        given = request.headers.get("x-hub-signature-256", "")
        secret = self._nobodys_secret if webhook is None else webhook.secret.encode()
        digest = hmac.new(secret, body, hashlib.sha256).hexdigest()
        signed = hmac.compare_digest(given.encode(), f"sha256={digest}".encode())
        if webhook is None or not signed:
            what = "a wrong" if given else "no"
            raise Unauthorized(
                f"{what} X-Hub-Signature-256: sign the body with the session's webhook secret "
                "(HMAC-SHA256, as GitHub does; `repl webhook ID --secret-file FILE` gives "
                "one); a session without a webhook, or none at all, is answered the same"
            )
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8 text") from None
        key = request.headers.get("x-github-delivery") or request.headers.get("idempotency-key")
        # what kind of delivery it is, and which one, for a reader that matches on them
        tags = {"event": request.headers.get("x-github-event", ""), "delivery": key or ""}
        tags = {name: value for name, value in tags.items() if value}
        sent = await self.engine.deliver(session_id, webhook, text, key, tags).result()
        return json_response(
            {"seq": sent.seq, "duplicate": sent.duplicate}, 200 if sent.duplicate else 201
        )

    async def metrics(self, request: Request) -> Response:
        """The daemon's counters in Prometheus's text format (prometheus_client renders them)."""
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        from starlette.responses import Response

        if request.state.token is not None:
            raise forbidden("root")
        totals = await self.engine.totals().result()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Snapshot(self.engine, totals))
        return Response(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def events(self, request: Request) -> Response:
        session_id = request.path_params["id"]
        # rights first, as for any request: a stream from the head asks only for the head
        # (``stats``, no right) before its waits, so without this a token that may not read
        # would get a 200 stream that ends at once (and an EventSource would retry for ever)
        self.engine.check_right(request.state.token, READ)
        match = _match(request)
        resume = request.headers.get("last-event-id")
        if resume is not None:
            if not _SEQ.fullmatch(resume.strip(" ")):
                raise BadRequest(f"Last-Event-ID {_shown(resume)} is not a seq")
            after: int | None = int(resume)
        else:
            after = _number(request, "after", None)
        if after is None:  # from the head: what is recorded from now on
            after = await self._head(session_id, request)
        else:  # refused now (a missing session, a seq after the head), not in the stream
            await self.call(p.Read(session=session_id, after=after, max=1), request)
        follow = _Follow(self.engine, self.streams, request.state.token, session_id, after, match)
        response: Response = _event_stream_class()(follow)
        return response

    async def _head(self, session_id: str, request: Request) -> int:
        listed = await self.call(p.Stats(session=session_id), request)
        assert isinstance(listed, p.StatsReply)
        return listed.sessions[0].head


#: an event stream's headers, as sse-starlette's ``EventSourceResponse`` sets them (with
#: its media type, ``text/event-stream; charset=utf-8``): no cache, no proxy's buffering
STREAM_HEADERS = {
    "Cache-Control": "no-store",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}
#: SSE's line ending, sse-starlette's default
SEP = "\r\n"
#: how many sessions' newest firings' frames are kept at most (``_Streams.frame``)
MAX_FRAMED = 1024


class _Follow:
    """What an event stream writes next: its waits after ``after``, one after another,
    until its client goes, and its heartbeat.

    The stream's task (the request's own) asks ``next`` for its next chunk and
    writes it. In between it awaits one future, and nothing else of the stream's
    runs: the engine's wait (a callback job, blocked with no work), the heartbeat
    (``_Streams``, one timer for every stream), a revocation of its token and
    the hang-up (``_Line``) each resolve that future. sse-starlette's
    ``EventSourceResponse`` ran a task group of four tasks per stream (the
    sender, the ping, a disconnect listener and an exit listener, each with
    its cancel scope and event, and a lock): three times what this costs
    (docs/benchmarks.md). Its framing, ``ServerSentEvent``, is what this writes.

    A batch's chunk goes on from the last event it told: a bare ``id:`` (no
    event) first of all, where the stream starts, so that a client that
    reconnects before the first firing resumes from there, with no hole; an
    ``event: lost`` before a gap, whose id is the last seq it stands for, so a
    resume counts it once; one ``event: firing`` a firing; and with a match, a
    bare ``id:`` when a batch ends past its last firing (the firings after it
    did not match), so that a resume does not look again.
    """

    __slots__ = (
        "after",
        "answer",
        "beat_due",
        "ended",
        "engine",
        "gone",
        "job",
        "match",
        "revoked",
        "session_id",
        "soon",
        "streams",
        "token",
        "woken",
    )

    def __init__(
        self,
        engine: Engine,
        streams: _Streams,
        token: TokenRecord | None,
        session_id: str,
        after: int,
        match: Match | None,
    ) -> None:
        self.engine = engine
        self.streams = streams
        self.token = token
        self.session_id = session_id
        self.after = after
        self.match = match
        self.job: Wait | None = None
        #: the wait's answer once it has one: (value, None) or (None, error)
        self.answer: tuple[p.Response | None, Exception | None] | None = None
        self.woken: asyncio.Future[None] | None = None  # what the stream's task awaits
        self.beat_due = False
        self.gone = False  # the client went away: nothing more is written
        self.revoked: Unauthorized | None = None
        self.ended = False  # over: its last chunk (``event: error``) is given, or it closed
        #: the next wait, once a wait's answer is told: it starts in the next pass of the
        #: event loop, a callback, so that every stream the same firing woke writes it
        #: before any waits again (a wait's start costs about what a write does: the last
        #: stream's write would wait for all the others' waits too, where a TCP wait is
        #: put back by its client)
        self.soon: asyncio.Handle | None = None
        if token is not None:
            engine.hold(token, self)

    def opening(self) -> bytes:
        """The first chunk: where the stream starts. Its heartbeat starts with it."""
        self.streams.add(self)
        return _position(self.after)

    async def next(self) -> bytes | None:
        """The next chunk to write, once there is one; None: the stream is over."""
        while True:
            if self.gone or self.ended:
                return None
            if self.revoked is not None:
                return self._error(self.revoked)
            if self.answer is not None:
                value, error = self.answer
                self.answer = self.job = None
                if isinstance(error, ReplError):  # stopped, the daemon closing, the store gone
                    return self._error(error)
                if error is not None:  # a failure of the daemon's own: uvicorn logs it
                    raise error
                assert isinstance(value, p.Woken)
                chunk = self._told(value)
                self.soon = asyncio.get_running_loop().call_soon(self._wait)  # see ``soon``
                return chunk
            if self.beat_due:
                self.beat_due = False
                return _ping()
            if self.job is None and self.soon is None:  # the first wait, at once
                self._wait()
                continue  # it may have its answer already: firings were there
            woken = self.woken = asyncio.get_running_loop().create_future()
            try:
                await woken
            finally:
                self.woken = None

    def close(self) -> None:
        """The stream is over, however it ended (its task cancelled too): its wait, its
        heartbeat and its hold on the token end with it."""
        self.ended = True
        if self.soon is not None:
            self.soon.cancel()
            self.soon = None
        if self.job is not None:
            self.job.cancel()  # nothing, once it has answered
            self.job = None
        self.streams.discard(self)
        if self.token is not None:
            self.engine.release(self.token, self)

    # -- what wakes the stream's task ---------------------------------------------------

    def answered(self, value: p.Response | None, error: Exception | None) -> None:
        """The wait's callback (never called once the wait is cancelled)."""
        self.answer = (value, error)
        self._wake()

    def beat(self) -> None:
        """The heartbeat's turn: a comment line goes out next."""
        self.beat_due = True
        self._wake()

    def revoke(self, error: Unauthorized) -> None:
        """The token was revoked: the stream ends with ``event: error``."""
        self.revoked = error
        self._cancel_wait()
        self._wake()

    def hung_up(self) -> None:
        """The client went away: nobody reads what the stream would write."""
        self.gone = True
        self._cancel_wait()
        self._wake()

    def _cancel_wait(self) -> None:
        if self.job is not None:
            self.job.cancel()  # it moved nothing: a stream touches no cursor
            self.job = None
            self.answer = None

    def _wake(self) -> None:
        woken = self.woken
        if woken is not None and not woken.done():
            woken.set_result(None)

    # -- the steps --------------------------------------------------------------------

    def _wait(self) -> None:
        """The next wait, after what the stream has told; refused at once (a revoked
        token, the daemon closing), that is its answer."""
        self.soon = None
        if self.gone or self.ended or self.revoked is not None:
            return
        engine = self.engine
        req = p.Wait(sessions=[self.session_id], after=self.after, match=self.match)
        try:
            job = engine.handle(req, self.token).job
        except Exception as exc:
            self.answered(None, exc)
            return
        assert isinstance(job, Wait)  # a wait is the engine's job, started here
        self.job = job
        job.start(self.answered)

    def _told(self, woken: p.Woken) -> bytes:
        """A wait's answer as one chunk of events; the stream then goes on after it."""
        after = self.after
        events = []
        for batch in woken.batches:
            if batch.lost:  # its id: the last seq it stands for, so a resume counts it once
                lost = json.dumps({"lost": batch.lost})
                events.append(_frame(event="lost", id=str(after + batch.lost), data=lost))
            told = after + batch.lost
            for firing in batch.firings:
                events.append(self.streams.frame(self.session_id, firing))
                told = firing.seq
            if batch.next > told:
                events.append(_position(batch.next))
            after = batch.next
        self.after = after
        return b"".join(events)

    def _error(self, exc: ReplError) -> bytes:
        """The last chunk: ``event: ended`` (the session stopped, the daemon closing, the
        store gone, the token revoked). Not ``error``: that is the name EventSource gives
        its own connection errors, so a listener for it would take ours for a broken
        connection (and reconnect), and ours for its own."""
        self.ended = True
        error = error_body(exc.code.value, exc.message).decode()
        return _frame(event="ended", data=error)


class _Streams:
    """What the daemon's open event streams share.

    One heartbeat: every ``HEARTBEAT`` seconds every stream writes a comment line,
    so that proxies keep it open (a stream's first within ``HEARTBEAT`` seconds of
    its start); a timer of each stream's own cost 0.6 KB a stream, and with no
    stream open there is no timer. And the frame of each session's newest firing
    told: one send to a thousand streams is framed once, not a thousand times
    (sse-starlette's framing of a firing costs more than its write).
    """

    def __init__(self) -> None:
        self.streams: set[_Follow] = set()
        self.timer: asyncio.TimerHandle | None = None
        #: a session's id -> its firing last framed, and that frame
        self.framed: dict[str, tuple[Firing, bytes]] = {}

    def frame(self, session_id: str, firing: Firing) -> bytes:
        """``event: firing``, its seq as ``id:``, its JSON as ``data:``."""
        last = self.framed.get(session_id)
        if last is not None and last[0] == firing:  # the same firing, to another stream
            return last[1]
        data = _json.encode(firing).decode()
        framed = _frame(event="firing", id=str(firing.seq), data=data)
        if len(self.framed) >= MAX_FRAMED:
            self.framed.clear()
        self.framed[session_id] = (firing, framed)
        return framed

    def add(self, stream: _Follow) -> None:
        self.streams.add(stream)
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(HEARTBEAT, self._beat)

    def discard(self, stream: _Follow) -> None:
        self.streams.discard(stream)
        if not self.streams:
            self.framed.clear()
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None

    def _beat(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(HEARTBEAT, self._beat)
        for stream in self.streams:
            stream.beat()  # only marks it, and resolves its future: none leaves the set here


class _Line:
    """Whether a request's client is still there, kept in the request's ASGI scope
    (``LINE``): the protocol (``_protocol_class``) marks it gone when its connection
    is lost before the response's end, and calls what the route left to be told.

    uvicorn tells an app so by answering ``receive`` with ``http.disconnect``, but
    only to a task blocked in ``receive``: a task of each open stream's own, with its
    frames and its future, 1.5 KB a stream, for an end told once.
    """

    __slots__ = ("gone", "then")

    def __init__(self) -> None:
        self.gone = False
        self.then: Callable[[], None] | None = None

    def listen(self, then: Callable[[], None]) -> None:
        """Call ``then`` when the client goes; at once if it has gone already."""
        if self.gone:
            then()
        else:
            self.then = then

    def stop(self) -> None:
        """The request is over: nothing more is told."""
        self.then = None

    def lost(self) -> None:
        """The protocol's: the connection is lost, the response unfinished."""
        self.gone = True
        then, self.then = self.then, None
        if then is not None:
            then()


#: the key of a request's ``_Line`` in its ASGI scope
LINE = "repl.line"


def _line(scope: MutableMapping[str, Any]) -> _Line:
    """The request's ``_Line``, made by whichever comes first: the route, or the loss."""
    line = scope.get(LINE)
    if line is None:
        line = scope[LINE] = _Line()
    assert isinstance(line, _Line)
    return line


def _frame(*, id: str | None = None, event: str | None = None, data: str | None = None) -> bytes:
    """One event as sse-starlette frames it."""
    from sse_starlette.event import ServerSentEvent

    return ServerSentEvent(data, event=event, id=id, sep=SEP).encode()


def _position(seq: int) -> bytes:
    """``event: position``: how far the stream has got (its start, or a look past firings
    that did not match), as ``id:`` with data: a client drops an event without data (the
    npm ``eventsource`` package does, and so remembers no ``Last-Event-ID`` from it), so
    one that reconnects before the next firing would resume from further back."""
    return _frame(event="position", id=str(seq), data=f'{{"after": {seq}}}')


def _ping() -> bytes:
    """The heartbeat: sse-starlette's own ping comment (``: ping - TIME``)."""
    from sse_starlette.event import ServerSentEvent

    return ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=SEP).encode()


@functools.cache
def _event_stream_class() -> Any:
    """The response of an event stream: Starlette's ``Response``, made on first use (the
    module imports without the http extra)."""
    from starlette.responses import Response

    class EventStream(Response):
        """An open event stream: its head, then ``follow``'s chunks as they come, written
        in the request's own task; its ``_Line`` tells the hang-up."""

        media_type = "text/event-stream"
        #: every stream's headers, one list (each response would make its own: 0.6 KB)
        shared_headers: list[tuple[bytes, bytes]] | None = None

        def __init__(self, follow: _Follow) -> None:
            self.follow = follow
            self.status_code = 200
            self.background = None
            if EventStream.shared_headers is None:
                self.init_headers(STREAM_HEADERS)
                EventStream.shared_headers = self.raw_headers
            self.raw_headers = EventStream.shared_headers

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            follow = self.follow
            try:
                start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                await send(start)
                if scope["method"] == "HEAD":  # its head, and no stream (sse-starlette's too)
                    await send({"type": "http.response.body", "body": b""})
                    return
                line = _line(scope)
                line.listen(follow.hung_up)
                try:
                    chunk: bytes | None = follow.opening()
                    while chunk is not None:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                        chunk = await follow.next()
                    if not follow.gone:
                        await send({"type": "http.response.body", "body": b""})
                finally:
                    line.stop()
            finally:
                follow.close()

    return EventStream


class _Gone(Exception):
    """A long poll's client hung up: nobody is there to answer."""


class _Poll:
    """A long poll's wait and its hold on its token while it waits. ``result`` gives the
    wait's answer or a revocation, whichever comes first (each releases the hold, so the
    other cannot follow), unless the client hangs up, after which nobody wants either; the
    request's end, however it comes (its task cancelled too), ends the wait if it is still
    on. An event, not a future, is awaited: a cancellation of the request's task cancels
    the event's own waiter, and this never finds its answer taken away from under it."""

    def __init__(self, engine: Engine, token: TokenRecord | None, job: Wait) -> None:
        self.engine = engine
        self.token = token
        self.job = job
        self.over = asyncio.Event()
        self.value: p.Response | None = None
        self.error: Exception | None = None
        if token is not None:
            engine.hold(token, self)

    def answered(self, value: p.Response | None, error: Exception | None) -> None:
        """The wait's callback (never called once the wait is cancelled)."""
        self._release()
        self.value, self.error = value, error
        self.over.set()

    def revoke(self, error: Unauthorized) -> None:
        """The token was revoked while the wait held it (so before its answer)."""
        self.job.cancel()
        self.answered(None, error)

    def hung_up(self) -> None:
        """The client went away: nobody wants the answer, whatever it is or would be."""
        self.job.cancel()  # nothing, once it has answered
        self.answered(None, _Gone())

    async def result(self) -> p.Response:
        try:
            await self.over.wait()
        finally:  # the answer is in, or this request ended first: the wait ends with it
            self.job.cancel()
            self._release()
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value

    def _release(self) -> None:
        if self.token is not None:
            self.engine.release(self.token, self)


class _Held:
    """An HTTP request's hold on its scoped token while it waits: a revocation cancels it."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None
        self.error: Unauthorized | None = None

    def revoke(self, error: Unauthorized) -> None:
        self.error = error
        if self.scope is not None:
            self.scope.cancel()


def _static_files() -> Any:
    from starlette.staticfiles import StaticFiles

    class Static(StaticFiles):
        """The page's files, with the page's headers."""

        async def get_response(self, path: str, scope: Any) -> Response:
            response = await super().get_response(path, scope)
            response.headers.update(PAGE_HEADERS)
            return response

    return Static


def _Static(directory: Path) -> Any:
    return _static_files()(directory=directory)


class _Snapshot:
    """A prometheus_client collector of the engine's counters as they are at this scrape.

    Names and units are Prometheus's (``_total`` for counters, seconds); no
    label is a session id, so the number of series does not grow with the
    sessions.
    """

    def __init__(self, engine: Engine, totals: Totals) -> None:
        self.engine = engine
        self.totals = totals

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        engine, counts = self.engine, self.engine.counts
        yield CounterMetricFamily(
            "repl_firings", "Firings this daemon recorded (sends and timers).", engine.firings
        )
        requests = CounterMetricFamily("repl_requests", "Requests handled, by op.", labels=["op"])
        for op, n in sorted(counts.requests.items()):
            requests.add_metric([op], n)
        yield requests
        errors = CounterMetricFamily("repl_errors", "Refusals, by wire code.", labels=["code"])
        for code, n in sorted(counts.errors.items()):
            errors.add_metric([code], n)
        yield errors
        commits = counts.commits  # the committer's writes (with Redis: its round trips)
        yield HistogramMetricFamily(
            "repl_commit_seconds",
            "How long a write to the store took: a group commit, or a Redis round trip.",
            buckets=commits.cumulative(),
            sum_value=commits.sum,
        )
        yield CounterMetricFamily(
            "repl_store_failures",
            "Writes the store refused or did not answer.",
            counts.store_failures,
        )
        yield CounterMetricFamily(
            "repl_heads_went_back",
            "Times a session's head came back from Redis below one this daemon had learned: "
            "Redis lost answered firings (a failover to a lagging replica), and their seqs go "
            "to new ones.",
            counts.heads_went_back,
        )
        yield GaugeMetricFamily("repl_sessions", "Sessions in the store.", self.totals.sessions)
        yield GaugeMetricFamily(
            "repl_lost_firings",
            "Firings the rings let go of before a reader read them.",
            self.totals.lost,
        )
        yield GaugeMetricFamily(
            "repl_waiters", "Waits blocked now (event streams too).", engine.waiting
        )
        yield GaugeMetricFamily(
            "repl_connections", "Connections of the line protocol open now.", engine.connections
        )
        yield GaugeMetricFamily(
            "repl_uptime_seconds", "Seconds since the daemon started.", engine.uptime()
        )


async def _drain(request: Request) -> None:
    """Read and drop what is left of a request's body that nobody reads (a refused one, or
    a GET's), at most ``MAX_DRAIN`` bytes for at most 2 s, before the answer: a connection
    closed with bytes unread is reset by the kernel, and the client, still sending, would
    lose the answer. Past those bounds it may (as with nginx's lingering close)."""
    from starlette.requests import ClientDisconnect

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


async def _body(request: Request) -> bytes:
    """The request's body, refused with 413 past ``MAX_BODY`` before more is read."""
    declared = request.headers.get("content-length")
    too_large = LineTooLong(f"the body is over {MAX_BODY:,} bytes: send it in parts")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
        raise too_large
    chunks = []
    size = 0
    from starlette.requests import ClientDisconnect

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
_SEQ = re.compile(r"[0-9]{1,19}")
_NUMBER = re.compile(r"-?[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,7}(\.[0-9]{1,6})?")


def _shown(value: str, most: int = 40) -> str:
    """``value`` as an error message shows it: quoted, and cut short when long."""
    return repr(value if len(value) <= most else value[:most] + "…")


def _number(request: Request, name: str, default: int | None) -> int | None:
    """A whole number of the query (ASCII digits, a minus at most), or ``BadRequest``."""
    value = request.query_params.get(name)
    if value is None:
        return default
    if not _NUMBER.fullmatch(value):
        raise BadRequest(f"?{name}={_shown(value)} is not a whole number")
    return int(value)


def _seconds(request: Request, name: str, default: float) -> float:
    """A number of seconds of the query (``30``, ``2.5``), from 0 to ``MAX_WAIT_TIMEOUT``."""
    value = request.query_params.get(name)
    if value is None:
        return default
    if not _SECONDS.fullmatch(value) or float(value) > MAX_WAIT_TIMEOUT:
        raise BadRequest(
            f"?{name}={_shown(value)} is not a number of seconds from 0 to {MAX_WAIT_TIMEOUT:g}"
        )
    return float(value)


def _tags(request: Request) -> dict[str, str]:
    """A send's ``?tag=KEY=VALUE`` words (repeatable) as its tags; ``BadTag`` when not."""
    return parse_tags(request.query_params.getlist("tag"))


def _match(request: Request) -> Match | None:
    """A reader's ``?match=KEY=VALUE`` / ``?match=KEY`` (repeatable: all must hold) and
    ``?handler=NAME``, or None when it gives neither."""
    query = request.query_params
    twice = "?match={} is given twice: which value should it have?"
    match = parse_match(query.getlist("match"), query.get("handler"), twice)
    check_match(match)  # the handler's name too
    return match


class _StartBody(msgspec.Struct, kw_only=True):
    """``POST /sessions``'s body, every field optional; unknown ones are ignored, as the
    line protocol ignores them."""

    id: str | None = None
    buffer: int | None = None
    exist_ok: bool = False


class _AckBody(msgspec.Struct, kw_only=True):
    """``POST /sessions/{id}/cursors/{name}``'s body."""

    seq: int


_Body = TypeVar("_Body", _StartBody, _AckBody)


def _decode(body: bytes, kind: type[_Body], shape: str) -> _Body:
    """A JSON body as ``kind`` (an empty one: its defaults), or ``BadRequest`` with msgspec's
    path to what is wrong and the shape it should have."""
    if not body.strip():
        body = b"{}"
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"bad body: {exc}; send {shape}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not JSON ({exc}): send {shape}") from None


class _Endpoint:
    """A route's endpoint as an ASGI app, which Starlette's ``Route`` calls as it is.

    A function endpoint Starlette runs in ``request_response``: a ``Request`` of
    its own and an exception wrapper (two closures, two coroutines) around the
    call, held for as long as the request is in flight (2 KB, for a long poll
    blocked). The guarded endpoint turns its refusals into answers itself, and
    what else it raises reaches the app's handlers all the same.
    """

    __slots__ = ("endpoint",)

    def __init__(self, endpoint: Callable[[Request], Awaitable[Response]]) -> None:
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.requests import Request

        response = await self.endpoint(Request(scope, receive, send))
        await response(scope, receive, send)


class _Front:
    """The app uvicorn runs: Starlette's, but for an event stream's request, which goes
    to its route's endpoint as soon as Starlette's own route has matched it.

    Through Starlette's stack, a request holds a frame of each layer for as long as
    it is in flight (the app, its error middleware and its closure around ``send``,
    the exception middleware and its wrapper, the router and the route): 3.5 KB for
    each open stream (docs/benchmarks.md), for layers that a stream's route never
    uses once it has answered. Starlette still matches its path (``Route.matches``),
    so a wrong method still gets Starlette's 405 from the whole stack; a failure of
    the daemon's own is still ``Api.failed``'s JSON 500, raised on for uvicorn to log,
    as Starlette's error middleware does. ``routes`` are Starlette's, all of them.
    """

    def __init__(
        self,
        app: Any,
        stream: Route,
        endpoint: Callable[[Request], Awaitable[Response]],
        failed: Callable[[Request, Exception], Awaitable[Response]],
    ) -> None:
        self.app = app
        self.routes = app.routes
        self.stream = stream
        self.endpoint = endpoint
        self.failed = failed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.routing import Match

        if scope["type"] == "http":
            matched, found = self.stream.matches(scope)
            if matched is Match.FULL:
                scope.update(found)
                response = await self._answer(scope, receive, send)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> Response:
        """The route's response, in a frame of its own, so that its ``Request`` (and the
        headers and query it parsed) is not held while the stream is open."""
        from starlette.requests import Request

        request = Request(scope, receive, send)
        try:
            return await self.endpoint(request)
        except Exception as exc:  # a failure of the daemon's own: 500, and uvicorn logs it
            await (await self.failed(request, exc))(scope, receive, send)
            raise


def make_app(engine: Engine, token: str) -> Any:
    """The ASGI app of the daemon's HTTP routes: Starlette's, streams in front (``_Front``)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Mount, Route

    api = Api(engine, token)
    guarded = api.guarded
    events = guarded(api.events)
    stream = Route("/sessions/{id}/events", events, methods=["GET"])
    routes = [
        # the page and its files need no token: they hold no data until it is given
        Route("/", guarded(api.page, open=True), methods=["GET"]),
        Mount("/static", app=_Static(directory=WEB), name="static"),
        Route("/favicon.ico", guarded(api.favicon, open=True), methods=["GET"]),
        # one route for both methods, so a 405's Allow lists every method it serves
        Route("/sessions/{id}/firings", guarded(api.firings), methods=["GET", "POST"]),
        stream,
        Route("/sessions/{id}/wait", guarded(api.wait), methods=["GET"]),
        # a cursor's name may hold a slash (any printable character but whitespace)
        Route("/sessions/{id}/cursors/{name:path}", guarded(api.ack), methods=["POST"]),
        Route("/sessions/{id}", guarded(api.stop), methods=["DELETE"]),
        Route("/sessions", guarded(api.sessions_root), methods=["GET", "POST"]),
        Route("/metrics", guarded(api.metrics), methods=["GET"]),
        Route("/healthz", guarded(api.healthz, open=True), methods=["GET"]),
        # a webhook carries its own secret: no token
        Route("/hooks/{id}", guarded(api.hook, open=True), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes, exception_handlers={HTTPException: api.refused, Exception: api.failed}
    )
    return _Front(app, stream, events.endpoint, api.failed)


async def serve_http(
    engine: Engine,
    host: str,
    port: int,
    token: str,
    idle_timeout: float,
    max_connections: int = 4096,
    tls: ssl.SSLContext | None = None,
    *,
    slow_consumer_s: float = DEFAULTS["slow_consumer_s"],
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the HTTP routes on ``host:port`` until cancelled; reports the bound port.

    uvicorn serves them in this event loop, on a socket bound here (so that a
    port in use is the same one-line refusal as the protocol's, and port 0
    reports the port it got). The daemon keeps its own signal handling: the
    server is told to stop when this task is cancelled, and given a moment
    to close its connections.
    """
    import uvicorn

    from session.errors import CannotListen

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY on an accepted connection
    # only when its socket says TCP (uvloop always does). uvicorn writes an answer's head
    # and its body apart, and with Nagle's algorithm on, the body waited for the ACK of
    # the head, which the client delays: 40 ms for every answer after the first on a
    # keep-alive connection (tests/http/test_http_inprocess.py)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise CannotListen(f"cannot serve HTTP on {host}:{port}: {exc.strerror}") from None
    config = uvicorn.Config(
        make_app(engine, token),
        http=_protocol_class(idle_timeout, max_connections, engine.counts.errors, slow_consumer_s),
        # no X-Forwarded-For: nothing here reads the client's address, and the middleware
        # would be one more frame held by every request in flight (an open stream's)
        proxy_headers=False,
        log_level="warning",
        access_log=False,
        lifespan="off",
        date_header=False,
        server_header=False,
        timeout_keep_alive=max(1, int(idle_timeout)),
        timeout_graceful_shutdown=1,
        # no limit_concurrency: the protocol class keeps --max-connections, so that what is
        # past it is answered in JSON as every other refusal
        h11_max_incomplete_event_size=64 * 1024,
    )
    if tls is not None:  # the daemon's own context (rules L1-L3), shared with the protocol's
        config.load()  # listener, so that a reload on SIGHUP serves both
        config.ssl = tls
    server = _server_class()(config)
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    task_status.started(sock.getsockname()[1])
    try:
        await asyncio.shield(serving)
    finally:
        server.stop()
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await serving
        sock.close()


def _json_headers(length: int, *, close: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % length)]
    return [*headers, (b"connection", b"close")] if close else headers


def _protocol_class(
    deadline: float, max_connections: int, errors: Counter[str], slow_consumer_s: float
) -> Any:
    """uvicorn's h11 protocol, with a deadline for each request's headers, the refusals
    uvicorn makes itself in the daemon's JSON, and the close of a slow consumer.

    uvicorn's flow control already bounds what a client that does not read
    costs (a response's write waits while the transport is past its
    high-water mark, and nothing more is read meanwhile), but not how long:
    a stream or a response whose client never reads again would hold its
    task and its connection for ever. Past the high-water mark for
    ``slow_consumer_s`` without a resume, the connection is aborted, as the
    line protocol closes one (code ``slow_consumer``, counted in
    ``repl_errors_total``); its route is told as for a client that left.

    uvicorn closes a connection idle between requests (its keep-alive
    timeout), but not one whose request never finishes arriving: a client
    that sends half a request line, or its headers a byte a minute, would
    hold a connection for ever. This closes a connection that has no
    request in progress ``deadline`` seconds after it opened or after its
    last response, as the line protocol's idle timeout does; an event
    stream, a request in progress, is never cut.

    A request h11 cannot parse is 400 ``bad_request`` (uvicorn's own answer
    is plain text), and one that arrives while the HTTP connections are
    past ``max_connections`` 503 ``too_many`` (uvicorn's ``limit_concurrency``
    with its plain text: the same count, this connection's included, taken
    at the same moment), each with ``Connection: close``.

    uvicorn's public API cannot serve these: its server takes a protocol
    class and nothing smaller (no hook for a per-request header deadline, for
    its own 400/503 bodies, or for its flow control's pause), so this
    subclasses ``H11Protocol`` and reads its ``conn``, ``cycle`` and ``flow``.
    Those are uvicorn's internals: pyproject.toml bounds uvicorn from above at
    the newest release this was tested against (0.55), so neither a user's
    install nor ``scripts/pin`` takes a newer one until the bound is moved by
    hand, with the suite passing on it.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    busy_body = error_body(
        Code.TOO_MANY,
        f"over {max_connections:,} HTTP connections (--max-connections): "
        "close one, or try again later",
    )

    async def busy(scope: Any, receive: Any, send: Any) -> None:
        errors[Code.TOO_MANY.value] += 1
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": _json_headers(len(busy_body), close=True),
            }
        )
        await send({"type": "http.response.body", "body": busy_body})

    unparsable = error_body(
        Code.BAD_REQUEST, "not a request of HTTP/1.1: see RFC 9112, or use an HTTP client"
    )

    class Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _stalled: asyncio.TimerHandle | None = None

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._stalled is None:
                self._stalled = self.loop.call_later(slow_consumer_s, self._slow)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._stalled is not None:
                self._stalled.cancel()
                self._stalled = None

        def _slow(self) -> None:
            self._stalled = None
            if self.transport.is_closing():
                return
            errors[Code.SLOW_CONSUMER.value] += 1
            unsent = self.transport.get_write_buffer_size()
            log.warning(
                "closing a slow HTTP consumer: %d bytes untaken for %g s", unsent, slow_consumer_s
            )
            self.transport.abort()

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._served = self.app

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to what h11 cannot parse, in JSON; then the close."""
            errors[Code.BAD_REQUEST.value] += 1
            headers = _json_headers(len(unparsable), close=True)
            head = self.conn.send(h11.Response(status_code=400, headers=headers))
            body = self.conn.send(h11.Data(data=unparsable))
            end = self.conn.send(h11.EndOfMessage())
            self.transport.write(b"".join(part or b"" for part in (head, body, end)))
            self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            self._deadline = self.loop.call_later(deadline, self._too_slow)

        def _busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def handle_events(self) -> None:
            over = len(self.connections) > max_connections or len(self.tasks) > max_connections
            self.app = busy if over else self._served  # the app for requests taken now
            super().handle_events()
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not self.conn.trailing_data[0]:
                # the body is in, and nothing of a next request waits behind it: read on.
                # uvicorn pauses reading when a body's part takes its buffer over 64 KiB,
                # and only the route's next receive resumes it; after the last part there
                # is none, so an open stream or long poll would never hear its client go
                self.flow.resume_reading()
            if self._busy() and self._deadline is not None:
                self._deadline.cancel()  # its headers are in: the request runs as long as it must
                self._deadline = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _too_slow(self) -> None:
            self._deadline = None
            if not self._busy() and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if self._stalled is not None:
                self._stalled.cancel()
                self._stalled = None
            unfinished = self._busy()
            super().connection_lost(exc)
            if unfinished:  # an open stream, a long poll: the route is told (``_Line``)
                assert self.cycle is not None
                scope = cast("MutableMapping[str, Any]", self.cycle.scope)  # a TypedDict
                _line(scope).lost()

    return Protocol


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, with no signal handlers of its own and no 0.1 s ticker:
        it sleeps until it is told to stop."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self._stop = asyncio.Event()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the daemon's own handlers stay: SIGTERM stops the whole daemon

        async def main_loop(self) -> None:
            await self.on_tick(0)  # the default headers, once
            await self._stop.wait()

        def stop(self) -> None:
            self.should_exit = True
            self._stop.set()

    return Server
