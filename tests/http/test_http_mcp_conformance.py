"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``, pinned in
tests/http/conformance's lock file; ``.ci/run`` runs ``npm ci`` there) against the daemon's
/mcp, started as ``repl daemon`` starts it (``python -m repl_cli.daemon_entry --http``).

Why a proxy: the suite's runner (``conformance server --url URL``) cannot send a header, and
/mcp answers 401 without ``Authorization: Bearer TOKEN``. So the test runs a small reverse
proxy on a loopback port of its own, in the test process: it rewrites each request's head,
adding the root token and naming the daemon's listener as ``Host`` (the SDK's DNS-rebinding
protection refuses any other), asks for ``Connection: close`` (so every request on a
connection is one whose head it rewrote), and then copies bytes both ways as they come, so
a Server-Sent Events stream reaches the suite unbuffered. The suite runs against the proxy.

Each applicable scenario runs by name and must pass. The others are in ``NOT_APPLICABLE``
with the reason; ``test_the_suite_lists_exactly_the_scenarios_known_here`` fails when a
refreshed pin adds or drops a server scenario, so it is sorted into one list or the other.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProc

CONFORMANCE = Path(__file__).resolve().parent / "conformance"
RUNNER = CONFORMANCE / "node_modules" / ".bin" / "conformance"

#: the scenarios repl serves, each run by name; every one must pass
APPLICABLE = (
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-error",
    "resources-list",
    "server-sse-multiple-streams",
    "logging-set-level",
    "completion-complete",
    "prompts-list",
)

_NOT_SERVED = "repl does not serve it (the method is not found)"
_FIXTURE = "needs the suite's reference server's fixtures (its named tools or resources)"

#: the suite's other server scenarios, each with why it does not apply to repl
NOT_APPLICABLE: dict[str, str] = {
    "tools-call-with-logging": f"{_FIXTURE}: the tool test_tool_with_logging",
    "resources-subscribe": (
        f"resources/subscribe over HTTP: {_NOT_SERVED}; subscriptions are the stdio "
        "server's, with `repl mcp --follow` pushes"
    ),
    "resources-unsubscribe": f"resources/unsubscribe over HTTP: {_NOT_SERVED}",
    "prompts-get-simple": f"{_FIXTURE}: the prompt test_simple_prompt",
    "prompts-get-with-args": f"{_FIXTURE}: the prompt test_prompt_with_arguments",
    "prompts-get-embedded-resource": f"{_FIXTURE}: the prompt test_prompt_with_embedded_resource",
    "prompts-get-with-image": f"{_FIXTURE}: the prompt test_prompt_with_image",
    "tools-call-image": _FIXTURE,
    "tools-call-audio": _FIXTURE,
    "tools-call-embedded-resource": _FIXTURE,
    "tools-call-mixed-content": _FIXTURE,
    "tools-call-with-progress": _FIXTURE,
    "tools-call-sampling": _FIXTURE,
    "tools-call-elicitation": _FIXTURE,
    "elicitation-sep1034-defaults": _FIXTURE,
    "elicitation-sep1330-enums": _FIXTURE,
    "resources-read-text": _FIXTURE,
    "resources-read-binary": _FIXTURE,
    "resources-templates-read": _FIXTURE,
    "json-schema-2020-12": f"{_FIXTURE}: the tool json_schema_2020_12_tool",
    "server-sse-polling": (
        f"{_FIXTURE}: the tool test_reconnection, which closes its stream mid-call"
    ),
    "dns-rebinding-protection": (
        "sends foreign Host and Origin headers, which the proxy replaces; "
        "tests/http/test_http_mcp.py checks the 421 and 403 directly"
    ),
}


def require_conformance() -> Path:
    """node, with the suite installed in tests/http/conformance: skipped where missing, failed
    in CI (``.ci/run`` runs ``npm ci`` there)."""
    if shutil.which("node") is None or not RUNNER.exists():
        if os.environ.get("CI"):
            pytest.fail(
                "node or tests/http/conformance/node_modules missing in CI: .ci/run runs npm ci"
            )
        pytest.skip("npm ci --prefix tests/http/conformance")
    return RUNNER


class McpDaemon(DaemonProc):
    module = "repl_cli.daemon_entry"


_HOP = {b"host", b"authorization", b"connection", b"keep-alive", b"proxy-connection"}


class BearerProxy:
    """A loopback reverse proxy to ``127.0.0.1:upstream`` that adds the bearer token to each
    request, on an event loop of its own in a thread; ``port`` is where it listens."""

    def __init__(self, upstream: int, token: str) -> None:
        self.upstream = upstream
        self.token = token
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BearerProxy:
        self._thread.start()
        assert self._ready.wait(10), "the proxy did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self.loop.run_until_complete(self._serve())
        self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    def rewrite(self, head: bytes) -> bytes:
        """The request head as the daemon is sent it: its own Host, the token, one request."""
        request_line, *fields = head[:-4].split(b"\r\n")
        kept = [f for f in fields if f.split(b":", 1)[0].strip().lower() not in _HOP]
        added = [
            f"Host: 127.0.0.1:{self.upstream}".encode(),
            f"Authorization: Bearer {self.token}".encode(),
            b"Connection: close",
        ]
        return b"\r\n".join([request_line, *kept, *added]) + b"\r\n\r\n"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        up_writer.write(self.rewrite(head))
        await asyncio.gather(
            self._pipe(reader, up_writer),
            self._pipe(up_reader, writer),
            return_exceptions=True,
        )

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.close()


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The suite's URL: the proxy's /mcp, in front of a daemon that serves /mcp."""
    require_conformance()
    home = tmp_path_factory.mktemp("http-mcp-conformance") / "home"
    d = McpDaemon(home, "--http", "127.0.0.1:0", "--memory", "--settle-ms", "0")
    try:
        assert d.http_port is not None
        with BearerProxy(d.http_port, d.token) as proxy:
            yield f"http://127.0.0.1:{proxy.port}/mcp"
    finally:
        d.close_clients()
        d.stop()


def conformance(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The locked suite's runner (never a fetch: ``npx`` is not involved)."""
    return subprocess.run(
        [str(require_conformance()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=CONFORMANCE,
        check=False,
    )


def test_the_suite_lists_exactly_the_scenarios_known_here() -> None:
    listed = conformance("list", "--server")
    assert listed.returncode == 0, listed.stderr
    scenarios = re.findall(r"^\s+- (\S+)$", listed.stdout, flags=re.MULTILINE)
    assert scenarios, listed.stdout
    assert not set(APPLICABLE) & set(NOT_APPLICABLE)
    assert sorted(scenarios) == sorted([*APPLICABLE, *NOT_APPLICABLE])


@pytest.mark.parametrize("scenario", APPLICABLE)
def test_scenario_passes(proxied: str, scenario: str) -> None:
    run = conformance("server", "--url", proxied, "--scenario", scenario)
    assert run.returncode == 0, f"{scenario} failed:\n{run.stdout}\n{run.stderr}"
