"""The import graph of the project's packages, and the rules of its layout.

    python scripts/imports.py            # the graph, one module a line, then the verdict
    python scripts/imports.py --quiet    # the verdict alone

Every ``import`` and ``from ... import`` of a module under ``session/``,
``repl_daemon/`` and ``repl_cli/`` counts, wherever it is written: at the top,
inside a function (a lazy import) or under ``if TYPE_CHECKING:``. The rules:

1. no module imports another that imports it back, at any distance (no cycle);
2. the engine (``repl_daemon.engine`` and its modules) reaches no module that
   imports ``redis`` or ``sqlite3``: it knows the backends by their interface
   (``repl_daemon.engine.committer.Backend``) alone;
3. the client (``repl_cli``) imports of the daemon only what a client shares
   with it (``CLIENT_MAY_IMPORT``): the wire's types, where a daemon is found,
   the daemon's options (which ``repl daemon`` takes as its own), the
   daemon's entry point (which ``repl daemon`` runs) and what it gives the MCP
   server it serves at ``/mcp`` (which ``repl daemon`` passes it);
4. neither the core (``session``) nor the daemon imports the client;
5. of the client's three packages (``CLIENT_PACKAGES``), the library
   (``repl_cli.api``) imports neither front end, the MCP server
   (``repl_cli.mcp``) imports the library and not the CLI, and the CLI
   (``repl_cli.cli``) imports the library, and the MCP server only lazily: in
   a function (``repl mcp``, and the ``/mcp`` of the daemon it runs), so that
   no other command loads it.

An import is lazy inside a function, or under ``if TYPE_CHECKING:`` (it is
never run); one anywhere else runs when its module loads.

It exits 1 and names what breaks a rule, 0 when all hold. ``--root DIR``
reads another tree of the same packages (the tests use it to show that each
rule is caught).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGES = ("session", "repl_daemon", "repl_cli")
ENGINE = "repl_daemon.engine"
#: what only a backend may import
BACKEND_ONLY = ("redis", "sqlite3")
#: the modules of the daemon that the client may import (rule 3), and why
CLIENT_MAY_IMPORT = {
    "repl_daemon": "the package itself",
    "repl_daemon.protocol": "the wire's types",
    "repl_daemon.locations": (
        "where a daemon is: the default address and state directory, and the keys"
        " of an /mcp request's scope"
    ),
    "repl_daemon.config": "the daemon's options, which `repl daemon` takes as its own",
    "repl_daemon.__main__": "the daemon's entry point, which `repl daemon` runs",
    "repl_daemon.http.mcp": "what the daemon gives the MCP server it serves at /mcp",
}
#: what each of the client's packages may import of the two others (rule 5): the library
#: neither front end, the MCP server the library, the CLI the library and (lazily) the MCP
#: server; ``LAZILY``: only inside a function, never when the importer loads
LAZILY = "lazily"
CLIENT_PACKAGES: dict[str, dict[str, str]] = {
    "repl_cli.api": {},
    "repl_cli.mcp": {"repl_cli.api": "always"},
    "repl_cli.cli": {"repl_cli.api": "always", "repl_cli.mcp": LAZILY},
}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the packages under ``root``, by its dotted name."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


class Imports:
    """What one module imports: the project's modules (``inside``; ``at_load`` those of
    them it imports when it loads, not lazily), and the outside top-level names."""

    def __init__(self) -> None:
        self.inside: set[str] = set()
        self.at_load: set[str] = set()
        self.outside: set[str] = set()


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Imports:
    """What module ``name`` imports (``Imports``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found = Imports()

    def note(target: str, loads: bool) -> None:
        if target.split(".")[0] in PACKAGES:
            while target not in known and "." in target:  # a name inside a module
                target = target.rpartition(".")[0]
            if target != name:
                found.inside.add(target)
                if loads:
                    found.at_load.add(target)
        else:
            found.outside.add(target.split(".")[0])

    def visit(node: ast.AST, loads: bool) -> None:
        """Every import at or under ``node``; ``loads``: run when the module loads."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                note(alias.name, loads)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                full = f"{base}.{alias.name}"
                note(full if full in known else base, loads)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            loads = False
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for branch in node.body:
                visit(branch, False)
            for branch in node.orelse:
                visit(branch, loads)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, loads)

    visit(tree, True)
    return found


def client_package(name: str) -> str | None:
    """Which of ``CLIENT_PACKAGES`` module ``name`` is of (None: none of them)."""
    return next((p for p in CLIENT_PACKAGES if name == p or name.startswith(p + ".")), None)


def across_the_client(name: str, found: Imports) -> list[str]:
    """What ``name``'s imports break of rule 5."""
    mine = client_package(name)
    if mine is None:
        return []
    broken = []
    for other in sorted(found.inside):
        theirs = client_package(other)
        if theirs is None or theirs == mine:
            continue
        allowed = CLIENT_PACKAGES[mine].get(theirs)
        if allowed is None:
            broken.append(f"{name} (of {mine}) imports {other}: {mine} may not import {theirs}")
        elif allowed == LAZILY and other in found.at_load:
            broken.append(
                f"{name} imports {other} when it loads: {mine} imports {theirs} only lazily, "
                "in a function"
            )
    return broken


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reach(graph: dict[str, set[str]], start: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    known = modules(args.root)
    graph: dict[str, set[str]] = {}
    outside: dict[str, set[str]] = {}
    found: dict[str, Imports] = {}
    for name, path in known.items():
        found[name] = imports_of(name, path, known)
        graph[name], outside[name] = found[name].inside, found[name].outside
    if not args.quiet:
        for name in sorted(graph):
            print(f"{name} -> {', '.join(sorted(graph[name])) or '-'}")
    broken = []
    for component in cycles(graph):
        broken.append(f"an import cycle: {' <-> '.join(component)}")
    engine = [name for name in known if name == ENGINE or name.startswith(ENGINE + ".")]
    for name in sorted(reach(graph, engine)):
        banned = outside[name] & set(BACKEND_ONLY)
        if banned:
            broken.append(f"the engine reaches {name}, which imports {', '.join(sorted(banned))}")
    for name in sorted(known):
        package = name.split(".")[0]
        for other in sorted(graph[name]):
            if package == "repl_cli" and other.startswith("repl_daemon"):
                if other not in CLIENT_MAY_IMPORT:
                    broken.append(f"the client's {name} imports the daemon's {other}")
            elif package != "repl_cli" and other.startswith("repl_cli"):
                broken.append(f"{name} imports the client's {other}")
        broken.extend(across_the_client(name, found[name]))
    for line in broken:
        print(f"imports: {line}", file=sys.stderr)
    if not broken:
        print(
            f"imports: {len(known)} modules, no cycle, the engine imports no backend, "
            "the client imports only what it shares with the daemon, "
            "the library imports no front end, the MCP server not the CLI, "
            "the CLI the MCP server only lazily"
        )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
