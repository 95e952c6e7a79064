"""``repl``: the command line (rules C1-C11). Each command parses, calls the client, prints.

The group puts one ``Repl`` in ``ctx.obj`` (click's repo example); it
connects on first use. Each command lives in a module of its area under
``repl_cli/cli/commands/``, imported only when that command runs (click's
lazy loading: ``LazyGroup`` and ``COMMANDS``), so ``repl read`` loads what
reading needs and no more; ``repl --help`` and shell completion load them
all. What every command is: ``repl_cli.cli.command``; the options several
share: ``repl_cli.cli.options``; formats: ``output``; delivery and
acknowledgement: ``deliver``; exit statuses: ``errors``. No default is
written in a command: ``repl daemon``'s options are made from
``repl_daemon.config.OPTIONS``, and the default cursors, handler and lease
are ``session.rules``'. ``main`` is the only place an exception becomes an
exit status and a line on stderr.

Keep these modules' imports cheap: ``repl read`` and ``repl wait`` are run
again and again by monitors. anyio, rich and the daemon's modules load only
in the commands that need them.
"""

from __future__ import annotations

import sys
from importlib import import_module

import click

from repl_cli.api.errors import Error
from repl_cli.api.receipt import ReaderGone
from repl_cli.cli import output
from repl_cli.cli.client import Repl
from repl_cli.cli.command import ReplGroup, client_for, global_options
from repl_cli.cli.errors import (
    ERROR,
    INTERRUPTED,
    OK,
    USAGE,
    CliError,
    Interrupted,
    exit_status,
    line_of,
    not_utf8_message,
    stderr_note,
)
from repl_cli.cli.sink import silence_stdout
from repl_daemon import protocol as p

#: where each command is: its module under ``repl_cli.cli.commands``, and its name there
COMMANDS = {
    "daemon": "daemon.daemon",
    "ping": "daemon.ping",
    "shutdown": "daemon.shutdown",
    "start": "sessions.start",
    "stop": "sessions.stop",
    "sessions": "sessions.sessions",
    "buffer": "sessions.buffer",
    "cursors": "sessions.cursors",
    "stats": "sessions.stats",
    "send": "send.send",
    "every": "timers.every",
    "timers": "timers.timers",
    "cancel": "timers.cancel",
    "read": "reading.read",
    "wait": "reading.wait",
    "follow": "reading.follow_command",
    "poll": "reading.poll",
    "ack": "reading.ack",
    "request": "requests.request",
    "reply": "requests.reply",
    "gather": "requests.gather",
    "claim": "groups.claim",
    "done": "groups.done",
    "release": "groups.release",
    "extend": "groups.extend",
    "group": "groups.group_command",
    "groups": "groups.groups",
    "claims": "groups.claims",
    "join": "groups.join",
    "approve": "approvals.approve",
    "deny": "approvals.deny",
    "approvals": "approvals.approvals",
    "token": "tokens.token",
    "webhook": "tokens.webhook",
    "mcp": "mcp.mcp_command",
    "completion": "completion.completion",
}


class LazyGroup(ReplGroup):
    """The root group, whose commands are imported as they are asked for (``COMMANDS``):
    click's documented lazy loading. A command added as click adds them (a test's) is
    served beside them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return super().get_command(ctx, cmd_name)
        module, name = where.rsplit(".", 1)
        found = getattr(import_module(f"repl_cli.cli.commands.{module}"), name)
        assert isinstance(found, click.Command) and found.name == cmd_name, where
        return found


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # not click.version_option: its gettext lookups cost every run a few ms
    if value and not ctx.resilient_parsing:
        output.line(f"repl {p.VERSION}")  # a stdout that fails (a full disk) is one line
        ctx.exit()


EPILOG = """\b
Exit status: 0 done; 1 an error (no such session, session stopped, cursor
after head, refused input, a stale claim: lease_lost); 2 a --timeout passed
(`wait` printed nothing, `request` got no reply, `claim` took nothing); 64
a usage error (also a malformed claim token: bad_claim); 75 unavailable,
try again later (no daemon, or its store is away); 77 not allowed (a token
refused, or a right it lacks); 130 interrupted.

\b
The global options may also come after the command (`repl read ID --addr X`).
Shell completion of commands, options, session ids, cursors, timers and
tokens: eval "$(repl completion bash)" (or zsh, fish): `repl completion --help`.
"""


@click.group(
    cls=LazyGroup,
    params=global_options(on_group=True),
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EPILOG,
)
@click.option(
    "-V",
    "--version",
    is_flag=True,
    is_eager=True,
    expose_value=False,
    callback=_print_version,
    help="Print the version and exit.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    addr: str | None,
    home: str | None,
    tls_ca: str | None,
    token_file: str | None,
) -> None:
    """A session inbox: send firings to sessions, and read, wait for or follow them."""
    repl = Repl(client_for(ctx))
    ctx.obj = repl
    ctx.call_on_close(repl.close)


def not_utf8(argv: list[str]) -> str | None:
    """The line for the first argument that is not UTF-8 text (Python hands such bytes
    over as lone surrogates), shown with its bytes escaped; None when all are. ``--home``
    is a path, and a path may be any bytes: it is left alone."""
    after_home = False
    for arg in argv:
        if not after_home and not arg.startswith("--home="):
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                raw = arg.encode("utf-8", "surrogateescape")
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    detail = f"{exc.reason} at byte {exc.start}"
                return not_utf8_message(f"the argument '{repr(raw)[2:-1]}'", detail)
        after_home = arg == "--home"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``repl``; every outcome becomes an exit status here, and at most one stderr line."""
    bad = not_utf8(sys.argv[1:] if argv is None else argv)
    if bad is not None:
        return _fail(bad, ERROR)
    try:
        status = cli.main(args=argv, prog_name="repl", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else "repl --help", err=True)
        return USAGE
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx else "repl"
        message = " ".join(exc.format_message().split()).rstrip(".")
        return _fail(f"{message} (see `{where} --help`)", USAGE)
    except click.ClickException as exc:
        return _fail(exc.format_message(), ERROR)
    except Error as exc:
        return _fail(line_of(exc), exit_status(exc))
    except CliError as exc:
        return _fail(exc.message, exc.status)
    except (ReaderGone, BrokenPipeError):
        silence_stdout()  # the reader left: stop quietly
        return OK
    except (Interrupted, KeyboardInterrupt, click.Abort):
        return INTERRUPTED
    return status if isinstance(status, int) else OK


def _fail(message: str, status: int) -> int:
    """One line on stderr (none when stderr is closed: the status must tell), and ``status``."""
    stderr_note(message)
    return status
