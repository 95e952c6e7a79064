"""What a test needs from the machine: skipped where it is missing, failed in CI
(``.ci/run`` installs it).
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def require_redis(*, cluster: bool = False) -> None:
    """Skip where redis-server (or, for a cluster, redis-cli) is missing; fail in CI,
    which must install them (``.ci/run``)."""
    needed = ["redis-server", "redis-cli"] if cluster else ["redis-server"]
    missing = [name for name in needed if shutil.which(name) is None]
    if missing:
        what = f"{' and '.join(missing)} missing"
        if os.environ.get("CI"):
            pytest.fail(f"{what} in CI: .ci/run must install redis-server and redis-tools")
        pytest.skip(f"{what}: apt-get install redis-server redis-tools")


def require_chromium() -> str:
    """Debian's chromium, for the page's browser test: skipped where it is missing, failed in
    CI (``.ci/run`` installs it); its path."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium missing in CI: .ci/run must install Debian's chromium")
        pytest.skip("chromium missing: apt-get install chromium")
    return found


def require_tool(name: str) -> str:
    """A command a test runs (Debian's ``jq`` for the GUIDE's shell recipes): skipped where
    it is missing, failed in CI (``.ci/run`` installs it); its path."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} missing in CI: .ci/run must install Debian's {name}")
        pytest.skip(f"{name} missing: apt-get install {name}")
    return found


def require_build() -> None:
    """The ``build`` package and a setuptools that builds wheels (the ``test`` extra brings
    both), for building the wheel: skipped where they are missing, failed in CI."""
    missing = [name for name in ("build", "setuptools") if importlib.util.find_spec(name) is None]
    if missing:
        what = f"{' and '.join(missing)} missing"
        if os.environ.get("CI"):
            pytest.fail(f"{what} in CI: .ci/run must install the test extra")
        pytest.skip(f"{what}: pip install -e '.[test]'")
