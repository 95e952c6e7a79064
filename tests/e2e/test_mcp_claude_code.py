"""Claude Code against ``repl mcp --follow``: what the newest one sends, and the real one
(docs/semantics.md M5, M6).

Claude Code 2.1.332 (the newest on 2026-12-05) probes a stdio server with
``server/discover`` (the 2026-07-28 protocol) and registers channel notifications only
on a connection of the ``initialize`` era. ``claude_code/2.1.332-stdio-refused.jsonl``
is what it wrote, byte for byte, to a ``repl mcp --follow`` that refused the probe (the
probe, then the handshake and its lists); ``2.1.332-stdio-answered.jsonl`` what it wrote
to the repl before this one, which answered the probe (the probe, a listen stream, the
discover again, the lists), recorded by a ``tee`` between the two under ``claude -p``.
Replayed line by line, each line as it was:

- the refused transcript gets the probe refused with -32601, the handshake declaring
  ``claude/channel``, and a send pushed as ``notifications/claude/channel``;
- the answered transcript (a client that stays in the 2026-07-28 era) gets no path for
  the session's firings, and in ``--ack pipe`` nothing is acknowledged.

And the real binary (npm ``@anthropic-ai/claude-code``, installed by ``.ci/run`` in
``claude_code/``), which needs no login for ``claude mcp list`` and ``claude mcp get``:
its health checks of a following server in either mode leave the cursor where it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_mcp_push import Harness, harness
from tests.helpers import DaemonProc, Repl, eventually, repl_argv, unread

HERE = Path(__file__).parent / "claude_code"
REFUSED = HERE / "2.1.332-stdio-refused.jsonl"
ANSWERED = HERE / "2.1.332-stdio-answered.jsonl"
CLAUDE = HERE / "node_modules" / ".bin" / "claude"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = DaemonProc(tmp_path_factory.mktemp("claude-code") / "home", "--memory")
    yield d
    d.close_clients()
    d.stop()


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def replay(h: Harness, line: bytes) -> dict[str, Any] | None:
    """Write one recorded line as it was; the answer to it (None for a notification)."""
    assert h.proc.stdin is not None
    h.proc.stdin.write(line)
    h.proc.stdin.flush()
    sent = json.loads(line)
    if "id" not in sent:
        return None
    while True:
        message = h.line()
        if message.get("id") == sent["id"]:
            return message
        h.pushed.append(message)


def test_the_newest_claude_code_is_refused_the_probe_and_gets_its_channel(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s = repl.session("cc", "waiting")
    probe, initialize, initialized, tools, resources = lines(REFUSED)
    with harness(daemon, "--follow", s) as h:
        refused = replay(h, probe)
        assert refused is not None
        assert refused["id"] == "server-discover-probe-1"
        assert refused["error"]["code"] == -32601 and "result" not in refused
        hello = replay(h, initialize)
        assert hello is not None
        assert hello["result"]["protocolVersion"] == "2025-11-25"
        assert hello["result"]["capabilities"]["experimental"] == {"claude/channel": {}}
        assert replay(h, initialized) is None
        listed = replay(h, tools)
        assert listed is not None and "ack" in {t["name"] for t in listed["result"]["tools"]}
        found = replay(h, resources)
        assert found is not None and s in {r["name"] for r in found["result"]["resources"]}
        assert h.channel()["content"] == "waiting"
        repl.send(s, "and now")
        pushed = h.channel()
        assert pushed["content"] == "and now" and pushed["meta"]["seq"] == "2"
        assert repl.cursor(s, "mcp") is None  # the agent has not acknowledged them
        assert h.close() == ""


def test_a_client_that_stays_in_the_2026_era_gets_nothing_acknowledged(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    s = repl.session("cc-modern", "for a channel")
    probe, listen, discover, resources, tools = lines(ANSWERED)
    with harness(daemon, "--follow", s, "--ack", "pipe") as h:
        refused = replay(h, probe)
        assert refused is not None and refused["error"]["code"] == -32601
        assert h.proc.stdin is not None
        h.proc.stdin.write(listen)  # its answer is a stream: the acknowledgement first
        h.proc.stdin.flush()
        acknowledged = h.line()
        assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
        again = replay(h, discover)
        assert again is not None and again["error"]["code"] == -32601
        listed = replay(h, resources)
        assert listed is not None and "result" in listed
        assert replay(h, tools) is not None
        repl.send(s, "another")
        # a listen stream that asked for no session's updates is no path: nothing written
        eventually(lambda: repl.waiters(s) == 0, what="the follow to hold what it read")
        assert unread(h.proc) == 0 and not h.pushed
        assert h.close() == ""
    assert repl.cursor(s, "mcp") is None


def require_claude() -> Path:
    if not CLAUDE.exists():
        if os.environ.get("CI"):
            pytest.fail("claude missing in CI: .ci/run must run npm ci in tests/e2e/claude_code")
        pytest.skip("claude missing: npm ci --prefix tests/e2e/claude_code")
    return CLAUDE


def claude(home: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC", "CLAUDE"))}
    env.update(HOME=str(home), DISABLE_AUTOUPDATER="1", NO_COLOR="1")
    return subprocess.run(
        [str(CLAUDE), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("mode", ["agent", "pipe"])
def test_claude_codes_health_checks_consume_nothing(
    daemon: DaemonProc, tmp_path: Path, mode: str
) -> None:
    require_claude()
    repl = Repl(daemon)
    s = repl.session("cc-real", "one", "two")
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    argv = repl_argv("mcp", "--follow", s, "--ack", mode)
    server = shutil.which(argv[0]) or argv[0]
    environment = [f"REPL_ADDR={daemon.addr}", f"REPL_HOME={daemon.home}"]
    added = claude(
        home,
        "mcp",
        "add",
        "repl",
        *(arg for pair in environment for arg in ("-e", pair)),
        "--",
        server,
        *argv[1:],
        cwd=project,
    )
    assert added.returncode == 0, added.stderr
    listed = claude(home, "mcp", "list", cwd=project)
    assert "repl:" in listed.stdout and "Connected" in listed.stdout, listed
    got = claude(home, "mcp", "get", "repl", cwd=project)
    assert "Connected" in got.stdout, got
    # `claude -p` connects its servers, then stops at the login it does not have
    claude(home, "-p", "hello", cwd=project)
    assert repl.cursor(s, "mcp") is None
