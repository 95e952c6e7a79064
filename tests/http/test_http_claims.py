"""Groups and claims over HTTP (SPEC §16): ``POST /sessions/{id}/groups/{name}/claim``, a
long poll answering ``200`` with the claim and the firing or ``204`` at its timeout;
``POST /sessions/{id}/claims/{claim}/done``, ``/release``, ``/extend``; ``GET
/sessions/{id}/groups`` and ``/claims``; ``POST``/``PUT /sessions/{id}/groups/{name}``.

Against a daemon process with ``--http``, over real sockets, with the standard
library's ``http.client`` as any program's client would be. What is proved: a claim
answers the firing and its claim token at once or when a firing comes; a claim that
times out is ``204`` and takes nothing (a later claim gets the firing); ``done``
finishes, a stale ``done`` is ``409 lease_lost`` and changes nothing; ``release`` with a
delay holds the firing back, and the last attempt goes to the dead-letter session;
``extend`` moves the lease's end; a token with ``read`` claims and finishes but may not
make a group (``403``); a client that hangs up mid-poll takes nothing (the next claim
gets attempt 1 of the firing); bad input is 400 and changes nothing.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest

from tests.helpers import DaemonProc, eventually
from tests.http.test_http_api import Web
from tests.http.test_http_tokens import scoped


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


def claim(web_api: Web, session: str, query: str = "timeout=0", group: str = "work") -> Any:
    """A claim's answer: its JSON on ``200``, None on ``204`` (nothing taken)."""
    status, answer = call(web_api, "POST", f"/sessions/{session}/groups/{group}/claim?{query}")
    if status == 204:
        assert answer == b""
        return None
    assert status == 200, answer
    return answer


def step(web_api: Web, session: str, token: str, what: str, query: str = "") -> tuple[int, Any]:
    """``done``, ``release`` or ``extend`` of a claim token."""
    return call(web_api, "POST", f"/sessions/{session}/claims/{token}/{what}?{query}")


def groups(web_api: Web, session: str) -> list[dict[str, Any]]:
    status, listed = call(web_api, "GET", f"/sessions/{session}/groups")
    assert status == 200
    rows: list[dict[str, Any]] = listed
    return rows


def held(web_api: Web, session: str, group: str | None = None) -> list[tuple[int, int]]:
    """The held firings' (seq, attempt)."""
    query = "" if group is None else f"?group={group}"
    status, listed = call(web_api, "GET", f"/sessions/{session}/claims{query}")
    assert status == 200
    return [(row["seq"], row["attempt"]) for row in listed]


def long_claim(web_api: Web, path: str) -> Callable[[], tuple[int, Any]]:
    """A blocking claim on a connection of its own, for ``in_background``."""

    def poll() -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", web_api.port, timeout=60)
        try:
            conn.request("POST", path, headers={"Authorization": f"Bearer {web_api.token}"})
            answer = conn.getresponse()
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else b""
        finally:
            conn.close()

    return poll


def test_a_claim_answers_200_with_the_claim_and_the_firing(web_api: Web) -> None:
    s = web_api.session()
    web_api.send(s, "resize photo 7")
    taken = claim(web_api, s, "lease=30s&timeout=5")
    assert set(taken) == {
        "claim",
        "seq",
        "attempt",
        "lease_until",
        "lease_until_ms",
        "lost",
        "firing",
    }
    assert (taken["claim"], taken["seq"], taken["attempt"], taken["lost"]) == ("work:1:1", 1, 1, 0)
    assert (taken["firing"]["seq"], taken["firing"]["result"]) == (1, "resize photo 7")
    assert taken["firing"]["by"] == "root"
    status, listed = call(web_api, "GET", f"/sessions/{s}/claims?group=work")
    assert (status, listed) == (
        200,
        [
            {
                "group": "work",
                "seq": 1,
                "attempt": 1,
                "lease_until": taken["lease_until"],
                "lease_until_ms": taken["lease_until_ms"],
            }
        ],
    )
    assert groups(web_api, s) == [
        {
            "name": "work",
            "done": 0,
            "ready": 0,
            "held": 1,
            "delayed": 0,
            "dead": 0,
            "max_attempts": 5,
            "dead_letter": f"{s}.dead",
        }
    ]
    assert held(web_api, s, "other") == []
    # a blocked claim is woken by a send, and counts among the session's waiters meanwhile
    polled = in_background(long_claim(web_api, f"/sessions/{s}/groups/work/claim?timeout=30"))
    eventually(lambda: web_api.waiters(s) == 1, what="the claim blocked")
    assert not polled.done()
    web_api.send(s, "resize photo 8")
    status, second = polled.result(timeout=30)
    assert status == 200 and (second["claim"], second["firing"]["result"]) == (
        "work:2:1",
        "resize photo 8",
    )
    assert web_api.waiters(s) == 0
    # another group gets every firing once too, and a reader takes nothing from either
    other = claim(web_api, s, group="audit")
    assert (other["claim"], other["seq"]) == ("audit:1:1", 1)
    assert call(web_api, "GET", f"/sessions/{s}/firings?after=0")[1]["next"] == 2


def test_a_claim_that_times_out_is_204_and_takes_nothing(web_api: Web) -> None:
    s = web_api.session()
    assert claim(web_api, s, "timeout=0") is None  # nothing there yet: the group is made
    assert [g["name"] for g in groups(web_api, s)] == ["work"]
    web_api.send(s, "job")
    first = claim(web_api, s)
    assert first["claim"] == "work:1:1"
    # the only firing is held: a second claimer times out with nothing taken
    assert claim(web_api, s, "timeout=0.2") is None
    assert held(web_api, s) == [(1, 1)]
    # and once it is given back, the second claimer gets it, its second attempt
    assert step(web_api, s, first["claim"], "release") == (200, {"dead": False})
    again = claim(web_api, s, "timeout=5")
    assert (again["claim"], again["seq"], again["attempt"]) == ("work:1:2", 1, 2)


def test_done_finishes_and_a_stale_done_is_409_lease_lost_and_changes_nothing(
    web_api: Web,
) -> None:
    s = web_api.session()
    web_api.send(s, "one")
    web_api.send(s, "two")
    stale = claim(web_api, s)["claim"]
    assert step(web_api, s, stale, "release")[0] == 200
    live = claim(web_api, s)  # the same firing, another attempt: the first claim is stale
    assert (live["claim"], live["attempt"]) == ("work:1:2", 2)
    before = (groups(web_api, s), held(web_api, s))
    for what in ("done", "release", "extend"):
        status, refused = step(web_api, s, stale, what)
        assert (status, refused["code"]) == (409, "lease_lost"), what
        assert "work:1:1" in refused["message"]
    assert (groups(web_api, s), held(web_api, s)) == before
    # the live claim finishes; then it is stale itself
    assert step(web_api, s, live["claim"], "done") == (200, {"seq": 1})
    status, twice = step(web_api, s, live["claim"], "done")
    assert (status, twice["code"]) == (409, "lease_lost")
    (row,) = groups(web_api, s)
    assert (row["done"], row["ready"], row["held"]) == (1, 1, 0)
    nxt = claim(web_api, s)
    assert (nxt["claim"], nxt["firing"]["result"]) == ("work:2:1", "two")
    assert step(web_api, s, nxt["claim"], "done") == (200, {"seq": 2})
    assert claim(web_api, s) is None  # each firing done once: nothing is offered again


def test_release_with_a_delay_holds_the_firing_back_and_the_last_attempt_is_dead(
    web_api: Web,
) -> None:
    s = web_api.session()
    web_api.send(s, "flaky job")
    first = claim(web_api, s)
    assert step(web_api, s, first["claim"], "release", "delay=5m") == (200, {"dead": False})
    (row,) = groups(web_api, s)
    assert (row["ready"], row["held"], row["delayed"]) == (0, 0, 1)
    assert claim(web_api, s) is None  # delayed: not claimable now
    assert held(web_api, s) == []
    # a group whose firings get one attempt: its last release is dead, in the dead letters
    status, made = call(web_api, "PUT", f"/sessions/{s}/groups/once", {"max_attempts": 1})
    assert (status, made["name"], made["max_attempts"], made["ready"]) == (200, "once", 1, 1)
    only = claim(web_api, s, group="once")
    assert step(web_api, s, only["claim"], "release", "delay=90") == (200, {"dead": True})
    (once,) = [g for g in groups(web_api, s) if g["name"] == "once"]
    assert (once["done"], once["dead"], once["ready"], once["delayed"]) == (1, 1, 0, 0)
    dead = call(web_api, "GET", f"/sessions/{s}.dead/firings")[1]["firings"]
    assert [(f["result"], f["tags"]["dead.group"]) for f in dead] == [("flaky job", "once")]


def test_extend_moves_the_lease_on(web_api: Web) -> None:
    s = web_api.session()
    web_api.send(s, "long job")
    taken = claim(web_api, s, "lease=10s")
    status, extended = step(web_api, s, taken["claim"], "extend", "lease=2m")
    assert status == 200 and set(extended) == {"lease_until", "lease_until_ms"}
    assert extended["lease_until_ms"] > taken["lease_until_ms"]
    status, listed = call(web_api, "GET", f"/sessions/{s}/claims")
    assert [(r["lease_until"], r["lease_until_ms"]) for r in listed] == [
        (extended["lease_until"], extended["lease_until_ms"])
    ]
    # plain seconds, as ?timeout= takes them; the default is 60 s
    assert step(web_api, s, taken["claim"], "extend", "lease=600")[0] == 200
    assert step(web_api, s, taken["claim"], "extend")[0] == 200
    assert held(web_api, s) == [(1, 1)]


def test_a_read_only_token_claims_and_finishes_but_makes_no_group(web_api: Web) -> None:
    """A worker's token that sees its session alone claims from a group made for it: its
    own first claim would make one whose dead letters go to a session it does not see
    (403, nothing made), and making a group needs admin."""
    s = web_api.session()
    web_api.send(s, "job")
    worker = scoped(web_api, "worker-claims", [s], ["read"])
    status, refused = call(worker, "POST", f"/sessions/{s}/groups/work/claim?timeout=0")
    assert (status, refused["code"]) == (403, "forbidden")
    assert refused["message"].startswith(f"session '{s}' has no group 'work', and a new group")
    assert groups(web_api, s) == []
    assert call(web_api, "PUT", f"/sessions/{s}/groups/work", {})[0] == 200  # the root's
    taken = claim(worker, s)
    assert taken["claim"] == "work:1:1"
    assert step(worker, s, taken["claim"], "extend")[0] == 200
    assert [g["name"] for g in groups(worker, s)] == ["work"]
    assert held(worker, s) == [(1, 1)]
    assert step(worker, s, taken["claim"], "done") == (200, {"seq": 1})
    for method in ("POST", "PUT"):
        status, refused = call(worker, method, f"/sessions/{s}/groups/fast", {"max_attempts": 2})
        assert (status, refused["code"]) == (403, "forbidden")
    assert [g["name"] for g in groups(web_api, s)] == ["work"]  # nothing made
    # a token that may only send may not claim; a session outside its patterns is 404
    sender = scoped(web_api, "sender-claims", [s], ["send"])
    status, refused = call(sender, "POST", f"/sessions/{s}/groups/work/claim?timeout=0")
    assert (status, refused["code"]) == (403, "forbidden")
    other = web_api.session()
    status, hidden = call(worker, "POST", f"/sessions/{other}/groups/work/claim?timeout=0")
    assert (status, hidden["code"]) == (404, "no_such_session")


def test_a_client_that_hangs_up_mid_poll_takes_nothing(web_api: Web) -> None:
    s = web_api.session()
    conn = http.client.HTTPConnection("127.0.0.1", web_api.port, timeout=10)
    conn.request(
        "POST",
        f"/sessions/{s}/groups/work/claim?timeout=600",
        headers={"Authorization": f"Bearer {web_api.token}"},
    )
    eventually(lambda: web_api.waiters(s) == 1, what="the claim blocked")
    conn.close()  # hangs up without reading an answer
    eventually(lambda: web_api.waiters(s) == 0, what="the claim released")
    web_api.send(s, "after the hang-up")
    assert held(web_api, s) == []
    taken = claim(web_api, s, "timeout=5")
    assert (taken["claim"], taken["seq"], taken["attempt"]) == ("work:1:1", 1, 1)
    assert web_api.request("GET", "/healthz", token=None)[0] == 200


def test_a_groups_body_with_a_field_it_does_not_know_is_refused_naming_it(web_api: Web) -> None:
    """A misspelt field (``max_attempt``) was ignored: the group made with 5 attempts, 200.
    Now 400, naming it and the fields there are, and no group is made; a bad group name is
    told as a group's, not a cursor's."""
    s = web_api.session()
    for method in ("PUT", "POST"):
        status, refused = call(web_api, method, f"/sessions/{s}/groups/e", {"max_attempt": 9})
        assert (status, refused) == (
            400,
            {
                "code": "bad_request",
                "message": "the body has no field 'max_attempt': send {\"max_attempts\": N, "
                '"dead_letter": SESSION, "from_now": true}',
            },
        )
    status, refused = call(web_api, "PUT", f"/sessions/{s}/groups/a%20b", {})
    assert (status, refused) == (
        400,
        {
            "code": "bad_group_name",
            "message": "group name 'a b' is not 1-64 printable characters without whitespace",
        },
    )
    assert groups(web_api, s) == []


def test_a_lease_out_of_bounds_is_told_in_the_seconds_it_was_given_in(web_api: Web) -> None:
    s = web_api.session()
    for query, says in (
        ("lease=100000", "lease 100,000 s is not between 1 s and 24 h"),
        ("lease=0.5", "lease 0.5 s is not between 1 s and 24 h"),
        ("lease=25h", "lease 90,000 s is not between 1 s and 24 h"),
    ):
        status, refused = call(web_api, "POST", f"/sessions/{s}/groups/work/claim?{query}")
        assert (status, refused) == (400, {"code": "bad_time", "message": says}), query
    assert groups(web_api, s) == []


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/sessions/S/groups/work/claim?lease=soon", None, 400, "bad_time"),
        ("POST", "/sessions/S/groups/work/claim?lease=0", None, 400, "bad_time"),
        ("POST", "/sessions/S/groups/work/claim?lease=25h", None, 400, "bad_time"),
        ("POST", "/sessions/S/groups/work/claim?timeout=-1", None, 400, "bad_request"),
        ("POST", "/sessions/S/groups/work/claim?timeout=3601", None, 400, "bad_request"),
        ("POST", "/sessions/S/groups/work/claim?from_now=maybe", None, 400, "bad_request"),
        ("POST", "/sessions/S/groups/work/claim?match=Bad", None, 400, "bad_tag"),
        ("POST", "/sessions/S/groups/a%20b/claim", None, 400, "bad_group_name"),
        ("GET", "/sessions/S/claims?group=a%20b", None, 400, "bad_group_name"),
        ("PUT", "/sessions/S/groups/a%20b", b"{}", 400, "bad_group_name"),
        ("PUT", "/sessions/S/groups/work", b'{"max_attempt": 9}', 400, "bad_request"),
        ("POST", "/sessions/S/groups/work", b'{"from-now": true}', 400, "bad_request"),
        ("POST", "/sessions/nosuch/groups/work/claim", None, 404, "no_such_session"),
        ("GET", "/sessions/S/groups/work/claim", None, 405, "unknown_op"),
        ("POST", "/sessions/S/claims/bogus/done", None, 400, "bad_claim"),
        ("POST", "/sessions/S/claims/work:1:1/done", None, 409, "lease_lost"),
        ("POST", "/sessions/S/claims/work:1:1/release?delay=x", None, 400, "bad_time"),
        ("POST", "/sessions/S/claims/work:1:1/extend?lease=-5", None, 400, "bad_time"),
        ("GET", "/sessions/S/claims/work:1:1/done", None, 405, "unknown_op"),
        ("POST", "/sessions/nosuch/claims/work:1:1/done", None, 404, "no_such_session"),
        ("PUT", "/sessions/S/groups/work", b'{"max_attempts": 0}', 400, "bad_max"),
        ("PUT", "/sessions/S/groups/work", b'{"max_attempts": "2"}', 400, "bad_request"),
        ("POST", "/sessions/S/groups/work", b"{", 400, "bad_request"),
        ("PUT", "/sessions/S/groups/work", b'{"dead_letter": "bad id"}', 400, "bad_session_id"),
        ("GET", "/sessions/nosuch/groups", None, 404, "no_such_session"),
        ("GET", "/sessions/nosuch/claims", None, 404, "no_such_session"),
        ("DELETE", "/sessions/S/groups", None, 405, "unknown_op"),
    ],
)
def test_bad_claim_requests_get_their_status_and_change_nothing(
    web_api: Web, method: str, path: str, body: bytes | None, status: int, code: str
) -> None:
    s = web_api.session()
    web_api.send(s, "kept")
    got, headers, answer = web_api.request(method, path.replace("/S/", f"/{s}/"), body)
    assert (got, headers["content-type"], answer["code"]) == (status, "application/json", code)
    assert groups(web_api, s) == []  # no group was made by a refused request
    assert claim(web_api, s)["claim"] == "work:1:1"  # and the firing is there to claim


@pytest.mark.parametrize("lost", [True, False])
def test_a_claim_whose_client_left_before_its_answer_was_written_is_given_back(
    lost: bool,
) -> None:
    """The window a hang-up mid-poll does not cover: the claim has answered, and the
    connection is lost before its answer is written. The answer (``Handed``) gives the
    firing back then, and only then (a daemon cannot make that window on demand)."""
    import asyncio

    from repl_daemon.http.consumer import Handed
    from repl_daemon.http.streams import line_of

    given: list[str] = []
    sent: list[dict[str, Any]] = []
    scope: dict[str, Any] = {"type": "http", "method": "POST", "headers": []}
    if lost:
        line_of(scope).lost()  # as uvicorn's protocol tells it: its writes then go nowhere

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    response = Handed(b'{"claim": "work:1:1"}', lambda: given.append("work:1:1"))
    asyncio.run(response(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert given == (["work:1:1"] if lost else [])


def test_done_next_finishes_and_answers_the_next_claim_or_its_timeout(web_api: Web) -> None:
    """``POST /sessions/{id}/claims/{claim}/next``, the generic route of ``done_next``: the
    next claim and its firing, ``200`` with ``timed_out`` when nothing came (the done
    made), ``409 lease_lost`` for a claim no longer live, taking nothing; it blocks as a
    claim does until a firing comes."""
    s = web_api.session()
    web_api.send(s, "one")
    web_api.send(s, "two")
    first = claim(web_api, s)["claim"]
    status, following = step(web_api, s, first, "next", "lease=30")
    assert status == 200, following
    assert (following["claim"], following["firing"]["result"]) == ("work:2:1", "two")
    assert following["timed_out"] is False
    status, none = step(web_api, s, "work:2:1", "next", "timeout=0")
    assert (status, none["timed_out"], none["claim"]) == (200, True, None)
    (row,) = groups(web_api, s)
    assert (row["done"], row["held"]) == (2, 0)
    status, refused = step(web_api, s, "work:2:1", "next", "timeout=0")
    assert (status, refused["code"]) == (409, "lease_lost")
    # it blocks until a firing comes, as a claim does
    third = claim(web_api, s, "timeout=0")
    assert third is None
    web_api.send(s, "three")
    token = claim(web_api, s)["claim"]
    poll = in_background(long_claim(web_api, f"/sessions/{s}/claims/{token}/next?timeout=30"))
    eventually(lambda: groups(web_api, s)[0]["done"] == 3, what="the done before the block")
    web_api.send(s, "four")
    status, fourth = poll.result(timeout=30)
    assert (status, fourth["claim"], fourth["firing"]["result"]) == (200, "work:4:1", "four")
    assert held(web_api, s) == [(4, 1)]
