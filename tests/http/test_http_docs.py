"""Every sample of docs/http.md runs, as written, against a real daemon (issue 24.5).

The samples are read from the document itself, so the page and this test
cannot drift: a fenced block is found by its language and a few words of
it, and ``test_every_sample_of_the_page_is_run_here`` fails for a block no
test here runs. What a sample cannot know is filled in the way a reader
would: the daemon's ports for ``7428``, ``TOKEN`` in the environment, the
daemon's token file for the scrape config's. The shell samples run in
bash with the installed ``repl`` first on ``PATH``; ``curl -N``, which
streams until stopped, gets ``--max-time``; the JavaScript one runs in
Debian's headless Chromium, driven by Playwright, on the daemon's own
origin (its ``fetch`` paths are relative), and must log each firing. A
``console`` sample is a transcript: each ``$`` command runs in turn and must
print what follows it (a firing's time aside). GUIDE.md's HTTP consumer in
Python runs here too, against a daemon with ``--http``.

The JavaScript sample of before split the stream on ``"\\n\\n"``; the
stream's lines end in CRLF, so it logged nothing (0 of 30 firings).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import SCRIPT, DaemonProc, eventually, free_port, require_chromium
from tests.http.test_http_page import ARGS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "http.md"
#: the address every sample is written for
WRITTEN = "127.0.0.1:7428"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: a firing's time, which no two runs share (in a message: who answered a prompt, when)
TS = re.compile(r'"ts":"[^"]*"| at \d{4}-\d\d-\d\dT[0-9:.]+Z')


@dataclass(frozen=True)
class Sample:
    lang: str
    text: str
    line: int  # where its fence opens, for messages


def samples(path: Path = PAGE) -> list[Sample]:
    text = path.read_text()
    return [
        Sample(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in FENCE.finditer(text)
    ]


#: each sample a test runs: its language and words only it has
CLAIMED = {
    "setup": ("sh", "repl daemon --http"),
    "stream": ("console", "event: lost"),
    "tags": ("console", "?match=corr=c-42"),
    "consumer": ("console", "/sessions/jobs/wait"),
    "join": ("console", "/sessions/me/gather"),
    "approvals": ("console", "/sessions/approvals/approvals"),
    "curl": ("sh", "curl -N"),
    "javascript": ("js", "getReader"),
    "scrape": ("yaml", "scrape_configs"),
}


def sample(name: str) -> str:
    lang, words = CLAIMED[name]
    found = [s for s in samples() if s.lang == lang and words in s.text]
    assert len(found) == 1, f"docs/http.md has {len(found)} {lang} samples with {words!r}"
    return found[0].text


def test_every_sample_of_the_page_is_run_here() -> None:
    unclaimed = [
        f"docs/http.md:{s.line}: a {s.lang or 'plain'} sample"
        for s in samples()
        if not any(s.lang == lang and words in s.text for lang, words in CLAIMED.values())
    ]
    assert not unclaimed, "samples no test runs:\n" + "\n".join(unclaimed)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    """A daemon of the test's own (the samples name the session ``inbox``)."""
    d = DaemonProc(tmp_path / "home", "--memory", "--http", "127.0.0.1:0", "--settle-ms", "0")
    yield d
    d.close_clients()
    d.stop()


def env(daemon: DaemonProc | None = None, **more: str) -> dict[str, str]:
    """A reader's shell: the installed ``repl`` first on PATH, and ``TOKEN`` as the page's
    first sample leaves it."""
    found = {**os.environ, "PATH": f"{SCRIPT.parent}{os.pathsep}{os.environ['PATH']}"}
    if daemon is not None:
        found |= {"TOKEN": daemon.token, **daemon.env()}
    return found | more


def aimed(text: str, http_port: int) -> str:
    assert WRITTEN in text, text
    return text.replace(WRITTEN, f"127.0.0.1:{http_port}")


def test_the_setup_sample_starts_a_daemon_and_reads_its_token(tmp_path: Path) -> None:
    line, http = free_port(), free_port()
    home = tmp_path / "home"
    shell = env(REPL_HOME=str(home), REPL_ADDR=f"127.0.0.1:{line}")
    script = aimed(sample("setup"), http) + '\nprintf "\\n%s\\n" "$TOKEN"\n'
    try:
        done = subprocess.run(
            ["bash", "-e", "-c", script], env=shell, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert f"HTTP on 127.0.0.1:{http}" in done.stdout, done.stdout
        token = done.stdout.splitlines()[-1]
        assert token == (home / "token").read_text().strip()
        request = urllib.request.Request(
            f"http://127.0.0.1:{http}/sessions", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert (answer.status, json.loads(answer.read())) == (200, [])
    finally:  # the daemon the sample detached: stopped as a reader would
        subprocess.run(["repl", "shutdown"], env=shell, capture_output=True, timeout=30)


def curl(command: str, seconds: float) -> str:
    """``curl -N`` bounded to ``seconds``, as no reader's would be."""
    assert command.count("curl -N ") == 1, command
    return command.replace("curl -N ", f"curl -sS -N --max-time {seconds:g} ")


def test_the_stream_sample_is_what_curl_prints(daemon: DaemonProc) -> None:
    """The session the prose describes: a ring of one, six firings; then the sample's
    command, whose output must be the sample's, but the firing's time."""
    assert daemon.http_port is not None
    c = daemon.client()
    c.ok({"op": "start", "session": "inbox", "buffer": 1})
    for n in range(37, 43):
        c.ok({"op": "send", "session": "inbox", "text": f"build {n} passed"})
    first, *printed = sample("stream").split("\n")
    command = aimed(first.removeprefix("$ "), daemon.http_port)
    done = subprocess.run(
        ["bash", "-c", curl(command, 2)], env=env(daemon), capture_output=True, timeout=30
    )
    assert done.returncode == 28, done.stderr  # curl's own: --max-time ran out, as intended
    got = done.stdout.decode()
    assert "\r\n" in got and "\n" not in got.replace("\r\n", "")  # CRLF, as the page says
    assert TS.sub('"ts":""', got.replace("\r\n", "\n")) == TS.sub('"ts":""', "\n".join(printed))


def transcript(text: str, daemon: DaemonProc) -> list[tuple[str, str]]:
    """Each ``$ `` command of a console sample with what it printed here and what the sample
    says it prints (a firing's time left out of both), run one after another in bash."""
    assert daemon.http_port is not None
    ran = []
    for block in text.split("$ ")[1:]:
        command, _, printed = block.partition("\n")
        done = subprocess.run(
            ["bash", "-c", aimed(command, daemon.http_port)],
            env=env(daemon),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, (command, done.stderr)
        got = done.stdout if done.stdout.endswith("\n") else done.stdout + "\n"
        ran.append((TS.sub("TS", got), TS.sub("TS", printed)))
    return ran


def test_the_tags_sample_prints_what_it_says(daemon: DaemonProc) -> None:
    daemon.client().ok({"op": "start", "session": "inbox"})
    ran = transcript(sample("tags"), daemon)
    assert len(ran) == 3
    for got, printed in ran:
        assert got == printed


def test_the_consumer_sample_prints_what_it_says(daemon: DaemonProc) -> None:
    """Start, send, a wait, the same wait again (nothing acknowledged the firing), a wait
    that acknowledges it and times out, an ack by hand, a stop: each as the page shows."""
    ran = transcript(sample("consumer"), daemon)
    assert len(ran) == 7
    for got, printed in ran:
        assert got == printed
    assert daemon.client().call({"op": "read", "session": "jobs"})["code"] == "no_such_session"


def test_the_join_sample_prints_what_it_says(daemon: DaemonProc) -> None:
    """Two replies gathered (the first poll times out naming the missing one, the second
    finds both), then a job claimed and joined (timed out with it held, then done)."""
    ran = transcript(sample("join"), daemon)
    assert len(ran) == 11
    for got, printed in ran:
        assert got == printed
    assert daemon.client().ok({"op": "cursors", "session": "me"})["cursors"] == []


def test_the_approvals_sample_prints_what_it_says(daemon: DaemonProc) -> None:
    """The prompt the prose describes, recorded as ``repl mcp --approvals`` records it with
    the worker's token; then the listing, an allow, and a deny refused, as the page shows."""
    from session import approvals as ap

    root = daemon.client()
    root.ok({"op": "start", "session": "approvals"})
    made = root.ok(
        {
            "op": "token",
            "action": "add",
            "name": "worker",
            "sessions": ["approvals"],
            "can": ["send"],
        }
    )
    worker = daemon.client(auth=False)
    worker.ok({"op": "auth", "token": made["token"]})
    preview = '{"command": "rm -rf build/ && pytest -q"}'
    worker.ok(
        {
            "op": "send",
            "session": "approvals",
            "text": ap.prompt_text("Bash", "run the tests in a clean checkout"),
            "handler": ap.PROMPT_HANDLER,
            "tags": ap.prompt_tags("tbxkq", "Bash", preview, ap.DEFAULT_APPROVERS),
        }
    )
    ran = transcript(sample("approvals"), daemon)
    assert len(ran) == 3
    for got, printed in ran:
        assert got == printed


GUIDE = ROOT / "GUIDE.md"


def guide_consumer() -> str:
    """The Python recipe of GUIDE.md's "A consumer in any language"."""
    text = GUIDE.read_text()
    section = text[text.index("### A consumer in any language") :]
    section = section[: section.index("\n### ")]
    (recipe,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return recipe


def test_the_guides_consumer_handles_each_firing_and_acknowledges_it(
    daemon: DaemonProc,
) -> None:
    """The recipe as written, but for the port: it prints the firings sent while it waits,
    in order, and acknowledges each batch with its next wait (so the ``wait`` cursor comes
    to the last seq it printed, and no further)."""
    assert daemon.http_port is not None
    c = daemon.client()
    c.ok({"op": "start", "session": "jobs"})
    c.ok({"op": "send", "session": "jobs", "text": "before it started"})
    recipe = aimed(guide_consumer(), daemon.http_port)
    proc = subprocess.Popen(
        [sys.executable, "-c", recipe], env=env(daemon), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "1 before it started\n"
        for n in range(2, 5):
            c.ok({"op": "send", "session": "jobs", "text": f"job {n}"})
        assert [proc.stdout.readline() for _ in range(3)] == ["2 job 2\n", "3 job 3\n", "4 job 4\n"]

        def acked() -> bool:
            rows = c.ok({"op": "cursors", "session": "jobs"})["cursors"]
            return {row["name"]: row["seq"] for row in rows} == {"wait": 4}

        eventually(acked, what="the wait cursor at 4")
        eventually(
            lambda: c.ok({"op": "stats", "session": "jobs"})["sessions"][0]["waiters"] == 1,
            what="the recipe waiting again",
        )
        c.ok({"op": "stop", "session": "jobs"})  # the recipe says why it ends, and ends
        assert proc.wait(30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()  # the recipe this test started
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_curl_sample_follows_a_session(daemon: DaemonProc) -> None:
    assert daemon.http_port is not None
    c = daemon.client()
    c.ok({"op": "start", "session": "inbox"})
    command = aimed(sample("curl").strip(), daemon.http_port)
    proc = subprocess.Popen(
        ["bash", "-c", curl(command, 10)], env=env(daemon), stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        eventually(lambda: c.ok({"op": "stats", "session": "inbox"})["sessions"][0]["waiters"] == 1)
        seq = c.ok({"op": "send", "session": "inbox", "text": "from the test"})["seq"]
        lines = [proc.stdout.readline().decode().rstrip("\r\n") for _ in range(8)]
    finally:
        proc.terminate()  # the curl this test started
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    # where it starts, the head, as an event with data (a client drops one without)
    assert lines[:4] == ["id: 0", "event: position", 'data: {"after": 0}', ""]
    assert lines[4:6] == [f"id: {seq}", "event: firing"]
    firing = json.loads(lines[6].removeprefix("data: "))
    assert (firing["seq"], firing["result"]) == (seq, "from the test")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=path, headless=True, args=ARGS)
        yield launched
        launched.close()


def test_the_javascript_sample_logs_every_firing_in_chromium(
    browser: Any, daemon: DaemonProc
) -> None:
    """The sample as a page of the daemon's origin would run it (``token`` given, as the
    sample expects it), 30 firings sent while it reads: it logs the 30, in order."""
    c = daemon.client()
    c.ok({"op": "start", "session": "inbox"})
    page = browser.new_context().new_page()
    logged: list[Any] = []
    errors: list[str] = []
    page.on("console", lambda m: (logged if m.type == "log" else errors).append(m))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{daemon.http_port}/healthz")  # the origin, and no script
    page.evaluate(
        "token => { (async () => {\n" + sample("javascript") + "\n})()"
        ".catch((e) => console.error(String(e))); }",
        daemon.token,
    )
    eventually(lambda: c.ok({"op": "stats", "session": "inbox"})["sessions"][0]["waiters"] == 1)
    for n in range(1, 31):
        c.ok({"op": "send", "session": "inbox", "text": f"firing {n}"})
    deadline = time.monotonic() + 10  # a bound, not a figure: generous on a loaded machine
    while len(logged) < 30 and not errors and time.monotonic() < deadline:
        page.wait_for_timeout(50)  # Playwright's sync API delivers events while it is called
    assert errors == []
    firings = [m.args[0].json_value() for m in logged]
    assert [(f["seq"], f["result"]) for f in firings] == [(n, f"firing {n}") for n in range(1, 31)]
    page.context.close()


def test_the_scrape_config_reads_metrics_as_prometheus_would(daemon: DaemonProc) -> None:
    """No Prometheus here: what it does with the config, done by hand. Its default path
    (``/metrics``) on the target, the credentials file's content (trimmed, as Prometheus
    trims it) as a Bearer token."""
    assert daemon.http_port is not None
    config = aimed(sample("scrape"), daemon.http_port)
    assert re.search(r"^\s+type: Bearer$", config, re.MULTILINE), config
    (written,) = re.findall(r"^\s+credentials_file: (\S+)$", config, re.MULTILINE)
    assert written.endswith("/repl/token")  # the token file of a state directory
    (target,) = re.findall(r'targets: \["([^"]+)"\]', config)
    secret = (daemon.home / "token").read_text().strip()
    request = urllib.request.Request(
        f"http://{target}/metrics", headers={"Authorization": f"Bearer {secret}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain; version=")
        assert b"repl_firings_total" in answer.read()
