"""Printing batches of firings and acknowledging only what was delivered (rule S9).

``show`` writes a batch line by line through the ``Sink`` and remembers,
per session, the last seq whose line the reader took. ``deliver`` (read,
wait) then acknowledges exactly that; ``follow`` carries it in its next
wait request. When the reader goes away, a write fails (a full disk, a
terminal gone) or the user presses Ctrl-C part-way, what was delivered is
still acknowledged and nothing after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from repl_cli.api.client import Client
from repl_cli.api.errors import Error
from repl_cli.api.receipt import ReaderGone
from repl_cli.cli.errors import WriteFailed
from repl_cli.cli.output import FiringFormat
from repl_cli.cli.sink import Sink
from repl_daemon import protocol as p
from session.firing import Firing
from session.tags import Match

if TYPE_CHECKING:
    from repl_cli.cli.client import Repl


class Batch:
    """What a read, poll or wait returned for one session."""

    __slots__ = ("firings", "lost", "next", "session")

    def __init__(self, session: str, next: int, lost: int, firings: Sequence[Firing]) -> None:
        self.session = session
        self.next = next
        self.lost = lost
        self.firings = firings

    @property
    def start(self) -> int:
        """The position the batch was read after (rule S3, solved for N)."""
        if self.firings:
            return self.firings[0].seq - 1 - self.lost
        return self.next - self.lost


class Printer:
    """Writes batches to stdout; ``cursor`` None acknowledges nothing (peek, --after, poll)."""

    def __init__(self, client: Client, fmt: FiringFormat, cursor: str | None) -> None:
        self.client = client
        self.fmt = fmt
        self.cursor = cursor
        self.sink = Sink(confirm=cursor is not None)

    @property
    def watch(self) -> int | None:
        """The pipe to watch while blocked in a wait, so a reader that left ends us."""
        return self.sink.fd if self.sink.pipe else None

    def show(self, batches: Sequence[Batch]) -> dict[str, int]:
        """Print; returns session -> the last seq delivered, for the sessions that moved.

        If the reader goes away, a write fails or Ctrl-C comes part-way, what
        was delivered is acknowledged before the exception goes on.
        """
        taken: dict[str, int] = {}
        try:
            for batch in batches:
                start = batch.start
                for text, seq in self.fmt.lines(
                    batch.session, batch.next, batch.lost, batch.firings
                ):
                    self.sink.put(text)
                    if seq > start:
                        taken[batch.session] = seq
                # all of it delivered: up to the last seq looked at, which a matching reader
                # looked past its last match (rule R3), so it need not look at them again
                if batch.next > start:
                    taken[batch.session] = batch.next
        except (ReaderGone, WriteFailed, KeyboardInterrupt):
            self.ack_on_the_way_out(taken, self.client)
            raise
        return taken

    def ack(self, taken: dict[str, int]) -> None:
        if self.cursor is None:
            return
        for session, seq in taken.items():
            self.client.call(p.Ack(session=session, cursor=self.cursor, seq=seq), p.Acked)

    def ack_together(self, taken: dict[str, int]) -> None:
        """``taken``'s acks in one request, applied all or none (a wait that looks and
        returns at once: the acks of a wait are checked whole, rule 14)."""
        if self.cursor is None or not taken:
            return
        sessions = list(taken)
        together = p.Wait(sessions=sessions, cursor=self.cursor, ack=taken, timeout_ms=0, max=1)
        self.client.call(together, p.Woken)

    def ack_on_the_way_out(self, taken: dict[str, int], client: Client) -> None:
        """Best effort while exiting: a second Ctrl-C must not cut the ack short."""
        if self.cursor is None or not taken:
            return
        import signal  # here, not at the top: `repl read` need not load it

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for session, seq in taken.items():
                client.call(p.Ack(session=session, cursor=self.cursor, seq=seq), p.Acked)
        except Error:
            pass  # the firings come again to the next reader: at least once


def at_most(batches: Sequence[Batch], most: int) -> list[Batch]:
    """The first ``most`` firings of ``batches``, in order, each batch cut to what it keeps.

    A batch cut short ends at its last kept firing (that is what is acknowledged,
    and where the next read starts); a batch left with none of its firings is left
    out whole, its loss too, to be told by the next read. One that had none (a loss
    alone) costs nothing and stays.
    """
    kept: list[Batch] = []
    for batch in batches:
        if not batch.firings:
            kept.append(batch)
        elif most > 0:
            firings = batch.firings[:most]
            most -= len(firings)
            cut = len(firings) < len(batch.firings)
            kept.append(
                Batch(batch.session, firings[-1].seq if cut else batch.next, batch.lost, firings)
            )
    return kept


def deliver(printer: Printer, batches: Sequence[Batch]) -> None:
    """Print the batches, then acknowledge what was delivered (read, wait)."""
    printer.ack(printer.show(batches))


def follow(
    printer: Printer,
    repl: Repl,
    session: str,
    cursor: str | None,
    count: int | None = None,
    match: Match | None = None,
    start: int | None = None,
) -> None:
    """Stream until interrupted (or ``count`` firings): the API's ``follow`` (one wait a
    batch, carrying the last batch's ack, riding out an outage), told what each batch's
    printing delivered, so that is what is acknowledged.

    With no ``cursor`` (a matching follow), nothing is acknowledged: each
    wait goes on after the last seq the one before looked at, from ``start``
    (None: the whole ring)."""
    client = printer.client
    carried: dict[str, int] = {}
    repl.watch = printer.watch
    batches = repl.follow(session, cursor=cursor, match=match, count=count, start=start)
    try:
        batch = next(batches)
        while True:
            carried = printer.show([Batch(batch.session, batch.next, batch.lost, batch.firings)])
            batch = batches.send(carried.get(batch.session))
    except StopIteration:
        return
    except (ReaderGone, WriteFailed, KeyboardInterrupt):
        # the wait carrying the ack may not have reached the session: ack it again on a
        # fresh connection, as the same token over the same TLS (acks are idempotent)
        fresh = client.fresh()
        try:
            printer.ack_on_the_way_out(carried, fresh)
        finally:
            fresh.close()
        raise
