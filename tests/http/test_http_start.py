"""``--http`` at start: without the extra, on an address in use, or not HOST:PORT, the daemon
refuses with one line (``python -m repl_daemon``'s ``main`` in this process), and with it
the daemon announces both addresses."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from repl_daemon.__main__ import main
from tests.helpers import DaemonProc


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
    monkeypatch.setitem(sys.modules, "starlette", None)  # as if `pip install repl` alone
    assert refused(capsys, tmp_path / "home", "--http", "127.0.0.1:0") == (
        "--http needs Starlette, uvicorn, sse-starlette and prometheus_client: "
        "pip install 'repl[http]'"
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
