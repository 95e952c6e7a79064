"""``python -m repl_daemon`` refusing to start: one line that says why, status 1, never a traceback.

These call its ``main`` in the test process: every refusal here happens
before the daemon listens (options, address, token, store), so no daemon
process is needed to see it. What must come from a real process (a
world-readable token, an address in use, a home that cannot be made) is in
test_daemon_input.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from repl_daemon import daemon
from repl_daemon.__main__ import main
from repl_daemon.backends.local import LocalBackend
from repl_daemon.backends.local.memory import MemoryStore
from repl_daemon.config import build_config
from session.errors import ConfigError, StoreFailed


def refused(capsys: pytest.CaptureFixture[str], home: Path, *args: str) -> str:
    """Start with ``args``; insist on status 1 and one line on stderr, and return the line."""
    status = main(["--addr", "127.0.0.1:0", "--home", str(home), *args])
    out, err = capsys.readouterr()
    assert status == 1, (args, err)
    assert out == ""
    assert err.startswith("repl daemon: ") and err.count("\n") == 1, err
    return err.removeprefix("repl daemon: ").removesuffix("\n")


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--settle-ms", "-1"], "--settle-ms -1 is out of range: it must be at least 0"),
        (["--quiet-ms", "-1"], "--quiet-ms -1 is out of range: it must be at least 0"),
        (["--idle-timeout", "0"], "--idle-timeout 0 is out of range: it must be above 0"),
        (["--max-connections", "0"], "--max-connections 0 is out of range: it must be at least 1"),
        (["--max-sessions", "-5"], "--max-sessions -5 is out of range: it must be at least 1"),
        (["--memory", "--store", "redis://127.0.0.1:1/0"], "give --memory or --store, not both"),
    ],
)
def test_an_option_out_of_its_bounds_is_refused_in_its_own_words(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], why: str
) -> None:
    assert refused(capsys, tmp_path / "home", "--memory", *args) == why
    assert not (tmp_path / "home").exists()  # refused before anything was made


def test_an_address_that_is_not_host_port_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = main(["--addr", "nonsense", "--home", str(tmp_path), "--memory"])
    assert status == 1
    assert capsys.readouterr().err == (
        "repl daemon: address 'nonsense' is not HOST:PORT (for example 127.0.0.1:7427)\n"
    )
    monkeypatch.setenv("REPL_ADDR", "127.0.0.1:99999")
    assert main(["--home", str(tmp_path), "--memory"]) == 1
    assert capsys.readouterr().err == (
        "repl daemon: address '127.0.0.1:99999' (from REPL_ADDR) is not HOST:PORT "
        "(for example 127.0.0.1:7427)\n"
    )


def test_a_config_built_from_values_outside_the_table_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^unknown daemon option\(s\): colour, speed$"):
        build_config({"speed": 3, "colour": "red"}, home=tmp_path)
    with pytest.raises(ConfigError, match="--loop 'fast' is not one of auto, asyncio, uvloop"):
        build_config({"loop": "fast"}, home=tmp_path)


def test_an_empty_token_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    token = home / "token"
    token.write_text("\n")
    os.chmod(token, 0o600)
    assert refused(capsys, home, "--memory") == (
        f"token file {token} is empty: delete it to make a new one"
    )
    assert token.read_text() == "\n"  # left for the user to delete


def test_a_store_url_it_does_not_know_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert refused(capsys, tmp_path / "home", "--store", "postgres://db/repl") == (
        "--store takes redis://HOST:PORT/DB, rediss://... or "
        "redis+cluster://HOST:PORT[,HOST:PORT...]; leave it out for the default store"
    )


def test_the_redis_store_without_the_redis_client_says_which_pip_install(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # as if `pip install repl-inbox` alone
    assert refused(capsys, tmp_path / "home", "--store", "redis://127.0.0.1:1/0") == (
        "--store redis:// needs the redis client: pip install 'repl-inbox[redis]'"
    )


class Unreadable(MemoryStore):
    """A store that opened but cannot be read when the daemon loads it."""

    closed = False

    def load(self) -> list[object]:  # type: ignore[override]
        raise StoreFailed("cannot read the store: it went away")

    def close(self) -> None:
        self.closed = True


def test_a_store_that_cannot_be_loaded_at_start_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Unreadable()
    monkeypatch.setattr(daemon, "open_backend", lambda config: LocalBackend(store))
    assert refused(capsys, tmp_path / "home") == "cannot read the store: it went away"
    assert store.closed


def test_the_loop_is_uvloop_when_asked_or_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert daemon.choose_loop("asyncio") is False
    monkeypatch.setattr(daemon, "find_spec", lambda name: None)
    assert daemon.choose_loop("auto") is False
    with pytest.raises(ConfigError, match=r"pip install 'repl-inbox\[uvloop\]'"):
        daemon.choose_loop("uvloop")
    monkeypatch.setattr(daemon, "find_spec", lambda name: object())
    assert daemon.choose_loop("auto") is True
    assert daemon.choose_loop("uvloop") is True
