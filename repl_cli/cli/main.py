"""``repl``: the command line (rules C1-C11). Each command parses, calls the client, prints.

The group puts one ``Client`` in ``ctx.obj`` (click's repo example); it
connects on first use. Formats live in ``output``, delivery and
acknowledgement in ``deliver``, reading stdin for ``send`` in ``sending``,
exit statuses in ``errors``. No default is written here: ``repl daemon``'s
options are made from ``repl_daemon.config.OPTIONS``, and the default
cursors and handler are ``session.rules``'. ``main`` is the only place an
exception becomes an exit status and a line on stderr.

Keep this module's imports cheap: ``repl read`` and ``repl wait`` are run
again and again by monitors. anyio, rich and the daemon's modules load only
in the commands that need them.

Why one module of some 1,300 lines: it is the table of the commands, each a
click declaration of its options and a short body, and a command in a
module of its own would make every ``repl`` run import what it does not
use (click builds the whole group at start). What a command does lives in
the modules it calls; what is long here is the options' help text.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from repl_cli.api.errors import Error
from repl_cli.api.receipt import ReaderGone
from repl_cli.cli import output
from repl_cli.cli.client import Client, Repl
from repl_cli.cli.deliver import Batch, Printer, at_most, deliver, follow
from repl_cli.cli.errors import (
    ERROR,
    INTERRUPTED,
    OK,
    TIMED_OUT,
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
from repl_daemon.config import OPTIONS, Option, to_argv
from session.rules import (
    ACK_CURSOR,
    DEFAULT_GROUP,
    DEFAULT_HANDLER,
    FOLLOW_CURSOR,
    MAX_WAIT_SESSIONS,
    READ_CURSOR,
    TICK_HANDLER,
    WAIT_CURSOR,
    WEBHOOK_HANDLER,
)

F = TypeVar("F", bound=Callable[..., Any])


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # not click.version_option: its gettext lookups cost every run a few ms
    if value and not ctx.resilient_parsing:
        output.line(f"repl {p.VERSION}")  # a stdout that fails (a full disk) is one line
        ctx.exit()


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


#: the options every command takes, before or after its name (``repl read ID --addr X``
#: as well as ``repl --addr X read ID``): a command's own copy wins over the group's
GLOBAL_OPTIONS = ("addr", "home", "tls_ca", "token_file")


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
            type=click.Path(dir_okay=False),
            metavar="FILE",
            help="Connect with TLS, trusting the CA certificate(s) in FILE (PEM); an address "
            "written tls://HOST:PORT uses TLS with the system's CAs [env REPL_TLS_CA].",
        ),
        click.Option(
            ["--token-file"],
            type=click.Path(dir_okay=False),
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


@click.group(
    cls=ReplGroup,
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


def _completing_client(ctx: click.Context) -> Client:
    """The client of a completion: completing, click runs no callback, so it is made from
    the options parsed so far (a command's own over the group's), with a short timeout."""
    given = {name: ctx.params.get(name) for name in GLOBAL_OPTIONS}
    client = client_for(ctx, given)
    client.timeout = 0.5
    return client


def _completed(
    ctx: click.Context, incomplete: str, ask: Callable[[Client], list[str]]
) -> list[str]:
    """What ``ask`` lists that starts with ``incomplete``; nothing when the daemon is away
    or slow, never an error in the shell."""
    client = _completing_client(ctx)
    try:
        names = ask(client)
    except Exception:  # completion must never break the shell's line
        return []
    finally:
        client.close()
    return [name for name in names if name.startswith(incomplete)]


def complete_sessions(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a session id: the daemon's sessions."""

    def ask(client: Client) -> list[str]:
        return [row.id for row in client.call(p.Sessions(), p.SessionList).sessions]

    return _completed(ctx, incomplete, ask)


def complete_cursors(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a cursor name: the cursors of the session given before it."""
    session = ctx.params.get("session") or (ctx.params.get("sessions") or [None])[0]
    if not session:
        return []

    def ask(client: Client) -> list[str]:
        listed = client.call(p.Cursors(session=session), p.CursorList)
        return [cursor.name for cursor in listed.cursors]

    return _completed(ctx, incomplete, ask)


def complete_timers(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a timer id: the pending timers of the session given before it."""
    session = ctx.params.get("session")

    def ask(client: Client) -> list[str]:
        return [t.timer for t in client.call(p.Timers(session=session), p.TimerList).timers]

    return _completed(ctx, incomplete, ask)


def complete_tokens(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a token's name (the root token's only: others list nothing)."""

    def ask(client: Client) -> list[str]:
        return [t.name for t in client.call(p.Token(action="list"), p.TokenList).tokens]

    return _completed(ctx, incomplete, ask)


def tag_option(command: F) -> F:
    """``--tag KEY=VALUE``, repeatable: what the firing carries (rules R1)."""
    return click.option(
        "--tag",
        "tag_words",
        multiple=True,
        metavar="KEY=VALUE",
        help="A tag the firing carries (repeatable; at most 16; KEY of a-z 0-9 . _ -, "
        "VALUE up to 1,024 characters).",
    )(command)


READER_MATCH_NOTE = "Without --cursor it looks at the whole ring and acknowledges nothing."
CLAIM_MATCH_NOTE = (
    "It takes the group's oldest firing that matches; the others stay ready for other claimers."
)


def match_options(command: F, *, claim: bool = False) -> F:
    """``--match KEY=VALUE`` / ``--match KEY`` and ``--handler NAME``: a matching reader
    (``wait``, ``read``, ``follow``) or, with ``claim``, a matching claimer."""
    command = click.option(
        "--handler",
        "handler_filter",
        metavar="NAME",
        help=(
            "Claim only a firing of handler NAME (with --match, both must hold)."
            if claim
            else "Only the firings of handler NAME (with --match, both must hold)."
        ),
    )(command)
    if claim:
        only = "Claim only a firing tagged KEY=VALUE (KEY alone: tagged KEY at all); "
        note = CLAIM_MATCH_NOTE
    else:
        only = "Only the firings tagged KEY=VALUE (KEY alone: tagged KEY at all); "
        note = READER_MATCH_NOTE
    return click.option(
        "--match",
        "match_words",
        multiple=True,
        metavar="KEY[=VALUE]",
        help=f"{only}repeatable, all must hold. {note}",
    )(command)


def claim_match_options(command: F) -> F:
    """``--match`` and ``--handler`` worded for ``repl claim`` (it has no --cursor)."""
    return match_options(command, claim=True)


def tags_of(words: tuple[str, ...]) -> dict[str, str]:
    """The ``--tag`` words as tags; a usage error naming what is wrong."""
    from session.errors import ReplError
    from session.tags import parse_tags

    try:
        return parse_tags(words)
    except ReplError as exc:
        raise click.UsageError(exc.message) from None


def match_of(words: tuple[str, ...], handler: str | None) -> Any:
    """The ``--match`` words and ``--handler`` as a ``Match``, None for neither."""
    from session.errors import ReplError
    from session.tags import parse_match

    try:
        return parse_match(words, handler)
    except ReplError as exc:
        raise click.UsageError(exc.message) from None


def firing_formats(command: F) -> F:
    """--seq, --full, --json: the output options of read, wait, follow and poll."""
    command = click.option(
        "--json", "as_json", is_flag=True, help="JSON Lines: a header, then one object a firing."
    )(command)
    command = click.option(
        "--full", is_flag=True, help='`NEXT LOST`, then one `(SEQ "HANDLER" "RESULT")` a line.'
    )(command)
    command = click.option(
        "--ts", is_flag=True, help="Put the firing's time (UTC, ISO 8601) before it."
    )(command)
    return click.option("--seq", is_flag=True, help="Put `#SEQ ` before each firing.")(command)


def firing_format(
    seq: bool, full: bool, as_json: bool, several: bool = False, ts: bool = False
) -> output.FiringFormat:
    if full and as_json:
        raise click.UsageError("give --full or --json, not both")
    style = output.JSON if as_json else output.FULL if full else output.TEXT
    colour = style == output.TEXT and output.colour_wanted()
    return output.FiringFormat(style=style, seq=seq, several=several, colour=colour, ts=ts)


# -- the daemon ---------------------------------------------------------------


def reconnect_option(command: F) -> F:
    """``--reconnect SECS`` of the readers that ride out a restart (rules C10)."""
    from repl_cli.api.reconnect import DEFAULT_RECONNECT

    return click.option(
        "--reconnect",
        type=click.FloatRange(min=0),
        default=DEFAULT_RECONNECT,
        show_default=True,
        metavar="SECS",
        help="While the daemon or its store is away, try again for up to SECS, then exit 75 "
        "(0: exit 75 at once).",
    )(command)


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


@cli.command()
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


@cli.command()
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


@cli.command()
@click.pass_obj
def shutdown(repl: Repl) -> None:
    """Stop the daemon gracefully (its waiters are told, its state written); return once
    it has exited. Exit 75 when no daemon answers."""
    from repl_cli.cli import launch

    pong = repl.ping()
    repl.shutdown()
    launch.wait_until_gone(repl.addr, pong.pid)
    output.line(f"stopped the daemon at {repl.addr} (pid {pong.pid})")


# -- sessions -------------------------------------------------------------------


@cli.command()
@click.argument("session", required=False)
@click.option("--buffer", type=int, metavar="N", help="The ring limit (default 256).")
@click.option("--exist-ok", is_flag=True, help="An existing session is not an error.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: session, created.")
@click.pass_obj
def start(
    repl: Repl, session: str | None, buffer: int | None, exist_ok: bool, as_json: bool
) -> None:
    """Create a session and print its id (one is made up when none is given)."""
    started = repl.start(session, buffer=buffer, exist_ok=exist_ok)
    if as_json:
        output.print_json({"session": started.session, "created": started.created})
        return
    output.line(started.session)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.pass_obj
def stop(repl: Repl, session: str) -> None:
    """Stop and remove a session; its waiters are told it stopped."""
    repl.stop(session)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_obj
def sessions(repl: Repl, as_json: bool) -> None:
    """List sessions: id, head, retained, limit, cursors, waiters."""
    listed = repl.sessions()
    if as_json:
        output.print_json(listed)
        return
    output.session_table(listed)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("limit", metavar="N", type=int)
@click.pass_obj
def buffer(repl: Repl, session: str, limit: int) -> None:
    """Set the ring limit to N (0 to 65,536); the oldest firings beyond it go."""
    repl.buffer(session, limit)


# -- sending --------------------------------------------------------------------


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("text", required=False)
@click.option(
    "--handler",
    default=DEFAULT_HANDLER,
    show_default=True,
    metavar="NAME",
    help="What produced it; a handler the session lacks makes an unhandled firing.",
)
@click.option("--key", metavar="KEY", help="A dedup key: a retry with it records nothing.")
@click.option("--lines", is_flag=True, help="Each line of stdin is its own firing.")
@click.option(
    "--in",
    "in_",
    metavar="DURATION",
    help="Record it later, after DURATION (250ms, 90s, 5m, 1h30m); prints the timer's id.",
)
@click.option(
    "--at",
    metavar="TIME",
    help="Record it at TIME (RFC 3339, e.g. 2026-12-01T05:00:00Z); prints the timer's id.",
)
@tag_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object a firing: seq, duplicate (with --in or --at: timer, due, every_ms, "
    "duplicate, seq).",
)
@click.pass_obj
def send(
    repl: Repl,
    session: str,
    text: str | None,
    handler: str,
    key: str | None,
    lines: bool,
    in_: str | None,
    at: str | None,
    tag_words: tuple[str, ...],
    as_json: bool,
) -> None:
    """Record a firing; prints its seq (`SEQ duplicate` for a deduplicated send).

    TEXT `-` or none reads stdin, less one trailing newline (empty stdin is
    refused: `repl send ID ''` sends an empty text). A request may be at most
    1 MiB (1,048,576 bytes) with the text's JSON escaping; a longer one is
    refused before it is sent (exit 1): send it in parts, e.g. with --lines.
    With --in or --at it is recorded later, once, even across a restart of
    the daemon: prints the timer's id (`repl timers` lists it, `repl cancel`
    cancels it).
    """
    from repl_cli.cli import sending  # only send reads stdin: read and wait need not load it

    later = in_ is not None or at is not None
    tags = tags_of(tag_words)
    if in_ is not None and at is not None:
        raise click.UsageError("give either --in or --at, not both")
    if lines:
        if text not in (None, "-"):
            raise click.UsageError("--lines reads stdin: give no TEXT (or -)")
        if key is not None:
            raise click.UsageError("--key names one firing: it cannot go with --lines")
        if later:
            raise click.UsageError("--in and --at schedule one firing: they cannot go with --lines")
        sending.send_lines(repl.client, session, handler, as_json, tags)
        return
    if text is None or text == "-":
        text = sending.stdin_text()
    if later:
        scheduled = repl.schedule(
            session, text, in_=in_, at=at, handler=handler, key=key, tags=tags
        )
        output.timer_set(scheduled, as_json)
        return
    output.sent(repl.send(session, text, handler=handler, key=key, tags=tags), as_json)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("interval", metavar="INTERVAL")
@click.argument("text", required=False, default="")
@click.option(
    "--handler",
    default=TICK_HANDLER,
    show_default=True,
    metavar="NAME",
    help="What each firing is recorded as (on-tick's result is TEXT).",
)
@click.option("--key", metavar="KEY", help="A dedup key: a retry with it makes no second timer.")
@click.option("--in", "in_", metavar="DURATION", help="The first firing after DURATION.")
@click.option("--at", metavar="TIME", help="The first firing at TIME (RFC 3339).")
@tag_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: timer, due, every_ms, duplicate, seq.",
)
@click.pass_obj
def every(
    repl: Repl,
    session: str,
    interval: str,
    text: str,
    handler: str,
    key: str | None,
    in_: str | None,
    at: str | None,
    tag_words: tuple[str, ...],
    as_json: bool,
) -> None:
    """Record a firing every INTERVAL (at least 1s); prints the timer's id.

    The first is one INTERVAL from now, unless --in or --at says when.
    Periods missed while the daemon was down fire once when it is back.
    """
    if in_ is not None and at is not None:
        raise click.UsageError("give either --in or --at, not both")
    tags = tags_of(tag_words)
    scheduled = repl.schedule(
        session, text, in_=in_, at=at, every=interval, handler=handler, key=key, tags=tags
    )
    output.timer_set(scheduled, as_json)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False, allow_dash=True),
    metavar="FILE",
    help="The webhook's secret, read from FILE (- for stdin; one trailing newline dropped).",
)
@click.option(
    "--handler",
    default=WEBHOOK_HANDLER,
    show_default=True,
    metavar="NAME",
    help="What each delivery is recorded as (its result is the body).",
)
@click.option("--remove", is_flag=True, help="Take the session's webhook away.")
@click.pass_obj
def webhook(repl: Repl, session: str, secret_file: str | None, handler: str, remove: bool) -> None:
    """Let HTTP POST /hooks/ID record firings signed with a secret (as GitHub signs them).

    Needs a daemon started with --http. Each delivery with a valid
    X-Hub-Signature-256 becomes a firing whose result is the body; its
    delivery id (X-GitHub-Delivery) makes a redelivery record nothing.
    """
    if remove == (secret_file is not None):
        raise click.UsageError("give --secret-file FILE, or --remove")
    if remove:
        repl.webhook(session, None)
        return
    assert secret_file is not None
    try:
        with click.open_file(secret_file, encoding="utf-8") as f:
            secret = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"cannot read the secret from {secret_file}: {exc}") from None
    secret = secret.removesuffix("\n").removesuffix("\r")
    if not secret:
        raise click.UsageError(f"{secret_file} is empty: the secret must be 1-256 characters")
    repl.webhook(session, secret, handler=handler)


@cli.command()
@click.argument("session", required=False, shell_complete=complete_sessions)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_obj
def timers(repl: Repl, session: str | None, as_json: bool) -> None:
    """List pending timers, soonest first: timer, session, due, every, handler, text."""
    listed = repl.timers(session)
    if as_json:
        output.print_json(listed)
        return
    output.timer_table(listed)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("timer", shell_complete=complete_timers)
@click.pass_obj
def cancel(repl: Repl, session: str, timer: str) -> None:
    """Cancel a pending timer; exit 1 when the session has no such timer."""
    repl.cancel(session, timer)


# -- groups and claims (SPEC §16) ------------------------------------------------


def duration_ms(text: str, option: str) -> int:
    """A ``--lease`` or ``--delay`` (``90s``, ``5m``, ``1h30m``) in ms; a usage error."""
    from session.errors import ReplError
    from session.schedule import parse_duration

    try:
        return parse_duration(text)
    except ReplError as exc:
        raise click.UsageError(f"{option}: {exc.message}") from None


def group_option(command: F) -> F:
    return click.option(
        "--group",
        default=DEFAULT_GROUP,
        show_default=True,
        metavar="NAME",
        help="The group (a named consumer of the session; made by its first claim).",
    )(command)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@group_option
@click.option(
    "--lease",
    default="60s",
    show_default=True,
    metavar="DURATION",
    help="How long the firing is yours (1s to 24h): no other claimer gets it meanwhile; "
    "then it is offered again, unless you `repl extend` it.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="SECS",
    help="Give up after SECS, having taken nothing (exit status 2).",
)
@click.option(
    "--from-now",
    is_flag=True,
    help="A group this claim makes starts after the newest firing (not at the oldest).",
)
@claim_match_options
@reconnect_option
@firing_formats
@click.pass_obj
def claim(
    repl: Repl,
    session: str,
    group: str,
    lease: str,
    timeout: float | None,
    from_now: bool,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Take the next firing of a group that no other claimer holds, under a lease.

    Blocks until the group has one (oldest first), prints the claim on a line
    of its own (the token `done`, `release` and `extend` take), then the
    firing as `wait` prints it; with --json the first line is {"claim",
    "seq", "attempt", "lease_until", "lost"}. Every firing of the session
    goes to one claimer of the group at a time; readers and other groups
    see every firing as before. Exit status 2: --timeout passed, nothing
    taken. A claimer that cannot write the firing (its reader gone, a full
    disk, a terminal gone) gives it back at once.
    """
    from repl_cli.cli.claiming import deliver_claim
    from repl_cli.cli.sink import Sink

    match = match_of(match_words, handler_filter)
    lease_ms = duration_ms(lease, "--lease")
    fmt = firing_format(seq, full, as_json, ts=ts)
    sink = Sink(confirm=True)
    repl.reconnect = reconnect
    # no watch on the pipe while blocked (as `wait` has): the answer may be on its way when
    # the reader leaves, and a claim the daemon answered must be given back, which only
    # its token allows; so the claim goes on, and what it takes and cannot write it gives
    # back (deliver_claim)
    claimed = repl.claim(
        session,
        group=group,
        lease=lease_ms / 1000,
        timeout=timeout,
        match=match,
        from_now=from_now,
    )
    if claimed.timed_out or claimed.claim is None:
        return TIMED_OUT
    token = claimed.claim
    deliver_claim(sink, claimed, session, fmt, lambda: repl.release(session, token))
    return OK


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("claim_token", metavar="CLAIM")
@click.pass_obj
def done(repl: Repl, session: str, claim_token: str) -> None:
    """Finish a claim: its firing is never offered to its group again.

    Exit status 1 (lease_lost) when CLAIM is no longer the live lease (it ran
    out and another claimer took the firing, or it is done): nothing changes.
    """
    repl.done(session, claim_token)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("claim_token", metavar="CLAIM")
@click.option(
    "--delay",
    metavar="DURATION",
    help="Claimable again only after DURATION (up to 24h) [default: at once].",
)
@click.pass_obj
def release(repl: Repl, session: str, claim_token: str, delay: str | None) -> None:
    """Give a claim's firing back to its group, to be claimed again.

    Its last attempt given back goes to the group's dead-letter session
    instead (said on stderr, naming that session). Exit status 1 (lease_lost)
    when CLAIM is no longer the live lease: nothing changes.
    """
    delay_s = 0.0 if delay is None else duration_ms(delay, "--delay") / 1000
    if repl.release(session, claim_token, delay=delay_s):
        where = dead_letter_of(repl, session, claim_token)
        stderr_note(f"that was its last attempt: the firing goes to {where}")


def dead_letter_of(repl: Repl, session: str, claim_token: str) -> str:
    """Where the last attempt of ``claim_token``'s firing went, for ``repl release``'s note:
    the daemon's answer says only that it died, so this asks for the group's settings (one
    more round trip, on a last attempt only); should that fail, the release stands and the
    note says where to look."""
    from session.errors import ReplError
    from session.groups import parse_token

    try:
        group = parse_token(claim_token)[0]
        named = [g.dead_letter for g in repl.groups(session) if g.name == group]
    except (Error, ReplError):
        named = []
    if named and named[0]:
        return f"the dead-letter session {named[0]}"
    return f"the group's dead-letter session (`repl groups {session}` names it)"


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("claim_token", metavar="CLAIM")
@click.option(
    "--lease",
    default="60s",
    show_default=True,
    metavar="DURATION",
    help="Keep it this long from now (1s to 24h).",
)
@click.pass_obj
def extend(repl: Repl, session: str, claim_token: str, lease: str) -> None:
    """Keep a claim's firing longer (a heartbeat); prints when the lease ends now.

    Exit status 1 (lease_lost) when CLAIM is no longer the live lease.
    """
    extended = repl.extend(session, claim_token, lease=duration_ms(lease, "--lease") / 1000)
    output.line(extended.lease_until)


@cli.command("group")
@click.argument("session", shell_complete=complete_sessions)
@click.argument("name")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1, max=1000),
    metavar="N",
    help="Claims a firing is given before it goes to the dead-letter session [default: 5].",
)
@click.option(
    "--dead-letter",
    metavar="SESSION",
    help="Where a firing's last attempt goes [default: ID.dead, made when first needed].",
)
@click.option(
    "--from-now",
    is_flag=True,
    help="A new group starts after the newest firing (not at the oldest).",
)
@click.option("--json", "as_json", is_flag=True, help="The group as a JSON object.")
@click.pass_obj
def group_command(
    repl: Repl,
    session: str,
    name: str,
    max_attempts: int | None,
    dead_letter: str | None,
    from_now: bool,
    as_json: bool,
) -> None:
    """Create a group, or set its attempts and dead-letter session; print it."""
    from repl_cli.cli.claiming import group_table

    info = repl.group(
        session, name, max_attempts=max_attempts, dead_letter=dead_letter, from_now=from_now
    )
    if as_json:
        output.print_json(info)
        return
    group_table([info])


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="A JSON list of {name, done, ready, held, delayed, dead, max_attempts, dead_letter}.",
)
@click.pass_obj
def groups(repl: Repl, session: str, as_json: bool) -> None:
    """List a session's groups: what is done, ready, held, delayed and dead in each."""
    from repl_cli.cli.claiming import group_table

    listed = repl.groups(session)
    if as_json:
        output.print_json(listed)
        return
    group_table(listed)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.option("--group", metavar="NAME", help="Of this group only [default: every group].")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="A JSON list of {group, seq, attempt, lease_until, lease_until_ms}.",
)
@click.pass_obj
def claims(repl: Repl, session: str, group: str | None, as_json: bool) -> None:
    """List the firings held under a lease: group, seq, attempt, when the lease ends."""
    from repl_cli.cli.claiming import claim_table

    listed = repl.claims(session, group=group)
    if as_json:
        output.print_json(listed)
        return
    claim_table(listed)


# -- tokens ---------------------------------------------------------------------


@cli.group()
def token() -> None:
    """Scoped tokens: one per program, each limited to some sessions and some rights.

    Only the root token (the `token` file in the daemon's home) manages them.
    A program uses its token through REPL_TOKEN (the token itself) or
    --token-file FILE.
    """


@token.command("add")
@click.argument("name")
@click.option(
    "--sessions",
    "patterns",
    required=True,
    metavar="PATTERN[,PATTERN...]",
    help="The sessions it sees: globs over ids, as 'team-a.*' (quote them for the shell).",
)
@click.option(
    "--can",
    required=True,
    metavar="RIGHT[,RIGHT...]",
    help="read (read, wait, follow, ack, cursors, poll), send (send, one-shot scheduled "
    "sends), admin (start, stop, buffer, timers, webhooks).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object: token, name, sessions, can."
)
@click.pass_obj
def token_add(repl: Repl, name: str, patterns: str, can: str, as_json: bool) -> None:
    """Make a token NAME and print it, once: keep it, it cannot be shown again."""
    from session.errors import ReplError
    from session.scopes import check_new_token_name, parse_scope

    try:  # checked here too: a usage error says so before anything is asked
        check_new_token_name(name)
        scope = parse_scope(patterns, can)
    except ReplError as exc:
        raise click.UsageError(exc.message) from None
    made = repl.token_add(name, list(scope.patterns), sorted(scope.rights))
    if as_json:
        output.print_json(
            {"token": made.token, "name": made.name, "sessions": made.sessions, "can": made.can}
        )
        return
    output.line(made.token)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of objects.")
@click.pass_obj
def token_list(repl: Repl, as_json: bool) -> None:
    """List the scoped tokens: name, sessions, rights (never the token itself)."""
    listed = repl.token_list()
    if as_json:
        output.print_json(listed)
        return
    output.table(
        ("name", "sessions", "can"),
        [(t.name, ",".join(t.sessions), ",".join(t.can)) for t in listed],
        whole=("name",),
    )


@token.command("revoke")
@click.argument("name", shell_complete=complete_tokens)
@click.pass_obj
def token_revoke(repl: Repl, name: str) -> None:
    """Revoke token NAME at once: its connections are closed, its waits end (exit 77)."""
    repl.token_revoke(name)


# -- reading --------------------------------------------------------------------


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--cursor",
    metavar="NAME",
    shell_complete=complete_cursors,
    help=f"Read after this cursor [default: {READ_CURSOR}].",
)
@click.option(
    "--after", type=click.IntRange(min=0), metavar="N", help="Read after seq N, no cursor."
)
@click.option(
    "--last", type=click.IntRange(min=1), metavar="N", help="The newest N firings; no cursor."
)
@click.option(
    "--since",
    metavar="WHEN",
    help="Firings recorded since WHEN: a time back (90s, 10m, 2h, 1d) or an ISO time "
    "(2026-12-01T08:00, UTC unless it names a zone); no cursor.",
)
@click.option("--max", "max_", type=click.IntRange(min=1), metavar="N", help="At most N firings.")
@click.option("--peek", is_flag=True, help="Do not acknowledge.")
@match_options
@firing_formats
@click.pass_obj
def read(
    repl: Repl,
    session: str,
    cursor: str | None,
    after: int | None,
    last: int | None,
    since: str | None,
    max_: int | None,
    peek: bool,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> None:
    """Print the firings after the cursor, then acknowledge them.

    --after, --last and --since look without a cursor and acknowledge nothing,
    and so does --match (or --handler) without --cursor: it looks at the whole
    ring, so a reply that came before you asked is found.
    """
    chosen = [name for name, v in (("--cursor", cursor), ("--after", after)) if v is not None]
    if len(chosen) > 1:
        raise click.UsageError("give --cursor or --after, not both")
    if chosen and (last is not None or since is not None):
        raise click.UsageError(f"--last and --since read without a cursor: leave out {chosen[0]}")
    if last is not None and max_ is not None:
        raise click.UsageError("give --last or --max, not both")
    match = match_of(match_words, handler_filter)
    if match is not None and (last is not None or since is not None):
        raise click.UsageError(
            "--match reads by cursor, --after or the whole ring: not --last or --since"
        )
    fmt = firing_format(seq, full, as_json, ts=ts)
    if last is not None or since is not None:
        from repl_cli.cli.recent import recent

        bound = None if since is None else parse_since(since)
        deliver(Printer(repl.client, fmt, None), [recent(repl, session, last, bound, max_)])
        return
    got = repl.read(session, cursor=cursor, after=after, max=max_, peek=peek, match=match)
    ack_cursor = None if peek or after is not None else cursor or READ_CURSOR
    if match is not None and cursor is None:
        ack_cursor = None  # a matching reader without a cursor acknowledges nothing
    deliver(
        Printer(repl.client, fmt, ack_cursor), [Batch(session, got.next, got.lost, got.firings)]
    )
    if match is not None and ack_cursor is not None and not got.firings and got.next:
        # a matching reader that found nothing still looked at everything up to next
        repl.ack(session, got.next, cursor=ack_cursor)


def parse_since(text: str) -> str:
    """``--since``'s bound as a firing's ``ts`` reads (UTC, ms); a usage error if it is none."""
    from repl_cli.cli.recent import since_ts

    bound = since_ts(text)
    if bound is None:
        raise click.UsageError(
            f"--since {text!r} is neither a time back (90s, 10m, 2h, 1d) "
            "nor an ISO time (2026-12-01T08:00)"
        )
    return bound


@cli.command()
@click.argument(
    "sessions", nargs=-1, required=True, metavar="ID...", shell_complete=complete_sessions
)
@click.option(
    "--cursor",
    metavar="NAME",
    shell_complete=complete_cursors,
    help=f"Wait after this cursor [default: {WAIT_CURSOR}; with --match, none].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="SECS",
    help="Give up after SECS (exit status 2).",
)
@click.option("--peek", is_flag=True, help="Do not acknowledge.")
@click.option(
    "--max",
    "most",
    type=click.IntRange(min=1),
    metavar="N",
    help="Print at most N firings, the oldest; the rest stay for the next wait.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    metavar="N",
    help="Wait until N firings are printed (in one batch or several), then exit.",
)
@match_options
@reconnect_option
@firing_formats
@click.pass_obj
def wait(
    repl: Repl,
    sessions: tuple[str, ...],
    cursor: str | None,
    timeout: float | None,
    peek: bool,
    most: int | None,
    count: int | None,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Block until firings exist after the cursor, print them, acknowledge, exit.

    With several sessions, it returns with those that have firings and puts
    each line's session id first. Exit status 2: --timeout passed, nothing came.
    A daemon restart or a store outage meanwhile is ridden out (--reconnect).
    With --match it returns only firings that match; without --cursor it then
    looks at the whole ring (a firing that came before the wait is found at
    once) and acknowledges nothing.
    """
    import time
    from functools import partial

    if peek and count is not None:
        raise click.UsageError("--count waits for new firings: a --peek would see the same again")
    if most is not None and count is not None:
        raise click.UsageError(
            "--max returns at once with at most N; --count waits for N: not both"
        )
    if len(sessions) > MAX_WAIT_SESSIONS:  # as the daemon counts them (rule 14)
        raise click.UsageError(
            f"{len(sessions):,} sessions named: one wait takes at most {MAX_WAIT_SESSIONS:,}"
        )
    match = match_of(match_words, handler_filter)
    if cursor is None and match is None:
        cursor = WAIT_CURSOR
    ids = list(dict.fromkeys(sessions))  # each once, where first named, as the daemon does
    fmt = firing_format(seq, full, as_json, several=len(ids) > 1, ts=ts)
    printer = Printer(repl.client, fmt, None if peek else cursor)
    repl.reconnect = reconnect
    repl.watch = printer.watch
    deadline = None if timeout is None else time.monotonic() + timeout
    printed = 0
    after: dict[str, int] = {}  # a cursorless --count goes on after what it printed
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        bound = most if count is None else count - printed
        woken = repl.wait(
            ids,
            cursor=cursor,
            timeout=left,
            max=bound,
            match=match,
            after=after.get(ids[0]) if cursor is None and len(ids) == 1 else None,
        )
        if woken.timed_out:
            return OK if printed else TIMED_OUT
        batches = [Batch(b.session, b.next, b.lost, b.firings) for b in woken.batches]
        if len(batches) > 1 and bound is not None:
            # the daemon bounds each session's batch; the whole is bounded here
            batches = at_most(batches, bound)
        taken = printer.show(batches)
        # printed: the ack is tried again across an outage too (acks are idempotent)
        repl.again().run(partial(printer.ack, taken))
        printed += sum(len(b.firings) for b in batches)
        after.update((b.session, b.next) for b in batches)
        if count is None or printed >= count:
            return OK


@cli.command("follow")
@click.argument("session", shell_complete=complete_sessions)
@click.option(
    "--cursor",
    metavar="NAME",
    shell_complete=complete_cursors,
    help=f"Follow this cursor [default: {FOLLOW_CURSOR}; with --match, none].",
)
@click.option("--from-now", is_flag=True, help="First acknowledge everything recorded so far.")
@click.option(
    "--count", type=click.IntRange(min=1), metavar="N", help="Stop after N firings (exit 0)."
)
@match_options
@reconnect_option
@firing_formats
@click.pass_obj
def follow_command(
    repl: Repl,
    session: str,
    cursor: str | None,
    from_now: bool,
    count: int | None,
    match_words: tuple[str, ...],
    handler_filter: str | None,
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> None:
    """Stream firings until interrupted, acknowledging each batch once printed.

    A daemon restart or a store outage is ridden out (--reconnect): it goes
    on from the cursor, so nothing is lost and nothing unprinted acknowledged.
    With --match, only firings that match; without --cursor it then follows
    them from the whole ring on and acknowledges nothing.
    """
    fmt = firing_format(seq, full, as_json, ts=ts)
    repl.reconnect = reconnect
    match = match_of(match_words, handler_filter)
    if cursor is None and match is None:
        cursor = FOLLOW_CURSOR
    start: int | None = None
    if from_now:
        if cursor is None:
            start = repl.again().run(lambda: repl.stats(session).sessions[0].head)
        else:
            chosen = cursor

            def skip() -> None:
                repl.ack(session, repl.stats(session).sessions[0].head, cursor=chosen)

            repl.again().run(skip)
    follow(Printer(repl.client, fmt, cursor), repl, session, cursor, count, match, start)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("text", required=False)
@click.option(
    "--reply-to",
    "reply_to",
    required=True,
    metavar="MINE",
    shell_complete=complete_sessions,
    help="The session the reply is to come to (yours); it must exist.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECS",
    help="Give up after SECS (exit status 2).",
)
@click.option(
    "--handler",
    default=DEFAULT_HANDLER,
    show_default=True,
    metavar="NAME",
    help="What the request is recorded as.",
)
@tag_option
@reconnect_option
@firing_formats
@click.pass_obj
def request(
    repl: Repl,
    session: str,
    text: str | None,
    reply_to: str,
    timeout: float,
    handler: str,
    tag_words: tuple[str, ...],
    reconnect: float,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> int:
    """Send TEXT to SESSION and wait for its reply in session MINE; print it as wait does.

    TEXT is tagged reply-to=MINE and corr= a fresh id; the reply is the
    firing of MINE tagged with that corr (`repl reply` sends one), found
    even when it came before the wait began. Nothing is acknowledged.
    Exit status 2: --timeout passed with no reply.
    """
    from repl_cli.cli import sending

    tags = tags_of(tag_words)  # the request's own tags are refused by the API (``ask``)
    if text is None or text == "-":
        text = sending.stdin_text()
    repl.reconnect = reconnect
    fmt = firing_format(seq, full, as_json, ts=ts)
    answer = repl.request(
        session, text, reply_to=reply_to, timeout=timeout, handler=handler, tags=tags
    )
    if answer is None:
        return TIMED_OUT
    deliver(Printer(repl.client, fmt, None), [Batch(reply_to, answer.seq, 0, [answer])])
    return OK


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("seq", type=click.IntRange(min=1))
@click.argument("text", required=False)
@click.option(
    "--handler",
    default=DEFAULT_HANDLER,
    show_default=True,
    metavar="NAME",
    help="What the reply is recorded as.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: seq, duplicate.")
@click.pass_obj
def reply(
    repl: Repl, session: str, seq: int, text: str | None, handler: str, as_json: bool
) -> None:
    """Answer a request, firing SEQ of SESSION: send TEXT where it asks for the answer.

    The reply carries the request's corr tag, which its requester waits for.
    TEXT `-` or none reads stdin. Exit status 1 when the firing has no
    reply-to tag (it was not sent with `repl request`).
    """
    from repl_cli.cli import sending

    if text is None or text == "-":
        text = sending.stdin_text()
    output.sent(repl.reply(session, seq, text, handler=handler), as_json)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.option("--max", "max_", type=click.IntRange(min=1), metavar="N", help="At most N firings.")
@firing_formats
@click.pass_obj
def poll(
    repl: Repl,
    session: str,
    max_: int | None,
    seq: bool,
    ts: bool,
    full: bool,
    as_json: bool,
) -> None:
    """Print the firings after cursor `poll`, which the daemon acknowledges at once.

    At most once: what is not printed (a closed pipe) is not seen again.
    """
    fmt = firing_format(seq, full, as_json, ts=ts)
    got = repl.poll(session, max=max_)
    deliver(Printer(repl.client, fmt, None), [Batch(session, got.next, got.lost, got.firings)])


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.argument("seq", type=click.IntRange(min=0))
@click.option(
    "--cursor",
    default=ACK_CURSOR,
    show_default=True,
    metavar="NAME",
    shell_complete=complete_cursors,
    help="The cursor to move.",
)
@click.pass_obj
def ack(repl: Repl, session: str, seq: int, cursor: str) -> None:
    """Acknowledge up to SEQ by hand (after --peek); a cursor never moves back."""
    repl.ack(session, seq, cursor=cursor)


@cli.command()
@click.argument("session", shell_complete=complete_sessions)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of {name, seq, lag}.")
@click.pass_obj
def cursors(repl: Repl, session: str, as_json: bool) -> None:
    """List a session's cursors: name, seq, lag behind the head."""
    listed = repl.cursors(session)
    if as_json:
        output.print_json(listed)
        return
    output.cursor_table(listed)


@cli.command()
@click.argument("session", required=False, shell_complete=complete_sessions)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: daemon and sessions.")
@click.pass_obj
def stats(repl: Repl, session: str | None, as_json: bool) -> None:
    """Counters: firings, lost, evaluations, waiters, connections."""
    got = repl.stats(session)
    if as_json:
        output.print_json({"daemon": got.daemon, "sessions": got.sessions})
        return
    output.stats_tables(got, with_daemon=session is None)


@cli.command("mcp")
@click.option(
    "--progress-every",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    metavar="SECS",
    help="While a wait blocks, tell a client that asked for progress this often.",
)
@click.option(
    "--follow",
    "follow",
    multiple=True,
    metavar="ID",
    shell_complete=complete_sessions,
    help="Push what arrives in this session to the client (repeatable).",
)
@click.option(
    "--cursor",
    metavar="NAME",
    help="Acknowledge what was pushed on this cursor [default: mcp].",
)
@click.option(
    "--allow-from",
    "allow_from",
    multiple=True,
    metavar="NAME[,NAME...]",
    help="Push only the firings these senders sent (token names, root, timer, webhook); "
    "the others are acknowledged unseen.",
)
@click.option(
    "--ack",
    "ack",
    type=click.Choice(["agent", "pipe"]),
    default=None,
    help="Who acknowledges what was pushed: the agent, with its ack tool or a reply "
    "[default]; or pipe: once the client took it and stayed connected 2 s more.",
)
@click.pass_obj
def mcp_command(
    repl: Repl,
    progress_every: float,
    follow: tuple[str, ...],
    cursor: str | None,
    allow_from: tuple[str, ...],
    ack: str | None,
) -> None:
    """Serve the Model Context Protocol on stdin/stdout: sessions as tools for an agent.

    An agent harness starts it as a child (for Claude Code: `claude mcp add
    repl -- repl mcp`). It connects to the daemon as every command does
    (--addr, --home, --token-file, REPL_TOKEN, TLS); logs go to stderr.
    Needs the mcp extra: pip install 'repl-inbox[mcp]'.

    With --follow ID it follows the session from its cursor (--cursor, default
    mcp) and pushes each new firing to the client: as a Claude Code channel
    message (notifications/claude/channel) and as an update of the resource
    repl://sessions/ID to a client subscribed to it. The agent acknowledges
    what it handled (its ack tool, or a reply); what it did not is pushed
    again by the next server. --ack pipe acknowledges instead once the
    client took a push out of the pipe and stayed connected 2 s more.
    """
    try:
        from repl_cli.mcp import server as mcp_server
        from repl_cli.mcp import stdio as mcp_stdio
    except ImportError:
        raise CliError(
            "repl mcp needs the official MCP SDK: pip install 'repl-inbox[mcp]' "
            "(or pipx install --force '.[mcp]' in a checkout)"
        ) from None
    from session.names import check_cursor_name, check_session_id
    from session.scopes import check_token_name

    if not follow and (cursor is not None or allow_from or ack is not None):
        given = "--cursor" if cursor is not None else "--allow-from" if allow_from else "--ack"
        raise click.UsageError(f"{given} is for what --follow pushes: give --follow ID too")
    client = repl.client
    settings = mcp_server.Settings(
        addr=client.addr,
        home=client.home,
        token_file=client.token_file,
        tls_ca=client.tls_ca,
        progress_every=progress_every,
        follow=tuple(dict.fromkeys(_checked(check_session_id, "--follow", s) for s in follow)),
        cursor=_checked(check_cursor_name, "--cursor", cursor or mcp_server.MCP_CURSOR),
        allow_from=_senders(allow_from, check_token_name) if allow_from else None,
        ack=mcp_server.Ack(ack or "agent"),
    )
    mcp_stdio.serve(settings)


def _checked(check: Callable[[str], str], option: str, value: str) -> str:
    """``value`` as ``check`` accepts it; a usage error naming ``option`` when it does not."""
    from session.errors import ReplError

    try:
        return check(value)
    except ReplError as exc:
        raise click.BadParameter(exc.message, param_hint=option) from None


def _senders(given: tuple[str, ...], check: Callable[[str], str]) -> frozenset[str]:
    """The names of ``--allow-from``, each option one name or several, comma-separated."""
    names = [name.strip() for words in given for name in words.split(",")]
    return frozenset(_checked(check, "--allow-from", name) for name in names)


@cli.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell code that completes repl's commands and options, and the daemon's
    session ids, cursors, timers and token names.

    \b
    bash:  eval "$(repl completion bash)"     in ~/.bashrc (bash 4.4 or newer)
    zsh:   eval "$(repl completion zsh)"      in ~/.zshrc
    fish:  repl completion fish > ~/.config/fish/completions/repl.fish
    """
    from click.shell_completion import get_completion_class

    shell_class = get_completion_class(shell)
    assert shell_class is not None  # click has all three
    output.line(shell_class(cli, {}, "repl", COMPLETE_VAR).source())


#: the environment variable click's completion scripts set to ask ``repl`` for completions
COMPLETE_VAR = "_REPL_COMPLETE"


# -- the entry point --------------------------------------------------------------


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
