"""``repl read``, ``send`` and ``wait`` load what they need and no more (issue 50).

Agents and scripts run ``repl`` anew for every step, so its start-up is their latency
(docs/benchmarks.md, the ``cli`` rows, measures it). No time is asserted here: each
command runs as a user runs it, through the console script's entry point with its stdout
a pipe, and the modules it loaded are looked at. It must load no module of the daemon
but the wire's, no module of the core but the few the wire's types are made of, no
command module but its own, none of the heavy libraries (anyio, asyncio, rich, the MCP
SDK, ssl, OpenSSL's hashes, logging, locale, importlib.metadata), and no decoder of every
request (``repl_daemon.protocol`` makes it on first use, which only the daemon makes).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from typing import Any

import click
import pytest

from repl_cli.cli.command import FilePath
from tests.helpers import Repl

#: the command, run with the test's session id (which holds one firing); the module of
#: ``repl_cli.cli.commands`` that holds it; what it prints
COMMANDS = {
    "read": (["read", "{s}", "--full"], "reading", '1 0\n(1 "on-message" "one")'),
    "send": (["send", "{s}", "two"], "send", "2"),
    "wait": (["wait", "{s}", "--timeout", "10"], "reading", "on-message: one"),
}

#: run ``repl ARGS`` as the console script does (``repl_cli.cli.entry.main``), then tell
#: on stderr its status, whether the request decoder was made, and the modules loaded
PROBE = """\
import sys
sys.argv = ["repl", *sys.argv[1:]]
from repl_cli.cli.entry import main
status = main()
from repl_daemon import protocol
sys.stderr.write(repr((status, protocol._request_decoder is None, sorted(sys.modules))))
"""

#: what a client of the daemon never needs at start-up (each with what is under it)
HEAVY = (
    "anyio",
    "asyncio",
    "rich",
    "mcp",
    "uvloop",
    "starlette",
    "redis",
    "sqlite3",
    "ssl",
    "_ssl",
    "hashlib",
    "_hashlib",
    "secrets",
    "random",
    "logging",
    "locale",
    "importlib.metadata",
    "pkg_resources",
    "email",
    "http",
    "json",
    "concurrent",
    "multiprocessing",
    "subprocess",
    "tempfile",
    "argparse",
    "dataclasses",
)
#: of the daemon's package, only the wire's types and where a daemon is
DAEMON_MAY = {"repl_daemon", "repl_daemon.protocol", "repl_daemon.locations"}
#: of the core, only what the wire's types are made of (and the API's operations use)
CORE_MAY = {
    "session",
    "session.errors",
    "session.firing",
    "session.rules",
    "session.tags",
    "session.approvals",
}


def loaded(env: dict[str, str], *args: str) -> tuple[Any, str, bool, set[str]]:
    """Run the probe: the command's exit status and what it printed, whether no request
    decoder was made, and the modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=30
    )
    status, no_decoder, modules = ast.literal_eval(done.stderr.splitlines()[-1])
    return status, done.stdout, no_decoder, set(modules)


def under(modules: set[str], roots: tuple[str, ...] | set[str]) -> set[str]:
    return {m for m in modules if any(m == r or m.startswith(f"{r}.") for r in roots)}


@pytest.mark.parametrize("verb", sorted(COMMANDS))
def test_a_command_loads_only_what_it_needs(repl: Repl, s: str, verb: str) -> None:
    repl.send(s, "one")  # so that read prints it and wait returns at once
    floor = subprocess.run(
        [sys.executable, "-c", "import sys, click, msgspec, socket; print(sorted(sys.modules))"],
        capture_output=True,
        text=True,
        env=repl.env,
        timeout=30,
    )
    # a module the bare imports load already here (a sitecustomize's) is not the CLI's
    baseline = set(ast.literal_eval(floor.stdout))
    args, module, printed = COMMANDS[verb]
    status, out, no_decoder, modules = loaded(repl.env, *(a.format(s=s) for a in args))

    assert (status, out) == (0, f"{printed}\n")
    assert no_decoder, "the client made the decoder of every request"
    assert under(modules, HEAVY) - baseline == set()
    assert under(modules, ("repl_daemon",)) <= DAEMON_MAY
    assert under(modules, ("session",)) <= CORE_MAY
    assert under(modules, ("repl_cli.cli.commands",)) == {
        "repl_cli.cli.commands",
        f"repl_cli.cli.commands.{module}",
    }
    assert under(modules, ("repl_cli.mcp", "repl_cli.aio", "repl_cli.api.aio")) == set()


def test_the_file_options_take_a_path_as_click_path_does() -> None:
    """``--tls-ca`` and ``--token-file`` take ``FilePath``, which sets click.Path's
    attributes itself rather than look its name up in gettext (which loads ``locale``):
    the same attributes click's constructor sets, so the same checks, completion and
    value (a directory is refused as "File '...' is a directory")."""
    assert vars(FilePath()) == vars(click.Path(dir_okay=False))
