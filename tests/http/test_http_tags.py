"""Tags and matching readers over HTTP (issue 25), against a daemon process with ``--http``.

A send takes its tags as ``?tag=KEY=VALUE`` (repeatable); a read and an event
stream take ``?match=KEY=VALUE`` / ``?match=KEY`` (repeatable: all must hold)
and ``?handler=NAME``. A matching read given no ``after`` looks at the whole
ring; a matching stream sends only the firings that match, with their seq as
``id:``, and stays blocked, at no cost, through the ones that do not. A
webhook's firing carries ``event`` and ``delivery``. A bad tag or match is
``400 bad_tag`` and records nothing. The CLI, as a subprocess, sees the same
tags and matches the same firings. The client is the standard library's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.helpers import DaemonProc, Repl, eventually
from tests.http.test_http_api import Stream, Web
from tests.http.test_http_webhooks import signed


@pytest.fixture
def web_api(web: DaemonProc) -> Iterator[Web]:
    yield Web(web)
    web.close_clients()


def post(web_api: Web, session: str, text: str, query: str = "") -> tuple[int, Any]:
    status, _, body = web_api.request("POST", f"/sessions/{session}/firings{query}", text.encode())
    return status, body


def get(web_api: Web, path: str) -> Any:
    status, _, body = web_api.request("GET", path)
    assert status == 200, body
    return body


def ring(web_api: Web, session: str) -> list[dict[str, Any]]:
    firings: list[dict[str, Any]] = web_api.daemon.client().ok(
        {"op": "read", "session": session, "after": 0}
    )["firings"]
    return firings


def evaluations(web_api: Web, session: str) -> int:
    stats = web_api.daemon.client().ok({"op": "stats", "session": session})
    count: int = stats["sessions"][0]["evaluations"]
    return count


def test_a_send_carries_its_tags_and_a_matching_read_finds_only_those(web_api: Web) -> None:
    s = web_api.session()
    odd = "deploy = done, ☃ & more"  # '=', ',' and '&' in a value: the query encodes them
    assert post(web_api, s, "plain") == (201, {"seq": 1, "duplicate": False})
    query = f"?tag=corr=c-1&tag=note={quote(odd)}"
    assert post(web_api, s, "the reply", query) == (201, {"seq": 2, "duplicate": False})
    assert post(web_api, s, "another", "?tag=corr=c-2&handler=on-build")[0] == 201
    everything = get(web_api, f"/sessions/{s}/firings")
    assert [f["tags"] for f in everything["firings"]] == [
        {},
        {"corr": "c-1", "note": odd},
        {"corr": "c-2"},
    ]
    # no after: the whole ring, only what matches; next is the last seq looked at
    found = get(web_api, f"/sessions/{s}/firings?match=corr=c-1")
    assert (found["next"], found["lost"]) == (3, 0)
    assert [(f["seq"], f["result"]) for f in found["firings"]] == [(2, "the reply")]
    present = get(web_api, f"/sessions/{s}/firings?match=corr")
    assert [f["seq"] for f in present["firings"]] == [2, 3]
    both = get(web_api, f"/sessions/{s}/firings?match=corr&match=note={quote(odd)}")
    assert [f["seq"] for f in both["firings"]] == [2]
    by_handler = get(web_api, f"/sessions/{s}/firings?handler=on-build")
    assert [f["seq"] for f in by_handler["firings"]] == [3]
    after = get(web_api, f"/sessions/{s}/firings?match=corr&after=2")
    assert [f["seq"] for f in after["firings"]] == [3]
    nothing = get(web_api, f"/sessions/{s}/firings?match=corr=c-9")
    assert (nothing["next"], nothing["firings"]) == (3, [])
    # a read, matching or not, touches no cursor
    assert web_api.daemon.client().ok({"op": "cursors", "session": s})["cursors"] == []


def test_the_cli_sees_the_tags_http_sent_and_http_matches_what_the_cli_tagged(
    web_api: Web,
) -> None:
    repl = Repl(web_api.daemon)
    s = web_api.session()
    assert post(web_api, s, "from http", "?tag=corr=h-1")[0] == 201
    assert repl.ok("send", s, "from the cli", "--tag", "corr=c-1", "--tag", "env=prod") == "2\n"
    lines = repl.ok("read", s, "--after", "0", "--json").splitlines()
    assert [json.loads(line).get("tags") for line in lines[1:]] == [
        {"corr": "h-1"},
        {"corr": "c-1", "env": "prod"},
    ]
    read = repl.ok("read", s, "--match", "corr=h-1", "--json").splitlines()
    assert [json.loads(line)["result"] for line in read[1:]] == ["from http"]
    found = get(web_api, f"/sessions/{s}/firings?match=env=prod")
    assert [(f["result"], f["tags"]) for f in found["firings"]] == [
        ("from the cli", {"corr": "c-1", "env": "prod"})
    ]


#: a bad tag or match, on each route that takes one
BAD: list[tuple[str, str]] = [
    ("POST", "?tag=Upper=1"),
    ("POST", "?tag=novalue"),
    ("POST", "?tag==empty-key"),
    ("POST", "?tag=k=1&tag=k=2"),
    ("POST", "?" + "&".join(f"tag=k{i}=v" for i in range(17))),
    ("POST", "?tag=k=" + "v" * 1025),
    ("GET", "/firings?match=Upper"),
    ("GET", "/firings?match=k&match=k=1"),
    ("GET", "/firings?match=k=" + "v" * 1025),
    ("GET", "/firings?" + "&".join(f"match=k{i}" for i in range(17))),
    ("GET", "/events?match=bad%20key"),
    ("GET", "/events?match=k=1&match=k=2"),
]


@pytest.mark.parametrize(("method", "query"), BAD)
def test_a_bad_tag_or_match_is_400_bad_tag_and_records_nothing(
    web_api: Web, method: str, query: str
) -> None:
    s = web_api.session()
    path = f"/sessions/{s}/firings{query}" if method == "POST" else f"/sessions/{s}{query}"
    status, got, answer = web_api.request(method, path, b"refused" if method == "POST" else None)
    assert (status, got["content-type"], answer["code"]) == (400, "application/json", "bad_tag")
    assert "\n" not in answer["message"]
    assert ring(web_api, s) == []
    assert web_api.waiters(s) == 0


def test_a_matching_stream_sends_only_the_firings_that_match_and_costs_nothing_idle(
    web_api: Web,
) -> None:
    s = web_api.session()
    stream = Stream(web_api, f"/sessions/{s}/events?match=corr=c-1")
    try:
        assert stream.status == 200
        eventually(lambda: web_api.waiters(s) == 1, what="the stream blocked")
        idle = evaluations(web_api, s)
        assert evaluations(web_api, s) == idle  # blocked: no work, stats is no evaluation
        post(web_api, s, "not for it")  # one send, and at most one look that leaves it blocked
        assert evaluations(web_api, s) <= idle + 2
        post(web_api, s, "for it", "?tag=corr=c-1")
        post(web_api, s, "not either", "?tag=corr=c-2")
        post(web_api, s, "for it too", "?tag=corr=c-1&tag=more=yes")
        got = [stream.event(), stream.event()]
        assert [(e["event"], e["id"]) for e in got] == [("firing", "2"), ("firing", "4")]
        assert [json.loads(e["data"])["result"] for e in got] == ["for it", "for it too"]
        assert json.loads(got[1]["data"])["tags"] == {"corr": "c-1", "more": "yes"}
    finally:
        stream.close()
    eventually(lambda: web_api.waiters(s) == 0, what="the stream released")
    # a resume after what it was sent looks on from there, with the same match
    post(web_api, s, "after the resume", "?tag=corr=c-1")
    again = Stream(web_api, f"/sessions/{s}/events?match=corr", {"Last-Event-ID": "4"})
    try:
        assert [(e["id"], json.loads(e["data"])["result"]) for e in [again.event()]] == [
            ("5", "after the resume")
        ]
    finally:
        again.close()


def test_a_matching_stream_from_a_seq_says_how_far_it_looked(web_api: Web) -> None:
    """A batch that ends in firings that do not match is followed by a bare ``id:`` of the
    last seq it looked at, so a client that reconnects with ``Last-Event-ID`` does not look
    at them again."""
    s = web_api.session()
    post(web_api, s, "match", "?tag=k=1")
    post(web_api, s, "no match")
    stream = Stream(web_api, f"/sessions/{s}/events?after=0&match=k")
    try:
        event = stream.event()
        assert (event["event"], event["id"]) == ("firing", "1")
        block = []
        while (line := stream._line()) != "":
            block.append(line)
        # how far the batch looked: a position, with data (a client drops an event without)
        assert block == ["id: 2", "event: position", 'data: {"after": 2}']
        post(web_api, s, "match again", "?tag=k=2")
        assert stream.event()["id"] == "3"
    finally:
        stream.close()


def test_a_webhook_firing_carries_its_event_and_delivery_tags(web_api: Web, tmp_path: Path) -> None:
    s = web_api.session()
    secret = tmp_path / "secret"
    secret.write_text("hook-secret\n")
    Repl(web_api.daemon).ok("webhook", s, "--secret-file", str(secret))
    body = b'{"action": "completed"}'
    headers = {
        "X-Hub-Signature-256": signed("hook-secret", body),
        "X-GitHub-Event": "workflow_run",
        "X-GitHub-Delivery": "72d3162e-cc78",
    }
    for expected in (201, 200):  # a redelivery records nothing
        status, _, _answer = web_api.request("POST", f"/hooks/{s}", body, headers, token=None)
        assert status == expected
    unnamed = {"X-Hub-Signature-256": signed("hook-secret", b"{}"), "Idempotency-Key": "k-7"}
    assert web_api.request("POST", f"/hooks/{s}", b"{}", unnamed, token=None)[0] == 201
    bare = {"X-Hub-Signature-256": signed("hook-secret", b"[]")}
    assert web_api.request("POST", f"/hooks/{s}", b"[]", bare, token=None)[0] == 201
    assert [f["tags"] for f in ring(web_api, s)] == [
        {"event": "workflow_run", "delivery": "72d3162e-cc78"},
        {"delivery": "k-7"},
        {},
    ]
    found = get(web_api, f"/sessions/{s}/firings?match=event=workflow_run")
    assert [f["result"] for f in found["firings"]] == ['{"action": "completed"}']
