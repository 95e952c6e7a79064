"""``python -m repl_daemon``: the daemon without the CLI (tests and service managers).

Options mirror ``repl daemon``. Once listening it prints one line to stdout,
``listening on HOST:PORT``, so a parent that asked for port 0 learns the port.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from repl_daemon.locations import DEFAULT_ADDR, default_home
from repl_daemon.main import Config, ConfigError, parse_addr, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repl_daemon")
    parser.add_argument("--addr", default=None, help=f"HOST:PORT (default {DEFAULT_ADDR})")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--store", default=None)
    parser.add_argument("--settle-ms", type=int, default=100)
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto")
    parser.add_argument("--idle-timeout", type=float, default=60.0)
    parser.add_argument("--max-connections", type=int, default=4096)
    parser.add_argument("--max-sessions", type=int, default=10_000)
    args = parser.parse_args(argv)
    try:
        config = build_config(
            addr=args.addr,
            home=args.home,
            memory=args.memory,
            store=args.store,
            settle_ms=args.settle_ms,
            idle_timeout=args.idle_timeout,
            max_connections=args.max_connections,
            max_sessions=args.max_sessions,
            loop=args.loop,
        )
        run(config)
    except ConfigError as exc:
        print(f"repl daemon: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # its home cannot be made or written, say
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"repl daemon: cannot start: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    return 0


def build_config(
    *,
    addr: str | None,
    home: Path | None,
    memory: bool,
    store: str | None,
    settle_ms: int,
    idle_timeout: float = 60.0,
    max_connections: int = 4096,
    max_sessions: int = 10_000,
    loop: str = "auto",
) -> Config:
    """The daemon's Config from command-line values (shared with ``repl daemon``)."""
    import os

    from repl_daemon.server import Limits

    host, port = parse_addr(addr or os.environ.get("REPL_ADDR") or DEFAULT_ADDR)
    if settle_ms < 0:
        raise ConfigError(f"--settle-ms {settle_ms} is negative")
    if memory and store:
        raise ConfigError("give --memory or --store, not both")
    return Config(
        home=home or default_home(),
        host=host,
        port=port,
        memory=memory,
        store_url=store,
        settle=settle_ms / 1000,
        limits=Limits(idle_timeout=idle_timeout, max_connections=max_connections),
        max_sessions=max_sessions,
        announce=True,
        loop=loop,
    )


if __name__ == "__main__":
    sys.exit(main())
