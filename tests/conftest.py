"""The fixtures more than one folder of tests uses, each declared once.

``daemon`` / ``durable_daemon`` are real daemon processes (tests/helpers.py
``DaemonProc``) on a port the OS chose and a fresh home, stopped when the
test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProc


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
