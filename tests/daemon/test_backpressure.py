"""A client that does not read its answers costs the daemon a bounded amount, for a bounded time.

A probe once pipelined 3,000 reads of an 800 KB ring on one connection and
read nothing: the daemon handled every line the first read brought before it
looked at what waited to be written, and went from 45 MB to 903 MB. Now a
connection stops taking lines as soon as its unsent answers pass
``max_queued_bytes`` (1 MiB), and stops reading its socket while the
transport is past that mark; one that takes nothing for ``--slow-consumer-s``
is closed (``slow_consumer``, NATS's word). Over HTTP uvicorn's flow control
bounds the memory and the same timer closes the connection.

Against daemon processes, over real sockets; the daemon's RSS is read from
``/proc``. The stated bound: one such client adds less than 64 MiB.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProc, eventually

#: what one client that reads nothing may add to the daemon's memory
BOUND_MIB = 64
READS = 3000
TEXT = "x" * 3000  # 256 of them: a ring of about 800 KB


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")  # pragma: no cover


def connect(d: DaemonProc) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall(json.dumps({"op": "auth", "token": d.token}).encode() + b"\n")
    return s


_buffers: dict[int, bytes] = {}


def lines(s: socket.socket, count: int) -> list[dict[str, object]]:
    """The next ``count`` answers on ``s`` (what was read past them is kept for the next)."""
    got, buffer = [], _buffers.pop(s.fileno(), b"")
    while len(got) < count:
        while b"\n" not in buffer:
            chunk = s.recv(1 << 20)
            assert chunk, f"closed after {len(got)} answers"
            buffer += chunk
        line, _, buffer = buffer.partition(b"\n")
        got.append(json.loads(line))
    _buffers[s.fileno()] = buffer
    return got


def raw_line(s: socket.socket) -> bytes:
    """The next answer on ``s`` as its bytes, unparsed (a whole ring is 800 KB of JSON)."""
    buffer = _buffers.pop(s.fileno(), b"")
    while b"\n" not in buffer:
        chunk = s.recv(1 << 20)
        assert chunk, "closed"
        buffer += chunk
    line, _, _buffers[s.fileno()] = buffer.partition(b"\n")
    return line


def push(s: socket.socket, data: bytes) -> int:
    """Send what the daemon takes without our reading anything; the bytes it took."""
    s.setblocking(False)
    sent = 0
    try:
        while sent < len(data):
            sent += s.send(data[sent:])
    except BlockingIOError:
        pass  # it stopped reading, as it should
    s.setblocking(True)
    return sent


def closed(s: socket.socket) -> bool:
    """Whether the daemon closed ``s`` (what it had written before is read and dropped)."""
    s.settimeout(0.05)
    try:
        while chunk := s.recv(1 << 20):
            del chunk
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def fill(d: DaemonProc) -> socket.socket:
    s = connect(d)
    requests = [{"op": "start", "session": "big", "buffer": 256}]
    requests += [{"op": "send", "session": "big", "text": TEXT} for _ in range(256)]
    s.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    assert all(answer["ok"] for answer in lines(s, 1 + len(requests)))
    return s


@pytest.fixture
def patient(tmp_path: Path) -> Iterator[DaemonProc]:
    """A daemon that never closes a slow consumer within a test's time."""
    d = DaemonProc(tmp_path / "home", "--memory", "--slow-consumer-s", "600")
    yield d
    d.stop()


def test_a_client_that_reads_nothing_costs_a_bounded_memory_and_loses_nothing(
    patient: DaemonProc,
) -> None:
    d = patient
    other = fill(d)
    assert d.proc is not None
    before = rss_mib(d.proc.pid)
    reads = b"".join(
        json.dumps({"op": "read", "session": "big", "after": 0, "id": i}).encode() + b"\n"
        for i in range(READS)
    )
    slow = connect(d)
    sent = push(slow, reads)
    # another client is served meanwhile, and the daemon has not queued 3,000 answers
    other.sendall(b'{"op": "ping"}\n')
    assert lines(other, 1)[0]["ok"] is True
    grown = rss_mib(d.proc.pid) - before
    assert grown < BOUND_MIB, f"the daemon grew by {grown} MiB for one client reading nothing"
    # the slow client starts reading: every answer comes, in order (what was not read was
    # only delayed); it sends the rest of its requests as the daemon takes them
    assert lines(slow, 1)[0]["ok"] is True  # its auth
    ids = []
    while len(ids) < READS:
        # each answer's head: its id, and that it is whole (a full ring of 256 firings)
        answer = raw_line(slow)
        assert answer.count(TEXT.encode()) == 256
        ids.append(int(answer[len(b'{"id":') : answer.index(b",")]))
        if sent < len(reads):
            sent += push(slow, reads[sent:])
    assert ids == list(range(READS))
    slow.close()
    other.close()


@pytest.fixture
def impatient(tmp_path: Path) -> Iterator[DaemonProc]:
    """A daemon that closes a slow consumer after half a second."""
    d = DaemonProc(tmp_path / "home", "--memory", "--slow-consumer-s", "0.5")
    yield d
    d.stop()


def test_a_slow_consumer_is_closed_and_its_blocked_wait_acknowledges_nothing(
    impatient: DaemonProc,
) -> None:
    d = impatient
    other = fill(d)
    other.sendall(b'{"op": "start", "session": "inbox"}\n')
    lines(other, 1)
    slow = connect(d)
    # a blocked wait on its own cursor, then reads it never takes
    slow.sendall(b'{"op": "wait", "sessions": ["inbox"], "cursor": "mine", "id": "w"}\n')
    eventually(lambda: waiters(other) == 1, what="the wait blocked")
    push(slow, b'{"op": "read", "session": "big", "after": 0}\n' * 200)
    other.sendall(b'{"op": "send", "session": "inbox", "text": "for the slow one"}\n')
    assert lines(other, 1)[0]["seq"] == 1
    # the daemon's event (its log says it): it closes the connection once nothing was taken
    # for the timeout; reading before that would be taking, which resets the clock
    eventually(lambda: "closing a slow consumer" in d.log.read_text(), timeout=30)
    assert closed(slow)
    # its wait acknowledged nothing: the firing comes to the cursor's next wait
    other.sendall(b'{"op": "wait", "sessions": ["inbox"], "cursor": "mine", "timeout_ms": 0}\n')
    (woken,) = lines(other, 1)
    assert [f["result"] for b in woken["batches"] for f in b["firings"]] == ["for the slow one"]  # type: ignore[attr-defined]
    # and the daemon serves on
    other.sendall(b'{"op": "ping"}\n')
    assert lines(other, 1)[0]["ok"] is True
    slow.close()
    other.close()


@pytest.fixture
def steady(tmp_path: Path) -> Iterator[DaemonProc]:
    """A daemon that closes a slow consumer after a second."""
    d = DaemonProc(tmp_path / "home", "--memory", "--slow-consumer-s", "1")
    yield d
    d.stop()


def test_a_client_that_reads_slowly_but_steadily_is_not_a_slow_consumer(
    steady: DaemonProc,
) -> None:
    """Closed is the client that takes none of its answers for ``--slow-consumer-s`` (here
    1 s), not one that takes them slowly: this one reads 64 KiB every 25 ms (about
    2.6 MB/s, the pace being the behaviour under test) and gets all of 12 full rings.
    (What it takes leaves the kernel's buffers first: the daemon sees it as its own unsent
    bytes falling a moment later, well within the second.)"""
    d = steady
    other = fill(d)
    slow = connect(d)
    reads = b'{"op": "read", "session": "big", "after": 0}\n' * 12
    slow.sendall(reads)
    got, taken = b"", 0
    while got.count(b"\n") < 13:  # its auth, then the 12 answers
        chunk = slow.recv(64 * 1024)
        assert chunk, f"closed after {taken:,} bytes"
        got += chunk
        taken += len(chunk)
        time.sleep(0.025)  # the reader's pace is the behaviour under test
    assert got.count(TEXT.encode()) == 12 * 256
    assert "slow consumer" not in d.log.read_text()
    slow.close()
    other.close()


def waiters(s: socket.socket) -> int:
    s.sendall(b'{"op": "sessions"}\n')
    (listed,) = lines(s, 1)
    return sum(row["waiters"] for row in listed["sessions"])  # type: ignore[attr-defined]


@pytest.fixture
def impatient_http(tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(
        tmp_path / "home", "--memory", "--http", "127.0.0.1:0", "--slow-consumer-s", "0.5"
    )
    yield d
    d.stop()


def test_an_http_client_that_reads_nothing_is_bounded_then_closed(
    impatient_http: DaemonProc,
) -> None:
    d = impatient_http
    other = fill(d)
    assert d.proc is not None and d.http_port is not None
    before = rss_mib(d.proc.pid)
    request = (
        "GET /sessions/big/firings?after=0 HTTP/1.1\r\nHost: repl\r\n"
        f"Authorization: Bearer {d.token}\r\n\r\n"
    ).encode()
    slow = socket.create_connection(("127.0.0.1", d.http_port), timeout=30)
    push(slow, request * READS)
    stream = socket.create_connection(("127.0.0.1", d.http_port), timeout=30)
    stream.sendall(request.replace(b"firings?after=0", b"events?after=0"))
    other.sendall(b'{"op": "ping"}\n')
    assert lines(other, 1)[0]["ok"] is True
    grown = rss_mib(d.proc.pid) - before
    assert grown < BOUND_MIB, f"the daemon grew by {grown} MiB for one client reading nothing"
    eventually(lambda: "closing a slow HTTP consumer" in d.log.read_text(), timeout=30)
    assert closed(slow)
    # the stream read nothing either, but its unsent events are under the mark: it stays
    assert not closed(stream)
    metrics = socket.create_connection(("127.0.0.1", d.http_port), timeout=30)
    metrics.sendall(request.replace(b"sessions/big/firings?after=0", b"metrics"))
    text = b""
    while b'code="slow_consumer"' not in text:
        chunk = metrics.recv(1 << 16)
        assert chunk, text[-500:]
        text += chunk
    for s in (metrics, stream, slow, other):
        s.close()


def test_an_http_response_with_connection_close_is_closed_too_when_nothing_is_taken(
    impatient_http: DaemonProc,
) -> None:
    """A response sent with ``Connection: close`` (the transport already closing, 12 MB of
    a ring's answer unsent) to a client that reads nothing is aborted all the same."""
    d = impatient_http
    assert d.http_port is not None
    setup = connect(d)
    requests = [{"op": "start", "session": "huge", "buffer": 4096}]
    requests += [{"op": "send", "session": "huge", "text": TEXT} for _ in range(4000)]
    setup.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    assert all(answer["ok"] for answer in lines(setup, 1 + len(requests)))
    closing = socket.create_connection(("127.0.0.1", d.http_port), timeout=30)
    closing.sendall(
        (
            "GET /sessions/huge/firings?after=0 HTTP/1.1\r\nHost: repl\r\n"
            f"Authorization: Bearer {d.token}\r\nConnection: close\r\n\r\n"
        ).encode()
    )
    eventually(lambda: "closing a slow HTTP consumer" in d.log.read_text(), timeout=30)
    assert closed(closing)
    closing.close()
    setup.close()
