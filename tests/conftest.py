"""The fixtures more than one folder of tests uses, each declared once.

``inproc`` is the daemon in the test process (tests/helpers.py
``InProcDaemon``): no subprocess, memory store unless the test asks for the
default SQLite store with ``@pytest.mark.parametrize("inproc", ["durable"],
indirect=True)``. ``daemon`` / ``durable_daemon`` are real daemon processes
(``DaemonProc``), for tests that signal, kill or restart the daemon or read
its stderr. Each is on a port the OS chose and a fresh home, and is stopped
when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    DAEMON_STORES,
    DaemonProc,
    InProcDaemon,
    RedisProc,
    daemon_config,
    inproc_daemon,
    require_redis,
)


@pytest.fixture
def inproc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[InProcDaemon]:
    """The daemon in this process: settle 0, idle timeout 5 s, memory or ``durable`` (SQLite).

    Teardown closes the test's clients and stops it cleanly: a daemon that
    failed while the test ran fails the test.
    """
    store = getattr(request, "param", "memory")
    assert store in DAEMON_STORES, f"inproc is one of {DAEMON_STORES}, not {store!r}"
    with inproc_daemon(daemon_config(tmp_path / "home", durable=store == "durable")) as d:
        yield d


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    """A memory daemon process with settle 0 and a short idle timeout."""
    d = DaemonProc(tmp_path / "home", "--memory", "--settle-ms", "0", "--idle-timeout", "5")
    yield d
    d.close_clients()
    d.stop()


@pytest.fixture
def durable_daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    """A daemon process on the default (SQLite) store, settle 0."""
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0", "--idle-timeout", "5")
    yield d
    d.close_clients()
    d.stop()


@pytest.fixture
def anyio_backend() -> str:
    """The anyio pytest plugin's backend for ``@pytest.mark.anyio`` tests."""
    return "asyncio"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProc]:
    """A redis-server of the test's own (skipped where it is not installed, outside CI)."""
    require_redis()
    server = RedisProc(tmp_path / "redis")
    yield server
    server.stop()
