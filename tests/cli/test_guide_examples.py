"""GUIDE.md's Python recipes run, as written, against a real daemon.

Every ``python`` block of the "In Python" section is run on its own with
the interpreter the tests use and ``REPL_ADDR``/``REPL_HOME`` naming a
daemon whose session ``inbox`` already holds "hello" and "quit" (so the
monitor recipe ends), started afresh for each recipe on the daemon they
share. Each must exit 0 without a traceback. The request and reply recipes run
as a worker and a requester; the Python worker of "Sharing work between agents"
drains three jobs, and its shell job with a heartbeat finishes one.
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


def sharing_recipes(kind: str) -> list[str]:
    """The ``kind`` blocks of "Sharing work between agents"."""
    text = GUIDE.read_text()
    section = text[text.index("## Sharing work between agents") :]
    section = section[: section.index("\n## ", 10)]
    return re.findall(rf"```{kind}\n(.*?)```", section, re.S)


@pytest.mark.parametrize("recipe", ["python", "heartbeat"])
def test_the_sharing_recipes_take_each_job_once(
    guide_daemon: DaemonProc, tmp_path: Path, recipe: str
) -> None:
    """The Python worker drains three jobs, each handled once and done; the shell job
    with a heartbeat takes one and finishes it, its heartbeat stopped. (The shell worker
    loop runs in tests/cli/test_guide_loops.py, with the others.)"""
    require_tool("jq")
    repl = Repl(guide_daemon)
    with contextlib.closing(guide_daemon.client()) as c:
        c.call({"op": "stop", "session": "jobs"})  # its groups go with it
    repl.ask({"op": "start", "session": "jobs"})
    repl.send("jobs", "first job", "second job", "third job")
    handle = tmp_path / "handle"  # writes down what it was given on stdin
    handle.write_text(f'#!/usr/bin/env bash\ncat >> "{tmp_path}/handled.txt"\n')
    handle.chmod(0o755)
    path = f"{tmp_path}:{Path(sys.executable).parent}:{repl.env.get('PATH', '')}"
    env = {**repl.env, "PATH": path}
    if recipe == "python":
        (block,) = sharing_recipes("python")
        run = [sys.executable, "-c", block]
    else:
        (block,) = [b for b in sharing_recipes("sh") if "repl extend" in b]
        run = ["bash", "-e", "-c", block]
    # output to files, in a process group of its own: the heartbeat's last `sleep` outlives
    # the recipe (for at most its 20 s) and would hold a pipe open; it is ended here
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(run, stdout=stdout, stderr=stderr, env=env, start_new_session=True)
    try:
        returncode = proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    done = subprocess.CompletedProcess(run, returncode, out.read_text(), err.read_text())
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    ((work,),) = [answer["groups"] for answer in repl.ask({"op": "groups", "session": "jobs"})]
    if recipe == "python":
        handled = [line.removeprefix("handling ") for line in done.stdout.splitlines()]
        assert handled == ["first job", "second job", "third job"], done.stdout
        assert (work["done"], work["ready"], work["held"]) == (3, 0, 0)
    else:
        assert (tmp_path / "handled.txt").read_text() == "first job\n"
        assert (work["done"], work["ready"], work["held"]) == (1, 2, 0)
