"""The daemon's options, written once: their names, defaults, bounds and help.

``OPTIONS`` is the one table of what a daemon can be told at start. Both
front doors read it: ``python -m repl_daemon`` builds its argparse parser
from it, and ``repl daemon`` builds its click options from it, so a default
or a bound is never written twice. ``build_config`` turns the values either
of them parsed into a checked ``Config``; ``to_argv`` writes values back as
``python -m repl_daemon``'s arguments, which is how ``repl daemon`` hands
them on.

The CLI imports this module on every run, so it imports nothing that
msgspec and the standard library's cheapest modules do not already bring.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from repl_daemon.locations import DEFAULT_ADDR, TLS_SCHEME, default_home, split_addr
from repl_daemon.protocol import MAX_LINE
from session.errors import ConfigError

LOOPS = ("auto", "asyncio", "uvloop")


class Option(NamedTuple):
    """One daemon option: ``kind`` is ``bool`` (a flag), ``int``, ``float``, ``str`` or choices."""

    flag: str
    kind: type | tuple[str, ...]
    default: Any
    help: str
    metavar: str | None = None
    #: the smallest value allowed; ``above`` means strictly greater
    minimum: float | None = None
    above: bool = False

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("--memory", bool, False, "Keep everything in this process only."),
    Option(
        "--store",
        str,
        None,
        "Share sessions with other daemons: redis://HOST:PORT/DB, rediss://... (TLS) or "
        "redis+cluster://HOST:PORT[,HOST:PORT...]; ?replicas=N waits for N replicas "
        "(without it: 1 when every primary has one, else 0) "
        "(default: repl.db in the state directory).",
        metavar="URL",
    ),
    Option(
        "--settle-ms",
        int,
        100,
        "After a wake, wait at most this long so a burst comes back as one batch.",
        metavar="MS",
        minimum=0,
    ),
    Option(
        "--quiet-ms",
        int,
        0,
        "After a wake, answer once no new firing has come for this long (the burst has "
        "stopped; 0: one turn of the event loop), at the latest --settle-ms after the wake.",
        metavar="MS",
        minimum=0,
    ),
    Option(
        "--idle-timeout",
        float,
        60.0,
        "Close a connection that sends nothing (or half a line) this long; waits are exempt.",
        metavar="SECS",
        minimum=0,
        above=True,
    ),
    Option(
        "--slow-consumer-s",
        float,
        30.0,
        "Close a connection (or HTTP stream) whose client has read none of its unsent "
        "answers, over 1 MiB of them, for this long (code slow_consumer).",
        metavar="SECS",
        minimum=0,
        above=True,
    ),
    Option(
        "--max-connections",
        int,
        4096,
        "Refuse connections past this many (answered too_many).",
        metavar="N",
        minimum=1,
    ),
    Option(
        "--max-sessions",
        int,
        10_000,
        "Refuse to start sessions past this many (answered too_many).",
        metavar="N",
        minimum=1,
    ),
    Option(
        "--http",
        str,
        None,
        "Also serve HTTP on HOST:PORT: send, read, live event streams, healthz "
        "(pip install 'repl-inbox[http]').",
        metavar="HOST:PORT",
    ),
    Option(
        "--tls-cert",
        str,
        None,
        "Serve TLS (the protocol, and --http) with this certificate chain (PEM); "
        "SIGHUP loads it again.",
        metavar="FILE",
    ),
    Option("--tls-key", str, None, "The private key of --tls-cert (PEM).", metavar="FILE"),
    Option(
        "--insecure",
        bool,
        False,
        "Allow listening beyond loopback without TLS (tokens then cross the network in clear).",
    ),
    Option(
        "--loop",
        LOOPS,
        "auto",
        "The event loop: uvloop (faster; pip install 'repl-inbox[uvloop]') when installed.",
    ),
)

DEFAULTS: dict[str, Any] = {option.dest: option.default for option in OPTIONS}


def to_argv(values: Mapping[str, Any]) -> list[str]:
    """Option values (keyed by ``Option.dest``) as ``python -m repl_daemon``'s arguments.

    A flag is written only when true, an option only when it has a value
    (None is left to the daemon's default). A value is joined to its flag
    (``--store=URL``), so one that starts with ``-`` is not taken for a flag.
    """
    argv: list[str] = []
    for option in OPTIONS:
        value = values.get(option.dest)
        if value is None or value is False:
            continue
        argv.append(option.flag if option.kind is bool else f"{option.flag}={value}")
    return argv


class Limits(msgspec.Struct, kw_only=True):
    """What one connection may cost the daemon."""

    max_line: int = MAX_LINE
    idle_timeout: float = DEFAULTS["idle_timeout"]
    max_connections: int = DEFAULTS["max_connections"]
    max_in_flight: int = 1024
    # answers written but not yet taken by a slow client: past this the
    # connection's reader pauses, so a client that never reads costs at most this
    max_queued_bytes: int = 1 << 20
    # what all connections together may hold of requests not yet whole (half lines):
    # past it, the one that holds the most is closed (each is also bound by max_line)
    max_buffered_bytes: int = 64 << 20
    # a client that has taken none of its unsent answers (past max_queued_bytes) for this
    # long is closed (slow_consumer): its answers are bounded, but not its stay
    slow_consumer_s: float = DEFAULTS["slow_consumer_s"]


class Config(msgspec.Struct, kw_only=True):
    """A checked daemon configuration; ``serve_daemon`` runs one."""

    home: Path
    host: str = "127.0.0.1"
    port: int = 7427
    memory: bool = False
    store_url: str | None = None
    settle: float = DEFAULTS["settle_ms"] / 1000
    quiet: float = DEFAULTS["quiet_ms"] / 1000
    limits: Limits = msgspec.field(default_factory=Limits)
    max_sessions: int = DEFAULTS["max_sessions"]
    #: print ``listening on HOST:PORT`` once listening (for a parent that asked for port 0)
    announce: bool = False
    #: "asyncio", "uvloop", or "auto": uvloop when it is installed
    loop: str = "auto"
    #: where to serve HTTP too (``--http``), or None
    http: tuple[str, int] | None = None
    #: the certificate chain and key to serve TLS with (rules L1-L3), or None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: listen beyond loopback without TLS all the same
    insecure: bool = False
    #: what serves /mcp on the HTTP listener (``repl_daemon.http.mcp.McpFactory``), given
    #: by ``repl daemon`` when the [mcp] extra is installed; None: /mcp answers 501
    mcp: Any = None


def parse_addr(addr: str, where: str = "") -> tuple[str, int]:
    split = split_addr(addr)
    if split is None:
        raise ConfigError(f"address {addr!r}{where} is not HOST:PORT (for example {DEFAULT_ADDR})")
    return split


def check(option: Option, value: Any) -> None:
    """Refuse a value outside the option's bounds, in the option's own words."""
    if value is None or option.minimum is None:
        return
    if value < option.minimum or (option.above and value == option.minimum):
        bound = "above" if option.above else "at least"
        raise ConfigError(
            f"{option.flag} {value:g} is out of range: it must be {bound} {option.minimum:g}"
        )


def build_config(
    values: Mapping[str, Any], *, addr: str | None = None, home: Path | None = None
) -> Config:
    """The daemon's Config from parsed option values (keyed by ``Option.dest``)."""
    given = {**DEFAULTS, **{k: v for k, v in values.items() if v is not None}}
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise ConfigError(f"unknown daemon option(s): {', '.join(sorted(unknown))}")
    for option in OPTIONS:
        check(option, given[option.dest])
    if given["loop"] not in LOOPS:
        raise ConfigError(f"--loop {given['loop']!r} is not one of {', '.join(LOOPS)}")
    if given["memory"] and given["store"]:
        raise ConfigError("give --memory or --store, not both")
    if addr is None and os.environ.get("REPL_ADDR"):
        addr, where = os.environ["REPL_ADDR"], " (from REPL_ADDR)"
    else:
        addr, where = addr or DEFAULT_ADDR, ""
    wants_tls = addr.startswith(TLS_SCHEME)
    host, port = parse_addr(addr.removeprefix(TLS_SCHEME), where)
    cert, key = given["tls_cert"], given["tls_key"]
    if (cert is None) != (key is None):
        raise ConfigError("give --tls-cert FILE and --tls-key FILE together")
    if wants_tls and cert is None:
        raise ConfigError(f"{addr}{where} asks for TLS: give --tls-cert FILE and --tls-key FILE")
    return Config(
        home=home or default_home(),
        host=host,
        port=port,
        memory=given["memory"],
        store_url=given["store"],
        settle=given["settle_ms"] / 1000,
        quiet=given["quiet_ms"] / 1000,
        limits=Limits(
            idle_timeout=given["idle_timeout"],
            max_connections=given["max_connections"],
            slow_consumer_s=given["slow_consumer_s"],
        ),
        max_sessions=given["max_sessions"],
        announce=True,
        loop=given["loop"],
        http=None if given["http"] is None else parse_addr(given["http"], " (--http)"),
        tls_cert=None if cert is None else Path(cert),
        tls_key=None if key is None else Path(key),
        insecure=given["insecure"],
    )
