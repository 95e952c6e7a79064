"""The CLI tests' fixtures: ``repl`` on a daemon the tests of a module share.

Starting a daemon is most of a CLI test's cost, so one serves a whole
module; each test works in sessions of its own (``Repl.session``), and
tests that look at every session take a daemon of their own instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import DaemonProc, Repl, module_daemon


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    yield from module_daemon(tmp_path_factory)


@pytest.fixture
def repl(shared: DaemonProc) -> Repl:
    """repl on the shared daemon: each test works in sessions of its own."""
    return Repl(shared)


@pytest.fixture
def s(repl: Repl) -> str:
    """A fresh session for the test."""
    return repl.session("s")
