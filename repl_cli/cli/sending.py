"""What ``repl send`` sends: the text from stdin, and ``--lines`` as a pipeline.

Stdin is read here and decoded as UTF-8, with an error that names the line
that is not. ``send_lines`` keeps up to ``SEND_WINDOW`` sends on one
connection before it reads their answers, and prints each seq as it comes.
Nothing here parses options: the command in ``main`` does, then calls in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TextIO

import click

from repl_cli.api.client import Client, encoded
from repl_cli.api.errors import Error
from repl_cli.cli.errors import CliError, not_utf8_message
from repl_cli.cli.sink import write_text
from repl_daemon import protocol as p

# how many sends `send --lines` keeps on the wire before reading answers
SEND_WINDOW = 256


def stdin_text() -> str:
    """All of stdin, less one trailing newline (``repl send ID -``); empty stdin is refused
    (``repl send ID </dev/null`` is a mistake more often than a wish: ``''`` says it)."""
    stdin = _stdin("give the TEXT as an argument, or pipe it in")
    if stdin.isatty():
        click.echo("repl: reading the text from the terminal: end it with Ctrl-D", err=True)
    data = stdin.buffer.read()
    if not data:
        raise CliError(
            "stdin is empty, so there is nothing to send: give the TEXT as an argument "
            "or pipe it in (`repl send ID ''` sends an empty text)"
        )
    return utf8(data, "stdin").removesuffix("\n")


def _stdin(hint: str) -> TextIO:
    """``sys.stdin``, or a CliError when the process started with it closed (``<&-``).

    Then fd 0 may be another file of ours by now (the daemon's socket): it
    must not be read.
    """
    if sys.stdin is None:
        raise CliError(f"stdin is closed: {hint}")
    return sys.stdin


def send_lines(
    client: Client,
    session: str,
    handler: str,
    as_json: bool = False,
    tags: dict[str, str] | None = None,
) -> None:
    """Pipelined over one connection: up to SEND_WINDOW sends on the wire at once.

    Each chunk of stdin is answered in full before the next is read, so a
    slow writer (``tail -f``) sees its seqs as its lines go. A line too long
    for a request is refused before any line of its chunk is sent.
    """
    step = SEND_WINDOW // 4
    number = 0  # lines before this chunk
    for chunk in stdin_lines():
        wire = [
            _encoded_line(session, t, handler, number + n, tags or {})
            for n, t in enumerate(chunk, 1)
        ]
        number += len(chunk)
        outstanding = 0
        seqs: list[str] = []
        for first in range(0, len(wire), step):
            piece = wire[first : first + step]
            while outstanding + len(piece) > SEND_WINDOW:
                seqs.append(f"{client.receive(p.Sent).seq}\n")
                outstanding -= 1
            client.send_raw(b"".join(piece))
            outstanding += len(piece)
        while outstanding:
            seqs.append(f"{client.receive(p.Sent).seq}\n")
            outstanding -= 1
        if as_json:  # a line never comes back a duplicate: it has no key
            seqs = [f'{{"seq": {seq.strip()}, "duplicate": false}}\n' for seq in seqs]
        write_text("".join(seqs))


def _encoded_line(
    session: str, text: str, handler: str, number: int, tags: dict[str, str]
) -> bytes:
    try:
        return encoded(p.Send(session=session, text=text, handler=handler, tags=tags))
    except Error as exc:
        exc.message = f"line {number} of stdin: {exc.message}"
        raise


def stdin_lines() -> Iterator[list[str]]:
    """Stdin's lines, a chunk at a time as they arrive (so a slow writer is not stalled)."""
    fd = _stdin("--lines sends the lines of stdin: pipe them in").fileno()
    rest = b""
    number = 0
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            break
        *complete, rest = (rest + data).split(b"\n")
        if complete:
            yield [utf8(raw, f"line {number + n + 1} of stdin") for n, raw in enumerate(complete)]
            number += len(complete)
    if rest:
        yield [utf8(rest, f"line {number + 1} of stdin")]


def utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(not_utf8_message(what, f"{exc.reason} at byte {exc.start}")) from None
