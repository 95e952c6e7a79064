"""The pure core of repl: sessions, their rings of firings, cursors and dedup keys.

Nothing here does I/O, reads a clock, or knows about asyncio: callers pass
timestamps in and get plain values back. Every rule of a session (S1-S17 of
docs/semantics.md; comments everywhere cite its rules by these ids: S3, T2,
H1, K2, ...) that does not need a socket lives here, so it can be tested synchronously and
exhaustively. A method that raises leaves its object exactly as it was.

Each name is imported from the module that holds it (``session.session.Session``,
``session.ring.Ring``): this package exports nothing of its own, so that a program that
needs only the wire's structs (``repl read`` imports ``session.firing`` and
``session.errors``) loads nothing more.
"""
