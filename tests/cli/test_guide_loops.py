"""Every shell loop of GUIDE.md and README.md handles every firing it acknowledges.

The GUIDE's request/reply worker once took the last line of each batch
(``repl wait ... --json | tail -n 1``) and acknowledged the whole batch:
three requests sent at once got one answer. Each loop over firings in the
documents is run here, as written, in bash, against a burst of three
firings sent before it starts (so its first wait gets all three at once),
with the commands it hands work to (``./handle``, ``handle``, ...) stubbed
by scripts that write down what they were given. Each must hand on all
three, and its cursor must stand at the burst's end (a worker loop of claims: its
group must have every job done, none held). A loop added to the documents without a
case here fails ``test_every_loop_of_the_documents_is_run``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import Repl, eventually, require_tool

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (ROOT / "GUIDE.md", ROOT / "README.md")
BURST = ("first job", "second job", "third job")

#: a stub that writes what it was given (stdin, else its arguments' files) to handled.txt
HANDLE = """#!/usr/bin/env bash
if [ "$#" -gt 0 ]; then cat "$@"; else cat; fi >> "$(dirname "$0")/handled.txt"
"""


def shell_loops() -> list[str]:
    """Every sh block of the documents that loops over what a ``repl`` reader, or a
    claimer of a group, gives."""
    loops = []
    for document in DOCUMENTS:
        for block in re.findall(r"```sh\n(.*?)```", document.read_text(), re.S):
            if re.search(r"^\s*while\b", block, re.M) and re.search(
                r"\brepl\b.*\b(wait|read|follow|poll|claim)\b", block
            ):
                loops.append(block)
    return loops


@dataclass
class Case:
    """A loop, found by a phrase of its block, and how to set it up and check it."""

    phrase: str
    session: str
    cursor: str | None  # where the loop's cursor must end; None: it has none
    send_options: tuple[str, ...] = ()
    #: where to find what the loop handed on: its own output, a stub's file, a session
    handled: Callable[[Repl, Path, str], str] | None = None
    #: what must be there, once each: the burst's texts unless said otherwise
    expected: tuple[str, ...] = BURST
    #: a loop over one read's lines ends by itself (exit 0); the others run until killed
    ends: bool = False
    #: a group whose every job must end done, none held (a worker loop of claims)
    group: str | None = None


def handled_file(repl: Repl, work: Path, stdout: str) -> str:
    path = work / "handled.txt"
    return path.read_text() if path.exists() else ""


def own_output(repl: Repl, work: Path, stdout: str) -> str:
    return stdout


def the_replies(repl: Repl, work: Path, stdout: str) -> str:
    return repl.run("read", "me", "--after", "0").stdout


CASES = [
    Case("cat batch.txt", "inbox", "monitor", handled=own_output),
    Case("repl ack inbox", "inbox", "worker", handled=handled_file),
    Case("on-idle-check", "inbox", "monitor", handled=handled_file),
    Case(
        "next=$next lost=$lost",
        "inbox",
        None,
        handled=own_output,
        expected=("next=3 lost=0", "firing 1", "firing 2", "firing 3"),
        ends=True,
    ),
    Case("--match reply-to", "jobs", "worker", ("--tag", "reply-to=me"), the_replies),
    Case("agent-a", "team-a.inbox", "wait", handled=handled_file),
    Case("while out=$(repl claim jobs", "jobs", None, handled=handled_file, group="work"),
    Case("--next --lease 5m", "jobs", None, handled=handled_file, group="work"),
]


def case_of(block: str) -> Case:
    found = [case for case in CASES if case.phrase in block]
    assert len(found) == 1, f"no one case for this loop of the documents:\n{block}"
    return found[0]


def test_every_loop_of_the_documents_is_run() -> None:
    loops = shell_loops()
    assert len(loops) >= len(CASES)
    assert sorted(case_of(block).phrase for block in loops) == sorted(c.phrase for c in CASES)


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    for name in ("handle", "check-for-silence"):
        stub = tmp_path / name
        stub.write_text(HANDLE if name == "handle" else "#!/bin/sh\n")
        stub.chmod(0o755)
    yield tmp_path


@pytest.mark.parametrize("block", shell_loops(), ids=lambda block: case_of(block).phrase)
def test_each_loop_hands_on_a_whole_burst(repl: Repl, work: Path, block: str) -> None:
    require_tool("jq")
    case = case_of(block)
    for session in (case.session, "me"):
        repl.run("stop", session)  # what an earlier test left
        repl.ok("start", session)
    env = {
        **repl.env,
        "PATH": f"{work}:{Path(sys.executable).parent}:{repl.env.get('PATH', '')}",
        "HOME": str(work),
    }
    if "agent-a" in block:
        token = repl.ok("token", "add", "agent-a", "--sessions", "team-a.*", "--can", "read,send")
        (work / ".config" / "agent-a").mkdir(parents=True)
        (work / ".config" / "agent-a" / "token").write_text(token)
    if "# the requester" in block:
        block = block.split("# the requester")[0]
    # the loop calls ``handle`` as a command, or ``./handle`` in its directory
    script = f'handle() {{ {work}/handle "$@"; }}\n{block}'
    repl.ok("send", case.session, "--lines", *case.send_options, input="\n".join(BURST) + "\n")
    out = work / "stdout.txt"
    err = work / "stderr.txt"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        loop = subprocess.Popen(
            ["bash", "-c", script],
            cwd=work,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    assert case.handled is not None
    try:

        def all_handed_on() -> bool:
            if loop.poll() is not None:
                assert case.ends and loop.returncode == 0, (loop.returncode, err.read_text())
            got = case.handled(repl, work, out.read_text()) if case.handled else ""
            return all(text in got for text in case.expected)

        eventually(all_handed_on, timeout=30, what=f"the loop handing on {case.expected}")
        if (cursor := case.cursor) is not None:
            eventually(lambda: repl.cursor(case.session, cursor) == len(BURST))
        if case.group is not None:

            def all_done() -> bool:
                rows = json.loads(repl.ok("groups", case.session, "--json"))
                row = next(r for r in rows if r["name"] == case.group)
                return (row["done"], row["held"], row["dead"]) == (len(BURST), 0, 0)

            eventually(all_done, what=f"every job of group {case.group} done")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a loop that ends may be gone, group and all
            os.killpg(loop.pid, signal.SIGKILL)
        loop.wait()
        if "agent-a" in block:
            repl.ok("token", "revoke", "agent-a")
    got = case.handled(repl, work, out.read_text())
    for text in case.expected:
        assert got.count(text) == 1, f"{text!r} handed on {got.count(text)} times:\n{got}"


def guide_block(phrase: str) -> str:
    """The one sh block of GUIDE.md that holds ``phrase``."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "GUIDE.md").read_text(), re.S)
    found = [block for block in blocks if phrase in block]
    assert len(found) == 1, f"no one sh block of GUIDE.md holds {phrase!r}"
    return found[0]


def background(block: str, work: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``block`` run in bash in ``work``, in a process group of its own (``handle`` as the
    loops call it), its output into files."""
    script = f'handle() {{ {work}/handle "$@"; }}\n{block}'
    with (work / "bg-out.txt").open("ab") as out, (work / "bg-err.txt").open("ab") as err:
        return subprocess.Popen(
            ["bash", "-c", script],
            cwd=work,
            env=env,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )


def run_block(block: str, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``block`` run to its end in bash in ``work``, as a user's shell runs it."""
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail\n{block}"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def stop(loops: list[subprocess.Popen[bytes]]) -> None:
    for loop in loops:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(loop.pid, signal.SIGKILL)
        loop.wait()


def test_the_coordinators_recipes_run_as_written(repl: Repl, work: Path) -> None:
    """GUIDE.md's coordinator page, as written: three agents (each the request/reply worker
    loop of the guide) asked at once, answered under a burst, the answers printed in the
    order named, and the same again with the same key (nothing sent twice); the by-hand
    gather; twenty jobs posted at once to two claim loops, and the join that ends once
    they are all done."""
    require_tool("jq")
    env = {
        **repl.env,
        "PATH": f"{work}:{Path(sys.executable).parent}:{repl.env.get('PATH', '')}",
        "HOME": str(work),
    }
    agents = ["agent-1", "agent-2", "agent-3"]
    for session in (*agents, "me", "jobs"):
        repl.run("stop", session)  # what an earlier test left
        repl.ok("start", session)
    worker = guide_block("--match reply-to").split("# the requester")[0]
    loops = [background(worker.replace("jobs", agent), work, env) for agent in agents]
    try:
        ask = guide_block("repl request --to")
        done = run_block(ask, work, env)
        assert done.returncode == 0, done.stderr
        answers = (work / "answers.txt").read_text().splitlines()
        assert answers == ["on-message: done: review PR 42: approve or not, and why"] * 3
        assert [repl.run("read", a, "--after", "0").stdout.count("review") for a in agents] == [
            1
        ] * 3
        again = run_block(ask, work, env)  # the coordinator run again, the same key
        assert again.returncode == 0 and (work / "answers.txt").read_text().splitlines() == answers
        assert [
            json.loads(repl.ok("stats", a, "--json"))["sessions"][0]["head"] for a in agents
        ] == [1] * 3
        by_hand = run_block(guide_block("repl gather me"), work, env)
        assert by_hand.returncode == 0, by_hand.stderr
        corrs = [json.loads(line)["tags"]["corr"] for line in by_hand.stdout.splitlines()[1:]]
        assert corrs == ["pr42-1", "pr42-2", "pr42-3"]
    finally:
        stop(loops)
    claimers = [background(guide_block("while out=$(repl claim jobs"), work, env) for _ in range(2)]
    try:
        joined = run_block(guide_block("repl join jobs"), work, env)
        assert (joined.returncode, joined.stdout, joined.stderr) == (0, "20 of 20 done\n", "")
        handled = (work / "handled.txt").read_text()
        assert (
            sorted(handled.split())
            == sorted(f"image-{n}.png" for n in range(1, 21)) + ["resize"] * 20
        )
    finally:
        stop(claimers)
