"""The wire's compound reads: ``read`` with ``last``, ``since`` or ``seq``, in one request.

An old client's ``read`` (none of the new fields) is answered as before: each
new field has a default (msgspec's schema evolution). A read that names two
ways (``cursor`` and ``last``, ``seq`` and ``after``...) is refused, as is a
``since`` that is no time, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Client, daemon_config, inproc_daemon


@pytest.fixture
def c(tmp_path: Path) -> Iterator[Client]:
    with inproc_daemon(daemon_config(tmp_path / "home")) as d:
        client = d.client()
        client.ok({"op": "start", "session": "s", "buffer": 4})
        for n in range(1, 7):  # 1 and 2 have left the ring
            client.ok({"op": "send", "session": "s", "text": f"f{n}"})
        yield client
        client.close()


def results(answer: dict[str, object]) -> list[str]:
    return [f["result"] for f in answer["firings"]]  # type: ignore[attr-defined, index]


def test_an_old_clients_read_is_answered_as_before(c: Client) -> None:
    # exactly the line a client of before this change sends: no last, since or seq
    c.send_raw(b'{"op": "read", "session": "s", "after": 4, "id": 1}\n')
    answer = c.recv()
    assert answer == {
        "id": 1,
        "ok": True,
        "next": 6,
        "lost": 0,
        "firings": answer["firings"],
    }
    assert results(answer) == ["f5", "f6"]


def test_last_since_and_seq_each_in_one_request(c: Client) -> None:
    last = c.ok({"op": "read", "session": "s", "last": 2})
    assert (results(last), last["next"], last["lost"]) == (["f5", "f6"], 6, 0)
    past = c.ok({"op": "read", "session": "s", "last": 5})
    assert (results(past), past["lost"]) == (["f3", "f4", "f5", "f6"], 1)
    since = c.ok({"op": "read", "session": "s", "since": "2000-01-01T00:00:00Z"})
    assert (results(since), since["lost"]) == (["f3", "f4", "f5", "f6"], 2)
    assert results(c.ok({"op": "read", "session": "s", "since": "2999-01-01T00:00:00Z"})) == []
    newest = c.ok({"op": "read", "session": "s", "since": "2000-01-01T00:00:00Z", "last": 1})
    assert results(newest) == ["f6"]
    one = c.ok({"op": "read", "session": "s", "seq": 4})
    assert (results(one), one["next"]) == (["f4"], 4)
    gone = c.ok({"op": "read", "session": "s", "seq": 1})
    assert (results(gone), gone["lost"]) == ([], 1)
    cursors = c.ok({"op": "cursors", "session": "s"})["cursors"]
    assert cursors == []  # none of them touched a cursor


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        ({"cursor": "c", "last": 2}, "bad_request", "not cursor and last/since"),
        ({"after": 0, "seq": 2}, "bad_request", "not after and seq"),
        ({"seq": 2, "max": 1}, "bad_request", "takes no max"),
        ({"last": 0}, "bad_max", "last 0 is below 1"),
        ({"seq": 0}, "bad_seq", "seqs start at 1"),
        ({"seq": 7}, "cursor_after_head", "no firing 7: its head is 6"),
        ({"since": "yesterday"}, "bad_time", "yesterday"),
    ],
)
def test_a_read_named_two_ways_or_with_a_bad_value_is_refused(
    c: Client, request_: dict[str, object], code: str, words: str
) -> None:
    before = c.ok({"op": "stats", "session": "s"})["sessions"]
    refused = c.call({"op": "read", "session": "s", **request_})
    assert (refused["ok"], refused["code"]) == (False, code)
    assert words in refused["message"]
    assert c.ok({"op": "stats", "session": "s"})["sessions"] == before
