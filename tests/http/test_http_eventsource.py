"""An event stream followed by the npm ``eventsource`` package resumes where it was.

``eventsource`` 4.x (what npm installs on Node 20) drops an event that has
no data, and the ``id:`` with it. The stream used to open with a bare
``id: N``, so a client that reconnected before its first firing resumed
without ``Last-Event-ID``, at the head, and missed what came meanwhile; and
the daemon's own ``event: error`` is the name EventSource gives its
connection errors. Here the real client (``tests/http/node``, installed by
``npm ci``; ``.ci/run`` does it) opens a stream, the daemon restarts before
the first firing, a firing is sent while the client is away, and the client
must be given it on its reconnect; then the session is stopped and the
client hears ``ended``, not a connection error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import DaemonProc, Repl, free_port, read_line

NODE = Path(__file__).resolve().parent / "node"


def require_eventsource() -> str:
    """node, with ``eventsource`` installed in tests/http/node: skipped where missing, failed
    in CI (``.ci/run`` runs ``npm ci`` there)."""
    node = shutil.which("node")
    if node is None or not (NODE / "node_modules" / "eventsource").is_dir():
        if os.environ.get("CI"):
            pytest.fail("node or tests/http/node/node_modules missing in CI: .ci/run runs npm ci")
        pytest.skip("npm ci --prefix tests/http/node")
    return node


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    # a fixed HTTP port, so the daemon comes back where the client reconnects
    d = DaemonProc(tmp_path / "home", "--http", f"127.0.0.1:{free_port()}", "--settle-ms", "0")
    yield d
    d.stop()


def told(follower: subprocess.Popen[bytes]) -> dict[str, Any]:
    told: dict[str, Any] = json.loads(read_line(follower, timeout=30))
    return told


def test_eventsource_resumes_after_a_restart_before_the_first_firing(daemon: DaemonProc) -> None:
    node = require_eventsource()
    repl = Repl(daemon)
    repl.ok("start", "inbox")
    repl.send("inbox", "before the stream", "also before")
    url = f"http://127.0.0.1:{daemon.http_port}/sessions/inbox/events"
    follower = subprocess.Popen(
        [node, str(NODE / "follow.mjs"), url, daemon.token],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert told(follower) == {"event": "open"}
        # where it starts (the head), told as an event the client keeps the id of
        assert told(follower) == {"event": "position", "id": "2", "data": {"after": 2}}
        daemon.restart()
        # told why the stream ends (the daemon shutting down), then the connection is gone
        going = told(follower)
        assert (going["event"], going["data"]["code"]) == ("ended", "shutting_down")
        assert told(follower) == {"event": "connection-error"}
        repl.send("inbox", "while the client was away")  # before it reconnects
        assert told(follower) == {"event": "open"}
        # it reconnected with Last-Event-ID 2: the stream starts there, not at the head (3)
        assert told(follower) == {"event": "position", "id": "2", "data": {"after": 2}}
        firing = told(follower)
        assert (firing["event"], firing["id"]) == ("firing", "3")
        assert firing["data"]["result"] == "while the client was away"
        repl.ok("stop", "inbox")
        ended = told(follower)
        assert (ended["event"], ended["data"]["code"]) == ("ended", "session_stopped")
    finally:
        follower.kill()
        follower.wait()
        assert follower.stdout is not None
        follower.stdout.close()
