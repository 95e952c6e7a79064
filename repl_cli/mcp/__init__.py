"""``repl mcp`` and ``/mcp``: the Model Context Protocol server over the async API.

``server`` (the server and its tools; ``claims`` and ``verbs`` the tools of
groups and of the table of verbs, ``tools`` what they share), ``push`` (what
``--follow`` pushes), ``prompts``, ``log``; the transports: ``stdio``
(``repl mcp``) and ``http`` (``/mcp`` on the daemon's ``--http`` listener,
with ``events`` and ``refusals``). Needs the ``[mcp]`` extra: nothing outside
this package imports it but lazily.
"""
