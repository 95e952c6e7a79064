"""repl from Python: the daemon's operations as methods, with typed answers.

    from repl_cli import api

    with api.connect() as repl:                 # REPL_ADDR / REPL_HOME, or addr=, home=
        repl.start("inbox", exist_ok=True)
        repl.send("inbox", "hello").seq          # 1
        for batch in repl.follow("inbox"):       # blocks; rides out a daemon restart
            for firing in batch.firings:
                print(firing.seq, firing.result)
            # asking for the next batch acknowledges this one

Every answer is the protocol's own msgspec Struct (``repl_daemon.protocol``:
``Sent``, ``Firings``, ``Woken``, ``SessionBatch``, ``Pong``...; a firing is
``session.firing.Firing``). Every failure is an ``Error`` whose ``status`` is
the exit status ``repl`` would end with: ``Unavailable`` (75: no daemon, it
went away or is shutting down, its store failed; try again), ``TimedOut``
is not an error (``wait`` answers ``timed_out``), and the rest (1, 64) are
errors that trying again will not mend; ``code`` is the daemon's wire code
when it came from the daemon. ``wait`` and ``follow`` reconnect as ``repl
wait`` and ``repl follow`` do (``reconnect`` seconds, 300 by default), and
log the outage on the ``repl`` logger instead of stderr.

A ``Repl`` may sit idle as long as its program likes: a connection the
daemon closed meanwhile (its ``--idle-timeout``, or a restart between two
calls) is replaced by the next call, which is answered with no error; a
request the daemon answered ``idle_timeout`` is sent once more, and one whose
answer was lost is sent again only when a repeat cannot change what it did
(``repl_cli/_async/operations.py`` states the rules: a keyless send is never
sent twice behind the caller's back).

The asynchronous twin is ``repl_cli.aio``. Both are one body of operations
(``repl_cli/_async/operations.py``, hand-written, and its blocking rewrite
``repl_cli/_sync/operations.py``) over each side's own I/O: here a blocking
socket (``repl_cli.client.Client``). This module is what the ``repl`` command
itself is made of.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from repl_cli._common import (
    Error,
    MatchLike,
    R,
    Unavailable,
    as_match,
    log_note,
)
from repl_cli._sync.operations import Operations
from repl_cli.client import Client
from repl_cli.reconnect import DEFAULT_RECONNECT, Reconnect
from repl_daemon import protocol as p
from session.firing import CursorInfo, Firing
from session.tags import Match

__all__ = [
    "CursorInfo",
    "Error",
    "Firing",
    "Match",
    "MatchLike",
    "Repl",
    "Unavailable",
    "as_match",
    "connect",
]


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
    """One connection to a daemon, and its operations (``repl_cli/_async/operations.py``
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
        #: a pipe the caller writes to (the CLI's stdout): its reader leaving ends a blocked
        #: ``wait`` at once (``ReaderGone``), so ``repl wait | head -n 1`` does not hang
        self.watch: int | None = None

    @property
    def addr(self) -> str:
        return self.client.addr

    def close(self) -> None:
        self.client.close()

    def again(self, deadline: float | None = None) -> Reconnect:
        """A ``Reconnect`` that runs a step again across an outage, as ``wait`` does."""
        return Reconnect(self.client, self.reconnect, deadline, note=self.note)

    # -- the primitives of the operations -------------------------------------------

    def _request(self, request: p.Request, expect: type[R]) -> R:
        return self.client.call(request, expect)

    def _blocking(self, request: p.Request, expect: type[R]) -> R:
        return self.client.call(request, expect, timeout=None, watch=self.watch)

    def _answered_once(self) -> bool:
        return self.client.connected_once

    def _clock(self) -> float:
        return time.monotonic()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)
