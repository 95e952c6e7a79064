"""``python -m repl_cli.cli.daemon_entry``: the daemon as ``repl daemon`` runs it.

``python -m repl_daemon`` with the same options, and one thing the daemon
cannot have by itself, as it never imports the client: the MCP server at
``/mcp`` on its ``--http`` listener (``repl_cli.mcp.http``), when the
``[mcp]`` extra is installed. ``repl daemon`` runs ``main`` in its own
process, and ``repl daemon --detach`` runs this module.
"""

from __future__ import annotations

import sys
from contextlib import AbstractAsyncContextManager
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from repl_daemon.http.mcp import Listener


def serving(listener: Listener) -> AbstractAsyncContextManager[Any]:
    """The MCP server's app for ``listener`` (``repl_daemon.http.mcp.McpFactory``),
    imported only when the daemon serves HTTP."""
    from repl_cli.mcp.http import serving as served

    return served(listener)


def mcp_factory() -> Any:
    """What serves /mcp: ``serving`` with the [mcp] extra, None without it."""
    return serving if find_spec("mcp") is not None else None


def main(argv: list[str] | None = None) -> int:
    from repl_daemon.__main__ import main as daemon_main

    return daemon_main(argv, mcp=mcp_factory())


if __name__ == "__main__":
    sys.exit(main())
