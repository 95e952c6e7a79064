"""The ``repl`` command: click commands over the blocking API (``repl_cli.api``).

``entry`` (the console script's entry point), ``main`` (the group, which
loads each command from its area's module of ``commands/`` when it is asked
for, and ``main``, where every outcome becomes an exit status), ``command`` and
``options`` (what every command is, and the options several share),
``client`` (the API, watching stdout while a wait blocks), ``deliver`` and
``sink`` (printing, then acknowledging only what the reader took),
``output`` (every format), ``errors`` (exit statuses), ``launch`` (``repl
daemon``). Nothing here imports anyio or rich at start-up, nor the MCP
server but in ``repl mcp``. A rule cited by its id (C8, S9, ...) is
docs/semantics.md's.
"""
