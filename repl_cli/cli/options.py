"""The options several commands share, and reading their words.

``--tag``, ``--match``/``--handler``, ``--seq``/``--ts``/``--full``/``--json``,
``--reconnect`` and ``--lease``: each declared once here, with what turns its
words into what the API takes (a usage error naming what is wrong).

Units at the edge: a duration the API takes (``--lease``, ``--delay``) is read
here, once, by its type (``DURATION``), into the API's one unit, seconds;
the API makes the wire's milliseconds of it when it builds the request. A
default is the rule's (``session.rules``), shown as a user writes one. The
durations the wire takes as text (``--in``, ``repl every``'s INTERVAL) go to
the daemon as given: it reads them (``session.schedule``), and its refusal is
the one wording of theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from repl_cli.cli import output
from session.rules import DEFAULT_HANDLER, DEFAULT_LEASE_MS

F = TypeVar("F", bound=Callable[..., Any])


if TYPE_CHECKING:  # click's ParamType is generic in its newest releases only (not 8.2, 8.3)
    _ParamType = click.ParamType[float, str | float]
else:
    _ParamType = click.ParamType


class Duration(_ParamType):
    """A length of time as repl writes one (``250ms``, ``90s``, ``5m``, ``1h30m``, read by the
    core's ``parse_duration``), as seconds, the API's unit; a usage error naming the
    option when it is none."""

    name = "duration"

    def convert(
        self, value: str | float, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if not isinstance(value, str):
            return value  # a default, in seconds already
        from session.errors import ReplError
        from session.schedule import parse_duration

        try:
            return parse_duration(value) / 1000
        except ReplError as exc:
            option = param.opts[0] if param is not None else "a duration"
            raise click.UsageError(f"{option}: {exc.message}", ctx) from None


DURATION = Duration()


def lease_option(help: str) -> Callable[[F], F]:
    """``--lease DURATION`` of ``claim`` and ``extend``: by default the rule's (60 s),
    written as a user writes one."""
    return click.option(
        "--lease",
        type=DURATION,
        default=f"{DEFAULT_LEASE_MS // 1000}s",
        show_default=True,
        metavar="DURATION",
        help=help,
    )


def handler_option(help: str, default: str = DEFAULT_HANDLER) -> Callable[[F], F]:
    """``--handler NAME``: what a firing is recorded as, by default the rule's handler for
    it (``session.rules``)."""
    return click.option("--handler", default=default, show_default=True, metavar="NAME", help=help)


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


def timeout_option(what: str = "", default: float | None = None) -> Callable[[F], F]:
    """``--timeout SECS`` of a command that blocks: give up after SECS, exit status 2 (rule
    C8); ``what`` says what it prints or leaves then."""
    return click.option(
        "--timeout",
        type=click.FloatRange(min=0),
        default=default,
        show_default=default is not None,
        metavar="SECS",
        help=f"Give up after SECS{what} (exit status 2).",
    )


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
