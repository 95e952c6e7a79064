"""Approvals over HTTP (SPEC §19, docs/semantics.md P4): ``GET /sessions/{id}/approvals``
lists the pending prompts (``?all=true`` the audit), ``POST .../approvals/{request_id}``
gives a verdict as the request's token, refused as the API refuses, with the token's
rights. Prompts are recorded as ``repl mcp --approvals`` records them (a send with the
prompt's tags, as the server's token); the relay's own tests are
tests/e2e/test_mcp_approvals.py and, over ``/mcp``, tests/http/test_http_mcp_approvals.py.
"""

from __future__ import annotations

import json
from typing import Any

from session import approvals as ap
from tests.helpers import DaemonProc
from tests.http.test_http_api import Web


def ask(
    daemon: DaemonProc,
    session: str,
    request_id: str,
    approvers: tuple[str, ...] = ("root",),
    tool: str = "Bash",
    preview: str = '{"command": "pytest -q"}',
) -> int:
    """A prompt, recorded as the relay records it; its seq."""
    tags = ap.prompt_tags(request_id, tool, preview, approvers)
    sent = daemon.client().ok(
        {
            "op": "send",
            "session": session,
            "text": ap.prompt_text(tool, "run the tests"),
            "handler": ap.PROMPT_HANDLER,
            "tags": tags,
        }
    )
    seq: int = sent["seq"]
    return seq


def head(daemon: DaemonProc, session: str) -> int:
    stats = daemon.client().ok({"op": "stats", "session": session})
    value: int = stats["sessions"][0]["head"]
    return value


def verdict(web: Web, session: str, request_id: str, body: Any, token: str = "") -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, answer = web.request(
        "POST", f"/sessions/{session}/approvals/{request_id}", raw, token=token
    )
    return status, answer


def token(daemon: DaemonProc, name: str, sessions: str, can: list[str]) -> str:
    made = daemon.client().ok(
        {"op": "token", "action": "add", "name": name, "sessions": [sessions], "can": can}
    )
    secret: str = made["token"]
    return secret


def test_pending_prompts_are_listed_and_a_verdict_is_recorded_as_the_token(
    web: DaemonProc,
) -> None:
    http = Web(web)
    s = http.session()
    ask(web, s, "tbxkq")
    ask(web, s, "mnopq", tool="Write")
    http.send(s, "yes tbxkq")  # a plain message with the right words: no verdict
    status, _, pending = http.request("GET", f"/sessions/{s}/approvals")
    assert status == 200
    assert [e["prompt"]["request_id"] for e in pending] == ["tbxkq", "mnopq"]
    first = pending[0]
    assert first["prompt"] == {
        "request_id": "tbxkq",
        "tool": "Bash",
        "description": "run the tests",
        "preview": '{"command": "pytest -q"}',
        "approvers": ["root"],
        "seq": 1,
        "ts": first["prompt"]["ts"],
        "by": "root",
    }
    assert (first["verdict"], first["verdicts"]) == (None, [])
    status, given = verdict(http, s, "tbxkq", {"behavior": "allow"})
    assert status == 201
    assert (given["request_id"], given["behavior"], given["by"], given["reason"]) == (
        "tbxkq",
        "allow",
        "root",
        "",
    )
    status, given = verdict(http, s, "mnopq", {"behavior": "deny", "reason": "not on main"})
    assert (status, given["behavior"], given["reason"]) == (201, "deny", "not on main")
    assert http.request("GET", f"/sessions/{s}/approvals")[2] == []
    status, _, audit = http.request("GET", f"/sessions/{s}/approvals?all=true")
    assert status == 200
    assert [(e["prompt"]["request_id"], e["verdict"]["behavior"]) for e in audit] == [
        ("tbxkq", "allow"),
        ("mnopq", "deny"),
    ]
    status, _, one = http.request("GET", f"/sessions/{s}/approvals/mnopq")
    assert status == 200 and one == audit[1]
    # the verdict is a firing like any other: a reader sees it, with who gave it
    status, _, read = http.request("GET", f"/sessions/{s}/firings?match=verdict")
    assert [(f["tags"]["approval"], f["by"], f["handler"]) for f in read["firings"]] == [
        ("tbxkq", "root", ap.VERDICT_HANDLER),
        ("mnopq", "root", ap.VERDICT_HANDLER),
    ]


def test_a_verdict_is_refused_as_the_api_refuses_it(web: DaemonProc) -> None:
    """400 for what is no request id, behavior or body; 404 for no such prompt; 409 for a
    prompt answered already, naming the verdict that counts: each records nothing."""
    http = Web(web)
    s = http.session()
    ask(web, s, "abcde")
    assert verdict(http, s, "abcde", {"behavior": "allow"})[0] == 201
    before = head(web, s)
    refusals = [
        ("TBXKQ", {"behavior": "allow"}, 400, "bad_request", "five letters a-z without l"),
        ("abcde", {"behavior": "yes"}, 400, "bad_request", "allow or deny, not 'yes'"),
        ("abcde", {"behaviour": "allow"}, 400, "bad_request", "no field 'behaviour'"),
        ("abcde", b"allow", 400, "bad_request", "not JSON"),
        ("abcde", {}, 400, "bad_request", "behavior"),
        ("fghij", {"behavior": "allow"}, 404, "no_such_prompt", "no approval request 'fghij'"),
        ("abcde", {"behavior": "deny"}, 409, "already_answered", "abcde already answered: "),
    ]
    for request_id, body, status, code, said in refusals:
        got, answer = verdict(http, s, request_id, body)
        assert (got, answer["code"]) == (status, code), (request_id, body, answer)
        assert said in answer["message"], answer
    got, answer = verdict(http, s, "abcde", {"behavior": "deny"})
    assert answer["message"].startswith("abcde already answered: allow by root at 20")
    _, _, missing = http.request("GET", f"/sessions/{s}/approvals/fghij")
    assert missing["message"].endswith("GET /sessions/ID/approvals?all=true lists them")
    assert http.request("GET", f"/sessions/{s}/approvals/TBXKQ")[0] == 400
    assert http.request("GET", f"/sessions/{s}/approvals?all=maybe")[0] == 400
    assert head(web, s) == before
    assert http.request("GET", "/sessions/nope/approvals")[0] == 404


def test_a_verdict_needs_send_and_counts_only_from_an_approver(web: DaemonProc) -> None:
    """A listing needs ``read``, a verdict ``send``: a token that may only read is refused
    (nothing recorded), one that may only send answers (the daemon reads the prompt for
    it) but cannot list. A verdict by a token that is no approver is 403 and kept: the
    audit shows the attempt, and the approver's verdict counts after it."""
    http = Web(web)
    s = http.session()
    ask(web, s, "qrstu", approvers=("ha-phone",))
    reader = token(web, "ha-reader", s, ["read"])
    phone = token(web, "ha-phone", s, ["send"])
    mallory = token(web, "ha-mallory", s, ["read", "send"])
    stranger = token(web, "ha-stranger", "elsewhere.*", ["read", "send"])
    status, _, listed = http.request("GET", f"/sessions/{s}/approvals", token=reader)
    assert status == 200 and len(listed) == 1
    status, refused = verdict(http, s, "qrstu", {"behavior": "allow"}, token=reader)
    assert (status, refused["code"]) == (403, "forbidden")
    assert http.request("GET", f"/sessions/{s}/approvals", token=phone)[0] == 403
    status, hidden = verdict(http, s, "qrstu", {"behavior": "allow"}, token=stranger)
    assert (status, hidden["code"]) == (404, "no_such_session")
    assert http.request("GET", f"/sessions/{s}/approvals", token=stranger)[0] == 404
    assert http.request("GET", f"/sessions/{s}/approvals", token=None)[0] == 401
    status, kept = verdict(http, s, "qrstu", {"behavior": "allow"}, token=mallory)
    assert (status, kept["code"]) == (403, "forbidden")
    assert "recorded but does not count: it is by ha-mallory" in kept["message"]
    assert "its approvers are ha-phone" in kept["message"]
    status, given = verdict(http, s, "qrstu", {"behavior": "deny", "reason": "no"}, token=phone)
    assert (status, given["by"], given["behavior"]) == (201, "ha-phone", "deny")
    _, _, (entry,) = http.request("GET", f"/sessions/{s}/approvals?all=1")
    assert entry["verdict"]["by"] == "ha-phone"
    assert [(v["by"], v["behavior"]) for v in entry["verdicts"]] == [
        ("ha-mallory", "allow"),
        ("ha-phone", "deny"),
    ]
