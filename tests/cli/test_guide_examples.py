"""GUIDE.md's Python recipes run, as written, against a real daemon.

Every ``python`` block of the "In Python" section is run on its own with
the interpreter the tests use and ``REPL_ADDR``/``REPL_HOME`` naming a
daemon whose session ``inbox`` already holds "hello" and "quit" (so the
monitor recipe ends), started afresh for each recipe on the daemon they
share. Each must exit 0 without a traceback.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProc, Repl, require_tool

GUIDE = Path(__file__).resolve().parents[2] / "GUIDE.md"


def python_recipes() -> list[str]:
    text = GUIDE.read_text()
    section = text[text.index("### In Python") :]
    section = section[: section.index("\n## ")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_guide_has_python_recipes() -> None:
    recipes = python_recipes()
    assert len(recipes) >= 4
    assert not any("subprocess" in r for r in recipes)  # the API, not the CLI in a child


@pytest.fixture(scope="module")
def guide_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """A memory daemon process for the recipes (settle 0), as the ``daemon`` fixture's."""
    home = tmp_path_factory.mktemp("guide") / "home"
    d = DaemonProc(home, "--memory", "--settle-ms", "0", "--idle-timeout", "5")
    yield d
    d.close_clients()
    d.stop()


@pytest.mark.parametrize("index", range(len(python_recipes())))
def test_each_python_recipe_of_the_guide_runs(guide_daemon: DaemonProc, index: int) -> None:
    repl = Repl(guide_daemon)
    # an ``inbox`` of its own: whatever an earlier recipe left in it (firings, cursors) is gone
    with contextlib.closing(guide_daemon.client()) as c:
        c.call({"op": "stop", "session": "inbox"})  # no_such_session for the first recipe
    repl.ask({"op": "start", "session": "inbox"})
    repl.send("inbox", "hello", "quit")
    done = subprocess.run(
        [sys.executable, "-c", python_recipes()[index]],
        capture_output=True,
        text=True,
        env=repl.env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def request_recipes(kind: str) -> list[str]:
    """The ``kind`` blocks of "Asking another agent and waiting for its answer"."""
    text = GUIDE.read_text()
    section = text[text.index("## Asking another agent and waiting for its answer") :]
    section = section[: section.index("\n## ", 10)]
    return re.findall(rf"```{kind}\n(.*?)```", section, re.S)


@pytest.mark.parametrize("kind", ["sh", "python"])
def test_the_request_and_reply_recipes_run(guide_daemon: DaemonProc, kind: str) -> None:
    """The worker loop runs in the background and the requester gets its answer, in shell
    (the worker and the requester are the two halves of one block) and in Python."""
    require_tool("jq")
    repl = Repl(guide_daemon)
    with contextlib.closing(guide_daemon.client()) as c:
        for session in ("jobs", "me"):
            c.call({"op": "stop", "session": session})
    repl.ask({"op": "start", "session": "jobs"})
    if kind == "sh":
        (block,) = request_recipes("sh")
        worker, requester = block.split("# the requester")
        run = ["bash", "-c"]
    else:
        worker, requester = request_recipes("python")
        run = [sys.executable, "-c"]
    env = {**repl.env, "PATH": f"{Path(sys.executable).parent}:{repl.env.get('PATH', '')}"}
    # the worker in a process group of its own: its `repl wait` goes with it when it ends
    with subprocess.Popen([*run, worker], env=env, start_new_session=True) as background:
        try:
            done = subprocess.run(
                [*run, requester], capture_output=True, text=True, env=env, timeout=60
            )
        finally:
            os.killpg(background.pid, signal.SIGKILL)
            background.wait()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].endswith("done: resize images/"), done.stdout
