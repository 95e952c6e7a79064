"""``repl_cli.aio``, as programs import it: the async API, which lives in ``repl_cli.api.aio``."""

from repl_cli.api.aio import AsyncRepl, connect

__all__ = ["AsyncRepl", "connect"]
