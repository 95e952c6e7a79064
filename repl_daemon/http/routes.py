"""The routes: each turns a request into one request of the line protocol for the one
``Engine`` and its answer into JSON; the token checked first (``Api.guarded``)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from repl_daemon import protocol as p
from repl_daemon.engine.claim import give_back
from repl_daemon.engine.engine import REVOKED
from repl_daemon.engine.outcome import Outcome
from repl_daemon.engine.wait import Wait
from repl_daemon.http.answers import (
    NO_TOKEN,
    PAGE_HEADERS,
    ROUTES,
    SVG,
    WAIT_TIMEOUT,
    WEB,
    encoder,
    error_response,
    json_response,
)
from repl_daemon.http.consumer import Gone, Handed, Held, Poll
from repl_daemon.http.metrics import Collector
from repl_daemon.http.query import (
    SEQ,
    StartBody,
    acks_of,
    decode,
    drain,
    match_of,
    query_duration,
    query_flag,
    query_number,
    query_seconds,
    read_body,
    shown,
    tags_of,
)
from repl_daemon.http.streams import EventStream, Follow, Streams, line_of
from session.errors import (
    BadRequest,
    BadSessionId,
    Code,
    NoSuchSession,
    ReplError,
    Unauthorized,
)
from session.rules import ADMIN, DEFAULT_HANDLER, DEFAULT_LEASE_MS, READ, WAIT_CURSOR
from session.scopes import TokenRecord, forbidden, scoped_refusal

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import Receive, Scope, Send

    from repl_daemon.engine import Engine


class Api:
    """The routes, over one engine and the daemon's root token."""

    def __init__(self, engine: Engine, token: str) -> None:
        self.engine = engine
        self._token = token.encode()
        #: what a delivery to no webhook is signed against, so that it costs what a real
        #: one does: a secret of this process's alone, never stored, never told
        self._nobodys_secret = secrets.token_bytes(32)
        self.streams = Streams()

    # -- plumbing ---------------------------------------------------------------

    async def authenticate(self, request: Request) -> TokenRecord | None:
        """The request's token: None for the root; ``Unauthorized`` for none or a wrong one."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise Unauthorized(NO_TOKEN)
        return await self.engine.authenticate(given.strip(), self._token).result()

    async def call(self, req: p.Request, request: Request) -> p.Response:
        """``req`` handled by the engine with the request's token; a blocked one (a wait)
        holds the token, and its revocation answers it ``unauthorized``."""
        return await self.answer(self.handle(req, request), request)

    def handle(self, req: p.Request, request: Request) -> Outcome[p.Response]:
        """``req`` given to the engine with the request's token: refused at once, or its
        outcome (for a wait, the job that blocks: ``answer`` awaits it)."""
        return self.engine.handle(req, request.state.token)

    async def answer(self, outcome: Outcome[p.Response], request: Request) -> p.Response:
        """``outcome``'s answer; a revocation of the request's token ends a blocked one."""
        engine = self.engine
        token: TokenRecord | None = request.state.token
        if token is None or outcome.job is None:
            return await outcome.result()
        held = Held()
        engine.hold(token, held)
        try:
            with anyio.CancelScope() as held.scope:
                return await outcome.result()
        finally:
            engine.unhold(token, held)
        raise held.error or Unauthorized(REVOKED)

    def guarded(
        self, route: Callable[[Request], Awaitable[Response]], *, open: bool = False
    ) -> Endpoint:
        """``route`` behind the token (unless ``open``), its refusals as JSON errors."""

        errors = self.engine.counts.errors

        async def endpoint(request: Request) -> Response:
            request.state.token = None
            if not open:
                try:
                    request.state.token = await self.authenticate(request)
                except ReplError as exc:  # a wrong token, or the store that keeps tokens away
                    errors[exc.code.value] += 1
                    await drain(request)
                    challenge = {"WWW-Authenticate": "Bearer"}
                    headers = challenge if exc.code is Code.UNAUTHORIZED else None
                    return error_response(exc.code.value, exc.message, headers=headers)
            try:
                response = await route(request)
                await drain(request)  # a body the route did not want (a GET's): see drain
                return response
            except ReplError as exc:
                errors[exc.code.value] += 1
                if exc.code is not Code.LINE_TOO_LONG:  # that one is refused unread, on purpose
                    await drain(request)
                if request.state.token is not None:  # a missing session with its own advice
                    exc = scoped_refusal(request.state.token.scope, exc)
                return error_response(exc.code.value, exc.message)

        return Endpoint(endpoint)

    # -- the routes -------------------------------------------------------------

    async def send(self, request: Request) -> Response:
        body = await read_body(request)
        try:
            text = body.decode()
        except UnicodeDecodeError:
            raise BadRequest("the body is not UTF-8 text") from None
        handler = request.query_params.get("handler", DEFAULT_HANDLER)
        tags = tags_of(request)
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
        match = match_of(request)
        last, seq = query_number(request, "last", None), query_number(request, "seq", None)
        since = request.query_params.get("since")
        compound = last is not None or seq is not None or since is not None
        # a matching read given no ``after`` looks at the whole ring (an early reply is found)
        after = query_number(request, "after", None if match or compound else 0)
        most = query_number(request, "max", None)
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
        body = await read_body(request)
        asked = decode(body, StartBody, '{"id": ID, "buffer": N, "exist_ok": true}')
        started = await self.call(
            p.Start(session=asked.id, buffer=asked.buffer, exist_ok=asked.exist_ok), request
        )
        assert isinstance(started, p.Started)
        return json_response(
            {"session": started.session, "created": started.created},
            201 if started.created else 200,
        )

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
        match = match_of(request)
        cursor = query.get("cursor")
        after = query_number(request, "after", None)
        ack = query_number(request, "ack", None)
        if after is not None and cursor is not None:
            raise BadRequest("give either ?cursor= or ?after=, not both")
        if cursor is None and after is None and match is None:
            cursor = WAIT_CURSOR
        if ack is not None and cursor is None:
            raise BadRequest(
                "?ack= needs a cursor: a wait with ?after=, or matching with no ?cursor=, "
                "acknowledges nothing"
            )
        timeout = query_seconds(request, "timeout", WAIT_TIMEOUT)
        req = p.Wait(
            sessions=[session_id],
            cursor=cursor,
            timeout_ms=round(timeout * 1000),
            max=query_number(request, "max", None),
            ack={} if ack is None else {session_id: ack},
            after=after,
            match=match,
        )
        job = self.handle(req, request).job
        assert isinstance(job, Wait)  # a wait is the engine's job, started here
        waited = await self._unless_gone(job, request)
        if waited is None:  # nobody to answer: the wait is released, nothing moved
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

    async def waits(self, request: Request) -> Response:
        """``GET /wait?session=A&session=B``: a long poll on several sessions, ``repl wait A
        B`` (rule 14).

        It answers as soon as one of them has firings after the cursor, or with
        ``?all=true`` once every one of them has (SPEC §18's join: early arrivals count
        at once), their batches in the order named; at ``?timeout=`` with
        ``timed_out`` and no batch. ``?ack=ID:SEQ`` (once for each session) is
        acknowledged first, as the one session's wait takes ``?ack=``; ``?cursor=``,
        ``?max=``, ``?match=`` and ``?handler=`` as there. Nothing it returns is
        acknowledged: the next call's acks do that, all of a join's together.
        """
        query = request.query_params
        sessions = query.getlist("session")
        self.engine.check_right(request.state.token, READ, sessions[0] if sessions else None)
        if not sessions:
            raise BadRequest("give ?session=ID, once for each session to wait on")
        match = match_of(request)
        cursor = query.get("cursor")
        if cursor is None and match is None:
            cursor = WAIT_CURSOR
        acks = acks_of(request)
        if acks and cursor is None:
            raise BadRequest("?ack= needs a cursor: matching with no ?cursor= acknowledges nothing")
        req = p.Wait(
            sessions=sessions,
            cursor=cursor,
            timeout_ms=round(query_seconds(request, "timeout", WAIT_TIMEOUT) * 1000),
            max=query_number(request, "max", None),
            ack=acks,
            match=match,
            all=query_flag(request, "all"),
        )
        woken = await self.polled(req, request)
        if woken is None:  # nobody to answer: the wait is released, nothing moved
            return Response(status_code=204)
        assert isinstance(woken, p.Woken)
        return json_response({"batches": woken.batches, "timed_out": woken.timed_out})

    async def polled(self, req: p.Request, request: Request) -> p.Response | None:
        """A long poll's answer (``req`` a wait, a claim, a gather, a join: the engine's
        wait, started here), or None when its client hung up first (``_unless_gone``)."""
        job = self.handle(req, request).job
        assert isinstance(job, Wait)
        return await self._unless_gone(job, request)

    async def _unless_gone(self, job: Wait, request: Request) -> p.Response | None:
        """The wait's answer, or None when the client hung up before it (the wait is then
        cancelled, having moved nothing; a claim's, having taken nothing).

        The wait is driven by its own callback (``Poll``), which this request awaits,
        so its answer goes out in the first pass of the event loop after the wake;
        the loss of the connection (``Line``, told by the protocol) ends the wait.
        This request's task is never cancelled for it. A revocation of the request's
        token answers it ``unauthorized``, as it answers a wait of the line protocol.
        """
        await drain(request)  # a body (a GET's, unasked): read before the answer
        poll = Poll(self.engine, request.state.token, job)
        job.start(poll.answered)
        line = line_of(request.scope)
        line.listen(poll.hung_up)
        try:
            return await poll.result()
        except Gone:
            return None
        finally:
            line.stop()

    # -- groups and claims (SPEC §16) --------------------------------------------

    async def claim(self, request: Request) -> Response:
        """``POST /sessions/{id}/groups/{name}/claim``: a long poll, ``repl claim``.

        It answers as soon as the group has a firing no other claimer holds (oldest
        first), taken under a lease of ``?lease=`` (default 60 s): ``200`` with the
        claim and the firing; at ``?timeout=`` (default 30 s) ``204``, nothing taken.
        ``?match=``/``?handler=`` as a wait's; ``?from_now=true`` for a group it makes.
        Blocked, it is the engine's claim, a wait that does no work; a client that
        hangs up before its answer takes nothing, and one gone before the answer was
        written gives the firing back (``Handed``).
        """

        session_id = request.path_params["id"]
        token = request.state.token
        self.engine.check_right(token, READ, session_id)
        timeout = query_seconds(request, "timeout", WAIT_TIMEOUT)
        req = p.Claim(
            session=session_id,
            group=request.path_params["name"],
            lease_ms=query_duration(request, "lease", DEFAULT_LEASE_MS),
            timeout_ms=round(timeout * 1000),
            match=match_of(request),
            from_now=query_flag(request, "from_now"),
        )
        claimed = await self.polled(req, request)  # a wait whose look claims (engine.claim)
        if claimed is None:  # nobody to answer: nothing was taken
            return Response(status_code=204)
        assert isinstance(claimed, p.Claimed)
        if claimed.timed_out or claimed.claim is None:
            return Response(status_code=204)
        claim = claimed.claim
        body = encoder.encode(
            {
                "claim": claim,
                "seq": claimed.seq,
                "attempt": claimed.attempt,
                "lease_until": claimed.lease_until,
                "lease_until_ms": claimed.lease_until_ms,
                "lost": claimed.lost,
                "firing": claimed.firing,
            }
        )
        response: Response = Handed(body, lambda: give_back(self.engine, session_id, claim, token))
        return response

    async def page(self, request: Request) -> Response:
        """The page (``GET /``): plain HTML shipped in the package; it holds no data until
        the token is given."""

        return FileResponse(WEB / "index.html", headers=PAGE_HEADERS)

    async def favicon(self, request: Request) -> Response:
        """``/favicon.ico``, which a browser asks for by itself: the page's icon (an SVG, which
        a browser takes by its type whatever the name)."""

        return FileResponse(WEB / "favicon.svg", headers=PAGE_HEADERS, media_type=SVG)

    async def refused(self, request: Request, exc: Exception) -> Response:
        """Starlette's own refusals as the daemon's JSON: no route is 404 and a method its
        route does not serve 405 (with ``Allow``), both ``unknown_op``, as an op the daemon
        does not know is over the line protocol; a page file that is not there is a 404 of
        the same kind."""

        assert isinstance(exc, HTTPException)
        path = shown(request.url.path)
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
        return error_response(code, message, exc.status_code, headers, own=True)

    async def failed(self, request: Request, exc: Exception) -> Response:
        """A failure of the daemon's own (a bug): 500 ``internal``, as JSON; uvicorn logs the
        traceback."""
        self.engine.counts.errors[Code.INTERNAL.value] += 1
        return error_response(
            Code.INTERNAL,
            "the daemon failed on this request: its log (daemon.log in its state directory) "
            "says why",
            own=True,
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
        body = await read_body(request)  # a body over 1 MiB is 413 whichever it is
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

        if request.state.token is not None:
            raise forbidden("root")
        totals = await self.engine.totals().result()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Collector(self.engine, totals))
        return Response(generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def events(self, request: Request) -> Response:
        session_id = request.path_params["id"]
        # rights first, as for any request: a stream from the head asks only for the head
        # (``stats``, no right) before its waits, so without this a token that may not read
        # would get a 200 stream that ends at once (and an EventSource would retry for ever)
        self.engine.check_right(request.state.token, READ)
        match = match_of(request)
        resume = request.headers.get("last-event-id")
        if resume is not None:
            if not SEQ.fullmatch(resume.strip(" ")):
                raise BadRequest(f"Last-Event-ID {shown(resume)} is not a seq")
            after: int | None = int(resume)
        else:
            after = query_number(request, "after", None)
        if after is None:  # from the head: what is recorded from now on
            after = await self._head(session_id, request)
        else:  # refused now (a missing session, a seq after the head), not in the stream
            await self.call(p.Read(session=session_id, after=after, max=1), request)
        follow = Follow(self.engine, self.streams, request.state.token, session_id, after, match)
        response: Response = EventStream(follow)
        return response

    async def _head(self, session_id: str, request: Request) -> int:
        listed = await self.call(p.Stats(session=session_id), request)
        assert isinstance(listed, p.StatsReply)
        return listed.sessions[0].head


class Endpoint:
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

        response = await self.endpoint(Request(scope, receive, send))
        await response(scope, receive, send)
