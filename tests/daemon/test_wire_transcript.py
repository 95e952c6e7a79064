"""Every op's answer, byte for byte, as it was before the verbs became one table (issue 47).

A fresh daemon (``--memory``, ``--http``, settle 0) is asked the same requests in the
same order: every op of the line protocol with its common shapes and refusals, then
every route of HTTP that is one request of the protocol, then ``tools/list`` of
``repl mcp`` (each tool's name, description and annotations, and what its schemas
promise: ``tool_shape``, whoever wrote them, pydantic or msgspec). What it
answers is compared with ``transcripts/``, recorded from the code before the table:
each answer line exactly as written, but for what no two runs share (a time, an
uptime, a pid, a token's secret, a made-up session id, a timer's random id), written
over by ``Steady``.

``REPL_RECORD_TRANSCRIPT=1`` writes the files again, from the code as it is: only on
purpose, when an answer is meant to change (and the diff is then the change).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.helpers import Client, DaemonProc

HERE = Path(__file__).parent / "transcripts"
RECORD = os.environ.get("REPL_RECORD_TRANSCRIPT") == "1"

#: what differs from run to run, each written over with one steady value
_VOLATILE = (
    (re.compile(rb'"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"'), b'"TS"'),
    (re.compile(rb" at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"), b" at TS"),  # who answered
    (re.compile(rb'"(uptime_s|pid|due_ms|lease_until_ms)":[0-9.e+-]+'), rb'"\1":0'),
    (re.compile(rb"repl_[A-Za-z0-9_-]{20,}"), b"repl_TOKEN"),
    (re.compile(rb'"s-[0-9a-f]{8}"'), b'"s-MADE-UP"'),  # an id the daemon made up
)
_TIMER = re.compile(rb"t-[0-9a-f]{12}")


class Steady:
    """Writes over what no two runs share; a timer's id becomes ``t-N`` by first sight."""

    def __init__(self) -> None:
        self.timers: dict[bytes, bytes] = {}

    def __call__(self, data: bytes) -> bytes:
        for pattern, steady in _VOLATILE:
            data = pattern.sub(steady, data)
        return _TIMER.sub(self._timer, data)

    def _timer(self, found: re.Match[bytes]) -> bytes:
        return self.timers.setdefault(found[0], b"t-%d" % (len(self.timers) + 1))


# -- the line protocol ------------------------------------------------------------------

S, T, J = "tx-s", "tx-t", "tx-jobs"

#: every op, in an order whose answers depend on nothing but the order
LINE: list[dict[str, Any]] = [
    {"op": "ping", "id": 1},
    {"op": "start", "session": S, "buffer": 4},
    {"op": "start", "session": S},
    {"op": "start", "session": S, "exist_ok": True, "id": "again"},
    {"op": "start", "session": T},
    {"op": "start", "session": J},
    {"op": "start", "session": "bad id"},
    {"op": "send", "session": S, "text": "one"},
    {"op": "send", "session": S, "text": "two", "key": "k2", "tags": {"reply-to": T, "corr": "c"}},
    {"op": "send", "session": S, "text": "two", "key": "k2"},
    {"op": "send", "session": S, "text": "raw", "handler": "on-nothing"},
    {"op": "send", "session": S, "text": "x", "tags": {"by": "me"}},
    {"op": "send", "session": "tx-none", "text": "x"},
    {"op": "read", "session": S, "after": 0},
    {"op": "read", "session": S, "after": 1, "max": 1},
    {"op": "read", "session": S},
    {"op": "read", "session": S, "cursor": "mine", "peek": True},
    {"op": "read", "session": S, "last": 2},
    {"op": "read", "session": S, "seq": 2},
    {"op": "read", "session": S, "match": {"corr": "c"}},
    {"op": "read", "session": S, "after": 99},
    {"op": "read", "session": S, "after": 0, "cursor": "x"},
    {"op": "wait", "sessions": [S], "timeout_ms": 0},
    {"op": "wait", "sessions": [S, T], "cursor": "w2", "ack": {S: 1}, "timeout_ms": 0},
    {"op": "wait", "sessions": [T], "timeout_ms": 0},
    {"op": "wait", "sessions": [S], "after": 3, "timeout_ms": 0},
    {"op": "ack", "session": S, "seq": 2, "cursor": "read"},
    {"op": "ack", "session": S, "seq": 1, "cursor": "read"},
    {"op": "ack", "session": S, "seq": 99},
    {"op": "cursors", "session": S},
    {"op": "poll", "session": S, "max": 1},
    {"op": "poll", "session": S},
    {"op": "buffer", "session": S, "limit": 2},
    {"op": "buffer", "session": S, "limit": 10**6},
    {"op": "read", "session": S, "after": 0},
    {"op": "sessions"},
    {"op": "stats", "session": S},
    {"op": "schedule", "session": T, "text": "later", "in": "1h", "key": "once"},
    {"op": "schedule", "session": T, "text": "later", "in": "1h", "key": "once"},
    {"op": "schedule", "session": T, "every": "1h", "tags": {"kind": "tick"}},
    {"op": "schedule", "session": T, "in": "soon"},
    {"op": "timers", "session": T},
    {"op": "timers"},
    {"op": "webhook", "session": T, "secret": "s3cret"},
    {"op": "webhook", "session": T, "secret": None},
    {"op": "token", "action": "add", "name": "tx-agent", "sessions": ["tx-*"], "can": ["read"]},
    {"op": "token", "action": "list"},
    {"op": "token", "action": "add", "name": "root", "sessions": ["*"], "can": ["read"]},
    {"op": "send", "session": J, "text": "job 1"},
    {"op": "send", "session": J, "text": "job 2", "tags": {"kind": "b"}},
    {"op": "group", "session": J, "group": "work", "max_attempts": 2},
    {"op": "group", "session": J, "group": "bad name!"},
    {"op": "claim", "session": J, "lease_ms": 60000},
    {"op": "claims", "session": J},
    {"op": "groups", "session": J},
    {"op": "extend", "session": J, "claim": "work:1:1", "lease_ms": 30000},
    {"op": "release", "session": J, "claim": "work:1:1", "delay_ms": 0},
    {"op": "done", "session": J, "claim": "work:1:1"},
    {"op": "claim", "session": J, "match": {"kind": "b"}},
    {"op": "done", "session": J, "claim": "work:2:1"},
    {"op": "claim", "session": J, "timeout_ms": 0},
    {"op": "claim", "session": J, "group": "other", "from_now": True, "timeout_ms": 0},
    {"op": "done", "session": J, "claim": "nonsense"},
    {"op": "join", "session": J, "group": "work", "timeout_ms": 0},
    {"op": "join", "session": J, "group": "work", "upto": 2, "timeout_ms": 0},
    {"op": "join", "session": J, "upto": 99},
    {"op": "send", "session": J, "text": "job 3"},
    {"op": "done_next", "session": J, "claim": "work:1:2", "lease_ms": 60000},
    {"op": "done_next", "session": J, "claim": "work:2:1"},
    {"op": "done_next", "session": J, "claim": "work:3:1", "timeout_ms": 0},
    {"op": "done_next", "session": J, "claim": "work:3:1"},
    {"op": "done_next", "session": J, "claim": "nonsense"},
    {"op": "token", "action": "revoke", "name": "tx-agent"},
    {"op": "stop", "session": T},
    {"op": "stop", "session": T},
    {"op": "nonsense"},
    {"op": "read"},
    {"op": "auth", "token": "x"},
]

#: what a line of no request is answered (not JSON, not an object)
RAW = [b"not json", b"[1, 2]", b"{}"]


def line_transcript(d: DaemonProc) -> list[str]:
    steady = Steady()
    client = Client(d.port, d.token)
    try:
        lines = []
        for request in LINE:
            client.send(request)
            lines.append(steady(client.readline()).decode())
        for raw in RAW:
            client.send_raw(raw + b"\n")
            lines.append(steady(client.readline()).decode())
        return lines
    finally:
        client.close()


# -- HTTP ---------------------------------------------------------------------------

H, HJ = "tx-h", "tx-hjobs"

#: method, path and query, body (None: none; a str: the text), and the headers beyond the
#: token's
ROUTES: list[tuple[str, str, Any, dict[str, str]]] = [
    ("POST", "/sessions", {"id": H, "buffer": 8}, {}),
    ("POST", "/sessions", {"id": H, "exist_ok": True}, {}),
    ("POST", "/sessions", {"id": HJ}, {}),
    ("POST", "/sessions", {"idd": "x"}, {}),
    ("POST", f"/sessions/{H}/firings?handler=on-message&tag=corr%3Dc", "hello", {}),
    ("POST", f"/sessions/{H}/firings", "again", {"Idempotency-Key": "k"}),
    ("POST", f"/sessions/{H}/firings", "again", {"Idempotency-Key": "k"}),
    ("GET", f"/sessions/{H}/firings?after=0", None, {}),
    ("GET", f"/sessions/{H}/firings?last=1", None, {}),
    ("GET", f"/sessions/{H}/firings?after=99", None, {}),
    ("GET", "/sessions/tx-none/firings", None, {}),
    ("GET", f"/sessions/{H}/wait?timeout=0", None, {}),
    ("GET", f"/sessions/{H}/wait?timeout=0&ack=2", None, {}),
    ("POST", f"/sessions/{H}/cursors/mine", {"seq": 1}, {}),
    ("POST", f"/sessions/{H}/cursors/mine", {"sq": 1}, {}),
    ("POST", f"/sessions/{HJ}/firings", "a job", {}),
    ("PUT", f"/sessions/{HJ}/groups/g", {"max_attempts": 3}, {}),
    ("POST", f"/sessions/{HJ}/groups/g/claim?lease=60&timeout=0", None, {}),
    ("GET", f"/sessions/{HJ}/claims", None, {}),
    ("GET", f"/sessions/{HJ}/groups", None, {}),
    ("POST", f"/sessions/{HJ}/claims/g:1:1/extend?lease=30", None, {}),
    ("POST", f"/sessions/{HJ}/claims/g:1:1/release?delay=0", None, {}),
    ("POST", f"/sessions/{HJ}/groups/g/claim?timeout=0", None, {}),
    ("POST", f"/sessions/{HJ}/claims/g:1:2/done", None, {}),
    ("POST", f"/sessions/{HJ}/claims/g:1:2/done", None, {}),
    ("POST", f"/sessions/{HJ}/groups/g/claim?timeout=0", None, {}),
    ("GET", f"/sessions/{H}/gather?corr=c&corr=zz&corr=c&timeout=0", None, {}),
    ("GET", f"/sessions/{H}/gather?timeout=0", None, {}),
    ("GET", f"/sessions/{HJ}/join?group=g&timeout=0", None, {}),
    ("GET", f"/sessions/{HJ}/join?upto=1&timeout=0", None, {}),
    ("GET", f"/sessions/{HJ}/join?upto=99", None, {}),
    ("GET", f"/wait?session={H}&session={HJ}&timeout=0", None, {}),
    ("GET", f"/wait?session={H}&session={HJ}&all=true&timeout=0&ack={HJ}:1", None, {}),
    ("GET", "/wait?timeout=0", None, {}),
    ("POST", f"/sessions/{HJ}/firings", "job 2", {}),
    ("POST", f"/sessions/{HJ}/firings", "job 3", {}),
    ("POST", f"/sessions/{HJ}/groups/g/claim?timeout=0", None, {}),
    ("POST", f"/sessions/{HJ}/claims/g:2:1/next?lease=30", None, {}),
    ("POST", f"/sessions/{HJ}/claims/g:3:1/next?timeout=0", None, {}),
    ("POST", f"/sessions/{HJ}/claims/g:3:1/next", None, {}),
    # a permission prompt as `repl mcp --approvals` records it, and verdicts on it (SPEC §19)
    (
        "POST",
        f"/sessions/{H}/firings?handler=on-approval&tag=approval%3Dtbxkq&tag=tool%3DBash"
        "&tag=preview%3Dls&tag=approvers%3Droot",
        "Bash: list the files",
        {},
    ),
    ("GET", f"/sessions/{H}/approvals", None, {}),
    ("POST", f"/sessions/{H}/approvals/tbxkq", {"behavior": "allow", "reason": "fine"}, {}),
    ("POST", f"/sessions/{H}/approvals/tbxkq", {"behavior": "deny"}, {}),
    ("POST", f"/sessions/{H}/approvals/zzzzz", {"behavior": "deny"}, {}),
    ("GET", f"/sessions/{H}/approvals?all=true", None, {}),
    ("GET", f"/sessions/{H}/approvals/tbxkq", None, {}),
    ("GET", "/nowhere", None, {}),
    ("DELETE", f"/sessions/{H}", None, {}),
    ("DELETE", f"/sessions/{H}", None, {}),
]


def http_transcript(d: DaemonProc) -> list[str]:
    steady = Steady()
    assert d.http_port is not None
    lines = []
    for method, path, body, headers in ROUTES:
        conn = http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=30)
        try:
            sent = {"Authorization": f"Bearer {d.token}", **headers}
            data = None
            if isinstance(body, str):
                data = body.encode()
            elif body is not None:
                data, sent["Content-Type"] = json.dumps(body).encode(), "application/json"
            conn.request(method, path, body=data, headers=sent)
            response = conn.getresponse()
            answer = steady(response.read()).decode()
            kind = response.getheader("content-type") or ""
            lines.append(f"{method} {path} -> {response.status} {kind} {answer}")
        finally:
            conn.close()
    return lines


# -- MCP ----------------------------------------------------------------------------


async def mcp_tools(d: DaemonProc) -> list[str]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    env = {**os.environ, "REPL_ADDR": d.addr, "REPL_HOME": str(d.home)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "repl_cli", "mcp"], env=env)
    with open(d.home.parent / "mcp-transcript.log", "a") as errlog:  # noqa: ASYNC230
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
    return [json.dumps(tool_shape(tool), sort_keys=True) for tool in listed.tools]


def tool_shape(tool: Any) -> dict[str, Any]:
    """What an agent is promised by a tool, however its schema is written (by pydantic
    from a function's signature, or by msgspec from the wire's Structs): its name, its
    description and annotations, each argument's type, default and whether it is
    required, and the fields of its result."""
    listed = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    inputs = listed["inputSchema"]
    required = set(inputs.get("required", []))
    arguments = {}
    for name, field in inputs.get("properties", {}).items():
        arguments[name] = {
            "type": kind_of(field, inputs.get("$defs", {})),
            "default": number(field.get("default")),
            "required": name in required,
        }
    outputs = listed.get("outputSchema", {}).get("properties", {})
    return {
        "name": listed["name"],
        "description": listed["description"],
        "annotations": listed.get("annotations"),
        "arguments": arguments,
        "result": sorted(outputs),
    }


def kind_of(field: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A field's JSON type, whichever way the schema writes it (``anyOf`` with null, a
    ``$ref``, an object of strings)."""
    if "$ref" in field:
        return kind_of(defs[field["$ref"].rsplit("/", 1)[1]], defs)
    if "anyOf" in field:
        return sorted(json.dumps(kind_of(f, defs), sort_keys=True) for f in field["anyOf"])
    if field.get("type") == "object":
        extra = field.get("additionalProperties")
        return ["object", kind_of(extra, defs) if isinstance(extra, dict) else None]
    if field.get("type") == "array":
        return ["array", kind_of(field.get("items", {}), defs)]
    return field.get("type")


def number(value: Any) -> Any:
    """60 and 60.0 alike (pydantic writes a float's default as it was given)."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


# -- the comparison ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    home = tmp_path_factory.mktemp("transcript") / "home"
    d = DaemonProc(home, "--memory", "--http", "127.0.0.1:0", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


def same_as_recorded(name: str, lines: list[str]) -> None:
    path = HERE / name
    if RECORD:
        HERE.mkdir(exist_ok=True)
        path.write_text("".join(line.rstrip("\n") + "\n" for line in lines))
        return
    recorded = path.read_text().splitlines()
    got = [line.rstrip("\n") for line in lines]
    for i, (before, now) in enumerate(zip(recorded, got, strict=False)):
        assert now == before, f"{name} line {i + 1} differs:\nwas {before}\nnow {now}"
    assert len(got) == len(recorded), f"{name}: {len(got)} lines, {len(recorded)} recorded"


def test_every_op_answers_over_the_line_protocol_as_before(fresh: DaemonProc) -> None:
    same_as_recorded("line.jsonl", line_transcript(fresh))


def test_every_route_answers_over_http_as_before(fresh: DaemonProc) -> None:
    same_as_recorded("http.txt", http_transcript(fresh))


def test_the_mcp_tools_are_listed_as_before(fresh: DaemonProc) -> None:
    same_as_recorded("mcp-tools.jsonl", sorted(anyio.run(mcp_tools, fresh)))
