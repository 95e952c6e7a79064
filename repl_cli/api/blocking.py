"""The blocking API: ``Repl``, one connection to a daemon over a socket, and ``connect``.

``repl_cli.api`` (this package's face) says what the API does; this module is
its I/O: ``repl_cli.api.client.Client``'s blocking socket under the
operations written once (``repl_cli/api/_sync/operations.py``, the blocking
rewrite of ``repl_cli/api/_async/operations.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from repl_cli.api._common import R, log_note
from repl_cli.api._sync.operations import Operations
from repl_cli.api.client import Client
from repl_cli.api.reconnect import DEFAULT_RECONNECT
from repl_daemon import protocol as p

__all__ = ["Repl", "connect"]


def connect(
    addr: str | None = None,
    home: str | Path | None = None,
    *,
    reconnect: float = DEFAULT_RECONNECT,
    token: str | None = None,
    tls_ca: str | Path | None = None,
    token_file: str | Path | None = None,
) -> Repl:
    """A ``Repl`` for the daemon at ``addr`` (``REPL_ADDR``, else 127.0.0.1:7427) with
    ``token`` (else ``REPL_TOKEN``, else the root token in ``home``: ``REPL_HOME``, else
    the default state directory), over TLS when ``addr`` is ``tls://HOST:PORT`` or
    ``tls_ca`` (else ``REPL_TLS_CA``) names the CA to trust. It connects on the first call;
    use it in a ``with`` block, or ``close`` it."""
    client = Client(addr, home, token=token, tls_ca=tls_ca, token_file=token_file)
    return Repl(client, reconnect=reconnect)


class Repl(Operations):
    """One connection to a daemon, and its operations (``repl_cli/api/_async/operations.py``
    says what each does), blocking."""

    def __init__(
        self,
        client: Client,
        *,
        reconnect: float = DEFAULT_RECONNECT,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.client = client
        self.reconnect = reconnect
        self.note = note or log_note

    @property
    def addr(self) -> str:
        return self.client.addr

    def close(self) -> None:
        self.client.close()

    # -- the primitives of the operations -------------------------------------------

    def _request(self, request: p.Request, expect: type[R]) -> R:
        return self.client.call(request, expect)

    def _blocking(self, request: p.Request, expect: type[R]) -> R:
        return self.client.call(request, expect, timeout=None)

    def _answered_once(self) -> bool:
        return self.client.connected_once

    def _clock(self) -> float:
        return time.monotonic()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)
