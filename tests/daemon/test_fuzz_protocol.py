"""Protocol fuzzing (issue 7): whatever bytes arrive, each line gets a valid
answer or an error with a code, the daemon never crashes or leaks a
connection, and a rejected request changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repl_daemon.protocol import OPS
from session.errors import Code
from tests.helpers import Client, InProcDaemon, daemon_config, eventually

CODES = {c.value for c in Code}
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcDaemon]:
    """One daemon in this process for the module; it must still stop cleanly at the end."""
    home: Path = tmp_path_factory.mktemp("fuzz") / "home"
    d = InProcDaemon(daemon_config(home))
    setup = d.client()
    setup.ok({"op": "start", "session": "a", "buffer": 8})
    for i in range(5):
        setup.ok({"op": "send", "session": "a", "text": f"m{i}"})
    setup.ok({"op": "ack", "session": "a", "cursor": "read", "seq": 2})
    yield d
    d.close_clients()
    assert d.running, "the daemon must still be serving after the fuzzing"
    d.stop()  # raises what the daemon raised, if anything


def snapshot(c: Client) -> Any:
    sessions = c.ok({"op": "sessions"})["sessions"]
    for s in sessions:
        s["waiters"] = 0
    return (
        sessions,
        [c.ok({"op": "read", "session": s["id"], "after": 0})["firings"] for s in sessions],
        [c.ok({"op": "cursors", "session": s["id"]})["cursors"] for s in sessions],
    )


def check_answer(line: bytes, answer: dict[str, Any]) -> None:
    assert isinstance(answer.get("ok"), bool), (line, answer)
    if not answer["ok"]:
        assert answer["code"] in CODES, (line, answer)
        assert isinstance(answer["message"], str) and answer["message"]


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
field_values = (
    json_values
    | st.sampled_from(["a", "", " ", "no such", "a" * 65, "-x", "\x00", "read", "é"])
    | st.integers(min_value=-(2**70), max_value=2**70)
)
fields = st.sampled_from(
    [
        "session",
        "sessions",
        "text",
        "cursor",
        "after",
        "max",
        "peek",
        "seq",
        "limit",
        "key",
        "handler",
        "timeout_ms",
        "ack",
        "buffer",
        "exist_ok",
        "id",
        "token",
    ]
)
# valid shapes with wrong values: a known op plus random fields (not shutdown, which
# takes no fields and would end the daemon under test: it has tests of its own)
shaped = st.builds(
    lambda op, extra: {"op": op, **extra},
    st.sampled_from([op for op in OPS if op not in ("auth", "stop", "wait", "shutdown")]),
    st.dictionaries(fields, field_values, max_size=5),
)


def one_line(data: bytes) -> bytes:
    return data.replace(b"\n", b" ")


@FUZZ
@given(st.binary(max_size=300).map(one_line))
def test_random_bytes_get_an_error_and_change_nothing(fuzzed: InProcDaemon, line: bytes) -> None:
    c = Client(fuzzed.port, fuzzed.token)
    try:
        before = snapshot(c)
        c.send_raw(line + b"\n")
        answer = c.recv()
        check_answer(line, answer)
        if not answer["ok"]:
            assert snapshot(c) == before
    finally:
        c.close()


@FUZZ
@given(json_values)
def test_random_json_gets_an_answer(fuzzed: InProcDaemon, value: Any) -> None:
    c = Client(fuzzed.port, fuzzed.token)
    try:
        before = snapshot(c)
        line = json.dumps(value).encode()
        c.send_raw(line + b"\n")
        answer = c.recv()
        check_answer(line, answer)
        assert not answer["ok"] or isinstance(value, dict)
        if not answer["ok"]:
            assert snapshot(c) == before
    finally:
        c.close()


@FUZZ
@given(shaped)
def test_known_ops_with_wrong_values_answer_and_reject_cleanly(
    fuzzed: InProcDaemon, request: dict[str, Any]
) -> None:
    c = Client(fuzzed.port, fuzzed.token)
    try:
        before = snapshot(c)
        line = json.dumps(request).encode()
        c.send_raw(line + b"\n")
        answer = c.recv()
        check_answer(line, answer)
        if not answer["ok"]:
            assert snapshot(c) == before
        assert c.ok({"op": "ping"}), "a well-framed request leaves the connection usable"
    finally:
        c.close()


def test_invalid_utf8_and_huge_numbers(fuzzed: InProcDaemon) -> None:
    c = fuzzed.client()
    for line in (
        b'{"op": "send", "session": "a", "text": "\xc3\x28"}',
        b'{"op": "read", "session": "a", "after": 1' + b"0" * 5000 + b"}",
        b'{"op": "read", "session": "a", "max": -1e308}',
        b"[" * 100_000,
    ):
        before = snapshot(c)
        c.send_raw(line + b"\n")
        answer = c.recv()
        check_answer(line, answer)
        assert answer["ok"] is False
        assert snapshot(c) == before
    huge = 10**4000
    assert c.call({"op": "ping", "id": huge})["id"] == huge, "any integer id is echoed"


def test_a_request_sent_byte_by_byte_is_answered(fuzzed: InProcDaemon) -> None:
    c = fuzzed.client()
    # a session of its own: the fuzzing above may send valid requests to "a" (a send, a
    # buffer), so "a" holds whatever the examples it drew left there
    c.ok({"op": "start", "session": "byte-by-byte"})
    for i in range(3):
        c.ok({"op": "send", "session": "byte-by-byte", "text": f"m{i}"})
    read = {"op": "read", "session": "byte-by-byte", "after": 0, "id": "slow"}
    for byte in json.dumps(read).encode():
        c.send_raw(bytes([byte]))
    c.send_raw(b"\n")
    answer = c.recv()
    assert answer["id"] == "slow" and len(answer["firings"]) == 3


def test_no_connection_leaks_after_the_fuzzing(fuzzed: InProcDaemon) -> None:
    fuzzed.close_clients()  # the earlier tests' connections
    c = fuzzed.client()
    eventually(lambda: c.ok({"op": "stats"})["daemon"]["connections"] == 1, 5, "one connection")
    for _ in range(50):
        extra = Client(fuzzed.port, fuzzed.token)
        extra.send_raw(b"\xff\n")
        extra.recv()
        extra.close()
    eventually(lambda: c.ok({"op": "stats"})["daemon"]["connections"] == 1, 5, "one connection")
