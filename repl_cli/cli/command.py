"""What every command of ``repl`` is: a ``ReplCommand`` (the global options after its name
too, listed apart in its help, its first sentence whole in ``repl --help``), in a
``ReplGroup``, with the client the options make (``client_for``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from repl_cli.cli import output
from repl_cli.cli.client import Client, Repl
from repl_cli.cli.errors import Interrupted


def _show_help(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        output.line(ctx.get_help())  # a stdout that fails (a full disk) is one line
        ctx.exit()


class _PlainHelp(click.Command):
    """A --help option made without click's gettext lookup, which every run paid for."""

    _plain_help: click.Option | None = None

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        names = self.get_help_option_names(ctx)
        if not names or not self.add_help_option:
            return None
        if self._plain_help is None:
            self._plain_help = click.Option(
                names,
                is_flag=True,
                is_eager=True,
                expose_value=False,
                callback=_show_help,
                help="Show this message and exit.",
            )
        return self._plain_help


GLOBAL_OPTIONS = ("addr", "home", "tls_ca", "token_file")


class FilePath(click.Path):
    """``click.Path(dir_okay=False)``, with its name given rather than looked up: click's
    constructor asks gettext for the word "file", and gettext's first lookup loads
    ``locale``, which every run of every command paid a millisecond or more for. What it
    checks, completes and returns is click's (a test compares the two)."""

    def __init__(self) -> None:  # click.Path's attributes for dir_okay=False, set here
        self.exists = False
        self.file_okay = True
        self.dir_okay = False
        self.readable = True
        self.writable = False
        self.executable = False
        self.resolve_path = False
        self.allow_dash = False
        self.type = None
        self.name = "file"


_FILE = FilePath()


def global_options(*, on_group: bool) -> list[click.Option]:
    """The connection options; only the group's read the environment (a command's copy is
    given on its command line or not at all)."""

    def env(name: str) -> str | None:
        return name if on_group else None

    return [
        click.Option(
            ["--addr"],
            envvar=env("REPL_ADDR"),
            metavar="HOST:PORT",
            help="The daemon's address, tls://HOST:PORT for TLS "
            "[env REPL_ADDR; default 127.0.0.1:7427].",
        ),
        click.Option(
            ["--home"],
            envvar=env("REPL_HOME"),
            metavar="DIR",
            help="The daemon's state directory, where its token is "
            "[env REPL_HOME; default $XDG_STATE_HOME/repl].",
        ),
        click.Option(
            ["--tls-ca"],
            type=_FILE,
            metavar="FILE",
            help="Connect with TLS, trusting the CA certificate(s) in FILE (PEM); an address "
            "written tls://HOST:PORT uses TLS with the system's CAs [env REPL_TLS_CA].",
        ),
        click.Option(
            ["--token-file"],
            type=_FILE,
            metavar="FILE",
            help="Authenticate with the token in FILE, one made by `repl token add` "
            "[else env REPL_TOKEN, the token itself; else the daemon's root token in --home].",
        ),
    ]


def first_sentence(text: str) -> str:
    """A help text's first sentence, whole: what ``repl --help`` lists for a command."""
    paragraph = " ".join(text.split("\n\n", 1)[0].split())
    cut = paragraph.find(". ")
    return paragraph if cut < 0 else paragraph[: cut + 1]


class ReplCommand(_PlainHelp):
    """A command that takes the global options after its name too, lists them apart in
    its help, and gives ``repl --help`` its first sentence whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(global_options(on_group=False))

    def get_short_help_str(self, limit: int = 45) -> str:
        return first_sentence(self.help or "")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # completing an option's value (`repl read ID --cursor <TAB>`), click parses the
        # words before it, ending in the option without its value, which fails and leaves
        # the arguments unparsed: without the option, the completer sees the session id
        if ctx.resilient_parsing and args:
            options = (p for p in self.get_params(ctx) if isinstance(p, click.Option))
            if any(not o.is_flag and args[-1] in o.opts for o in options):
                args = args[:-1]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        given = {name: ctx.params.pop(name, None) for name in GLOBAL_OPTIONS}
        if any(value is not None for value in given.values()) and isinstance(ctx.obj, Repl):
            ctx.obj.client = client_for(ctx, given)
        return super().invoke(ctx)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own: list[tuple[str, str]] = []
        shared: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                (shared if param.name in GLOBAL_OPTIONS else own).append(record)
        if own:
            with formatter.section("Options"):
                formatter.write_dl(own)
        with formatter.section("Global options (before or after the command)"):
            formatter.write_dl(shared)


class ReplGroup(_PlainHelp, click.Group):
    command_class = ReplCommand
    group_class = type  # `repl token`'s commands are ReplCommands too

    def get_short_help_str(self, limit: int = 45) -> str:
        return first_sentence(self.help or "")

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # click would print a blank line and raise Abort; we exit quietly
            raise Interrupted() from None


def client_for(ctx: click.Context, given: dict[str, Any] | None = None) -> Client:
    """The client the options make: a command's own (``given``) over the group's."""
    root = ctx.find_root()
    values = {name: root.params.get(name) for name in GLOBAL_OPTIONS}
    values.update({name: v for name, v in (given or {}).items() if v is not None})
    from_env = (given or {}).get("addr") is None and (
        root.get_parameter_source("addr") is click.core.ParameterSource.ENVIRONMENT
    )
    return Client(
        values["addr"],
        values["home"],
        addr_from_env=from_env,
        token_file=values["token_file"],
        tls_ca=values["tls_ca"],
    )


def command(name: str | None = None, **attrs: Any) -> Callable[[Callable[..., Any]], ReplCommand]:
    """``click.command``, making a ``ReplCommand``: how each module of
    ``repl_cli.cli.commands`` declares its commands."""
    return click.command(name, cls=ReplCommand, **attrs)
