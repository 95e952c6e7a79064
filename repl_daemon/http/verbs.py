"""The generic route: every verb whose row in the table (``repl_daemon.protocol.VERBS``)
has an ``Http`` is served by ``route``, with no code of its own.

A request of such a route becomes one request of the line protocol: its path's
fields (``/sessions/{session}/claims/{claim}/done``), then its query's (a field
``X_ms`` given as ``?X=``, in seconds or as a duration: ``?lease=90``,
``?lease=5m``; a list as its word once for each item: ``?corr=A&corr=B``), then its
JSON body's (the row's ``body`` fields, every other field of the body refused,
naming it), typed by the request's own Struct. The token's right on the session is
checked first, as the engine would (so a token that may not do it is told so before
anything about its input), then the engine answers, and the answer is the body: the
whole of it but ``id`` and ``ok``, or the one field the row names (a listing), with
the row's status.

A long poll (``Verb.long_poll``: a gather, a join) is served as the wait's own long
poll is: ``?timeout=`` seconds (default 30, at most an hour), its answer ``200`` once
it has one, and ``200`` at the timeout too, with ``timed_out`` and what its answer
says then (what came, what is missing, what is left: a 204 could not say it). Blocked,
it is the engine's wait, no task and no work; a client that hangs up lets it go, and a
revocation of its token answers it ``401``. One whose answer is a claim's
(``done --next``: ``p.Claimed`` with a claim token) gives its firing back when its
client went before the answer was written in full, as the claim's own route does.

What is served by hand (``routes.Api``), and why: a send (its body is the text,
its dedup key a header, its status says whether it was a duplicate), a read and a
wait (HTTP's own defaults for where they start, and a wait on several sessions'
acks), a start (its body names ``id``, its status says whether it made the session),
a claim (its path is the group's, ``?match=`` a wait's, a 204 when nothing was
taken), the listing (each session's lag beside the protocol's row), the event
stream, webhooks, metrics and the page.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec.inspect import ListType
from starlette.responses import Response
from starlette.routing import Route

from repl_daemon import protocol as p
from repl_daemon.engine.claim import give_back
from repl_daemon.http.answers import WAIT_TIMEOUT, encoder
from repl_daemon.http.consumer import Handed
from repl_daemon.http.query import (
    decode,
    query_duration,
    query_flag,
    query_number,
    query_seconds,
    read_body,
)
from session.errors import BadRequest

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from repl_daemon.http.routes import Api

MS = "_ms"
#: a long poll's bound, its query's ``?timeout=``
TIMEOUT = "timeout_ms"


def routes(api: Api) -> Iterator[Route]:
    """A route for every verb of the table that HTTP serves by the generic route."""

    for verb in p.VERBS:
        if isinstance(verb.http, p.Http):
            endpoint = api.guarded(Served(api, verb, verb.http))
            yield Route(verb.http.path, endpoint, methods=list(verb.http.methods))


class Served:
    """One verb's endpoint: its request made from the path, the query and the body."""

    def __init__(self, api: Api, verb: p.Verb, http: p.Http) -> None:
        self.api = api
        self.verb = verb
        self.http = http
        info = msgspec.inspect.type_info(verb.request)
        assert isinstance(info, msgspec.inspect.StructType)
        self.fields = {f.encode_name: f for f in info.fields if f.encode_name not in ("op", "id")}
        self.body = body_struct(verb.request.__name__, self.fields, http.body)
        #: each field's word in the query (``X_ms``: ``X``), but the row's own
        self.words = {name: name.removesuffix(MS) for name in self.fields} | dict(http.query)

    async def __call__(self, request: Request) -> Response:

        token = request.state.token
        given: dict[str, Any] = dict(request.path_params)
        if self.verb.right:  # rights first, as the engine checks them
            self.api.engine.check_right(token, self.verb.right, given.get("session"))
        given.update(self.query(request, set(given)))
        if self.body is not None:
            asked = decode(await read_body(request), self.body, self.http.example)
            given.update(msgspec.structs.asdict(asked))
        for name, field in self.fields.items():
            if field.required and name not in given:  # only the query's can be missing here
                word = self.words[name]
                each = f" once for each {word}" if isinstance(scalar(field.type), ListType) else ""
                raise BadRequest(f"?{word}= is missing: give it{each}")
        try:
            req = msgspec.convert(given, self.verb.request)
        except msgspec.ValidationError as exc:  # a field the path gave, of the wrong shape
            raise BadRequest(f"bad request: {exc}") from None
        if self.verb.long_poll:
            polled = await self.api.polled(req, request)
            if polled is None:  # nobody to answer: the wait is released, nothing moved
                return Response(status_code=204)
            answer = polled
        else:
            answer = await self.api.call(req, request)
        if self.http.status == 204:
            return Response(status_code=204)
        body = encoded(answer, self.http.answer)
        if isinstance(answer, p.Claimed) and answer.claim is not None:  # done --next's
            return self.handed(body, req, answer.claim, request)
        return Response(body, self.http.status, media_type="application/json")

    def handed(self, body: bytes, req: p.Request, claim: str, request: Request) -> Response:
        """A claim's answer (``done --next``'s), given back when its client is gone before
        the answer was written in full, as ``routes.Api.claim``'s is (``Handed``)."""
        session_id = getattr(req, "session")  # noqa: B009 - a claim's request has one
        token = request.state.token
        return Handed(body, lambda: give_back(self.api.engine, session_id, claim, token))

    def query(self, request: Request, taken: set[str]) -> dict[str, Any]:
        """The query's fields of the request, each of its type: a number, a yes or no, a
        length (``X_ms`` as ``?X=``), a word; a query word no field has is let be."""
        given: dict[str, Any] = {}
        if self.verb.long_poll:  # bounded as every long poll of HTTP is
            timeout = query_seconds(request, TIMEOUT.removesuffix(MS), WAIT_TIMEOUT)
            given[TIMEOUT] = round(timeout * 1000)
        for name, field in self.fields.items():
            if name in taken or name in given or name in self.http.body:
                continue
            asked = self.words[name]
            if asked not in request.query_params:
                continue
            kind = scalar(field.type)
            if isinstance(kind, ListType):
                given[name] = request.query_params.getlist(asked)
            elif name.endswith(MS):
                given[name] = query_duration(request, asked, 0)
            elif isinstance(kind, msgspec.inspect.IntType):
                given[name] = query_number(request, asked, None)
            elif isinstance(kind, msgspec.inspect.BoolType):
                given[name] = query_flag(request, asked)
            else:
                given[name] = request.query_params[asked]
        return given


def scalar(kind: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """``kind`` without its ``None`` (``int | None`` is an int, as a query gives it), and
    without its description (an ``Annotated`` field's ``Metadata``)."""
    if isinstance(kind, msgspec.inspect.Metadata):
        kind = kind.type
    if isinstance(kind, msgspec.inspect.UnionType):
        kinds = [k for k in kind.types if not isinstance(k, msgspec.inspect.NoneType)]
        if len(kinds) == 1:
            return kinds[0]
    return kind


def body_struct(
    name: str, fields: dict[str, msgspec.inspect.Field], body: tuple[str, ...]
) -> type[msgspec.Struct] | None:
    """The Struct a route's JSON body is decoded as: the request's ``body`` fields, with
    their defaults, and no other (a misspelt field is refused, naming it)."""
    if not body:
        return None
    made: list[Any] = []
    for field in (fields[f] for f in body):
        python = _python_type(field.type)
        if field.required:
            made.append((field.encode_name, python))
        elif field.default_factory is not msgspec.NODEFAULT:
            made.append(
                (field.encode_name, python, msgspec.field(default_factory=field.default_factory))
            )
        else:
            made.append((field.encode_name, python, field.default))
    return msgspec.defstruct(f"{name}Body", made, kw_only=True, forbid_unknown_fields=True)


def _python_type(kind: msgspec.inspect.Type) -> Any:
    """The Python annotation of a body field's msgspec type (the few kinds bodies hold)."""
    if isinstance(kind, msgspec.inspect.UnionType):
        parts = tuple(_python_type(k) for k in kind.types)
        union: Any = parts[0]
        for part in parts[1:]:
            union = union | part
        return union
    simple = {
        msgspec.inspect.IntType: int,
        msgspec.inspect.BoolType: bool,
        msgspec.inspect.StrType: str,
        msgspec.inspect.FloatType: float,
        msgspec.inspect.NoneType: type(None),
    }
    for inspected, python in simple.items():
        if isinstance(kind, inspected):
            return python
    raise TypeError(f"a body field of type {kind!r} is not served by the generic route")


def encoded(answer: p.Response, field: str | None) -> bytes:
    """The body of an answer: its ``field`` alone, or every field but ``id`` and ``ok``."""
    if field is not None:
        return encoder.encode(getattr(answer, field))
    whole = msgspec.structs.asdict(answer)
    return encoder.encode({k: v for k, v in whole.items() if k not in ("id", "ok")})
