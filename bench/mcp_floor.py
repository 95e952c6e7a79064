"""The MCP floor: the official SDK's ``MCPServer`` with one tool that returns at once.

The push group (bench/mcp_follow.py) calls this server's ``send`` tool with the SDK's
stdio client beside ``repl mcp``'s ``send``: same client, same transport, same arguments
(``session``, ``text``) and a result of the same shape (``seq``, ``duplicate``), but no
daemon behind it. What ``repl mcp`` costs above this is its own work (its tool's
wrapper, the async API's request over TCP, the daemon's send). Run as a script,
``python bench/mcp_floor.py``, on stdin/stdout; not named ``mcp``, which would shadow the
SDK (the script's directory is first on ``sys.path``).
"""

from __future__ import annotations

from typing import TypedDict

from mcp.server.mcpserver import MCPServer


class SentOut(TypedDict):
    seq: int
    duplicate: bool


server = MCPServer("bench-floor")


@server.tool()
def send(session: str, text: str) -> SentOut:
    """Do nothing, at once."""
    return SentOut(seq=1, duplicate=False)


if __name__ == "__main__":
    server.run("stdio")
