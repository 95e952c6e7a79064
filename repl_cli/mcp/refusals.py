"""Every refusal of ``/mcp`` in the daemon's words: JSON ``{"code", "message"}`` (SPEC §17).

Every other refusal of the daemon's HTTP is that JSON (``repl_daemon.http.answers``),
and so are the refusals ``/mcp`` makes itself (the token's 401, a bad query's 400, a
``Last-Event-ID`` no longer kept). The SDK's are not: its DNS-rebinding check answers
a foreign ``Host`` with a plain-text 421 and a foreign ``Origin`` with a plain-text 403,
and its transport refuses a request it cannot serve (no such MCP session, none named,
a method it does not take, an ``Accept`` it cannot meet, a second GET stream) with a
JSON-RPC error that answers no message (``"id": null``). ``refusing`` rewrites those
as they are sent: the status kept, the code the status has in the daemon's table, the
message saying what to do, and the headers that still hold (``Allow``,
``Mcp-Session-Id``). A JSON-RPC error that answers a message (one with its id, or a
parse error, whose id could not be read) is MCP's own answer, which an MCP client
reads (the 2026-07-28 protocol answers an unknown method with 404 and -32601), and is
left as it is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from mcp.types import PARSE_ERROR

if TYPE_CHECKING:
    from starlette.types import Message, Scope, Send

#: a refusal's code by its status (``repl_daemon.http.answers.STATUS``, the other way)
CODES = {
    403: "forbidden",
    404: "no_such_session",
    405: "unknown_op",
    413: "line_too_long",
    500: "internal",
    503: "too_many",
}
#: the headers a rewritten refusal keeps
KEPT = (b"allow", b"mcp-session-id", b"www-authenticate")


def header(headers: Any, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in headers if k.lower() == name), "")


def said(status: int, scope: Scope, given: str) -> str:
    """What a refusal of the SDK's says, in the daemon's words: what to do."""
    headers = scope["headers"]
    if status == 421:
        return (
            f"Host {header(headers, b'host')!r} is not this listener's own: /mcp on a "
            "loopback listener answers only requests sent to its own address, as "
            "http://127.0.0.1:PORT/mcp (DNS rebinding)"
        )
    if status == 403 and "Origin" in given:
        return (
            f"Origin {header(headers, b'origin')!r} is not this listener's own: a page "
            "of another site may not call /mcp on a loopback listener (DNS rebinding)"
        )
    if status == 404:
        named = header(headers, b"mcp-session-id")[:64]
        return (
            f"no MCP session {named!r}: it ended (a DELETE, 30 minutes idle, the daemon "
            "restarted) or was another token's: initialize a new one, without Mcp-Session-Id"
        )
    if status == 400 and "Missing session ID" in given:
        return (
            "this request names no MCP session: give the Mcp-Session-Id header that the "
            "answer to initialize gave (only an initialize starts one)"
        )
    if status == 400 and "Content-Type" in given:
        return "a POST to /mcp carries a JSON-RPC message: give Content-Type: application/json"
    if status == 406:
        return (
            "give Accept: application/json, text/event-stream (a POST is answered with "
            "either; a GET with text/event-stream)"
        )
    if status == 405:
        return f"{scope['method']} is not served on /mcp: it takes DELETE, GET and POST"
    if status == 409:
        return (
            "this MCP session has its GET stream open already: one at a time (to resume a "
            "cut one, give Last-Event-ID)"
        )
    return given.removeprefix("Bad Request: ")


def answers_a_message(answer: Any) -> bool:
    """Whether ``answer`` is a JSON-RPC error answering a message: MCP's, kept as it is."""
    if not isinstance(answer, dict) or "jsonrpc" not in answer:
        return False
    error = answer.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return answer.get("id") is not None or code == PARSE_ERROR


def rewritten(scope: Scope, start: Message, body: bytes) -> tuple[Message, bytes] | None:
    """The refusal ``start`` and ``body`` as the daemon's JSON; None to send it as it is."""
    try:
        answer = json.loads(body) if body else None
    except ValueError:
        answer = None
    if answers_a_message(answer):
        return None
    if isinstance(answer, dict) and isinstance(answer.get("code"), str):
        return None  # the daemon's JSON already
    given = body.decode("utf-8", "replace").strip()
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        given = str(answer["error"].get("message", given))
    status = start["status"]
    code = CODES.get(status, "bad_request")
    refusal = {"code": code, "message": said(status, scope, given)}
    text = json.dumps(refusal, separators=(",", ":")).encode()
    headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() in KEPT]
    headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(text))]
    return {**start, "headers": headers}, text


def refusing(scope: Scope, send: Send) -> Send:
    """``send``, through which a refusal (a status of 400 or more) goes as the daemon's JSON:
    its start is held until its body is whole, then both are sent, rewritten or not."""
    held: Message | None = None
    chunks: list[bytes] = []

    async def sent(message: Message) -> None:
        nonlocal held
        if held is None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(chunks)
        answer = rewritten(scope, held, body)
        start, body = (held, body) if answer is None else answer
        await send(start)
        await send({"type": "http.response.body", "body": body})

    return sent


__all__ = ["refusing", "rewritten"]
