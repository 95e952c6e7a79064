"""The layout's rules (``scripts/imports.py``): no import cycle, an engine that imports
no backend, a client that imports of the daemon only what they share, a daemon that
imports no client, a library that imports neither front end and a CLI that loads the
MCP server only lazily; and that the check catches each, on a tree made to break it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "imports.py"


def check(root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--quiet", "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_project_has_no_cycle_and_an_engine_that_imports_no_backend() -> None:
    done = check()
    assert done.returncode == 0, done.stderr
    assert "no cycle, the engine imports no backend" in done.stdout
    assert "the client imports only what it shares with the daemon" in done.stdout
    assert "the library imports no front end, the MCP server not the CLI" in done.stdout
    assert "the CLI the MCP server only lazily" in done.stdout


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for package in ("session", "repl_daemon", "repl_cli"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_cycle_through_a_type_checking_import_is_caught(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "repl_daemon/a.py": "from repl_daemon.b import B\n",
            "repl_daemon/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from repl_daemon import a\n"
                "B = 1\n"
            ),
        },
    )
    done = check(root)
    assert done.returncode == 1
    assert "an import cycle: repl_daemon.a <-> repl_daemon.b" in done.stderr


def test_an_engine_that_reaches_sqlite_through_a_lazy_import_is_caught(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "repl_daemon/engine/__init__.py": "",
            "repl_daemon/engine/engine.py": (
                "def open() -> None:\n    from repl_daemon.backends.local import sqlite\n"
            ),
            "repl_daemon/backends/__init__.py": "",
            "repl_daemon/backends/local/__init__.py": "",
            "repl_daemon/backends/local/sqlite.py": "import sqlite3\n",
        },
    )
    done = check(root)
    assert done.returncode == 1
    assert (
        "the engine reaches repl_daemon.backends.local.sqlite, which imports sqlite3" in done.stderr
    )


def test_a_client_that_imports_the_daemons_engine_is_caught(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "repl_cli/fast.py": "from repl_daemon.protocol import VERSION\n",
            "repl_cli/slow.py": "def f() -> None:\n    from repl_daemon.engine import Engine\n",
            "repl_daemon/protocol.py": "VERSION = 1\n",
            "repl_daemon/engine.py": "class Engine: ...\n",
            "repl_daemon/http.py": "from repl_cli import fast\n",
        },
    )
    done = check(root)
    assert done.returncode == 1
    assert "the client's repl_cli.slow imports the daemon's repl_daemon.engine" in done.stderr
    assert "repl_daemon.http imports the client's repl_cli.fast" in done.stderr
    assert "repl_cli.fast imports" not in done.stderr  # the wire's types: allowed


def test_a_library_or_a_front_end_that_reaches_across_the_client_is_caught(
    tmp_path: Path,
) -> None:
    """The library imports no front end, even lazily; the MCP server imports the library,
    never the CLI; the CLI imports the library, and the MCP server only in a function (or
    for types), so that ``repl read`` never loads it."""
    lazy = "def f() -> None:\n    from repl_cli.mcp import server\n"
    typed = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from repl_cli.mcp import server\n"
    )
    root = tree(
        tmp_path,
        {
            "repl_cli/api/__init__.py": "",
            "repl_cli/api/client.py": "def f() -> None:\n    from repl_cli.cli import output\n",
            "repl_cli/api/errors.py": "class Error(Exception): ...\n",
            "repl_cli/cli/__init__.py": "",
            "repl_cli/cli/output.py": "from repl_cli.api.errors import Error\n",
            "repl_cli/cli/eager.py": "from repl_cli.mcp import server\n",
            "repl_cli/cli/lazy.py": lazy,
            "repl_cli/cli/typed.py": typed,
            "repl_cli/mcp/__init__.py": "",
            "repl_cli/mcp/server.py": "from repl_cli.api.errors import Error\n",
            "repl_cli/mcp/stdio.py": "from repl_cli.cli.output import x\n",
        },
    )
    done = check(root)
    assert done.returncode == 1
    assert (
        "repl_cli.api.client (of repl_cli.api) imports repl_cli.cli.output: "
        "repl_cli.api may not import repl_cli.cli" in done.stderr
    )
    assert (
        "repl_cli.mcp.stdio (of repl_cli.mcp) imports repl_cli.cli.output: "
        "repl_cli.mcp may not import repl_cli.cli" in done.stderr
    )
    assert (
        "repl_cli.cli.eager imports repl_cli.mcp.server when it loads: repl_cli.cli imports "
        "repl_cli.mcp only lazily, in a function" in done.stderr
    )
    assert "repl_cli.cli.lazy" not in done.stderr and "repl_cli.cli.typed" not in done.stderr
    assert "repl_cli.cli.output" not in done.stderr.replace("imports repl_cli.cli.output", "")
    assert len(done.stderr.splitlines()) == 3


def test_a_long_module_or_function_says_why_it_is_long() -> None:
    """No product module of over 800 lines, and no function of over 80, without a sentence
    in it saying why (``Why one module`` in a module's docstring, ``Long (`` in a function's
    first comment): a newcomer reads a module in one sitting, or is told why not."""
    import ast

    unexplained = []
    for package in ("session", "repl_daemon", "repl_cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            name = path.relative_to(ROOT).as_posix()
            if len(text.splitlines()) > 800 and "Why one module" not in text:
                unexplained.append(f"{name} ({len(text.splitlines())} lines)")
            lines = text.splitlines()
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    if node.end_lineno - node.lineno + 1 > 80:
                        body = "\n".join(lines[node.lineno - 1 : node.lineno + 60])
                        if "# Long (" not in body:
                            unexplained.append(f"{name}: {node.name}")
    assert not unexplained, f"long and not saying why: {unexplained}"
