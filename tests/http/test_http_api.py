"""The HTTP API (SPEC §10) over real HTTP, against a daemon process started with ``--http``.

Sends with ``Idempotency-Key``; reads after N; Server-Sent Events in order
with ``id:`` the seq, a resume by ``Last-Event-ID`` without duplicates, the
``lost`` event before a gap, and a stream released at once when its client
goes; the token on every data route (none on ``/healthz``); the statuses of
bad input, with nothing recorded. The client is the standard library's
``http.client``: what any program would send.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import DaemonProc, eventually

_ids = count(1)


class Web:
    """Requests to the daemon's HTTP port, with its token unless told otherwise."""

    def __init__(self, daemon: DaemonProc) -> None:
        assert daemon.http_port is not None
        self.daemon = daemon
        self.port = daemon.http_port
        self.token = daemon.token

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = "",
    ) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token or self.token}"
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            raw = response.read()
            got = {k.lower(): v for k, v in response.getheaders()}
            value = json.loads(raw) if got.get("content-type") == "application/json" else raw
            return response.status, got, value
        finally:
            conn.close()

    def session(self, buffer: int | None = None) -> str:
        """A fresh session of the test's own, started over the line protocol."""
        name = f"h{next(_ids)}"
        request: dict[str, Any] = {"op": "start", "session": name}
        if buffer is not None:
            request["buffer"] = buffer
        self.daemon.client().ok(request)
        return name

    def send(self, session: str, text: str, **headers: str) -> tuple[int, Any]:
        status, _, body = self.request(
            "POST", f"/sessions/{session}/firings", text.encode(), headers
        )
        return status, body

    def waiters(self, session: str) -> int:
        stats = self.daemon.client().ok({"op": "stats", "session": session})
        waiters: int = stats["sessions"][0]["waiters"]
        return waiters


class Stream:
    """An open event stream, read event by event (``event``, ``id``, ``data``)."""

    def __init__(self, web: Web, path: str, headers: dict[str, str] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", web.port), timeout=10)
        lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {web.token}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.file = self.sock.makefile("rb")
        status_line = self.file.readline().decode()
        self.status = int(status_line.split()[1])
        self.headers: dict[str, str] = {}
        while (line := self.file.readline().decode().strip()) != "":
            name, _, value = line.partition(":")
            self.headers[name.lower()] = value.strip()
        self.chunked = self.headers.get("transfer-encoding") == "chunked"
        self.buffer = b""
        #: the last ``id:`` the stream gave, as a browser's EventSource keeps it
        self.last_id: str | None = None
        #: the ``id`` of the last ``event: position`` (where it started, or looked up to)
        self.position: str | None = None

    def _line(self) -> str:
        while b"\n" not in self.buffer:
            if self.chunked:
                size = int(self.file.readline().strip(), 16)
                if size == 0:
                    raise EOFError("the stream ended")
                self.buffer += self.file.read(size)
                self.file.readline()
            else:
                data = self.file.read1(4096)
                if not data:
                    raise EOFError("the stream ended")
                self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode().rstrip("\r")

    def event(self) -> dict[str, str]:
        """The next event, comments and ``position`` events (``last_id`` keeps their id, and
        ``position`` where the last one stood) skipped."""
        fields: dict[str, str] = {}
        while True:
            line = self._line()
            if line == "":
                if "id" in fields:
                    self.last_id = fields["id"]
                if fields.get("event") == "position":
                    assert json.loads(fields["data"]) == {"after": int(fields["id"])}
                    self.position = fields["id"]
                elif "event" in fields:
                    return fields
                fields = {}
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture
def web_api(web: DaemonProc) -> Iterator[Web]:
    yield Web(web)
    web.close_clients()


def test_healthz_needs_no_token_and_says_the_store_works(web_api: Web) -> None:
    status, _, body = web_api.request("GET", "/healthz", token=None)
    assert (status, body) == (200, {"ok": True})


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/sessions"),
        ("GET", "/sessions/x/firings"),
        ("POST", "/sessions/x/firings"),
        ("GET", "/sessions/x/events"),
    ],
)
@pytest.mark.parametrize("token", [None, "wrong", "Basic"])
def test_every_data_route_needs_the_token(
    web_api: Web, method: str, path: str, token: str | None
) -> None:
    session = web_api.session()
    path = path.replace("/x/", f"/{session}/")
    headers = {"Authorization": "Basic dXNlcjpwdw=="} if token == "Basic" else {}
    sent = None if token in (None, "Basic") else token
    status, got, body = web_api.request(method, path, b"x", headers=headers, token=sent)
    assert status == 401 and got["www-authenticate"] == "Bearer"
    assert body["code"] == "unauthorized"
    assert (
        web_api.daemon.client().ok({"op": "read", "session": session, "after": 0})["firings"] == []
    )


@pytest.mark.parametrize("token", [None, "wrong", "Basic"])
def test_a_401_says_which_tokens_are_taken_and_not_where_the_daemon_keeps_its_own(
    web_api: Web, token: str | None
) -> None:
    """An unauthenticated client is told what to give: the root token (the ``token`` file
    in the daemon's state directory) or one made by ``repl token add``, which is taken too
    (it once said "the daemon's token", as if none other were); not the daemon's path,
    which it has no business knowing."""
    headers = {"Authorization": "Basic dXNlcjpwdw=="} if token == "Basic" else {}
    sent = None if token in (None, "Basic") else token
    status, _, body = web_api.request("GET", "/sessions", headers=headers, token=sent)
    assert (status, body["code"]) == (401, "unauthorized")
    message = body["message"]
    assert "root token (the `token` file in its state directory)" in message, message
    assert "`repl token add`" in message, message
    home = web_api.daemon.home
    assert str(home) not in message and str(home.resolve()) not in message


def test_a_send_is_201_then_200_for_its_idempotency_key(web_api: Web) -> None:
    s = web_api.session()
    assert web_api.send(s, "deploy 42", **{"Idempotency-Key": "d42"}) == (
        201,
        {"seq": 1, "duplicate": False},
    )
    assert web_api.send(s, "deploy 42", **{"Idempotency-Key": "d42"}) == (
        200,
        {"seq": 1, "duplicate": True},
    )
    status, _, body = web_api.request(
        "POST", f"/sessions/{s}/firings?handler=on-build", "é ☃\n".encode()
    )
    assert (status, body["seq"]) == (201, 2)
    status, _, read = web_api.request("GET", f"/sessions/{s}/firings?after=0")
    assert status == 200 and (read["next"], read["lost"]) == (2, 0)
    assert [(f["seq"], f["handler"], f["result"], f["event"]) for f in read["firings"]] == [
        (1, "on-message", "deploy 42", None),
        (2, "on-build", None, "é ☃\n"),
    ]
    _, _, one = web_api.request("GET", f"/sessions/{s}/firings?after=0&max=1")
    assert [f["seq"] for f in one["firings"]] == [1] and one["next"] == 1
    # a read touches no cursor
    assert web_api.daemon.client().ok({"op": "cursors", "session": s})["cursors"] == []


def test_the_newest_n_since_a_time_and_one_seq_are_one_get_each(web_api: Web) -> None:
    s = web_api.session()
    for n in range(1, 5):
        web_api.send(s, f"f{n}")

    def got(query: str) -> tuple[int, list[str]]:
        status, _, body = web_api.request("GET", f"/sessions/{s}/firings?{query}")
        return status, [f["result"] for f in body.get("firings", [])]

    assert got("last=2") == (200, ["f3", "f4"])
    assert got("since=2000-01-01T00:00:00Z&last=1") == (200, ["f4"])
    assert got("since=2999-01-01T00:00:00Z") == (200, [])
    assert got("seq=3") == (200, ["f3"])
    status, _, refused = web_api.request("GET", f"/sessions/{s}/firings?after=0&seq=3")
    assert (status, refused["code"]) == (400, "bad_request")
    assert "not after and seq" in refused["message"]
    status, _, late = web_api.request("GET", f"/sessions/{s}/firings?seq=9")
    assert (status, late["code"]) == (400, "cursor_after_head")


def test_sessions_lists_what_the_protocol_lists_and_each_ones_lag(web_api: Web) -> None:
    s = web_api.session(buffer=8)
    status, _, listed = web_api.request("GET", "/sessions")
    mine = [row for row in listed if row["id"] == s]
    assert status == 200
    assert mine == [
        {"id": s, "head": 0, "retained": 0, "limit": 8, "cursors": 0, "waiters": 0, "lag": 0}
    ]
    web_api.send(s, "one")
    web_api.send(s, "two")
    web_api.daemon.client().ok({"op": "ack", "session": s, "cursor": "slow", "seq": 0})
    web_api.daemon.client().ok({"op": "ack", "session": s, "cursor": "fast", "seq": 2})
    _, _, listed = web_api.request("GET", "/sessions")
    (row,) = [row for row in listed if row["id"] == s]
    assert (row["head"], row["cursors"], row["lag"]) == (2, 2, 2)  # the furthest behind


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/sessions/nosuch/firings", b"x", 404, "no_such_session"),
        ("GET", "/sessions/nosuch/firings", None, 404, "no_such_session"),
        ("GET", "/sessions/nosuch/events", None, 404, "no_such_session"),
        ("POST", "/sessions/bad%20id/firings", b"x", 400, "bad_session_id"),
        ("POST", "/sessions/S/firings", b"\xff\xfe", 400, "bad_request"),
        ("POST", "/sessions/S/firings?handler=a%20b", b"x", 400, "bad_handler"),
        ("POST", "/sessions/S/firings", b"x" * (1 << 20 + 1), 413, "line_too_long"),
        ("GET", "/sessions/S/firings?after=-1", None, 400, "bad_seq"),
        ("GET", "/sessions/S/firings?after=two", None, 400, "bad_request"),
        ("GET", "/sessions/S/firings?after=5", None, 400, "cursor_after_head"),
        ("GET", "/sessions/S/firings?max=0", None, 400, "bad_max"),
        ("GET", "/sessions/S/events?after=5", None, 400, "cursor_after_head"),
    ],
)
def test_bad_requests_get_their_status_and_record_nothing(
    web_api: Web, method: str, path: str, body: bytes | None, status: int, code: str
) -> None:
    s = web_api.session()
    got, _, answer = web_api.request(method, path.replace("/S/", f"/{s}/"), body)
    assert (got, answer["code"]) == (status, code), answer
    assert "\n" not in answer["message"]
    assert web_api.daemon.client().ok({"op": "read", "session": s, "after": 0})["firings"] == []
    assert web_api.request("GET", "/healthz", token=None)[0] == 200  # the daemon unhurt


def test_a_key_header_that_is_too_long_is_bad_key(web_api: Web) -> None:
    s = web_api.session()
    status, answer = web_api.send(s, "x", **{"Idempotency-Key": "k" * 300})
    assert (status, answer["code"]) == (400, "bad_key")


def test_events_come_in_order_with_their_seq_as_id(web_api: Web) -> None:
    s = web_api.session()
    web_api.send(s, "before")
    stream = Stream(web_api, f"/sessions/{s}/events")  # from the head: not "before"
    try:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        eventually(lambda: web_api.waiters(s) == 1)
        for text in ("one", "two", "three"):
            web_api.send(s, text)
        events = [stream.event() for _ in range(3)]
        assert [(e["event"], e["id"]) for e in events] == [
            ("firing", "2"),
            ("firing", "3"),
            ("firing", "4"),
        ]
        assert [json.loads(e["data"])["result"] for e in events] == ["one", "two", "three"]
        assert json.loads(events[0]["data"])["seq"] == 2
    finally:
        stream.close()
    # released at once: its wait is gone from the session
    eventually(lambda: web_api.waiters(s) == 0, timeout=5)


def test_a_stream_resumes_after_last_event_id_without_duplicates(web_api: Web) -> None:
    s = web_api.session()
    for text in ("a", "b", "c"):
        web_api.send(s, text)
    first = Stream(web_api, f"/sessions/{s}/events?after=0")
    try:
        assert [first.event()["id"] for _ in range(2)] == ["1", "2"]
    finally:
        first.close()
    web_api.send(s, "d")
    again = Stream(web_api, f"/sessions/{s}/events", {"Last-Event-ID": "2"})
    try:
        got = [again.event() for _ in range(2)]
        assert [(e["id"], json.loads(e["data"])["result"]) for e in got] == [("3", "c"), ("4", "d")]
    finally:
        again.close()


def test_a_gap_is_announced_by_a_lost_event(web_api: Web) -> None:
    s = web_api.session(buffer=2)
    for i in range(5):
        web_api.send(s, f"m{i}")
    stream = Stream(web_api, f"/sessions/{s}/events?after=0")
    try:
        lost = stream.event()
        assert (lost["event"], json.loads(lost["data"])) == ("lost", {"lost": 3})
        assert [stream.event()["id"] for _ in range(2)] == ["4", "5"]
    finally:
        stream.close()


def test_a_stopped_session_ends_its_streams_with_an_error_event(web_api: Web) -> None:
    s = web_api.session()
    stream = Stream(web_api, f"/sessions/{s}/events")
    try:
        eventually(lambda: web_api.waiters(s) == 1)
        web_api.daemon.client().ok({"op": "stop", "session": s})
        ended = stream.event()
        assert ended["event"] == "ended"
        assert json.loads(ended["data"])["code"] == "session_stopped"
        with pytest.raises(EOFError):
            stream.event()
    finally:
        stream.close()


def test_many_streams_come_and_go_and_leave_no_waiter(web_api: Web) -> None:
    s = web_api.session()
    streams = [Stream(web_api, f"/sessions/{s}/events") for _ in range(20)]
    try:
        eventually(lambda: web_api.waiters(s) == 20)
        web_api.send(s, "to all")
        assert {json.loads(st.event()["data"])["result"] for st in streams} == {"to all"}
    finally:
        for stream in streams:
            stream.close()
    eventually(lambda: web_api.waiters(s) == 0, timeout=5)
    assert web_api.request("GET", "/healthz", token=None)[0] == 200
    assert web_api.waiters(s) == 0  # still none, once the daemon has served a later request


def scrape(web_api: Web) -> dict[str, Any]:
    """``/metrics`` parsed by prometheus_client's own parser: family name -> family."""
    from prometheus_client.parser import text_string_to_metric_families

    status, got, body = web_api.request("GET", "/metrics")
    assert status == 200 and got["content-type"].startswith("text/plain; version=")
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    family_name = name.removesuffix("_total").removesuffix("_count")
    for s in families[family_name].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return 0.0


def test_metrics_have_prometheus_names_and_move(web_api: Web) -> None:
    s = web_api.session()
    before = scrape(web_api)
    kinds = {name: family.type for name, family in before.items()}
    assert kinds == {
        "repl_firings": "counter",
        "repl_requests": "counter",
        "repl_errors": "counter",
        "repl_commit_seconds": "histogram",
        "repl_store_failures": "counter",
        "repl_heads_went_back": "counter",
        "repl_sessions": "gauge",
        "repl_lost_firings": "gauge",
        "repl_waiters": "gauge",
        "repl_connections": "gauge",
        "repl_uptime_seconds": "gauge",
    }
    web_api.send(s, "counted")
    web_api.request("GET", "/sessions/nosuch/firings")
    web_api.request("GET", "/sessions", token="wrong")
    after = scrape(web_api)
    assert sample(after, "repl_firings_total") == sample(before, "repl_firings_total") + 1
    assert sample(after, "repl_requests_total", op="send") == (
        sample(before, "repl_requests_total", op="send") + 1
    )
    for code in ("no_such_session", "unauthorized"):
        assert sample(after, "repl_errors_total", code=code) == (
            sample(before, "repl_errors_total", code=code) + 1
        )
    assert sample(after, "repl_commit_seconds_count") > sample(before, "repl_commit_seconds_count")
    assert sample(after, "repl_sessions") >= 1
    # no label is ever a session id: the series do not grow with the sessions
    labels = {k for family in after.values() for x in family.samples for k in x.labels}
    assert labels <= {"op", "code", "le"}
    assert web_api.request("GET", "/metrics", token="wrong")[0] == 401


def test_a_stream_says_where_it_starts_and_a_gap_is_counted_once_across_a_resume(
    web_api: Web,
) -> None:
    s = web_api.session(buffer=2)
    for i in range(3):
        web_api.send(s, f"m{i}")
    fresh = Stream(web_api, f"/sessions/{s}/events")  # from the head: it says so at once
    try:
        web_api.send(s, "after the start")
        assert fresh.event()["id"] == "4"
        assert fresh.last_id == "4"
    finally:
        fresh.close()
    for i in range(4):  # a gap: 5 and 6 leave the ring of 2
        web_api.send(s, f"n{i}")
    first = Stream(web_api, f"/sessions/{s}/events", {"Last-Event-ID": "4"})
    try:
        lost = first.event()
        assert (lost["event"], lost["id"], json.loads(lost["data"])) == ("lost", "6", {"lost": 2})
    finally:
        first.close()
    again = Stream(web_api, f"/sessions/{s}/events", {"Last-Event-ID": lost["id"]})
    try:  # resumed after the gap it was told of: no second lost event
        assert [(e["event"], e["id"]) for e in (again.event(), again.event())] == [
            ("firing", "7"),
            ("firing", "8"),
        ]
    finally:
        again.close()


def test_a_stream_is_not_cached_nor_buffered_and_a_head_request_gets_its_head_alone(
    web_api: Web,
) -> None:
    """A stream's head says ``text/event-stream``, ``Cache-Control: no-store`` and
    ``X-Accel-Buffering: no`` (a proxy must pass each event on at once); HEAD gives that
    head and no stream: the answer ends, the connection serves the next request, and no
    wait is left."""
    s = web_api.session()
    stream = Stream(web_api, f"/sessions/{s}/events")
    try:
        assert stream.status == 200
        assert stream.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert stream.headers["cache-control"] == "no-store"
        assert stream.headers["x-accel-buffering"] == "no"
    finally:
        stream.close()
    conn = http.client.HTTPConnection("127.0.0.1", web_api.port, timeout=10)
    auth = {"Authorization": f"Bearer {web_api.token}"}
    try:
        conn.request("HEAD", f"/sessions/{s}/events", headers=auth)
        head = conn.getresponse()
        assert (head.status, head.read()) == (200, b"")
        got = {k.lower(): v for k, v in head.getheaders()}
        assert got["content-type"] == "text/event-stream; charset=utf-8"
        assert (got["cache-control"], got["x-accel-buffering"]) == ("no-store", "no")
        conn.request("GET", "/sessions", headers=auth)  # the same connection: HEAD ended
        listed = conn.getresponse()
        assert listed.status == 200 and s in {row["id"] for row in json.loads(listed.read())}
    finally:
        conn.close()
    eventually(lambda: web_api.waiters(s) == 0, timeout=5)


def test_a_daemon_that_stops_ends_its_streams_with_an_error_event_and_logs_no_error(
    tmp_path: Path,
) -> None:
    """SIGTERM with streams open: each is told ``event: ended`` (``shutting_down``) and
    ended, as a wait of the line protocol is told; none is cut off by the server's own
    deadline (which would log a traceback)."""
    daemon = DaemonProc(tmp_path / "home", "--http", "127.0.0.1:0", "--settle-ms", "0")
    web = Web(daemon)
    try:
        s = web.session()
        streams = [Stream(web, f"/sessions/{s}/events") for _ in range(3)]
        eventually(lambda: web.waiters(s) == 3)
        daemon.close_clients()
        assert daemon.stop() == 0
        for stream in streams:
            ended = stream.event()
            assert ended["event"] == "ended"
            assert json.loads(ended["data"])["code"] == "shutting_down"
            with pytest.raises(EOFError):
                stream.event()
            stream.close()
    finally:
        daemon.close_clients()
        daemon.stop()
    logged = daemon.log.read_text()
    assert "Traceback" not in logged and "ERROR" not in logged, logged


@pytest.mark.parametrize(
    ("method", "path", "status", "says"),
    [
        ("GET", "/nope", 404, "no route GET '/nope': the routes are /sessions, "),
        ("GET", "/sessions/S/nothing", 404, "no route GET '/sessions/S/nothing'"),
        ("GET", "/static/nope.js", 404, "no route GET '/static/nope.js'"),
        (
            "PUT",
            "/sessions/S/firings",
            405,
            "PUT is not served on '/sessions/S/firings': it takes GET, HEAD, POST",
        ),
        ("POST", "/healthz", 405, "POST is not served on '/healthz': it takes GET, HEAD"),
        (
            "POST",
            "/static/app.js",
            405,
            "POST is not served on '/static/app.js': it takes GET, HEAD",
        ),
        ("GET", "/hooks/S", 405, "GET is not served on '/hooks/S': it takes POST"),
        (
            "POST",
            "/sessions/S/events",
            405,
            "POST is not served on '/sessions/S/events': it takes GET, HEAD",
        ),
    ],
)
@pytest.mark.parametrize("token", ["", None])
def test_no_route_and_a_method_no_route_serves_are_json_errors_as_every_other(
    web_api: Web, method: str, path: str, status: int, says: str, token: str | None
) -> None:
    """Starlette's own 404 and 405 were plain text; they are the daemon's JSON, code
    ``unknown_op`` (as an op the daemon does not know over the line protocol), with or
    without a token, and a 405 still says what the route takes (``Allow``)."""
    s = web_api.session()
    got, headers, answer = web_api.request(method, path.replace("/S/", f"/{s}/"), token=token)
    assert (got, headers["content-type"]) == (status, "application/json"), answer
    assert set(answer) == {"code", "message"} and answer["code"] == "unknown_op"
    assert answer["message"].startswith(says.replace("/S/", f"/{s}/")), answer
    if status == 405:  # in order, so that the message is the same every time
        assert answer["message"].endswith(f"it takes {headers['allow']}")
    assert web_api.daemon.client().ok({"op": "read", "session": s, "after": 0})["firings"] == []


def test_a_request_uvicorn_cannot_parse_is_a_json_400_and_the_connection_closed(
    web_api: Web,
) -> None:
    with socket.create_connection(("127.0.0.1", web_api.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nnocolon\r\n\r\n")
        with sock.makefile("rb") as reader:
            answer = reader.read()  # to the close
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith("HTTP/1.1 400 ")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    assert (headers["content-type"], headers["connection"]) == ("application/json", "close")
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body) == {
        "code": "bad_request",
        "message": "not a request of HTTP/1.1: see RFC 9112, or use an HTTP client",
    }


def test_the_favicon_is_served_with_no_token_and_the_page_links_it(web_api: Web) -> None:
    """A browser asks for ``/favicon.ico`` by itself (a 404 in the page's console before);
    the page links its icon, a file shipped with it."""
    from repl_daemon.http.answers import WEB

    shipped = (WEB / "favicon.svg").read_bytes()
    for path in ("/favicon.ico", "/static/favicon.svg"):
        status, headers, body = web_api.request("GET", path, token=None)
        assert (status, headers["content-type"], body) == (200, "image/svg+xml", shipped)
        assert headers["x-content-type-options"] == "nosniff"
    _, _, page = web_api.request("GET", "/", token=None)
    assert b'<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">' in page
