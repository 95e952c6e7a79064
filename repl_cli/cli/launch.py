"""``repl daemon``: run the daemon in the foreground, or start it in the background.

The foreground daemon is ``repl_daemon.daemon.run`` in this process. A
detached one is ``python -m repl_cli.cli.daemon_entry`` (``python -m repl_daemon``
with the MCP server at ``/mcp`` when the extra is installed) in a new session with stdout and
stderr appended to ``<home>/daemon.log``; we return once it printed its
``listening on HOST:PORT`` line there (it accepts connections by then).
repl_daemon is imported only here, so other commands never load anyio.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from repl_cli.api.client import parse_addr
from repl_cli.cli.errors import CliError
from repl_cli.cli.output import line
from repl_daemon.locations import TLS_SCHEME

START_TIMEOUT = 30.0
#: how long ``repl shutdown`` waits for the daemon to exit
STOP_TIMEOUT = 30.0


def already_running(addr: str) -> bool:
    """True when a repl daemon answers at ``addr`` (port 0 never is).

    Anything that accepts the connection but does not answer like a daemon
    is left for the bind to report.
    """
    host, port = parse_addr(addr)
    if port == 0:
        return False
    try:
        with socket.create_connection((host, port), timeout=1) as plain:
            sock = plain
            if addr.startswith(TLS_SCHEME):  # is anything there: its certificate is not asked
                import ssl

                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(plain)
            sock.sendall(b'{"op": "ping"}\n')
            answer = sock.makefile("rb").readline(4096)
    except OSError:
        return False
    # unauthenticated, a daemon answers {"ok": false, "code": "unauthorized", ...}
    return answer.startswith(b"{") and b'"ok"' in answer


def refuse_if_running(addr: str) -> None:
    if already_running(addr):
        raise CliError(
            f"a daemon is already running at {addr} (`repl ping` tells which): "
            "use it, stop it with `repl shutdown`, or pass another --addr"
        )


def foreground(addr: str, home: Path, options: list[str]) -> None:
    """Run the daemon in this process with ``options`` (``python -m repl_daemon``'s)."""
    refuse_if_running(addr)
    from repl_cli.cli.daemon_entry import main as daemon_main

    status = daemon_main(["--addr", addr, "--home", str(home), *options])
    if status:
        raise SystemExit(status)  # the daemon said why, in one line


def detach(addr: str, home: Path, options: list[str]) -> None:
    """Start the daemon in the background; return once it accepts connections."""
    refuse_if_running(addr)
    home = home.absolute()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    log_path = home / "daemon.log"
    command = [
        sys.executable,
        "-m",
        "repl_cli.cli.daemon_entry",
        "--addr",
        addr,
        "--home",
        str(home),
        *options,
    ]
    # the log names sessions and errors: readable by its owner only, like the token
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as log:
        offset = log.seek(0, os.SEEK_END)
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives this shell and its Ctrl-C
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    wants_http = any(o == "--http" or o.startswith("--http=") for o in options)
    bound, http = _await_listening(proc, log_path, offset, wants_http)
    if any(o.startswith("--tls-cert") for o in options):
        bound, http = f"tls://{bound}", http and f"https://{http}"
    also = f", HTTP on {http}" if http else ""
    line(f"repl daemon listening on {bound}{also} (pid {proc.pid}); log: {log_path}")


def _await_listening(
    proc: subprocess.Popen[bytes], log_path: Path, offset: int, wants_http: bool = False
) -> tuple[str, str | None]:
    """The address it listens on, and (``--http``) its HTTP address, printed next."""
    deadline = time.monotonic() + START_TIMEOUT
    pause = 0.005
    while True:
        with open(log_path, "rb") as log:
            log.seek(offset)
            written = log.read().decode("utf-8", "replace").splitlines()
        bound = next((t for t in written if t.startswith("listening on ")), None)
        http = next((t for t in written if t.startswith("http on ")), None)
        if bound is not None and (http is not None or not wants_http):
            return (
                bound.removeprefix("listening on ").strip(),
                None if http is None else http.removeprefix("http on ").strip(),
            )
        if proc.poll() is not None:
            raise CliError(f"the daemon exited at start ({_last_words(written)}): see {log_path}")
        if time.monotonic() > deadline:
            raise CliError(
                f"the daemon (pid {proc.pid}) did not start listening within "
                f"{START_TIMEOUT:g} s: see {log_path}"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _last_words(lines: list[str]) -> str:
    """The line of a failed start's log that says why (past any traceback's frame)."""
    for text in reversed(lines):
        words = text.strip().strip("|").strip()
        if words and not set(words) <= set("+-|"):
            return words.removeprefix("repl daemon: ")
    return "it wrote nothing"


def wait_until_gone(addr: str, pid: int) -> None:
    """Return once the daemon at ``addr`` no longer answers and, when it is on this
    machine (``pid`` is a process here), once that process has exited."""
    deadline = time.monotonic() + STOP_TIMEOUT
    pause = 0.01
    while already_running(addr) or _alive(pid):
        if time.monotonic() > deadline:
            raise CliError(
                f"the daemon at {addr} (pid {pid}) did not exit within {STOP_TIMEOUT:g} s: "
                "see its log (daemon.log in its state directory)"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs here; an exited child not yet reaped (a zombie) has exited."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False  # gone, or not a process of this machine
    return state not in (b"Z", b"X")
