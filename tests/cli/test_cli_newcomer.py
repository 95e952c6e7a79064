"""What a newcomer met in the CLI, each ending in the behaviour a careful tool has.

Each test here failed before its fix: a send over the request limit is
refused before it is sent (1, and an error the API does not retry); the
daemon's HTTP port given as ``--addr`` is named so in a couple of seconds;
a reader whose first connection fails is 75 at once; the global options
work after the command too; timer JSON holds what its help says; empty
stdin is refused; a scoped token is advised what it can do; ``repl stats``
says what its counters count; ``repl --help`` holds whole sentences, the
exit statuses and completion; and completion itself, through bash.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from repl_cli import aio, api
from tests.cli.test_cli_formats import run_on_terminal
from tests.helpers import (
    DaemonProc,
    Repl,
    assert_one_error_line,
    free_port,
    repl_argv,
    repl_shell,
)

#: a text whose request is over the 1 MiB limit (each quote takes 2 bytes escaped)
TOO_LONG = '"' * 600_000


# -- 1. a send over the request limit -------------------------------------------


def test_a_send_over_the_limit_is_refused_before_it_is_sent(repl: Repl, s: str) -> None:
    requests_before = repl.ask({"op": "stats"})[0]["daemon"]["requests"]
    stderr = repl.fails(1, "send", s, input=TOO_LONG)
    assert "over the 1,048,576 bytes (1 MiB) a request may take" in stderr
    assert "run the command again" not in stderr  # not an outage: trying again cannot mend it
    (stats,) = repl.ask({"op": "stats", "session": s})
    assert stats["sessions"][0]["head"] == 0
    # nothing reached the daemon but this ask itself (its auth and its stats)
    assert stats["daemon"]["requests"] == requests_before + 2
    # a line of --lines too, named; the lines before it went, and were printed
    lines = repl.run("send", s, "--lines", input=f"short\n{TOO_LONG}\nnever\n")
    assert lines.returncode == 1 and lines.stdout == "1\n"
    assert_one_error_line(lines.stderr)
    assert "line 2 of stdin: the request is" in lines.stderr
    assert repl.ask({"op": "stats", "session": s})[0]["sessions"][0]["head"] == 1


def test_the_limit_is_in_send_help(repl: Repl) -> None:
    text = " ".join(repl.ok("send", "--help").split())
    assert "at most 1 MiB (1,048,576 bytes)" in text


def test_the_apis_refuse_it_as_an_error_not_worth_retrying(repl: Repl, s: str) -> None:
    with api.connect(repl.daemon.addr, repl.daemon.home) as r:
        with pytest.raises(api.Error) as refused:
            r.send(s, TOO_LONG)
        assert isinstance(refused.value, api.TooLong)
        assert refused.value.code == "line_too_long"
        assert r.send(s, "fits").seq == 1  # the connection is still good

    async def asynchronously() -> None:
        async with aio.connect(repl.daemon.addr, repl.daemon.home) as r:
            with pytest.raises(api.Error) as refused:
                await r.send(s, TOO_LONG)
            assert not isinstance(refused.value, api.Unavailable)
            assert refused.value.code == "line_too_long"
            assert (await r.send(s, "fits too")).seq == 2

    anyio.run(asynchronously)


# -- 2. the daemon's HTTP port given as --addr ----------------------------------


@pytest.fixture(scope="module")
def with_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("http") / "home", "--memory", "--http", "127.0.0.1:0")
    yield d
    d.stop()


def test_the_http_port_is_not_a_daemon_and_is_told_so(with_http: DaemonProc) -> None:
    r = Repl(with_http)
    http_addr = f"127.0.0.1:{with_http.http_port}"
    # within the subprocess timeout (the old client waited 30 s for the HTTP server)
    done = r.run("--addr", http_addr, "ping", timeout=15)
    assert done.returncode == 1, done.stderr
    assert_one_error_line(done.stderr)
    assert f"what answers at {http_addr} is not a repl daemon (an HTTP server" in done.stderr

    async def asynchronously() -> None:
        async with aio.connect(http_addr, with_http.home) as a:
            with anyio.fail_after(15), pytest.raises(api.Error, match="an HTTP server answers"):
                await a.ping()

    anyio.run(asynchronously)
    # the daemon itself still answers at its own address
    assert r.run("ping").returncode == 0


# -- 3. a reader whose very first connection fails --------------------------------


def test_readers_with_no_daemon_at_all_are_75_at_once(repl: Repl) -> None:
    env = {**repl.env, "REPL_ADDR": f"127.0.0.1:{free_port()}"}
    waited = repl.run("wait", "inbox", "--timeout", "1", env=env)
    assert waited.returncode == 75, waited.stderr  # not 2, "nothing came"
    assert "no daemon at" in waited.stderr and "reconnecting" not in waited.stderr
    # follow would have retried for --reconnect's 300 s: the run's timeout tells
    followed = repl.run("follow", "inbox", env=env, timeout=20)
    assert followed.returncode == 75, followed.stderr
    assert_one_error_line(followed.stderr)
    from_now = repl.run("follow", "inbox", "--from-now", env=env, timeout=20)
    assert from_now.returncode == 75, from_now.stderr


# -- 4. the global options after the command ----------------------------------------


def test_global_options_are_taken_after_the_command_and_win(repl: Repl, s: str) -> None:
    daemon = repl.daemon
    elsewhere = {**repl.env, "REPL_ADDR": f"127.0.0.1:{free_port()}", "REPL_HOME": "/nonexistent"}
    repl.send(s, "hello")
    done = repl.run(
        "read", s, "--after", "0", "--addr", daemon.addr, "--home", str(daemon.home), env=elsewhere
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "on-message: hello\n"
    # before the command as ever, and after it the command's own wins over the group's
    both = repl.run(
        "--addr",
        f"127.0.0.1:{free_port()}",
        "--home",
        str(daemon.home),
        "sessions",
        "--json",
        "--addr",
        daemon.addr,
        env=elsewhere,
    )
    assert both.returncode == 0, both.stderr
    assert s in [row["id"] for row in json.loads(both.stdout)]
    token = repl.run("token", "list", "--addr", daemon.addr, "--home", str(daemon.home))
    assert token.returncode == 0, token.stderr


def test_every_help_shows_the_global_options(repl: Repl) -> None:
    for command in (["read"], ["daemon"], ["token", "add"], ["send"]):
        text = repl.ok(*command, "--help")
        assert "Global options (before or after the command):" in text, command
        for flag in ("--addr", "--home", "--tls-ca", "--token-file"):
            assert flag in text.split("Global options")[1], (command, flag)


# -- 6. timer JSON ------------------------------------------------------------------------


def test_timer_json_holds_what_the_help_says(repl: Repl, s: str) -> None:
    fields = ["timer", "due", "every_ms", "duplicate", "seq"]
    once = json.loads(repl.ok("send", s, "later", "--in", "1h", "--json"))
    assert list(once) == fields and once["every_ms"] is None and once["duplicate"] is False
    again = json.loads(repl.ok("every", s, "1h", "--json"))
    assert list(again) == fields and again["every_ms"] == 3_600_000
    assert "timer, due, every_ms, duplicate, seq" in " ".join(repl.ok("every", "--help").split())
    send_help = " ".join(repl.ok("send", "--help").split())
    assert "with --in or --at: timer, due, every_ms, duplicate, seq" in send_help


# -- 8. empty stdin -----------------------------------------------------------------------


def test_empty_stdin_is_refused_and_an_empty_argument_is_not(repl: Repl, s: str) -> None:
    stderr = repl.fails(1, "send", s, input="")
    assert "stdin is empty" in stderr and "`repl send ID ''`" in stderr
    assert repl.ask({"op": "stats", "session": s})[0]["sessions"][0]["head"] == 0
    assert repl.ok("send", s, "") == "1\n"
    assert repl.ok("send", s, input="\n") == "2\n"  # an empty line is a text: one was sent


# -- 9. a scoped token's advice -------------------------------------------------------


def test_a_scoped_token_is_advised_what_it_can_do(repl: Repl, tmp_path: Path) -> None:
    mine = repl.session("adv")
    reader = repl.ask(
        {
            "op": "token",
            "action": "add",
            "name": f"r-{mine}",
            "sessions": [f"{mine}*"],
            "can": ["read"],
        }
    )[0]["token"]
    admin = repl.ask(
        {
            "op": "token",
            "action": "add",
            "name": f"a-{mine}",
            "sessions": [f"{mine}*"],
            "can": ["read", "admin"],
        }
    )[0]["token"]
    other = repl.session("hidden")  # exists, outside both tokens' patterns

    def as_token(token: str, *args: str) -> subprocess.CompletedProcess[str]:
        return repl.run(*args, env={**repl.env, "REPL_TOKEN": token})

    # covered but missing, and the token cannot start sessions: it is not told to
    done = as_token(reader, "read", f"{mine}.two")
    assert done.returncode == 1 and "repl start" not in done.stderr, done.stderr
    assert "this token cannot start it (it lacks the admin right)" in done.stderr
    # outside its patterns: hidden and missing are told alike, with its patterns
    hidden = as_token(reader, "read", other)
    missing = as_token(reader, "read", f"{other}x")
    assert hidden.returncode == missing.returncode == 1
    assert hidden.stderr == missing.stderr.replace(f"{other}x", other)
    assert f"this token sees only {mine}*" in hidden.stderr
    # a token that may start it is told to, and the advice works
    told = as_token(admin, "read", f"{mine}.two")
    assert f"start it with `repl start {mine}.two`" in told.stderr
    assert as_token(admin, "start", f"{mine}.two").returncode == 0
    assert as_token(admin, "read", f"{mine}.two").returncode == 0


# -- 10. repl stats says what its counters count --------------------------------------


def test_stats_labels_what_is_counted_since_start(repl: Repl, s: str) -> None:
    repl.send(s, "one")
    piped = repl.ok("stats")
    assert "\nfirings since start\t" in piped and "\nsessions now\t" in piped
    env = {**repl.env, "TERM": "xterm-256color", "COLUMNS": "200", "NO_COLOR": "1"}
    both = run_on_terminal(repl, "stats", env=env)
    assert "the daemon, since it started" in both and "over each one's life" in both
    one = run_on_terminal(repl, "stats", s, env=env)
    assert s in one and "sessions" not in one  # no stray title above one session's row


# -- 12. repl --help ---------------------------------------------------------------------


def test_help_lists_whole_sentences_exit_statuses_and_completion(repl: Repl) -> None:
    text = repl.ok("--help")
    commands = text.split("Commands:")[1]
    assert "..." not in commands
    flat = " ".join(commands.split())
    assert "Acknowledge up to SEQ by hand (after --peek); a cursor never moves back." in flat
    assert "Exit status: 0 done; 1 an error" in flat and "75 unavailable" in flat
    assert "77 not allowed" in flat and "130 interrupted" in flat
    assert 'eval "$(repl completion bash)"' in flat


# -- completion ------------------------------------------------------------------------


def complete(repl: Repl, words: str) -> list[str]:
    """What bash completes for ``words`` (the last one being completed; ``''`` for a new
    word), through the script ``repl completion bash`` prints, as bash runs it."""
    script = f"""
        eval "$({repl_shell()} completion bash)"
        COMP_WORDS=({words})
        COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
        _repl_completion repl
        printf '%s\\n' "${{COMPREPLY[@]}}"
    """
    # the completion script runs `repl` by name: put ours first on PATH
    bin_dir = str(Path(repl_shell().split()[0]).parent)
    env = {**repl.env, "PATH": f"{bin_dir}:{repl.env.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_completion_scripts_for_each_shell(repl: Repl) -> None:
    for shell in ("bash", "zsh", "fish"):
        script = repl.ok("completion", shell)
        assert "_REPL_COMPLETE" in script, shell
    assert repl.fails(64, "completion", "tcsh")


def test_bash_completes_commands_sessions_cursors_timers_and_tokens(repl: Repl) -> None:
    s = repl.session("comp")
    repl.ask(
        {"op": "read", "session": s, "cursor": "bot-7"},
        {"op": "token", "action": "add", "name": f"tok-{s}", "sessions": [s], "can": ["read"]},
    )
    (timer,) = repl.ask({"op": "schedule", "session": s, "text": "t", "in": "1h"})
    assert "follow" in complete(repl, "repl fol")
    assert s in complete(repl, "repl read comp")
    assert complete(repl, f"repl read {s} --cursor bot") == ["bot-7"]
    assert complete(repl, f"repl cancel {s} ''") == [timer["timer"]]
    assert f"tok-{s}" in complete(repl, "repl token revoke tok-")
    assert "--addr" in complete(repl, f"repl read {s} --ad")


def test_help_and_version_to_a_full_disk_are_one_line(repl: Repl) -> None:
    """Found by the no-traceback fuzz: help written to a stdout that fails was a traceback."""
    for args in (["start", "--help"], ["--help"], ["--version"]):
        with open("/dev/full", "wb") as full:
            done = subprocess.run(
                repl_argv(*args), stdout=full, stderr=subprocess.PIPE, env=repl.env, timeout=30
            )
        assert done.returncode == 1, (args, done.stderr)
        assert_one_error_line(done.stderr.decode())
        assert "cannot write to stdout" in done.stderr.decode()
