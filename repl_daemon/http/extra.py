"""Whether the ``http`` extra is installed: the one module of ``repl_daemon.http`` that
imports none of it, so that ``repl daemon --http`` without it stops at start with the
``pip install`` to run, in one line, before anything of the HTTP server is loaded
(``repl_daemon.daemon`` asks here first; the rest of the package imports Starlette,
uvicorn, sse-starlette and prometheus_client at its top)."""

from __future__ import annotations

from session.errors import ConfigError

INSTALL_HINT = (
    "--http needs Starlette, uvicorn, sse-starlette and prometheus_client: "
    "pip install 'repl-inbox[http]'"
)


def check_installed() -> None:
    """``ConfigError`` with the ``pip install`` to run when the ``http`` extra is missing."""
    try:
        import prometheus_client  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
