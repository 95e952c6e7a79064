"""repl's client side: three products, a package each.

- ``repl_cli.api``: the Python library, blocking (``repl_cli.api.Repl``) and
  async (``repl_cli.api.aio``, also importable as ``repl_cli.aio``);
- ``repl_cli.cli``: the ``repl`` command, made of the blocking API;
- ``repl_cli.mcp``: the MCP server (``repl mcp``, and ``/mcp`` on the daemon),
  made of the async API.

The library imports neither front end; docs/layout.md maps the three.
"""
