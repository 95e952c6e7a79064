"""The CLI tests' fixtures: ``repl`` on a daemon the tests of a module share.

``repl`` runs as a subprocess, as a user runs it; the daemon it talks to
runs in the test process (``InProcDaemon``): the subprocess needs only its
address and home. One serves a whole module; each test works in sessions of
its own (``Repl.session``), and tests that look at every session take a
daemon of their own (``inproc``) instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from repl_daemon.config import Limits
from tests.helpers import InProcDaemon, Repl, daemon_config, inproc_daemon


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcDaemon]:
    """The module's daemon: memory, settle 0, the default idle timeout."""
    home = tmp_path_factory.mktemp("cli") / "home"
    with inproc_daemon(daemon_config(home, limits=Limits())) as d:
        yield d


@pytest.fixture
def repl(shared: InProcDaemon) -> Repl:
    """repl on the shared daemon: each test works in sessions of its own."""
    return Repl(shared)


@pytest.fixture
def s(repl: Repl) -> str:
    """A fresh session for the test."""
    return repl.session("s")
