"""Starting and stopping the daemon: its home, its token, its store, its signals.

``run`` is what ``repl daemon`` calls; ``serve_daemon`` is the same daemon
as an async function that tests start inside their own task group (port 0,
``task_status`` reports the bound port), and ``serve_engine`` serves an
engine a test built itself (so it can look at the engine's sessions).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import secrets
import signal
import stat
import sys
from importlib.util import find_spec
from pathlib import Path

import anyio
from anyio.abc import TaskStatus

from repl_daemon.config import Config
from repl_daemon.engine import Backend, Engine
from repl_daemon.engine.clock import REAL, Clock
from repl_daemon.server import serve
from repl_daemon.tls import Certificate, is_loopback, refuse_clear_text
from session.errors import ConfigError, StoreFailed

log = logging.getLogger("repl.daemon")


def ensure_token(home: Path) -> str:
    """The daemon's token: created 0600 at first start, refused if others can read it."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = home / "token"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"token file {path} has mode {mode:o}, readable by others: "
                f"run `chmod 600 {path}` and start again"
            ) from None
        token = path.read_text().strip()
    else:
        token = secrets.token_hex(32)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    if not token:
        raise ConfigError(f"token file {path} is empty: delete it to make a new one")
    return token


def open_backend(config: Config) -> Backend:
    """The backend a config names, its store opened (Redis: its URL checked, connected by
    the committer's ``load``); ``ConfigError`` (one line) when it cannot be. Each backend
    is imported only here, when it is the one asked for."""
    from repl_daemon.backends.local import LocalBackend

    if config.memory:
        from repl_daemon.backends.local.memory import MemoryStore

        return LocalBackend(MemoryStore())
    try:
        if config.store_url:
            return _open_redis(config.store_url)
        from repl_daemon.backends.local.sqlite import SqliteStore

        return LocalBackend(SqliteStore(config.home / "repl.db"))
    except StoreFailed as exc:
        raise ConfigError(exc.message) from None


def _open_redis(url: str) -> Backend:
    if not url.startswith(("redis://", "rediss://", "redis+cluster://", "rediss+cluster://")):
        raise ConfigError(
            "--store takes redis://HOST:PORT/DB, rediss://... or "
            "redis+cluster://HOST:PORT[,HOST:PORT...]; leave it out for the default store"
        )
    from repl_daemon.backends.redis import RedisBackend
    from repl_daemon.backends.redis.store import RedisStore

    return RedisBackend(RedisStore(url))


async def serve_daemon(
    config: Config,
    *,
    backend: Backend | None = None,
    stop: anyio.Event | None = None,
    certificate: Certificate | None = None,
    clock: Clock = REAL,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until ``stop`` is set (a clean shutdown) or it is cancelled; on
    ``clock`` (a test's own, which it moves by hand, or the real one)."""
    try:
        if config.http is not None:
            from repl_daemon.http.extra import check_installed

            check_installed()  # before anything is opened: the pip install to run, in one line
        certificate = certificate or open_certificate(config)
        token = ensure_token(config.home)
        backend = backend or open_backend(config)
        engine = Engine(
            backend,
            settle=config.settle,
            quiet=config.quiet,
            max_sessions=config.max_sessions,
            clock=clock,
        )
        try:
            count = await engine.load()
        except StoreFailed as exc:
            raise ConfigError(exc.message) from None
        log.info("loaded %d session(s) from %s", count, backend.name)
        # after the load, whose failure (a damaged file) is then the start's only line
        log.info("event loop: %s", _loop_name())
        for level, line in backend.notes():
            log.log(level, line)
        await serve_engine(
            engine, config, token, stop=stop, certificate=certificate, task_status=task_status
        )
    finally:
        if backend is not None:  # run's, or the one opened here (a failed start too)
            with anyio.CancelScope(shield=True):
                await backend.close()


async def serve_engine(
    engine: Engine,
    config: Config,
    token: str,
    *,
    stop: anyio.Event | None = None,
    certificate: Certificate | None = None,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a loaded engine on ``config``'s address until ``stop`` is set; closes no store."""
    context = None if certificate is None else certificate.context
    async with anyio.create_task_group() as tg:
        tg.start_soon(engine.run)
        await anyio.lowlevel.checkpoint()  # the committer runs before the first request
        port = await tg.start(
            functools.partial(serve, tls=context),
            engine,
            config.host,
            config.port,
            token,
            config.limits,
        )
        scheme = "tls://" if context is not None else ""
        log.info("listening on %s%s:%d (home %s)", scheme, config.host, port, config.home)
        http_port = None
        if config.http is not None:
            from repl_daemon.http.mcp import Listener, connect_host
            from repl_daemon.http.server import serve_http

            host, wanted = config.http
            limits = config.limits
            mcp = None
            if config.mcp is not None:
                ca = None if certificate is None else certificate.cert
                line = f"{scheme}{connect_host(config.host)}:{port}"
                mcp = (config.mcp, Listener(line, config.home, ca, host, wanted, False))
            http_port = await tg.start(
                functools.partial(serve_http, slow_consumer_s=limits.slow_consumer_s, mcp=mcp),
                engine,
                host,
                wanted,
                token,
                limits.idle_timeout,
                limits.max_connections,
                context,
            )
            log.info("serving HTTP on %s:%d", host, http_port)
        if config.announce:
            # the parent of a detached or test daemon reads this line for the port
            print(f"listening on {config.host}:{port}", flush=True)
            if config.http is not None:
                print(f"http on {config.http[0]}:{http_port}", flush=True)
        task_status.started(port)
        stop = stop or anyio.Event()

        async def on_request() -> None:  # `repl shutdown`
            await engine.shutdown_requested.wait()
            stop.set()

        tg.start_soon(on_request)
        try:
            await stop.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await _drain(engine)
            tg.cancel_scope.cancel()


async def _drain(engine: Engine) -> None:
    """Tell every waiter the daemon is going, then write what was answered."""
    await engine.shutdown()
    with anyio.move_on_after(1):
        await engine.no_waiters.wait()
    # give the connections' writers a moment to put those answers on the wire
    await anyio.sleep(0.05)


def open_certificate(config: Config) -> Certificate | None:
    """The config's TLS certificate, loaded; None without one. Refuses (one line) to
    listen beyond loopback in clear text unless ``--insecure``."""
    listeners = [("--addr", config.host)]
    if config.http is not None:
        listeners.append(("--http", config.http[0]))
    tls = config.tls_cert is not None and config.tls_key is not None
    refuse_clear_text(listeners, tls=tls, insecure=config.insecure)
    if config.tls_cert is None or config.tls_key is None:
        if config.insecure and not all(is_loopback(host) for _, host in listeners):
            log.warning("listening beyond loopback without TLS (--insecure): tokens are clear text")
        return None
    certificate = Certificate(config.tls_cert, config.tls_key)
    log.info("TLS with the certificate %s", config.tls_cert)
    return certificate


async def _run(config: Config, backend: Backend, certificate: Certificate | None) -> None:
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:

            async def on_signal() -> None:
                async for signum in signals:
                    if signum == signal.SIGHUP:  # a renewed certificate: no one is dropped
                        if certificate is None:
                            log.info("received SIGHUP: no TLS certificate to reload")
                        else:
                            certificate.reload()
                        continue
                    log.info("received %s: shutting down", signal.Signals(signum).name)
                    stop.set()
                    return

            tg.start_soon(on_signal)
            await serve_daemon(config, backend=backend, stop=stop, certificate=certificate)
            tg.cancel_scope.cancel()


#: how many allocations of tracked objects, less deallocations, start a young
#: collection (Python's is 700)
YOUNG_COLLECTION_AFTER = 10_000
#: how many collections of the middle generation come before a full one (Python's is 10)
FULL_COLLECTION_EVERY = 100


def run(config: Config) -> None:
    """Run in the foreground until SIGTERM or SIGINT; raises ConfigError on bad setup."""
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s repl[%(process)d] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    # set-up errors surface here, before the event loop, as one clear ConfigError
    use_uvloop = choose_loop(config.loop)
    certificate = open_certificate(config)
    ensure_token(config.home)
    backend = open_backend(config)
    # what start-up made (modules, functions, the config) lives as long as the
    # process: out of the collector's sight, a full collection while many
    # waits are in flight takes 1.7 ms instead of 7.5-15 ms
    gc.freeze()
    # and a full collection comes a tenth as often (after 100 collections of the middle
    # generation, not 10): each walks every session the daemon holds, whose objects make
    # no cycles, and over 10,000 sessions they took a quarter of a durable send's time
    # (pipelined sends across them: 28-31 thousand a second by default, 33-42 with this).
    # Young collections come after 10,000 new tracked objects, not 700: an operation in
    # flight holds several (its call, its future, its callbacks, its answer), and the
    # sooner a young collection comes, the more of them it finds still live, walks, and
    # moves on to the middle generation to be walked again.
    # Pipelined sends through the Redis store: 31.2-33.1 thousand a second against
    # 29.0-29.9 (5,000: 29.0-30.7); a young collection of 10,000 live objects takes
    # 133 µs, once every few hundred operations
    _, middle, _ = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_AFTER, middle, FULL_COLLECTION_EVERY)
    try:
        anyio.run(_run, config, backend, certificate, backend_options={"use_uvloop": use_uvloop})
    except* ConfigError as group:  # an address it cannot bind, a store it cannot reach
        raise ConfigError(str(_first(group))) from None


def _loop_name() -> str:
    """The event loop this runs on: uvloop's, or asyncio's own."""
    return (
        "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    )


def choose_loop(loop: str) -> bool:
    """Whether to run on uvloop: asked for, or ``auto`` and installed.

    uvloop roughly halves the daemon's round trip here (docs/benchmarks.md);
    it is an optional extra, ``pip install 'repl-inbox[uvloop]'``, so the default
    install stays pure Python. ``loop`` is one of ``config.LOOPS``:
    ``build_config`` checked it.
    """
    if loop == "asyncio":
        return False
    if find_spec("uvloop") is None:
        if loop == "uvloop":
            raise ConfigError("--loop uvloop needs uvloop: pip install 'repl-inbox[uvloop]'")
        return False
    return True


def _first(group: BaseExceptionGroup[ConfigError]) -> BaseException:
    """The first exception inside (possibly nested) exception groups."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first
