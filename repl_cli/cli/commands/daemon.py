"""``repl daemon``, ``repl ping``, ``repl shutdown``: running the daemon, and asking after it.

``repl daemon``'s options are made from the daemon's own
(``repl_daemon.config.OPTIONS``), in their order; only this module loads
them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import command
from repl_cli.cli.options import F
from repl_daemon.config import OPTIONS, Option, to_argv


def daemon_options(command: F) -> F:
    """One click option per daemon option (``repl_daemon.config.OPTIONS``), in its order."""
    for option in reversed(OPTIONS):  # click lists the last decorator applied first
        command = _click_option(option)(command)
    return command


def _click_option(option: Option) -> Callable[[F], F]:
    if option.kind is bool:
        return click.option(option.flag, option.dest, is_flag=True, help=option.help)
    kind: Any = option.kind
    if isinstance(option.kind, tuple):
        kind = click.Choice(option.kind)
    elif option.minimum is not None and option.kind is int:
        kind = click.IntRange(min=int(option.minimum), min_open=option.above)
    elif option.minimum is not None:
        kind = click.FloatRange(min=option.minimum, min_open=option.above)
    return click.option(
        option.flag,
        option.dest,
        type=kind,
        default=option.default,
        show_default=option.default is not None,
        metavar=option.metavar,
        help=option.help,
    )


@command()
@daemon_options
@click.option("--detach", is_flag=True, help="Run in the background; log to <home>/daemon.log.")
@click.pass_obj
def daemon(repl: Repl, /, detach: bool, **options: Any) -> None:
    """Run the daemon (in the foreground unless --detach)."""
    from repl_cli.cli import launch

    if options["memory"] and options["store"]:
        raise click.UsageError("give --memory or --store, not both")
    # python -m repl_daemon parses them again, whether it runs here or detached
    run = launch.detach if detach else launch.foreground
    run(repl.addr, repl.client.home, to_argv(options))


@command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
def ping(repl: Repl, as_json: bool) -> None:
    """Is the daemon there? Its version, address, pid, store and uptime (exit 75: no)."""
    pong = repl.ping()
    if as_json:
        output.print_json(
            {
                "version": pong.version,
                "addr": repl.addr,
                "pid": pong.pid,
                "store": pong.store,
                "uptime_s": pong.uptime_s,
            }
        )
        return
    output.pong(pong, repl.addr)


@command()
@click.pass_obj
def shutdown(repl: Repl) -> None:
    """Stop the daemon gracefully (its waiters are told, its state written); return once
    it has exited. Exit 75 when no daemon answers."""
    from repl_cli.cli import launch

    pong = repl.ping()
    repl.shutdown()
    launch.wait_until_gone(repl.addr, pong.pid)
    output.line(f"stopped the daemon at {repl.addr} (pid {pong.pid})")
