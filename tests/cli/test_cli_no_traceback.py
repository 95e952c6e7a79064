"""Never a traceback: the installed ``repl`` under random arguments, environment and stdio.

Each example runs the real console script with a random command line
(known commands and options, random values, bytes that are not UTF-8), a
random environment (``REPL_ADDR`` and ``REPL_HOME`` that are right, wrong,
malformed or not UTF-8) and stdout that is a pipe, ``/dev/full`` or closed.
Whatever happens, stderr holds no traceback and the exit status is one the
CLI documents (0, 1, 2, 64, 75). Commands that stop or start daemons, and
``follow``, which runs until interrupted, are left to their own tests; a
``wait`` gets a short ``--timeout`` and no reconnecting.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import DaemonProc, examples, repl_argv

STATUSES = {0, 1, 2, 64, 75}
COMMANDS = [
    "start",
    "stop",
    "sessions",
    "send",
    "read",
    "wait",
    "ack",
    "cursors",
    "buffer",
    "poll",
    "stats",
    "ping",
    "nosuch",
]
OPTIONS = [
    "--cursor",
    "--after",
    "--max",
    "--peek",
    "--key",
    "--handler",
    "--lines",
    "--buffer",
    "--exist-ok",
    "--json",
    "--full",
    "--seq",
    "--timeout",
    "--help",
    "-",
    "--",
]
NOT_UTF8 = [b"a\xe9", b"\xff\xfe", b"\xc3", b"ok\x80ok"]


def _values() -> st.SearchStrategy[bytes]:
    # an argument cannot hold a NUL byte: the kernel ends it there
    text = st.text(st.characters(blacklist_characters="\x00"), max_size=12).map(
        lambda t: t.encode("utf-8", "surrogatepass")
    )
    return st.one_of(
        st.sampled_from([b"s", b"0", b"-1", b"3", b"99999999999999999999", b"", b"a b"]),
        st.sampled_from(NOT_UTF8),
        text,
        st.binary(min_size=1, max_size=8).filter(lambda b: b"\x00" not in b),
    )


arguments = st.lists(
    st.one_of(st.sampled_from(OPTIONS).map(str.encode), _values()), min_size=0, max_size=6
)


#: a random command line, environment and stdio: the same for the suite's run and the long one
RUNS = {
    "command": st.sampled_from(COMMANDS),
    "args": arguments,
    "addr": st.sampled_from(["daemon", "nowhere", "garbage", "not-utf8", "unset"]),
    "home": st.sampled_from(["daemon", "missing", "not-utf8"]),
    "out": st.sampled_from(["pipe", "full", "closed"]),
    "stdin": st.sampled_from([b"", b"text\n", b"\xe9\xff\n"]),
}
FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


# each example is a run of repl (half a second under coverage): 25 in the suite,
# CLI_FUZZ_EXAMPLES=N for more, and the slow variant runs 100
@settings(max_examples=examples(25, "CLI_FUZZ_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**RUNS)
def test_no_traceback_whatever_the_arguments_environment_or_stdio(
    daemon: DaemonProc,
    tmp_path: Path,
    command: str,
    args: list[bytes],
    addr: str,
    home: str,
    out: str,
    stdin: bytes,
) -> None:
    run_once(daemon, tmp_path, command, args, addr, home, out, stdin)


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=examples(100, "CLI_FUZZ_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**RUNS)
def test_no_traceback_whatever_the_arguments_environment_or_stdio_over_a_long_search(
    daemon: DaemonProc,
    tmp_path: Path,
    command: str,
    args: list[bytes],
    addr: str,
    home: str,
    out: str,
    stdin: bytes,
) -> None:
    run_once(daemon, tmp_path, command, args, addr, home, out, stdin)


def run_once(
    daemon: DaemonProc,
    tmp_path: Path,
    command: str,
    args: list[bytes],
    addr: str,
    home: str,
    out: str,
    stdin: bytes,
) -> None:
    """One run of repl: whatever happens, no traceback and a documented exit status."""
    env = {k: v for k, v in os.environb.items() if k not in (b"REPL_ADDR", b"REPL_HOME")}
    env[b"REPL_ADDR"] = {
        "daemon": f"127.0.0.1:{daemon.port}".encode(),
        "nowhere": b"127.0.0.1:1",
        "garbage": b"no port here",
        "not-utf8": b"127.0.0.1:\xe9",
        "unset": b"",
    }[addr]
    env[b"REPL_HOME"] = {
        "daemon": os.fsencode(daemon.home),
        "missing": os.fsencode(tmp_path / "nothing-here"),
        "not-utf8": os.fsencode(tmp_path) + b"/h\xe9",
    }[home]
    argv = [os.fsencode(a) for a in repl_argv(command)] + args
    if command == "wait":
        argv += [b"--timeout", b"0.2", b"--reconnect", b"0"]
    kwargs: dict[str, object] = {"stdout": subprocess.PIPE}
    if out == "full":
        kwargs["stdout"] = open(os.devnull if not Path("/dev/full").exists() else "/dev/full", "wb")  # noqa: SIM115
    elif out == "closed":
        kwargs["stdout"] = None
        kwargs["pass_fds"] = ()
    try:
        if out == "closed":
            done = subprocess.run(
                [b"/bin/sh", b"-c", b'exec "$@" >&-', b"sh", *argv],
                input=stdin,
                stderr=subprocess.PIPE,
                env=env,
                timeout=30,
            )
        else:
            done = subprocess.run(
                argv, input=stdin, stderr=subprocess.PIPE, env=env, timeout=30, **kwargs
            )  # type: ignore[call-overload]
    finally:
        if out == "full":
            kwargs["stdout"].close()  # type: ignore[union-attr]
    stderr = done.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, (argv, stderr)
    assert done.returncode in STATUSES, (argv, done.returncode, stderr)
    if done.returncode not in (0, 2):
        assert stderr.startswith("repl: ") or stderr.startswith("Usage:"), (argv, stderr)
