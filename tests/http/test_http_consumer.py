"""The HTTP consumer (issue 26): the loop ``repl wait`` runs, over HTTP, from any language.

``POST /sessions`` starts a session, ``DELETE /sessions/{id}`` stops it,
``GET /sessions/{id}/wait`` is a long poll (acknowledging ``?ack=`` first,
never what it returns), ``POST /sessions/{id}/cursors/{name}`` acknowledges.
Against a daemon process with ``--http``, over real sockets, with the
standard library's ``http.client`` as the client any program would be; the
CLI, where it appears, is a subprocess. What is proved: the consumer loop
delivers each firing at least once (the same firings again without an ack,
the next ones with it); a blocked poll is woken by ``repl send``; a timeout
answers ``timed_out`` and moves nothing; a client that hangs up mid-poll
releases the wait and moves no cursor; a stop tells a blocked poll; scoped
tokens (404 outside, 403 for a right lacking, 401 without) and a revocation
that ends a blocked poll; a matching poll over the whole ring; bad input is
400 and changes nothing.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from tests.helpers import DaemonProc, Repl, eventually
from tests.http.test_http_api import Web
from tests.http.test_http_tokens import revoke, scoped


@pytest.fixture
def web_api(web: DaemonProc) -> Iterator[Web]:
    yield Web(web)
    web.close_clients()


def call(
    web_api: Web, method: str, path: str, body: Any = None, token: str | None = ""
) -> tuple[int, Any]:
    """A request with a JSON body (unless None); its status and its JSON (or b"")."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    status, _, answer = web_api.request(method, path, data, headers, token=token)
    return status, answer


def in_background(fn: Callable[[], Any]) -> Future[Any]:
    """``fn`` run in a thread of its own; its result (or what it raised) in the future."""
    done: Future[Any] = Future()

    def run() -> None:
        try:
            done.set_result(fn())
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return done


def long_poll(web_api: Web, path: str) -> Callable[[], tuple[int, Any]]:
    """A blocking GET of ``path`` on a connection of its own, for ``in_background``."""

    def poll() -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", web_api.port, timeout=60)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {web_api.token}"})
            answer = conn.getresponse()
            return answer.status, json.loads(answer.read())
        finally:
            conn.close()

    return poll


def cursors(web_api: Web, session: str) -> dict[str, int]:
    rows = web_api.daemon.client().ok({"op": "cursors", "session": session})["cursors"]
    return {row["name"]: row["seq"] for row in rows}


def results(answer: dict[str, Any]) -> list[tuple[int, str]]:
    return [(f["seq"], f["result"]) for f in answer["firings"]]


def test_start_answers_created_or_exists_and_stop_is_204(web_api: Web) -> None:
    status, made = call(web_api, "POST", "/sessions", {"id": "c-start", "buffer": 4})
    assert (status, made) == (201, {"session": "c-start", "created": True})
    assert call(web_api, "POST", "/sessions", {"id": "c-start", "exist_ok": True}) == (
        200,
        {"session": "c-start", "created": False},
    )
    status, refused = call(web_api, "POST", "/sessions", {"id": "c-start"})
    assert (status, refused) == (
        409,
        {
            "code": "session_exists",
            "message": "session 'c-start' exists: stop it first, or give \"exist_ok\": true "
            "in the body",
        },
    )
    listed = {row["id"]: row for row in call(web_api, "GET", "/sessions")[1]}
    assert listed["c-start"]["limit"] == 4
    # no body: a session with an id of the daemon's making
    status, fresh = call(web_api, "POST", "/sessions")
    assert status == 201 and fresh["created"] is True and fresh["session"]
    status, ahead = call(web_api, "GET", f"/sessions/{fresh['session']}/firings?after=9")
    assert ahead == {
        "code": "cursor_after_head",
        "message": "after 9 is after head 0: read from the head or before it "
        "(GET /sessions shows it)",
    }
    assert call(web_api, "DELETE", "/sessions/c-start") == (204, b"")
    status, gone = call(web_api, "DELETE", "/sessions/c-start")
    assert (status, gone) == (
        404,
        {
            "code": "no_such_session",
            "message": "no session 'c-start': start it with POST /sessions and the body "
            '{"id": "c-start"}',
        },
    )
    status, after = call(web_api, "GET", "/sessions/c-start2/firings?after=0")
    assert "`" not in after["message"] and "--" not in after["message"]
    assert "c-start" not in {row["id"] for row in call(web_api, "GET", "/sessions")[1]}


def test_the_consumer_loop_gets_each_firing_at_least_once(web_api: Web) -> None:
    """Start, send, poll: the firings; poll again without an ack: the same firings (the
    client may not have handled them); poll with ``ack`` of the last ``next``: the next
    ones only. A poll moves the cursor only by the ack it carries."""
    assert call(web_api, "POST", "/sessions", {"id": "c-loop"})[0] == 201
    web_api.send("c-loop", "one")
    web_api.send("c-loop", "two")
    status, first = call(web_api, "GET", "/sessions/c-loop/wait?timeout=10")
    assert status == 200 and first["timed_out"] is False
    assert (first["next"], first["lost"], results(first)) == (2, 0, [(1, "one"), (2, "two")])
    assert cursors(web_api, "c-loop") == {}  # a poll acknowledges nothing it returns
    _, again = call(web_api, "GET", "/sessions/c-loop/wait?timeout=10")
    assert again == first  # at least once: the same firings, since nothing acknowledged them
    web_api.send("c-loop", "three")
    _, after_ack = call(web_api, "GET", f"/sessions/c-loop/wait?timeout=10&ack={first['next']}")
    assert (after_ack["next"], results(after_ack)) == (3, [(3, "three")])
    assert cursors(web_api, "c-loop") == {"wait": 2}
    # the ack of the last batch, and nothing more: a timeout that says where the cursor is
    _, idle = call(web_api, "GET", f"/sessions/c-loop/wait?timeout=0&ack={after_ack['next']}")
    assert idle == {"next": 3, "lost": 0, "firings": [], "timed_out": True}
    assert cursors(web_api, "c-loop") == {"wait": 3}


def test_a_named_cursor_and_the_ack_route(web_api: Web) -> None:
    s = web_api.session()
    for text in ("a", "b", "c"):
        web_api.send(s, text)
    _, got = call(web_api, "GET", f"/sessions/{s}/wait?cursor=worker-1&max=2&timeout=5")
    assert (got["next"], results(got)) == (2, [(1, "a"), (2, "b")])
    assert call(web_api, "POST", f"/sessions/{s}/cursors/worker-1", {"seq": 2}) == (
        200,
        {"cursor": "worker-1", "seq": 2},
    )
    # an ack never moves a cursor back: the answer says where it is
    assert call(web_api, "POST", f"/sessions/{s}/cursors/worker-1", {"seq": 1}) == (
        200,
        {"cursor": "worker-1", "seq": 2},
    )
    _, rest = call(web_api, "GET", f"/sessions/{s}/wait?cursor=worker-1&timeout=5")
    assert results(rest) == [(3, "c")]
    # any printable name, a slash too; the default wait cursor is untouched by all this
    assert call(web_api, "POST", f"/sessions/{s}/cursors/team/a", {"seq": 3}) == (
        200,
        {"cursor": "team/a", "seq": 3},
    )
    assert cursors(web_api, s) == {"worker-1": 2, "team/a": 3}


def test_a_blocked_poll_is_woken_by_a_cli_send(web_api: Web) -> None:
    s = web_api.session()
    polled = in_background(long_poll(web_api, f"/sessions/{s}/wait?timeout=30"))
    eventually(lambda: web_api.waiters(s) == 1, what="the poll blocked")
    assert not polled.done()
    assert Repl(web_api.daemon).ok("send", s, "from the cli") == "1\n"
    status, answer = polled.result(timeout=30)
    assert status == 200 and answer["timed_out"] is False
    assert results(answer) == [(1, "from the cli")]
    assert web_api.waiters(s) == 0


def test_a_poll_that_times_out_says_so_and_moves_nothing(web_api: Web) -> None:
    s = web_api.session()
    web_api.send(s, "old")
    web_api.daemon.client().ok({"op": "ack", "session": s, "cursor": "wait", "seq": 1})
    status, answer = call(web_api, "GET", f"/sessions/{s}/wait?timeout=0.2")
    assert (status, answer) == (200, {"next": 1, "lost": 0, "firings": [], "timed_out": True})
    assert cursors(web_api, s) == {"wait": 1}
    assert web_api.waiters(s) == 0


def test_a_client_that_hangs_up_mid_poll_moves_nothing_and_is_released(web_api: Web) -> None:
    s = web_api.session()
    web_api.send(s, "handled")
    web_api.daemon.client().ok({"op": "ack", "session": s, "cursor": "wait", "seq": 1})
    conn = http.client.HTTPConnection("127.0.0.1", web_api.port, timeout=10)
    conn.request(
        "GET",
        f"/sessions/{s}/wait?timeout=600",
        headers={"Authorization": f"Bearer {web_api.token}"},
    )
    eventually(lambda: web_api.waiters(s) == 1, what="the poll blocked")
    conn.close()  # hangs up without reading an answer
    eventually(lambda: web_api.waiters(s) == 0, what="the wait released")
    web_api.send(s, "after the hang-up")
    assert cursors(web_api, s) == {"wait": 1}
    # the firing is there for the next poll: nothing was taken by the one that went away
    _, answer = call(web_api, "GET", f"/sessions/{s}/wait?timeout=5")
    assert results(answer) == [(2, "after the hang-up")]
    assert web_api.request("GET", "/healthz", token=None)[0] == 200


def test_stopping_a_session_tells_its_blocked_polls(web_api: Web) -> None:
    s = web_api.session()
    polled = in_background(long_poll(web_api, f"/sessions/{s}/wait?timeout=30"))
    eventually(lambda: web_api.waiters(s) == 1, what="the poll blocked")
    assert call(web_api, "DELETE", f"/sessions/{s}") == (204, b"")
    status, answer = polled.result(timeout=30)
    assert (status, answer["code"]) == (410, "session_stopped")


def test_a_matching_poll_with_no_cursor_looks_at_the_whole_ring_and_takes_nothing(
    web_api: Web,
) -> None:
    s = web_api.session()
    web_api.send(s, "noise")
    status, _, _ = web_api.request("POST", f"/sessions/{s}/firings?tag=corr=c-7", b"early reply")
    assert status == 201
    # a reply that came before the requester asked is found
    _, found = call(web_api, "GET", f"/sessions/{s}/wait?match=corr=c-7&timeout=5")
    assert (found["next"], results(found)) == (2, [(2, "early reply")])
    status, refused = call(web_api, "GET", f"/sessions/{s}/wait?match=corr=c-7&ack=2")
    assert (status, refused["code"]) == (400, "bad_request")
    # blocked through a firing that does not match, woken by the one that does
    polled = in_background(long_poll(web_api, f"/sessions/{s}/wait?match=corr=c-8&timeout=30"))
    eventually(lambda: web_api.waiters(s) == 1, what="the matching poll blocked")
    web_api.request("POST", f"/sessions/{s}/firings?tag=corr=c-9", b"not this one")
    web_api.request("POST", f"/sessions/{s}/firings?tag=corr=c-8", b"this one")
    status, answer = polled.result(timeout=30)
    assert status == 200 and results(answer) == [(4, "this one")]
    # nothing matching within the timeout: where it looked to, for a poll with ?after=
    _, none = call(web_api, "GET", f"/sessions/{s}/wait?match=corr=c-0&timeout=0")
    assert none == {"next": 4, "lost": 0, "firings": [], "timed_out": True}
    _, later = call(web_api, "GET", f"/sessions/{s}/wait?after=3&timeout=0")
    assert results(later) == [(4, "this one")]
    assert cursors(web_api, s) == {}


def test_a_blocked_poll_costs_no_evaluation(web_api: Web) -> None:
    s = web_api.session()
    polled = in_background(long_poll(web_api, f"/sessions/{s}/wait?timeout=30"))
    eventually(lambda: web_api.waiters(s) == 1, what="the poll blocked")
    stats = web_api.daemon.client()

    def evaluations() -> int:
        count: int = stats.ok({"op": "stats", "session": s})["sessions"][0]["evaluations"]
        return count

    before = evaluations()
    for _ in range(20):  # stats is no evaluation, and the blocked poll does none either
        assert evaluations() == before
    web_api.send(s, "wake")
    assert results(polled.result(timeout=30)[1]) == [(1, "wake")]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/sessions/S/wait?timeout=-1", None, 400, "bad_request"),
        ("GET", "/sessions/S/wait?timeout=soon", None, 400, "bad_request"),
        ("GET", "/sessions/S/wait?timeout=3601", None, 400, "bad_request"),
        ("GET", "/sessions/S/wait?ack=-1", None, 400, "bad_seq"),
        ("GET", "/sessions/S/wait?ack=5", None, 400, "ack_after_head"),
        ("GET", "/sessions/S/wait?ack=x", None, 400, "bad_request"),
        ("GET", "/sessions/S/wait?cursor=a%20b", None, 400, "bad_cursor_name"),
        ("GET", "/sessions/S/wait?cursor=", None, 400, "bad_cursor_name"),
        ("GET", "/sessions/S/wait?cursor=c&after=0", None, 400, "bad_request"),
        ("GET", "/sessions/S/wait?after=0&ack=0", None, 400, "bad_request"),
        ("GET", "/sessions/S/wait?max=0", None, 400, "bad_max"),
        ("GET", "/sessions/S/wait?after=5", None, 400, "cursor_after_head"),
        ("GET", "/sessions/S/wait?match=Bad", None, 400, "bad_tag"),
        ("GET", "/sessions/S/wait?handler=a%20b", None, 400, "bad_handler"),
        ("GET", "/sessions/nosuch/wait", None, 404, "no_such_session"),
        ("GET", "/sessions/nosuch/wait?ack=1", None, 404, "no_such_session"),
        ("POST", "/sessions/S/cursors/c", b'{"seq": 5}', 400, "ack_after_head"),
        ("POST", "/sessions/S/cursors/c", b'{"seq": -1}', 400, "bad_seq"),
        ("POST", "/sessions/S/cursors/c", b'{"seq": "1"}', 400, "bad_request"),
        ("POST", "/sessions/S/cursors/c", b"", 400, "bad_request"),
        ("POST", "/sessions/S/cursors/c", b"seq=1", 400, "bad_request"),
        ("POST", "/sessions/S/cursors/a%20b", b'{"seq": 0}', 400, "bad_cursor_name"),
        ("POST", "/sessions/nosuch/cursors/c", b'{"seq": 0}', 404, "no_such_session"),
        ("POST", "/sessions", b'{"id": "bad id"}', 400, "bad_session_id"),
        ("POST", "/sessions", b'{"buffer": 70000}', 400, "bad_limit"),
        ("POST", "/sessions", b'{"id": 7}', 400, "bad_request"),
        ("POST", "/sessions", b"[]", 400, "bad_request"),
        ("POST", "/sessions", b"{", 400, "bad_request"),
        ("DELETE", "/sessions/nosuch", None, 404, "no_such_session"),
        ("DELETE", "/sessions/bad%20id", None, 400, "bad_session_id"),
        ("PUT", "/sessions/S", None, 405, "unknown_op"),
        ("GET", "/sessions/S/cursors/c", None, 405, "unknown_op"),
    ],
)
def test_bad_consumer_requests_get_their_status_and_change_nothing(
    web_api: Web, method: str, path: str, body: bytes | None, status: int, code: str
) -> None:
    s = web_api.session()
    web_api.send(s, "kept")
    before = web_api.daemon.client().ok({"op": "stats"})["daemon"]["sessions"]
    got, headers, answer = web_api.request(
        method, path.replace("/S/", f"/{s}/").replace("/S", f"/{s}"), body
    )
    assert (got, headers["content-type"], answer["code"]) == (status, "application/json", code)
    assert "\n" not in answer["message"]
    assert cursors(web_api, s) == {}
    assert web_api.daemon.client().ok({"op": "stats"})["daemon"]["sessions"] == before
    assert [
        f["seq"]
        for f in web_api.daemon.client().ok({"op": "read", "session": s, "after": 0})["firings"]
    ] == [1]


def test_every_consumer_route_needs_the_token(web_api: Web) -> None:
    s = web_api.session()
    for method, path, body in (
        ("POST", "/sessions", b"{}"),
        ("DELETE", f"/sessions/{s}", None),
        ("GET", f"/sessions/{s}/wait?timeout=0", None),
        ("POST", f"/sessions/{s}/cursors/c", b'{"seq": 0}'),
    ):
        for token in (None, "wrong"):
            status, headers, answer = web_api.request(method, path, body, token=token)
            assert (status, answer["code"]) == (401, "unauthorized"), (method, path)
            assert headers["www-authenticate"] == "Bearer"
    assert s in {row["id"] for row in call(web_api, "GET", "/sessions")[1]}


def test_scoped_tokens_see_their_sessions_and_need_their_rights(web_api: Web) -> None:
    client = web_api.daemon.client()
    for session in ("cs-own.1", "cs-other.1"):
        client.ok({"op": "start", "session": session})
        client.ok({"op": "send", "session": session, "text": "x"})
    admin = scoped(web_api, "c-admin", ["cs-own.*"], ["admin"])
    reader = scoped(web_api, "c-reader", ["cs-own.*"], ["read"])
    sender = scoped(web_api, "c-sender", ["cs-own.*"], ["send"])
    # admin starts and stops within its patterns only
    assert call(admin, "POST", "/sessions", {"id": "cs-own.2"}) == (
        201,
        {"session": "cs-own.2", "created": True},
    )
    status, refused = call(admin, "POST", "/sessions", {"id": "cs-other.2"})
    assert (status, refused["code"]) == (403, "forbidden")
    status, refused = call(admin, "POST", "/sessions")  # an id of the daemon's: not its own
    assert (status, refused["code"]) == (403, "forbidden")
    assert call(admin, "DELETE", "/sessions/cs-own.2")[0] == 204
    # outside the patterns: missing, on every route, the same as a session never started
    for who, method, path, body in (
        (admin, "DELETE", "/sessions/{}", None),
        (reader, "GET", "/sessions/{}/wait?timeout=0", None),
        (reader, "GET", "/sessions/{}/wait?timeout=0&ack=1", None),
        (reader, "POST", "/sessions/{}/cursors/c", {"seq": 1}),
    ):
        hidden = call(who, method, path.format("cs-other.1"), body)
        missing = call(who, method, path.format("cs-other.404"), body)
        assert hidden[0] == missing[0] == 404, (method, path)
        assert hidden[1]["code"] == missing[1]["code"] == "no_such_session"
        assert hidden[1]["message"] == missing[1]["message"].replace("cs-other.404", "cs-other.1")
    assert cursors(web_api, "cs-other.1") == {}
    # a right it lacks: 403, and nothing moves
    for who, method, path, body in (
        (reader, "POST", "/sessions", {"id": "cs-own.3"}),
        (reader, "DELETE", "/sessions/cs-own.1", None),
        (sender, "GET", "/sessions/cs-own.1/wait?timeout=0", None),
        (sender, "GET", "/sessions/cs-own.1/wait?timeout=0&ack=1", None),
        (sender, "POST", "/sessions/cs-own.1/cursors/c", {"seq": 1}),
        (admin, "GET", "/sessions/cs-own.1/wait?timeout=0", None),
    ):
        status, answer = call(who, method, path, body)
        assert (status, answer["code"]) == (403, "forbidden"), (method, path)
    assert cursors(web_api, "cs-own.1") == {}
    # and what it may do, it does
    _, got = call(reader, "GET", "/sessions/cs-own.1/wait?timeout=5")
    assert results(got) == [(1, "x")]
    assert call(reader, "POST", "/sessions/cs-own.1/cursors/c", {"seq": 1}) == (
        200,
        {"cursor": "c", "seq": 1},
    )
    assert {row["id"] for row in call(web_api, "GET", "/sessions")[1]} >= {"cs-own.1", "cs-other.1"}


def test_a_revocation_ends_a_blocked_poll_with_401(web_api: Web) -> None:
    web_api.daemon.client().ok({"op": "start", "session": "cr-own.1"})
    agent = scoped(web_api, "c-revoked", ["cr-own.*"], ["read"])
    polled = in_background(long_poll(agent, "/sessions/cr-own.1/wait?timeout=30"))
    eventually(lambda: web_api.waiters("cr-own.1") == 1, what="the poll blocked")
    revoke(web_api, "c-revoked")
    status, answer = polled.result(timeout=30)
    assert (status, answer["code"]) == (401, "unauthorized") and "revoked" in answer["message"]
    assert web_api.waiters("cr-own.1") == 0
    assert call(agent, "GET", "/sessions/cr-own.1/wait?timeout=0")[0] == 401
