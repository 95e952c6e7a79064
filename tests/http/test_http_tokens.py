"""Scoped tokens over HTTP (SPEC §10, §11), against a daemon process started with ``--http``.

A scoped Bearer token sends and reads on its own sessions; a session outside
its patterns is 404 with the very JSON of a session that does not exist (but
for the id), on every session route; a right it lacks is 403 and records
nothing; ``/metrics`` is the root's (403); ``/sessions`` lists its own
sessions only; a wrong token is 401, a revoked one too; and its event
stream gets its firings, then ends with ``event: ended`` of code
``unauthorized`` when the token is revoked. The client is the standard
library's, as in test_http_api.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import DaemonProc, eventually
from tests.http.test_http_api import Stream, Web


@pytest.fixture
def web_api(web: DaemonProc) -> Iterator[Web]:
    """Requests with the root token."""
    yield Web(web)
    web.close_clients()


def scoped(web_api: Web, name: str, patterns: list[str], can: list[str]) -> Web:
    """A token made by the root over the line protocol; requests with it."""
    made = web_api.daemon.client().ok(
        {"op": "token", "action": "add", "name": name, "sessions": patterns, "can": can}
    )
    agent = Web(web_api.daemon)
    agent.token = made["token"]
    return agent


def start(web_api: Web, *sessions: str) -> None:
    client = web_api.daemon.client()
    for session in sessions:
        client.ok({"op": "start", "session": session})


def revoke(web_api: Web, name: str) -> None:
    web_api.daemon.client().ok({"op": "token", "action": "revoke", "name": name})


def ring(web_api: Web, session: str) -> list[tuple[int, str]]:
    """The session's firings as the root reads them."""
    got = web_api.daemon.client().ok({"op": "read", "session": session, "after": 0})
    return [(f["seq"], f["result"]) for f in got["firings"]]


#: the session routes, each with ``{}`` for the id, the body a POST sends, and the status of
#: the answer for a missing session: 404, or 400 for a request bad whatever the session (a
#: seq after the hidden session's head is 404: its head is not told)
ROUTES: list[tuple[str, str, bytes | None, int]] = [
    ("POST", "/sessions/{}/firings", b"hello", 404),
    ("POST", "/sessions/{}/firings?handler=on-deploy", b"hello", 404),
    ("POST", "/sessions/{}/firings?handler=a%20b", b"hello", 400),
    ("GET", "/sessions/{}/firings", None, 404),
    ("GET", "/sessions/{}/firings?after=0&max=5", None, 404),
    ("GET", "/sessions/{}/firings?after=5", None, 404),
    ("GET", "/sessions/{}/firings?max=0", None, 404),
    ("GET", "/sessions/{}/events", None, 404),
    ("GET", "/sessions/{}/events?after=0", None, 404),
    ("GET", "/sessions/{}/events?after=5", None, 404),
    # every route of groups and claims (SPEC §16)
    ("POST", "/sessions/{}/groups/work/claim?timeout=0", None, 404),
    ("POST", "/sessions/{}/groups/other/claim?timeout=5&lease=120&match=k", None, 404),
    ("POST", "/sessions/{}/groups/work/claim?timeout=0&lease=0.5", None, 400),
    ("POST", "/sessions/{}/claims/work:1:1/done", None, 404),
    ("POST", "/sessions/{}/claims/work:1:1/release", None, 404),
    ("POST", "/sessions/{}/claims/work:1:1/release?delay=5", None, 404),
    ("POST", "/sessions/{}/claims/work:1:1/extend", None, 404),
    ("POST", "/sessions/{}/claims/work:1:1/extend?lease=120", None, 404),
    ("POST", "/sessions/{}/claims/nonsense/done", None, 400),
    ("GET", "/sessions/{}/groups", None, 404),
    ("GET", "/sessions/{}/claims", None, 404),
    ("GET", "/sessions/{}/claims?group=work", None, 404),
    # a group is made with admin, which this token lacks: refused the same either way
    ("PUT", "/sessions/{}/groups/work", b'{"max_attempts": 1}', 403),
    ("POST", "/sessions/{}/groups/work", b"{}", 403),
]

#: the routes of groups an admin token uses, with the status for a missing session
ADMIN_ROUTES: list[tuple[str, str, bytes | None, int]] = [
    ("PUT", "/sessions/{}/groups/work", b'{"max_attempts": 1}', 404),
    ("POST", "/sessions/{}/groups/new", b'{"dead_letter": "mine.dlq"}', 404),
    ("PUT", "/sessions/{}/groups/work", b'{"max_attempts": 0}', 400),
]


def test_a_scoped_token_sends_and_reads_its_own_sessions(web_api: Web) -> None:
    start(web_api, "own-a.1")
    agent = scoped(web_api, "http-own", ["own-a.*"], ["read", "send"])
    assert agent.send("own-a.1", "one", **{"Idempotency-Key": "k1"}) == (
        201,
        {"seq": 1, "duplicate": False},
    )
    assert agent.send("own-a.1", "one", **{"Idempotency-Key": "k1"}) == (
        200,
        {"seq": 1, "duplicate": True},
    )
    status, _, read = agent.request("GET", "/sessions/own-a.1/firings?after=0")
    assert status == 200 and (read["next"], read["lost"]) == (1, 0)
    assert [(f["seq"], f["result"]) for f in read["firings"]] == [(1, "one")]
    assert ring(web_api, "own-a.1") == [(1, "one")]


def held_there(web_api: Web, session: str) -> tuple[Any, Any]:
    """The groups and the held claims of ``session``, as the root sees them."""
    client = web_api.daemon.client()
    groups = client.ok({"op": "groups", "session": session})["groups"]
    return groups, client.ok({"op": "claims", "session": session})["claims"]


def test_out_of_scope_is_404_exactly_as_a_missing_session(web_api: Web) -> None:
    start(web_api, "mine.1", "theirs.1")
    web_api.send("theirs.1", "secret")
    taken = web_api.daemon.client().ok({"op": "claim", "session": "theirs.1", "timeout_ms": 0})
    assert taken["claim"] == "work:1:1"  # theirs: held, its group made
    before = held_there(web_api, "theirs.1")
    agent = scoped(web_api, "http-scope", ["mine.*"], ["read", "send"])
    assert_hidden_like_missing(agent, ROUTES)
    admin = scoped(web_api, "http-scope-admin", ["mine.*"], ["read", "send", "admin"])
    assert_hidden_like_missing(admin, ADMIN_ROUTES, starts=True)
    assert ring(web_api, "theirs.1") == [(1, "secret")]  # nothing recorded there
    assert held_there(web_api, "theirs.1") == before  # still held, the group as it was
    # the root sees it
    assert web_api.request("GET", "/sessions/theirs.1/firings?after=0")[0] == 200


def assert_hidden_like_missing(
    agent: Web, routes: list[tuple[str, str, bytes | None, int]], starts: bool = False
) -> None:
    """Each route on theirs.1 (hidden from ``agent``: mine.* only) answers as on a session
    never started, outside the patterns or inside them (less the advice: ``starts``, the
    token may start an id of its patterns)."""
    for method, route, body, expected in routes:
        status, _, hidden = agent.request(method, route.format("theirs.1"), body)
        assert status == expected, (route, hidden)
        if status == 404:
            # the advice the CLI, MCP and the line protocol give a scoped token, never
            # a `repl start` it could not run
            assert hidden == {
                "code": "no_such_session",
                "message": "no session 'theirs.1': this token sees only mine.*: check the id",
            }
        # exactly as a session never started outside the patterns; inside them, the same
        # refusal with the advice that id gets from this token (it may not start it)
        got, _, answer = agent.request(method, route.format("theirs.404"), body)
        assert got == status, route
        assert json.loads(json.dumps(answer).replace("theirs.404", "theirs.1")) == hidden
        got, _, answer = agent.request(method, route.format("mine.404"), body)
        assert got == status and answer["code"] == hidden["code"], route
        if status == 404:
            advice = "start it with POST /sessions" if starts else "this token cannot start it"
            assert advice in answer["message"], route


def test_a_right_the_token_lacks_is_403_and_records_nothing(web_api: Web) -> None:
    start(web_api, "rights.1")
    web_api.send("rights.1", "there")
    reader = scoped(web_api, "http-reader", ["rights.*"], ["read"])
    sender = scoped(web_api, "http-sender", ["rights.*"], ["send"])
    status, _, body = reader.request("POST", "/sessions/rights.1/firings", b"refused")
    assert (status, body["code"]) == (403, "forbidden") and "send" in body["message"]
    for method, route in (
        ("GET", "/sessions/rights.1/firings"),
        ("GET", "/sessions/rights.1/events?after=0"),
        ("GET", "/sessions/rights.1/events"),  # from the head: refused at once, not in a stream
        ("POST", "/sessions/rights.1/groups/work/claim?timeout=0"),
        ("POST", "/sessions/rights.1/claims/work:1:1/done"),
        ("POST", "/sessions/rights.1/claims/work:1:1/release"),
        ("POST", "/sessions/rights.1/claims/work:1:1/extend"),
        ("GET", "/sessions/rights.1/groups"),
        ("GET", "/sessions/rights.1/claims"),
    ):
        status, _, body = sender.request(method, route)
        assert (status, body["code"]) == (403, "forbidden"), route
        assert "read" in body["message"]
    status, _, body = reader.request("PUT", "/sessions/rights.1/groups/work", b"{}")
    assert (status, body["code"]) == (403, "forbidden") and "admin right" in body["message"]
    assert web_api.daemon.client().ok({"op": "groups", "session": "rights.1"})["groups"] == []
    assert ring(web_api, "rights.1") == [(1, "there")]
    assert reader.request("GET", "/sessions/rights.1/firings")[0] == 200
    assert sender.send("rights.1", "sent")[0] == 201


def test_a_group_writes_into_no_session_outside_the_patterns(web_api: Web) -> None:
    """The issue's probe over HTTP: an admin of group-a.* set its group's dead letters to
    group-b.secret (or a new id, then started) with PUT, and its job's last attempt wrote
    there. Refused now (403, nothing configured, nothing started); and a read token on
    exactly group-c.inbox, whose first claim made a group whose dead letters went to
    group-c.inbox.dead, is refused that claim in HTTP's words."""
    start(web_api, "group-a.x", "group-b.secret", "group-c.inbox")
    admin = scoped(web_api, "http-group-a", ["group-a.*"], ["read", "send", "admin"])
    for elsewhere in ("group-b.secret", "group-b.new"):
        for method in ("PUT", "POST"):
            body = json.dumps({"max_attempts": 1, "dead_letter": elsewhere}).encode()
            status, _, refused = admin.request(method, "/sessions/group-a.x/groups/work", body)
            assert (status, refused) == (
                403,
                {
                    "code": "forbidden",
                    "message": "a scoped token names as a group's dead-letter session only a "
                    "session its patterns cover: give one that matches group-a.*",
                },
            )
    root = web_api.daemon.client()
    assert root.ok({"op": "groups", "session": "group-a.x"})["groups"] == []
    body = json.dumps({"max_attempts": 1, "dead_letter": "group-a.dlq"}).encode()
    status, _, made = admin.request("PUT", "/sessions/group-a.x/groups/work", body)
    assert status == 200 and made["dead_letter"] == "group-a.dlq"
    worker = scoped(web_api, "http-group-c", ["group-c.inbox"], ["read"])
    route = "/sessions/group-c.inbox/groups/work/claim?timeout=0"
    status, _, refused = worker.request("POST", route)
    assert (status, refused) == (
        403,
        {
            "code": "forbidden",
            "message": "session 'group-c.inbox' has no group 'work', and a new group would "
            "send its dead letters to 'group-c.inbox.dead', which this token does not see: "
            "make the group first with a dead-letter session the token sees (PUT "
            '/sessions/group-c.inbox/groups/work with the body {"dead_letter": SESSION}), or '
            "with a token that sees 'group-c.inbox.dead'",
        },
    )
    assert root.ok({"op": "groups", "session": "group-c.inbox"})["groups"] == []
    listed = {row["id"] for row in root.ok({"op": "sessions"})["sessions"]}
    assert not {"group-b.new", "group-c.inbox.dead"} & listed
    assert ring(web_api, "group-b.secret") == []


def test_metrics_are_the_roots_and_sessions_lists_only_the_tokens_own(web_api: Web) -> None:
    start(web_api, "listed.1", "listed.2", "unlisted.1")
    agent = scoped(web_api, "http-lister", ["listed.*"], ["read", "send", "admin"])
    status, _, body = agent.request("GET", "/metrics")
    assert (status, body["code"]) == (403, "forbidden") and "root" in body["message"]
    assert web_api.request("GET", "/metrics")[0] == 200
    status, _, rows = agent.request("GET", "/sessions")
    assert status == 200
    assert [row["id"] for row in rows] == ["listed.1", "listed.2"]
    _, _, everything = web_api.request("GET", "/sessions")
    assert {"listed.1", "listed.2", "unlisted.1"} <= {row["id"] for row in everything}


@pytest.mark.parametrize("route", ["/sessions", "/sessions/wrong.1/firings", "/metrics"])
def test_a_wrong_token_is_401(web_api: Web, route: str) -> None:
    status, got, body = web_api.request("GET", route, token="repl_not-a-token")
    assert (status, body["code"]) == (401, "unauthorized")
    assert got["www-authenticate"] == "Bearer"


def test_a_revoked_tokens_stream_ends_unauthorized_and_it_is_401_after(web_api: Web) -> None:
    start(web_api, "streamed.1")
    agent = scoped(web_api, "http-streamer", ["streamed.*"], ["read", "send"])
    spared = scoped(web_api, "http-spared", ["streamed.*"], ["read"])
    stream = Stream(agent, "/sessions/streamed.1/events")
    other = Stream(spared, "/sessions/streamed.1/events")
    try:
        assert stream.status == 200 and other.status == 200
        eventually(lambda: web_api.waiters("streamed.1") == 2, what="both streams waiting")
        assert agent.send("streamed.1", "one")[0] == 201
        assert agent.send("streamed.1", "two")[0] == 201
        got = [stream.event() for _ in range(2)]
        assert [(e["event"], e["id"]) for e in got] == [("firing", "1"), ("firing", "2")]
        assert [json.loads(e["data"])["result"] for e in got] == ["one", "two"]
        assert [other.event()["id"] for _ in range(2)] == ["1", "2"]

        revoke(web_api, "http-streamer")

        ended = stream.event()
        assert ended["event"] == "ended"
        error: dict[str, Any] = json.loads(ended["data"])
        assert error["code"] == "unauthorized" and "revoked" in error["message"]
        with pytest.raises(EOFError):
            stream.event()
        # the other token's stream goes on
        eventually(lambda: web_api.waiters("streamed.1") == 1, what="the other stream alone")
        web_api.send("streamed.1", "three")
        assert json.loads(other.event()["data"])["result"] == "three"
    finally:
        stream.close()
        other.close()
    for method, route in (("GET", "/sessions"), ("POST", "/sessions/streamed.1/firings")):
        status, _, body = agent.request(method, route, b"late")
        assert (status, body["code"]) == (401, "unauthorized"), route
    assert ring(web_api, "streamed.1") == [(1, "one"), (2, "two"), (3, "three")]
