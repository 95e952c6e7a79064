"""The import graph of the project's packages, and the two rules of its layout.

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
4. neither the core (``session``) nor the daemon imports the client.

It exits 1 and names what breaks a rule, 0 when all hold. ``--root DIR``
reads another tree of the same packages (the tests use it to show that a cycle
is caught).
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


def imports_of(name: str, path: Path, known: dict[str, Path]) -> tuple[set[str], set[str]]:
    """What module ``name`` imports: the project's modules, and the outside top-level names."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    inside: set[str] = set()
    outside: set[str] = set()

    def note(target: str) -> None:
        if target.split(".")[0] in PACKAGES:
            while target not in known and "." in target:  # a name inside a module
                target = target.rpartition(".")[0]
            if target != name:
                inside.add(target)
        else:
            outside.add(target.split(".")[0])

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                note(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            for alias in node.names:
                full = f"{base}.{alias.name}"
                note(full if full in known else base)
    return inside, outside


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
    for name, path in known.items():
        graph[name], outside[name] = imports_of(name, path, known)
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
    for line in broken:
        print(f"imports: {line}", file=sys.stderr)
    if not broken:
        print(
            f"imports: {len(known)} modules, no cycle, the engine imports no backend, "
            "the client imports only what it shares with the daemon"
        )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
