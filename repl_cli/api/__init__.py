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
``session.firing.Firing``). Every failure is an ``Error``, of one class a
meaning (``repl_cli.api.errors``): ``Unavailable`` (no daemon, it went away
or is shutting down, its store failed: try again), and those that trying
again will not mend: ``NotFound``, ``AlreadyExists``, ``BadInput``,
``AfterHead``, ``LeaseLost``, ``AlreadyAnswered``, ``Unauthorized``, ``Forbidden``, ``TooMany``,
``TooLong``, ``ProtocolError``, ``Misconfigured``, ``Internal``. Its
``code`` is the daemon's wire code when it came from the daemon, its
``message`` what happened. A wait that times out is no error (``wait``
answers ``timed_out``). ``wait`` and ``follow`` reconnect as ``repl wait``
and ``repl follow`` do (``reconnect`` seconds, 300 by default), and log the
outage on the ``repl`` logger instead of stderr.

A ``Repl`` may sit idle as long as its program likes: a connection the
daemon closed meanwhile (its ``--idle-timeout``, or a restart between two
calls) is replaced by the next call, which is answered with no error; a
request the daemon answered ``idle_timeout`` is sent once more, and one whose
answer was lost is sent again only when a repeat cannot change what it did
(``repl_cli/api/_async/operations.py`` states the rules: a keyless send is never
sent twice behind the caller's back).

The asynchronous twin is ``repl_cli.api.aio``. Both are one body of operations
(``repl_cli/api/_async/operations.py``, hand-written, and its blocking rewrite
``repl_cli/api/_sync/operations.py``) over each side's own I/O: here a blocking
socket (``repl_cli.api.blocking``), or an anyio stream (``repl_cli.api.aio``). The
``repl`` command is made of this API, and so is ``repl mcp`` (of the async one).
"""

from repl_cli.api._common import REQUEST_TIMEOUT, MatchLike, as_match
from repl_cli.api.blocking import Repl, connect
from repl_cli.api.errors import (
    AfterHead,
    AlreadyAnswered,
    AlreadyExists,
    AnswerLost,
    BadInput,
    Error,
    Forbidden,
    Internal,
    LeaseLost,
    Misconfigured,
    NotFound,
    ProtocolError,
    TooLong,
    TooMany,
    Unauthorized,
    Unavailable,
)
from session.firing import CursorInfo, Firing
from session.tags import Match

__all__ = [
    "REQUEST_TIMEOUT",
    "AfterHead",
    "AlreadyAnswered",
    "AlreadyExists",
    "AnswerLost",
    "BadInput",
    "CursorInfo",
    "Error",
    "Firing",
    "Forbidden",
    "Internal",
    "LeaseLost",
    "Match",
    "MatchLike",
    "Misconfigured",
    "NotFound",
    "ProtocolError",
    "Repl",
    "TooLong",
    "TooMany",
    "Unauthorized",
    "Unavailable",
    "as_match",
    "connect",
]
