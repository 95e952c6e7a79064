"""``--http`` at start: without the extra, on an address in use, or not HOST:PORT, the daemon
refuses with one line (``python -m repl_daemon``'s ``main`` in this process), and with it
the daemon announces both addresses."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from repl_daemon.__main__ import main
from tests.helpers import DaemonProc, eventually


def refused(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> str:
    status = main(["--addr", "127.0.0.1:0", "--home", str(home), "--memory", *args])
    out, err = capsys.readouterr()
    assert status == 1, (args, err)
    assert out == ""  # nothing announced: a parent waiting for the address is told no
    assert err.startswith("repl daemon: ") and err.count("\n") == 1, err
    return err.removeprefix("repl daemon: ").removesuffix("\n")


def test_http_without_the_extra_says_which_pip_install(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "starlette", None)  # as if `pip install repl-inbox` alone
    assert refused(capsys, tmp_path / "home", "--http", "127.0.0.1:0") == (
        "--http needs Starlette, uvicorn, sse-starlette and prometheus_client: "
        "pip install 'repl-inbox[http]'"
    )


def test_an_http_address_in_use_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(capsys, tmp_path / "home", "--http", f"127.0.0.1:{port}")
    assert line.startswith(f"cannot serve HTTP on 127.0.0.1:{port}: ")


def test_an_http_address_that_is_not_host_port_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line = refused(capsys, tmp_path / "home", "--http", "8080")
    assert "'8080' (--http) is not HOST:PORT" in line


def test_a_daemon_with_http_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--memory", "--http", "127.0.0.1:0")
    assert d.http_port is not None and d.http_port != d.port
    assert d.stop() == 0


def test_a_request_that_never_finishes_arriving_is_closed_and_a_stream_is_not(
    tmp_path: Path,
) -> None:
    """Half a request line, or headers that stop: closed after the idle timeout (1 s here),
    as the line protocol's connections are; an event stream (a request in progress) stays."""
    d = DaemonProc(tmp_path / "home", "--memory", "--http", "127.0.0.1:0", "--idle-timeout", "1")
    try:
        assert d.http_port is not None
        d.client().ok({"op": "start", "session": "s"})
        half = socket.create_connection(("127.0.0.1", d.http_port), timeout=10)
        half.sendall(b"GET /healthz HTT")
        headers = socket.create_connection(("127.0.0.1", d.http_port), timeout=10)
        headers.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        stream = socket.create_connection(("127.0.0.1", d.http_port), timeout=10)
        stream.sendall(
            b"GET /sessions/s/events HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {d.token}\r\n\r\n".encode()
        )
        assert stream.recv(4096).startswith(b"HTTP/1.1 200")
        for conn in (half, headers):
            assert conn.recv(4096) == b""  # closed by the daemon (the socket waits up to 10 s)
        stream.settimeout(2.5)
        with pytest.raises(TimeoutError):  # still open, waiting for a firing
            while stream.recv(4096):
                pass
        d.client().ok({"op": "send", "session": "s", "text": "still here"})
        stream.settimeout(10)
        assert b"still here" in stream.recv(4096)
        for conn in (half, headers, stream):
            conn.close()
    finally:
        d.close_clients()
        d.stop()


def test_http_connections_past_max_connections_are_503(tmp_path: Path) -> None:
    """``--max-connections`` bounds HTTP's connections too: an event stream holds one. The
    refusal is JSON, as every other (it was uvicorn's plain text), and closes."""
    d = DaemonProc(tmp_path / "home", "--memory", "--http", "127.0.0.1:0", "--max-connections", "3")
    try:
        assert d.http_port is not None
        d.client().ok({"op": "start", "session": "s"})
        request = (
            b"GET /sessions/s/events HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {d.token}\r\n\r\n".encode()
        )
        streams = []
        for _ in range(3):
            conn = socket.create_connection(("127.0.0.1", d.http_port), timeout=10)
            conn.sendall(request)
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")
            streams.append(conn)
        extra = socket.create_connection(("127.0.0.1", d.http_port), timeout=10)
        extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        with extra.makefile("rb") as reader:
            head, _, body = reader.read().partition(b"\r\n\r\n")  # to the close
        assert head.startswith(b"HTTP/1.1 503")
        assert b"\r\ncontent-type: application/json\r\n" in head + b"\r\n"
        assert json.loads(body) == {
            "code": "too_many",
            "message": "over 3 HTTP connections (--max-connections): close one, or try again later",
        }
        extra.close()
        streams.pop().close()
        port = d.http_port

        def served() -> bool:  # 503 until the daemon has let go of the closed stream
            with socket.create_connection(("127.0.0.1", port), timeout=10) as again:
                again.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                status = again.recv(4096).split(b" ", 2)[:2]
            assert status in ([b"HTTP/1.1", b"200"], [b"HTTP/1.1", b"503"]), status
            return status[1] == b"200"

        eventually(served, 10, "the closed stream's place to be served again")
        for conn in streams:
            conn.close()
    finally:
        d.close_clients()
        d.stop()
