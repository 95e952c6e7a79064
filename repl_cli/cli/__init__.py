"""The ``repl`` command: click commands over the blocking API (``repl_cli.api``).

``main`` (the group and the entry point), ``deliver`` and ``sink`` (printing,
then acknowledging only what the reader took), ``output`` (every format),
``errors`` (exit statuses), ``launch`` (``repl daemon``). Nothing here
imports anyio or rich at start-up. A rule cited by its id (C8, S9, ...) is
docs/semantics.md's.
"""
