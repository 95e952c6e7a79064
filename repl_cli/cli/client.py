"""The CLI's connection: the blocking API, with what only a command writing to stdout needs.

``Client`` and ``Repl`` are the library's (``repl_cli.api``), and each adds
one thing: a blocked wait ends at once when the reader of our stdout leaves
(``watch``, the pipe ``repl wait | head -n 1`` writes to), and a reader's
step is run again across an outage (``again``, a ``Reconnect``), told on
stderr. The library knows no stdout: these live here.
"""

from __future__ import annotations

import select
import time
from collections.abc import Callable
from typing import TypeVar

from repl_cli.api import blocking
from repl_cli.api import client as api_client
from repl_cli.api._common import R
from repl_cli.api.errors import Error
from repl_cli.api.receipt import ReaderGone
from repl_cli.api.reconnect import DEFAULT_RECONNECT, Outage
from repl_cli.cli.errors import stderr_note
from repl_daemon import protocol as p

T = TypeVar("T")


class Client(api_client.Client):
    """The blocking client, watching the pipe ``watch`` (None: nothing) while it waits for
    an answer: when that pipe's reader leaves, ``ReaderGone``."""

    watch: int | None = None

    def _readable_within(self, poller: select.poll, wait_ms: int | None) -> bool:
        if self.watch is None:
            return super()._readable_within(poller, wait_ms)
        poller.register(self.watch, 0)  # POLLERR only: the pipe's reader closed it
        try:
            ready = poller.poll(wait_ms)
        finally:
            poller.unregister(self.watch)
        if any(fd == self.watch for fd, _ in ready):
            raise ReaderGone()
        return bool(ready)


class Repl(blocking.Repl):
    """The blocking API over the CLI's ``Client``: a request that blocks (a wait) watches
    ``watch``, the pipe the command writes to, so that its reader leaving ends it."""

    client: Client

    def __init__(
        self,
        client: Client,
        *,
        reconnect: float = DEFAULT_RECONNECT,
        note: Callable[[str], None] = stderr_note,
    ) -> None:
        super().__init__(client, reconnect=reconnect, note=note)
        #: a pipe the command writes to (its stdout): its reader leaving ends a blocked
        #: ``wait`` at once (``ReaderGone``), so ``repl wait | head -n 1`` does not hang
        self.watch: int | None = None

    def _blocking(self, request: p.Request, expect: type[R]) -> R:
        self.client.watch = self.watch
        try:
            return super()._blocking(request, expect)
        finally:
            self.client.watch = None

    def again(self) -> Reconnect:
        """A ``Reconnect`` that runs a step again across an outage, as ``wait`` does."""
        return Reconnect(self.client, self.reconnect, note=self.note)


class Reconnect:
    """Runs a reader's steps again (on a new connection) while the daemon or its store is
    unavailable, sleeping between tries (``Outage`` decides how long)."""

    def __init__(self, client: Client, seconds: float, *, note: Callable[[str], None]) -> None:
        self.client = client
        self.outage = Outage(seconds, client.addr, note)

    def run(self, step: Callable[[], T]) -> T:
        """``step()``, tried again until it is not refused as unavailable; any other error
        goes on at once (a stopped or missing session is no outage)."""
        outage = self.outage
        while True:
            try:
                result = step()
            except Error as exc:
                pause = outage.lost(exc, was_there=self.client.connected_once)
                self.client.close()
                time.sleep(pause)
                continue
            outage.back()
            return result
