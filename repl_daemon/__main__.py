"""``python -m repl_daemon``: the daemon without the CLI (tests and service managers).

Its options are ``repl_daemon.config.OPTIONS``, the same table ``repl daemon``
reads. Once listening it prints one line to stdout, ``listening on
HOST:PORT``, so a parent that asked for port 0 learns the port.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from repl_daemon.config import OPTIONS, build_config
from repl_daemon.locations import DEFAULT_ADDR
from session.errors import ConfigError


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m repl_daemon")
    parser.add_argument(
        "--addr", default=None, help=f"HOST:PORT [env REPL_ADDR; default {DEFAULT_ADDR}]"
    )
    parser.add_argument("--home", type=Path, default=None, help="The state directory.")
    for option in OPTIONS:
        if option.kind is bool:
            parser.add_argument(option.flag, action="store_true", help=option.help)
        elif isinstance(option.kind, tuple):
            parser.add_argument(
                option.flag, choices=option.kind, default=option.default, help=option.help
            )
        else:
            parser.add_argument(
                option.flag,
                type=option.kind,
                default=option.default,
                metavar=option.metavar,
                help=option.help,
            )
    return parser


def main(argv: list[str] | None = None, *, mcp: Any = None) -> int:
    """Run the daemon with ``argv``'s options; ``mcp`` serves /mcp on its HTTP listener
    (a ``repl_daemon.http.mcp.McpFactory``, which ``repl daemon`` gives: the client's)."""
    args = vars(parser().parse_args(argv))
    addr, home = args.pop("addr"), args.pop("home")
    from repl_daemon.daemon import run

    try:
        config = build_config(args, addr=addr, home=home)
        config.mcp = mcp
        run(config)
    except ConfigError as exc:
        print(f"repl daemon: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # its home cannot be made or written, say
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"repl daemon: cannot start: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
