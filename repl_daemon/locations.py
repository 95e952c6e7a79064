"""Where a daemon is: its default address and its home (state directory).

Shared by the daemon and the CLI, so it imports nothing but the standard
library's cheapest modules: the CLI loads it on every run.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_ADDR = "127.0.0.1:7427"
#: an address written ``tls://HOST:PORT`` is reached over TLS (rules L1-L3)
TLS_SCHEME = "tls://"


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
