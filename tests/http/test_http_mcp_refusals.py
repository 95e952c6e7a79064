"""``repl_cli.mcp.refusals`` by itself: a refusal of the SDK's rewritten as the daemon's JSON as
it is sent, whatever its status and however its body comes (docs/semantics.md M7); what is
no refusal, or MCP's own answer to a message, sent as it came. (Each refusal /mcp makes, end
to end: tests/http/test_http_mcp.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from repl_cli.mcp.refusals import refusing

pytestmark = pytest.mark.anyio

SCOPE = {"method": "POST", "headers": [(b"host", b"127.0.0.1:1")]}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def answered(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    through = refusing(SCOPE, send)
    for message in messages:
        await through(message)
    return sent


def start(status: int, *headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": list(headers)}


def chunk(body: bytes, more: bool = False) -> dict[str, Any]:
    return {"type": "http.response.body", "body": body, "more_body": more}


@pytest.mark.parametrize(
    ("status", "code"), [(413, "line_too_long"), (503, "too_many"), (418, "bad_request")]
)
async def test_any_refusal_is_json_with_the_code_of_its_status(status: int, code: str) -> None:
    sent = await answered(
        start(status, (b"content-type", b"text/plain"), (b"mcp-session-id", b"s1")),
        chunk(b"Bad Request: too ", more=True),
        chunk(b"much"),
    )
    head, body = sent
    assert head["status"] == status
    assert dict(head["headers"])[b"content-type"] == b"application/json"
    assert dict(head["headers"])[b"mcp-session-id"] == b"s1"  # still true: kept
    assert int(dict(head["headers"])[b"content-length"]) == len(body["body"])
    assert json.loads(body["body"]) == {"code": code, "message": "too much"}


async def test_what_is_no_refusal_or_is_mcps_answer_goes_as_it_came() -> None:
    ok = [start(200), chunk(b"data: x\r\n\r\n", more=True), chunk(b"")]
    assert await answered(*ok) == ok
    mcp = json.dumps({"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "no"}})
    refused = [start(404), {"type": "http.response.body", "body": mcp.encode()}]
    assert await answered(*refused) == refused  # (the whole body in one message)
