"""HTTP on daemons sharing Redis: an event stream on one daemon is woken by a send made over
HTTP on another, as any wait is (SPEC §10 on the store of §7)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import RedisProc, SharedDaemons, eventually
from tests.http.test_http_api import Stream, Web


@pytest.fixture
def two(tmp_path: Path, redis_server: RedisProc) -> Iterator[SharedDaemons]:
    daemons = SharedDaemons(tmp_path, redis_server.url, 2, "--http", "127.0.0.1:0")
    yield daemons
    daemons.close()


def test_a_stream_on_one_daemon_wakes_for_a_send_on_another(two: SharedDaemons) -> None:
    a, b = Web(two.daemons[0]), Web(two.daemons[1])
    two.client(0).ok({"op": "start", "session": "x"})
    stream = Stream(a, "/sessions/x/events")
    try:
        eventually(lambda: a.waiters("x") == 1)
        assert b.send("x", "across", **{"Idempotency-Key": "k"}) == (
            201,
            {"seq": 1, "duplicate": False},
        )
        event = stream.event()
        assert (event["id"], json.loads(event["data"])["result"]) == ("1", "across")
        assert b.send("x", "across", **{"Idempotency-Key": "k"})[0] == 200
    finally:
        stream.close()
    assert a.request("GET", "/healthz", token=None)[0] == 200


def test_healthz_is_503_while_redis_is_away(two: SharedDaemons, redis_server: RedisProc) -> None:
    a = Web(two.daemons[0])
    assert a.request("GET", "/healthz", token=None)[0] == 200
    redis_server.stop()
    status, _, body = a.request("GET", "/healthz", token=None)
    assert (status, body["code"]) == (503, "store_failed")
    assert "redis" in body["message"]
