"""The ``repl`` command line: click commands over a blocking client of the daemon.

``main`` (the commands), ``client`` (the wire), ``deliver`` and ``sink``
(printing, then acknowledging only what the reader took), ``output`` (every
format), ``errors`` (exit statuses), ``launch`` (``repl daemon``). Nothing
here imports anyio or rich at start-up. A rule cited by its id (C8, S9, ...) is
docs/semantics.md's.
"""
