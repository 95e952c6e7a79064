"""The ``repl`` command's entry point: the console script's (``[project.scripts]`` in
pyproject.toml) and ``python -m repl_cli``'s.

``repl`` runs anew for every read, send and wait a monitor or an agent makes, so its
start-up is its latency (docs/benchmarks.md, the CLI's start-up). Loading a command's
modules makes tens of thousands of objects that live as long as the process: the cyclic
garbage collector is held off while they load (it would walk them again and again and
find nothing to free), and they are then frozen (``gc.freeze``), which also spares the
walk over every one of them that the interpreter makes as it exits: several ms of each
run. What a command makes after that is collected as usual, so a command that runs for
long (``repl daemon``, ``repl mcp``, ``repl follow``) is collected as any program is.
"""

from __future__ import annotations

import gc


def main() -> int:
    """Run ``repl`` (``repl_cli.cli.main.main``), its modules loaded and frozen as above."""
    gc.disable()
    try:
        from repl_cli.cli.main import main as run
    finally:
        gc.freeze()
        gc.enable()
    return run()
