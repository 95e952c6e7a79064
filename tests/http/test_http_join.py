"""Join over HTTP (SPEC §18, docs/semantics.md J6): ``GET /wait?session=A&session=B`` with
``?all=true``, ``GET /sessions/{id}/gather?corr=...`` and ``GET /sessions/{id}/join``, three
long polls against a daemon process with ``--http``, over real sockets, with the standard
library's ``http.client`` as any program's client would be.

What is proved: each blocks until the last piece arrives, sent from another client (the
line protocol), and then answers ``200`` with the op's answer; at its ``?timeout=`` it
answers ``200`` with ``timed_out`` and what it has to say then (what came, what is
missing, what is left), having moved nothing; a client that hangs up lets it go; bad
input is ``400`` with its code, a session that is not there (or that the token does not
see) ``404``, a token without ``read`` ``403``, a revoked one ``401``, each JSON.

A blocked poll runs in a thread of its own; the test waits for the daemon to count it
among the session's waiters (a bounded wait for an event, never a sleep) before it sends
what completes it, and an answer that came too early would lack what was sent after.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers import DaemonProc, eventually
from tests.http.test_http_api import Web
from tests.http.test_http_claims import in_background
from tests.http.test_http_tokens import revoke, scoped


@pytest.fixture
def web_api(web: DaemonProc) -> Iterator[Web]:
    yield Web(web)
    web.close_clients()


def get(web_api: Web, path: str, token: str | None = "") -> tuple[int, Any]:
    """A GET's status and its JSON (``b""`` for none)."""
    status, _, answer = web_api.request("GET", path, token=token)
    return status, answer


def long_get(web_api: Web, path: str) -> Callable[[], tuple[int, Any]]:
    """A blocking GET on a connection of its own, for ``in_background``."""

    def poll() -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", web_api.port, timeout=60)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {web_api.token}"})
            answer = conn.getresponse()
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else b""
        finally:
            conn.close()

    return poll


def blocked(web_api: Web, *sessions: str) -> None:
    """Once the daemon counts a waiter on each of ``sessions``."""
    for session in sessions:
        eventually(lambda s=session: web_api.waiters(s) == 1, what=f"a poll blocked on {session}")


def send(web_api: Web, session: str, text: str, **tags: str) -> int:
    seq: int = web_api.daemon.client().ok(
        {"op": "send", "session": session, "text": text, "tags": tags}
    )["seq"]
    return seq


def cursors(web_api: Web, session: str) -> dict[str, int]:
    listed = web_api.daemon.client().ok({"op": "cursors", "session": session})["cursors"]
    return {row["name"]: row["seq"] for row in listed}


def claim(web_api: Web, session: str) -> str:
    request = {"op": "claim", "session": session, "timeout_ms": 0}
    token: str = web_api.daemon.client().ok(request)["claim"]
    return token


def done(web_api: Web, session: str, token: str) -> None:
    web_api.daemon.client().ok({"op": "done", "session": session, "claim": token})


def texts(batches: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    return [(b["session"], [f["result"] for f in b["firings"]]) for b in batches]


# -- answered when the last piece arrives ---------------------------------------------


def test_a_wait_on_all_answers_200_once_every_session_has_firings(web_api: Web) -> None:
    a, b, c = web_api.session(), web_api.session(), web_api.session()
    send(web_api, b, "b early")  # an early arrival counts at once
    path = f"/wait?session={a}&session={b}&session={c}&all=true&timeout=30"
    answer = in_background(long_get(web_api, path))
    blocked(web_api, a, b, c)
    send(web_api, a, "a")
    send(web_api, a, "a again")
    send(web_api, c, "c last")
    status, woken = answer.result(timeout=30)
    assert status == 200, woken
    assert woken["timed_out"] is False
    assert texts(woken["batches"]) == [(a, ["a", "a again"]), (b, ["b early"]), (c, ["c last"])]
    assert [batch["next"] for batch in woken["batches"]] == [2, 1, 1]
    assert cursors(web_api, a) == cursors(web_api, b) == {}  # nothing acknowledged
    # the next wait acknowledges them all together, and finds nothing more
    acks = "&".join(f"ack={batch['session']}:{batch['next']}" for batch in woken["batches"])
    status, again = get(
        web_api, f"/wait?session={a}&session={b}&session={c}&all=true&timeout=0&{acks}"
    )
    assert (status, again) == (200, {"batches": [], "timed_out": True})
    assert [cursors(web_api, s) for s in (a, b, c)] == [{"wait": 2}, {"wait": 1}, {"wait": 1}]


def test_a_wait_on_several_sessions_answers_with_the_first_that_has_firings(
    web_api: Web,
) -> None:
    a, b = web_api.session(), web_api.session()
    answer = in_background(long_get(web_api, f"/wait?session={a}&session={b}&cursor=mine"))
    blocked(web_api, a, b)
    send(web_api, b, "b first")
    status, woken = answer.result(timeout=30)
    assert status == 200 and texts(woken["batches"]) == [(b, ["b first"])]
    assert woken["timed_out"] is False


def test_a_gather_answers_200_when_the_last_reply_comes(web_api: Web) -> None:
    me = web_api.session()
    send(web_api, me, "w2's early reply", corr="c-2")
    send(web_api, me, "not a reply")
    answer = in_background(long_get(web_api, f"/sessions/{me}/gather?corr=c-1&corr=c-2&corr=c-3"))
    blocked(web_api, me)
    send(web_api, me, "w3's reply", corr="c-3")
    send(web_api, me, "a retry of w2's", corr="c-2")
    send(web_api, me, "w1's reply", corr="c-1")
    status, gathered = answer.result(timeout=30)
    assert status == 200, gathered
    assert [f["result"] for f in gathered["firings"]] == [
        "w1's reply",
        "w2's early reply",  # the first by seq of c-2, not the retry's
        "w3's reply",
    ]
    assert (gathered["missing"], gathered["timed_out"]) == ([], False)
    # it moved nothing: asked again, it answers the same at once
    assert get(web_api, f"/sessions/{me}/gather?corr=c-1&corr=c-2&corr=c-3") == (200, gathered)
    assert cursors(web_api, me) == {}


def test_a_join_answers_200_when_the_last_job_is_done(web_api: Web) -> None:
    jobs = web_api.session()
    for n in range(3):
        send(web_api, jobs, f"job {n}")
    first, second, third = (claim(web_api, jobs) for _ in range(3))
    answer = in_background(long_get(web_api, f"/sessions/{jobs}/join?timeout=30"))
    blocked(web_api, jobs)
    done(web_api, jobs, first)
    send(web_api, jobs, "a job posted after the join began: not waited for")
    done(web_api, jobs, second)
    done(web_api, jobs, third)
    status, joined = answer.result(timeout=30)
    assert status == 200, joined
    assert joined == {
        "upto": 3,
        "done": 3,
        "dead": 0,
        "ready": 0,
        "held": 0,
        "delayed": 0,
        "timed_out": False,
    }
    # the fourth job is still there: a join takes nothing
    assert web_api.daemon.client().ok({"op": "groups", "session": jobs})["groups"][0]["ready"] == 1


def test_a_join_of_another_group_up_to_a_seq(web_api: Web) -> None:
    jobs, dlq = web_api.session(), web_api.session()
    client = web_api.daemon.client()
    client.ok({"op": "group", "session": jobs, "group": "g/1", "max_attempts": 1})
    client.ok({"op": "group", "session": jobs, "group": "g/1", "dead_letter": dlq})
    send(web_api, jobs, "fine")
    send(web_api, jobs, "poison")
    send(web_api, jobs, "not waited for: after upto")
    fine = client.ok({"op": "claim", "session": jobs, "group": "g/1", "timeout_ms": 0})["claim"]
    poison = client.ok({"op": "claim", "session": jobs, "group": "g/1", "timeout_ms": 0})["claim"]
    answer = in_background(long_get(web_api, f"/sessions/{jobs}/join?group=g%2F1&upto=2"))
    blocked(web_api, jobs)
    client.ok({"op": "done", "session": jobs, "claim": fine})
    assert client.ok({"op": "release", "session": jobs, "claim": poison})["dead"] is True
    status, joined = answer.result(timeout=30)
    assert status == 200, joined
    assert (joined["upto"], joined["done"], joined["dead"], joined["timed_out"]) == (2, 2, 1, False)


# -- at the timeout: 200, timed_out, nothing moved -------------------------------------


def test_at_the_timeout_each_answers_200_timed_out_and_moves_nothing(web_api: Web) -> None:
    a, b = web_api.session(), web_api.session()
    send(web_api, a, "only a", corr="x")
    status, woken = get(web_api, f"/wait?session={a}&session={b}&all=true&cursor=co&timeout=0.2")
    assert (status, woken) == (200, {"batches": [], "timed_out": True})
    assert cursors(web_api, a) == {}  # looked at, never acknowledged
    status, gathered = get(web_api, f"/sessions/{a}/gather?corr=y&corr=x&corr=z&timeout=0.2")
    assert status == 200
    assert [f["result"] for f in gathered["firings"]] == ["only a"]
    assert (gathered["missing"], gathered["timed_out"]) == (["y", "z"], True)
    held = claim(web_api, a)
    status, joined = get(web_api, f"/sessions/{a}/join?timeout=0.2")
    assert status == 200
    assert (joined["upto"], joined["done"], joined["held"], joined["timed_out"]) == (1, 0, 1, True)
    assert cursors(web_api, a) == {}
    done(web_api, a, held)  # the claim was the test's: the join took nothing from it
    assert get(web_api, f"/sessions/{a}/join?timeout=0")[1]["timed_out"] is False


def test_a_client_that_hangs_up_lets_its_poll_go(web_api: Web) -> None:
    s, empty = web_api.session(), web_api.session()
    send(web_api, s, "a job nobody claims")
    for path in (
        f"/sessions/{s}/gather?corr=never&timeout=30",
        f"/sessions/{s}/join?timeout=30",
        f"/wait?session={s}&session={empty}&all=true&timeout=30",
    ):
        sock = socket.create_connection(("127.0.0.1", web_api.port), timeout=10)
        try:
            lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1"]
            lines += [f"Authorization: Bearer {web_api.token}"]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            blocked(web_api, s)
        finally:
            sock.close()
        eventually(lambda: web_api.waiters(s) == 0, what=f"{path} let go")
    assert cursors(web_api, s) == {}


def test_a_stopped_session_ends_a_blocked_poll_410(web_api: Web) -> None:
    empty = web_api.session()
    for path in (
        "/sessions/{s}/join",
        "/sessions/{s}/gather?corr=x",
        "/wait?session={s}&session={empty}&all=1",
    ):
        s = web_api.session()
        send(web_api, s, "a job nobody does")
        answer = in_background(long_get(web_api, path.format(s=s, empty=empty)))
        blocked(web_api, s)
        web_api.daemon.client().ok({"op": "stop", "session": s})
        status, refused = answer.result(timeout=30)
        assert (status, refused["code"]) == (410, "session_stopped"), (path, refused)
        assert s in refused["message"]


# -- refusals --------------------------------------------------------------------------


def test_bad_input_is_400_with_its_code_and_changes_nothing(web_api: Web) -> None:
    s = web_api.session()
    send(web_api, s, "one")
    for path, code, words in (
        (f"/sessions/{s}/join?group=bad%20name!&timeout=0", "bad_group_name", "bad name!"),
        (f"/sessions/{s}/join?upto=2&timeout=0", "bad_seq", "upto 2"),
        (f"/sessions/{s}/join?upto=x", "bad_request", "?upto='x' is not a whole number"),
        (f"/sessions/{s}/join?timeout=soon", "bad_request", "?timeout='soon'"),
        (f"/sessions/{s}/join?timeout=3601", "bad_request", "from 0 to 3600"),
        (f"/sessions/{s}/gather", "bad_request", "?corr= is missing: give it once for each corr"),
        (f"/sessions/{s}/gather?corr=" + "x" * 1025, "bad_tag", "over 1,024 characters"),
        (f"/sessions/{s}/gather?corr=a&timeout=-1", "bad_request", "?timeout='-1'"),
        ("/wait?all=true", "bad_request", "give ?session=ID"),
        (f"/wait?session={s}&ack={s}", "bad_request", "is not ID:SEQ"),
        (f"/wait?session={s}&ack={s}:1&ack={s}:1", "bad_request", "twice"),
        (f"/wait?session={s}&match=k&ack={s}:1", "bad_request", "?ack= needs a cursor"),
        (f"/wait?session={s}&ack=other:1&timeout=0", "bad_request", "not on"),
        (f"/wait?session={s}&ack={s}:9&timeout=0", "ack_after_head", "9"),
        (f"/wait?session={s}&all=maybe", "bad_request", "?all='maybe' is not true or false"),
        ("/wait?session=bad%20id", "bad_session_id", "bad id"),
    ):
        status, refused = get(web_api, path)
        assert (status, refused["code"]) == (400, code), (path, refused)
        assert words in refused["message"], (path, refused)
    assert cursors(web_api, s) == {}
    assert web_api.daemon.client().ok({"op": "groups", "session": s})["groups"] == []


def test_a_session_that_is_not_there_is_404(web_api: Web) -> None:
    s = web_api.session()
    for path in (
        "/sessions/hj-none/gather?corr=a",
        "/sessions/hj-none/join",
        f"/wait?session={s}&session=hj-none&all=true",
    ):
        status, refused = get(web_api, path)
        assert (status, refused["code"]) == (404, "no_such_session"), (path, refused)
        assert "hj-none" in refused["message"]


def test_a_token_without_read_is_403_and_one_that_does_not_see_the_session_404(
    web_api: Web,
) -> None:
    mine, other = web_api.session(), web_api.session()
    sender = scoped(web_api, "hj-sender", [mine], ["send"])
    reader = scoped(web_api, "hj-reader", [mine], ["read"])
    for path in (
        f"/sessions/{mine}/gather?corr=a",
        f"/sessions/{mine}/join",
        f"/wait?session={mine}&all=true",
    ):
        status, refused = get(sender, path)
        assert (status, refused["code"]) == (403, "forbidden"), (path, refused)
        assert "no read right" in refused["message"]
        status, hidden = get(reader, path.replace(mine, other))
        assert (status, hidden["code"]) == (404, "no_such_session"), (path, hidden)
    # the reader's own session it may join and gather, and a revocation ends its poll: 401
    assert get(reader, f"/sessions/{mine}/join?timeout=0")[0] == 200
    send(web_api, mine, "a job")
    answer = in_background(long_get(reader, f"/sessions/{mine}/join?timeout=30"))
    blocked(web_api, mine)
    revoke(web_api, "hj-reader")
    status, refused = answer.result(timeout=30)
    assert (status, refused["code"]) == (401, "unauthorized")
