"""Where a daemon is: its default address and its home (state directory); and where,
in the ASGI scope of a request to ``/mcp``, the daemon leaves what the client's MCP
server finds there (``SCOPE_TOKEN``, ``SCOPE_LINE``).

Shared by the daemon and the CLI, so it imports nothing but the standard
library's cheapest modules: the CLI loads it on every run. (The client may not
import ``repl_daemon.http``, whose package loads the daemon's HTTP server: the
scope's keys are here so that both sides name them once.)
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ADDR = "127.0.0.1:7427"
#: an address written ``tls://HOST:PORT`` is reached over TLS (rules L1-L3)
TLS_SCHEME = "tls://"

#: the scope's key for the token a request to /mcp presented (checked by then)
SCOPE_TOKEN = "repl.token"
#: the scope's key of a request's ``Line`` (``repl_daemon.http.streams``): its ``gone``
#: is True once the client's connection was lost before the response ended
SCOPE_LINE = "repl.line"


def default_home() -> Path:
    """``REPL_HOME``, else ``$XDG_STATE_HOME/repl``, else ``~/.local/state/repl``."""
    env = os.environ.get("REPL_HOME")
    if env:
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "repl"


def split_addr(addr: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a host and a port; None when it is not one."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return None
    return host.strip("[]"), int(port)
