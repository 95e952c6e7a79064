"""The HTTP tests share one daemon process with ``--http`` (each test in sessions of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProc


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """A durable daemon serving HTTP on a port of its own, settle 0."""
    home: Path = tmp_path_factory.mktemp("http") / "home"
    d = DaemonProc(home, "--http", "127.0.0.1:0", "--settle-ms", "0", "--idle-timeout", "5")
    yield d
    d.close_clients()
    d.stop()
