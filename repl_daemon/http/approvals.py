"""Approvals over HTTP (SPEC §19, docs/semantics.md P4): the permission prompts that
``repl mcp --approvals SESSION`` (or ``/mcp?approvals=SESSION``) recorded, listed, and a
verdict given as the request's token, for the page and any program.

- ``GET /sessions/{id}/approvals``: the prompts still pending, oldest first;
  ``?all=true`` every prompt the ring holds, with the verdict that counts (the audit).
  Each as ``repl approvals --json`` prints it: ``{"prompt", "verdict", "verdicts"}``.
- ``GET /sessions/{id}/approvals/{request_id}``: that one prompt, so.
- ``POST /sessions/{id}/approvals/{request_id}`` with ``{"behavior": "allow"|"deny",
  "reason": TEXT}``: the verdict, a firing sent with the request's token (its ``by``);
  ``201`` with it once it is the one that counts. Refused as the API refuses: ``400`` a
  request id or behavior that is none, ``404 no_such_prompt``, ``409 already_answered``
  (nothing recorded; or recorded, when another verdict came first meanwhile), ``403
  forbidden`` when the token is none of the prompt's approvers (the verdict recorded
  and kept, as the audit).

Rights: a listing needs ``read``, a verdict ``send`` (it is a send). The daemon reads the
prompt itself for a verdict, in the token's own sessions, so a token that may only send
(a bridge that was handed the request id) answers too. Nothing here decides anything:
each step is an op of the engine (``read`` matching ``approval``, ``send``) and
``session.approvals``'s rule over what it gives, the rule ``repl approve`` and the relay
read the session with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from repl_daemon import protocol as p
from repl_daemon.http.answers import json_response
from repl_daemon.http.query import decode, query_flag, read_body
from session import approvals as ap
from session.firing import Firing
from session.rules import READ, SEND
from session.scopes import Scope, TokenRecord
from session.tags import Match

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from repl_daemon.http.routes import Api


class VerdictBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A verdict's body: ``behavior`` (allow or deny), and ``reason``, its text."""

    behavior: str
    reason: str = ""


SHAPE = '{"behavior": "allow" or "deny", "reason": TEXT}'


class Approvals:
    """The routes of approvals, over the API's engine and its token checks."""

    def __init__(self, api: Api) -> None:
        self.api = api

    async def listed(self, request: Request) -> Response:
        """``GET /sessions/{id}/approvals``: pending; ``?all=true`` every prompt."""
        session = request.path_params["id"]
        token: TokenRecord | None = request.state.token
        self.api.engine.check_right(token, READ, session)
        every = query_flag(request, "all")
        entries = await self._read(session, None, token)
        shown = [e for e in ap.answered(entries).values() if every or e.verdict is None]
        return json_response(shown)

    async def one(self, request: Request) -> Response:
        """``GET`` or ``POST /sessions/{id}/approvals/{request_id}``: the prompt, or a
        verdict on it."""
        session, request_id = request.path_params["id"], request.path_params["request_id"]
        token: TokenRecord | None = request.state.token
        engine = self.api.engine
        if request.method == "GET":
            engine.check_right(token, READ, session)
            ap.check_request_id(request_id)
            return json_response(await self._prompt(session, request_id, token))
        engine.check_right(token, SEND, session)  # rights first, as for every request
        ap.check_request_id(request_id)
        asked = decode(await read_body(request), VerdictBody, SHAPE)
        tags = ap.verdict_tags(request_id, asked.behavior)
        looker = reader(token)
        ap.unanswered(await self._prompt(session, request_id, looker))
        sent = await engine.handle(
            p.Send(session=session, text=asked.reason, handler=ap.VERDICT_HANDLER, tags=tags),
            token,
        ).result()
        assert isinstance(sent, p.Sent)
        given = ap.counted(await self._prompt(session, request_id, looker), sent.seq)
        return json_response(given, 201)

    async def _prompt(
        self, session: str, request_id: str, token: TokenRecord | None
    ) -> ap.Answered:
        return ap.prompt_in(await self._read(session, request_id, token), session, request_id)

    async def _read(
        self, session: str, request_id: str | None, token: TokenRecord | None
    ) -> list[Firing]:
        """The session's prompts and verdicts (of ``request_id``, or all): one matching
        read of the whole ring, through no cursor."""
        asked = p.Read(session=session, match=Match({ap.APPROVAL: request_id}))
        found = await self.api.engine.handle(asked, token).result()
        assert isinstance(found, p.Firings)
        return found.firings


def reader(token: TokenRecord | None) -> TokenRecord | None:
    """The token a verdict's prompt is read with: the request's, in its own sessions, with
    the right to read them for this (the verdict is what it sends)."""
    if token is None or READ in token.scope.rights:
        return token
    scope = Scope(token.scope.patterns, token.scope.rights | {READ})
    return msgspec.structs.replace(token, scope=scope)
