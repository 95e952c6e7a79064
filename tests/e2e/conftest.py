"""Fixtures only the end-to-end tests use."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import RedisProc, require_redis


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProc]:
    """A redis-server of the test's own (skipped where it is not installed, outside CI)."""
    require_redis()
    server = RedisProc(tmp_path / "redis")
    yield server
    server.stop()
