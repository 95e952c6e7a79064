"""README.md's first command works on a machine with nothing but Python and the checkout.

A new user once met ``pipx: command not found`` (Debian's python3 comes
without pipx), and with pipx a ``repl`` in ``~/.local/bin``, which a fresh
shell does not have on its PATH. This runs the command exactly as README.md
writes it, with ``bash``, in a copy of the checkout, with a fresh ``HOME``
and a PATH that holds Python and the system's own tools but no pipx and no
uv, and sees the daemon listen and answer its ``repl ping``. Only the
address is steered (``REPL_ADDR``, which the daemon honours), so that the
test never takes the default port of a daemon someone is running.

It installs from the package index as a user does (a build of the wheel and
its dependencies), about half a minute, so it is slow-marked; ``.ci/run``
runs the slow tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import eventually, free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: what a checkout may hold beside its sources (a developer's venv, caches, builds)
NOT_SOURCES = shutil.ignore_patterns(
    ".venv*", ".git", ".*cache", "__pycache__", "build", "dist", "*.egg-info", ".coverage*"
)


def first_command() -> str:
    """The one line of the first shell block under "Install and run the daemon"."""
    text = README.read_text()
    section = text[text.index("## Install and run the daemon") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "README.md's install section has no sh block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, f"README.md's first command is not one line: {lines}"
    return lines[0]


def test_the_first_command_needs_no_pipx_and_no_path_change() -> None:
    command = first_command()
    assert "pipx" not in command and "uv " not in command
    # the daemon runs from the environment the command made, not from a PATH lookup
    assert ".venv/bin/repl daemon" in command


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readmes_first_command_starts_a_listening_daemon_on_a_fresh_machine(
    tmp_path: Path,
) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=NOT_SOURCES)
    home = tmp_path / "home"
    home.mkdir()
    # a PATH with Python (the interpreter itself, not this suite's virtual environment)
    # and the system's tools: nothing a user would have added, no pipx, no uv
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    base_python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    (bin_dir / "python3").symlink_to(base_python)
    path = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    for absent in ("pipx", "uv", "repl"):
        found = shutil.which(absent, path=path)
        assert found is None, f"{absent} is on the fresh machine's PATH: {found}"
    port = free_port()
    kept = ("LANG", "LC_ALL", "TMPDIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
    env = {name: os.environ[name] for name in kept if name in os.environ}
    env |= {"HOME": str(home), "PATH": path, "REPL_ADDR": f"127.0.0.1:{port}"}
    log = tmp_path / "command.log"
    with log.open("wb") as out:
        shell = subprocess.Popen(
            ["bash", "-c", first_command()],
            cwd=checkout,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def listening() -> bool:
            if shell.poll() is not None:
                raise AssertionError(f"the command ended ({shell.returncode}):\n{log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        eventually(listening, timeout=540, what="README's daemon listening")
        repl = checkout / ".venv" / "bin" / "repl"
        pong = subprocess.run(
            [str(repl), "ping", "--json"], env=env, capture_output=True, text=True, timeout=30
        )
        assert pong.returncode == 0, pong.stderr
        assert json.loads(pong.stdout)["addr"] == f"127.0.0.1:{port}"
        # its state went where a fresh HOME puts it, and the installed repl, not the checkout's
        # sources, runs it
        assert (home / ".local" / "state" / "repl" / "token").exists()
        where = subprocess.run(
            [
                str(checkout / ".venv" / "bin" / "python"),
                "-c",
                "import repl_cli; print(repl_cli.__file__)",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "site-packages" in where.stdout, where
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGTERM)
            try:
                shell.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(shell.pid, signal.SIGKILL)
                shell.wait()
