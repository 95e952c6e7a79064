"""The fixtures more than one folder of tests uses, each declared once.

``inproc`` is the daemon in the test process (tests/helpers/daemons.py
``InProcDaemon``): no subprocess, memory store unless the test asks for the
default SQLite store with ``@pytest.mark.parametrize("inproc", ["durable"],
indirect=True)``. A test that also asks for ``clock`` (a ``MovedClock``) gets
its ``inproc`` daemon on that clock: its timers come due when the test
moves it. ``daemon`` / ``durable_daemon`` are real daemon processes
(``DaemonProc``), for tests that signal, kill or restart the daemon or read
its stderr. Each is on a port the OS chose and a fresh home, and is stopped
when the test ends.

Redis: ``redis_server`` is a redis-server of the test's own (to kill or
restart). ``redis_single``, ``redis_cluster`` (3 primaries) and
``redis_cluster_replicated`` (3 primaries, a replica each) are started once
per test session, on first use, and shared; ``redis_any`` is one of the
three per parameter (``REDIS_KINDS``), emptied before its test (FLUSHALL on
every primary).

Tests marked ``slow`` (soaks, long variants of property tests) are skipped
unless a marker expression is given: ``pytest -m slow`` runs them (as
``.ci/run`` does, after ``scripts/check``). Every property test runs
without a deadline and without hypothesis's ``too_slow`` health check: a
loaded machine is slow, not wrong. How many examples each runs is its own
(``tests.helpers.examples``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.helpers import (
    DAEMON_STORES,
    REDIS_KINDS,
    DaemonProc,
    InProcDaemon,
    MovedClock,
    RedisClusterProcs,
    RedisProc,
    daemon_config,
    inproc_daemon,
    require_redis,
)

settings.register_profile("repl", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("repl")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``slow`` tests unless ``-m`` chose what runs."""
    if config.option.markexpr:
        return
    later = pytest.mark.skip(reason="slow: `pytest -m slow` runs it")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(later)


@pytest.fixture
def inproc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[InProcDaemon]:
    """The daemon in this process: settle 0, idle timeout 5 s, memory or ``durable`` (SQLite).

    Teardown closes the test's clients and stops it cleanly: a daemon that
    failed while the test ran fails the test.
    """
    store = getattr(request, "param", "memory")
    assert store in DAEMON_STORES, f"inproc is one of {DAEMON_STORES}, not {store!r}"
    config = daemon_config(tmp_path / "home", durable=store == "durable")
    if "clock" in request.fixturenames:
        with inproc_daemon(config, request.getfixturevalue("clock")) as d:
            yield d
    else:
        with inproc_daemon(config) as d:
            yield d


@pytest.fixture
def clock() -> MovedClock:
    """A clock that stands still until the test moves it; the test's ``inproc`` runs on it."""
    return MovedClock()


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


@pytest.fixture(scope="session")
def redis_single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisProc]:
    """One redis-server for the whole test session (tests flush it: ``redis_any``)."""
    require_redis()
    server = RedisProc(tmp_path_factory.mktemp("redis-single"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    """A Redis Cluster of 3 primaries on loopback, for the whole test session."""
    require_redis(cluster=True)
    cluster = RedisClusterProcs(tmp_path_factory.mktemp("redis-cluster"), primaries=3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster_replicated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RedisClusterProcs]:
    """A Redis Cluster of 3 primaries with a replica each, for the whole test session."""
    require_redis(cluster=True)
    cluster = RedisClusterProcs(
        tmp_path_factory.mktemp("redis-cluster-replicated"), primaries=3, replicas=1
    )
    yield cluster
    cluster.stop()


_REDIS_FIXTURES = {
    "single": "redis_single",
    "cluster": "redis_cluster",
    "cluster+replicas": "redis_cluster_replicated",
}


@pytest.fixture(params=REDIS_KINDS)
def redis_any(request: pytest.FixtureRequest) -> RedisProc | RedisClusterProcs:
    """Each kind of Redis in turn (one redis-server, a cluster, a cluster with replicas), empty.

    Its ``--store`` URL is ``tests.helpers.store_url(redis_any)``.
    """
    server: RedisProc | RedisClusterProcs = request.getfixturevalue(_REDIS_FIXTURES[request.param])
    server.flush()
    return server
