"""The page at ``/`` (SPEC §10) in a real browser: Debian's headless Chromium, driven by
Playwright for Python through ``executable_path`` (Playwright's own browser download is not
needed).

Open the page, give the token once (kept for the tab), see the sessions, open one, see a
firing sent with ``repl send`` appear, send from the box and see ``repl read`` print it, see
a gap announced, a firing's tags as text; the table follows what happens (a head as the
live view moves, sessions started and stopped elsewhere); on a phone's viewport nothing
runs off the side. The approvals pane (SPEC §19, rule P4): an agent's prompts with Allow
and Deny, its verdict recorded as the page's token and sent on by ``repl mcp
--approvals``, and the audit. Each test keeps a screenshot (``docs/page.png`` was taken by
this test).

The table's tests stop the page's clock (Playwright's ``page.clock``): nothing the page
does by time (its slow listing) happens unless the test moves that clock, so what the
table shows in between is what the page did on the events it saw.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import DaemonProc, Repl, require_chromium

#: Chromium as root in a sandbox with no network: the flags the machine's notes give
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: how long the page may take to show what it was sent (generous: a loaded CI machine)
SHOWN_WITHIN_MS = 5000
#: the longest the page may go, visible, without listing the sessions again (its own
#: ``LIST_EVERY_MS`` is 5 s): a stopped clock moved this far has made it list once at least
LISTS_WITHIN_MS = 10_000
#: the time a stopped page clock shows
STOPPED_AT = datetime.datetime(2026, 12, 4, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=path, headless=True, args=ARGS)
        yield launched
        launched.close()


def url(web: DaemonProc) -> str:
    return f"http://127.0.0.1:{web.http_port}/"


def logged_in(
    browser: Any,
    web: DaemonProc,
    errors: list[str] | None = None,
    *,
    at: str = "",
    stopped: bool = False,
    token: str | None = None,
    **context: Any,
) -> Any:
    """A page past its login (with ``token``, else the root's), opened at ``#at``;
    ``errors`` collects what its console says is an error (a resource that failed to load
    is one: the favicon's 404 was). A ``stopped`` page's clock stands still from the
    start: its timers fire only when the test moves it (``page.clock.run_for``)."""
    page = browser.new_context(**context).new_page()
    if stopped:
        # installed a little before: an installed clock runs until paused, and a pause at the
        # very time it was installed at is in its past a moment later (CI saw "Cannot
        # fast-forward to the past")
        page.clock.install(time=STOPPED_AT - datetime.timedelta(seconds=10))
        page.clock.pause_at(STOPPED_AT)
    if errors is not None:
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url(web) + (f"#{at}" if at else ""))
    page.fill("#token", token or web.token)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#app:not([hidden])", timeout=SHOWN_WITHIN_MS)
    return page


def test_the_page_follows_a_session_live_and_sends_from_its_box(
    browser: Any, web: DaemonProc, tmp_path: Path
) -> None:
    repl = Repl(web)
    repl.ok("start", "page-live")
    repl.ok("send", "page-live", "sent before the page opened")
    errors: list[str] = []
    page = logged_in(browser, web, errors, viewport={"width": 1280, "height": 800})
    row = page.locator("#sessions tbody tr[data-id='page-live']")
    row.wait_for(timeout=SHOWN_WITHIN_MS)
    assert row.locator("td").nth(1).inner_text() == "1"  # its head
    row.click()
    page.wait_for_selector("#firings li[data-seq='1']", timeout=SHOWN_WITHIN_MS)
    repl.ok("send", "page-live", "hello from repl send")
    shown = page.locator("#firings li[data-seq='2']")
    shown.wait_for(timeout=SHOWN_WITHIN_MS)
    assert shown.locator(".text").inner_text() == "hello from repl send"
    assert shown.locator(".handler").inner_text() == "on-message"
    page.fill("#text", "typed in the browser")
    page.click("#send button[type=submit]")
    page.wait_for_selector("#firings li[data-seq='3']", timeout=SHOWN_WITHIN_MS)
    assert repl.ok("read", "page-live", "--after", "2") == "on-message: typed in the browser\n"
    page.screenshot(path=str(tmp_path / "page.png"))
    assert (tmp_path / "page.png").stat().st_size > 10_000
    # the token is kept for the tab: a reload opens the page without asking
    page.reload()
    page.wait_for_selector("#app:not([hidden])", timeout=SHOWN_WITHIN_MS)
    assert page.locator("#login").is_hidden()
    # the icon it links is what the browser shows, and nothing it loaded failed
    icon = page.evaluate(
        "fetch(document.querySelector('link[rel=icon]').href)"
        ".then(r => [r.status, r.headers.get('content-type')])"
    )
    assert icon == [200, "image/svg+xml"]
    assert errors == []
    page.context.close()


def test_a_wrong_token_is_refused_and_asked_for_again(browser: Any, web: DaemonProc) -> None:
    page = browser.new_context().new_page()
    page.goto(url(web))
    page.fill("#token", "not-the-token")
    page.click("#login button[type=submit]")
    error = page.locator("#login-error")
    error.wait_for(timeout=SHOWN_WITHIN_MS)
    # Playwright's own wait (not wait_for_function, whose string the page's CSP refuses
    # to evaluate: no 'unsafe-eval')
    from playwright.sync_api import expect

    expect(error).to_contain_text("refused", timeout=SHOWN_WITHIN_MS)
    assert "refused" in error.inner_text() and "repl token add" in error.inner_text()
    assert page.locator("#app").is_hidden()
    page.context.close()


def test_the_login_says_where_a_token_is_without_a_path_of_this_daemons(
    browser: Any, web: DaemonProc
) -> None:
    """The page is served to anyone, so it names no path of the daemon's: it says the root
    token is the file ``token`` in the daemon's state directory (whatever ``--home`` or
    ``REPL_HOME`` made it), and that a token from ``repl token add`` is taken too. It once
    said ``cat ~/.local/state/repl/token`` whatever the daemon's home."""
    page = browser.new_context().new_page()
    page.goto(url(web))
    hint = page.locator("#login").inner_text()
    assert "root token" in hint and "state directory" in hint and "repl token add" in hint
    assert "cat ~/.local/state/repl/token" not in hint
    assert str(web.home) not in page.content()
    page.context.close()


def test_a_token_from_repl_token_add_opens_the_page_on_its_own_sessions(
    browser: Any, web: DaemonProc
) -> None:
    repl = Repl(web)
    repl.ok("start", "page-scoped.1")
    repl.ok("start", "page-other")
    made = repl.ok("token", "add", "page-agent", "--sessions", "page-scoped.*", "--can", "read")
    page = browser.new_context().new_page()
    page.goto(url(web))
    page.fill("#token", made.strip())
    page.click("#login button[type=submit]")
    page.wait_for_selector("#app:not([hidden])", timeout=SHOWN_WITHIN_MS)
    page.locator("#sessions tbody tr[data-id='page-scoped.1']").wait_for(timeout=SHOWN_WITHIN_MS)
    assert page.locator("#sessions tbody tr[data-id='page-other']").count() == 0
    page.context.close()


def test_a_gap_is_shown_as_dropped_firings(browser: Any, web: DaemonProc) -> None:
    repl = Repl(web)
    repl.ok("start", "page-gap", "--buffer", "2")
    for i in range(5):
        repl.ok("send", "page-gap", f"m{i}")
    page = logged_in(browser, web)
    page.goto(url(web) + "#page-gap")
    page.wait_for_selector("#firings li.lost", timeout=SHOWN_WITHIN_MS)
    assert page.locator("#firings li.lost").inner_text() == "3 earlier firings dropped"
    assert page.locator("#firings li[data-seq]").count() == 2
    page.context.close()


def test_on_a_phone_nothing_runs_off_the_side(
    browser: Any, web: DaemonProc, tmp_path: Path
) -> None:
    repl = Repl(web)
    repl.ok("start", "page-phone")
    long_tag = "note=" + "x" * 300  # a badge no wider than the phone, whatever its value
    repl.ok("send", "page-phone", "a long line " * 20, "--tag", long_tag, "--tag", "env=prod")
    page = logged_in(browser, web, viewport={"width": 390, "height": 844}, is_mobile=True)
    page.goto(url(web) + "#page-phone")
    page.wait_for_selector("#firings li[data-seq='1']", timeout=SHOWN_WITHIN_MS)
    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, f"the page is {wide} px wider than the phone"
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    page.context.close()


def test_a_firing_shows_its_tags_as_text(browser: Any, web: DaemonProc) -> None:
    """Each tag a badge, ``KEY=VALUE``; a value is a client's text, shown as text: markup in
    it makes no element. A firing with no tag shows none. It once looked like any other."""
    from playwright.sync_api import expect

    repl = Repl(web)
    repl.ok("start", "page-tags")
    repl.ok("send", "page-tags", "untagged")
    marked = '<img src=x onerror="document.title=1">'
    repl.ok("send", "page-tags", "deploy done", "--tag", "env=prod", "--tag", f"note={marked}")
    errors: list[str] = []
    page = logged_in(browser, web, errors, at="page-tags")
    shown = page.locator("#firings li[data-seq='2']")
    shown.wait_for(timeout=SHOWN_WITHIN_MS)
    expect(shown.locator(".tag")).to_have_text(["env=prod", f"note={marked}"])
    assert shown.locator(".tag .key").all_inner_texts() == ["env", "note"]
    assert shown.locator("img").count() == 0 and page.title() == "repl"
    assert page.locator("#firings li[data-seq='1'] .tag").count() == 0
    assert errors == []
    page.context.close()


def test_the_tables_head_follows_the_live_view(browser: Any, web: DaemonProc) -> None:
    """A firing the live view shows moves its session's row at once: tried in Chromium on
    2026-12-04, the table said head 2 beside a live view at #3 (until its next listing).
    The lag moves with it (the cursor ``read`` is one behind)."""
    repl = Repl(web)
    repl.ok("start", "page-head")
    repl.ok("send", "page-head", "one")
    repl.ok("send", "page-head", "two")
    repl.ok("read", "page-head")  # the cursor read at 2: lag 0
    page = logged_in(browser, web, at="page-head", stopped=True)
    page.wait_for_selector("#firings li[data-seq='2']", timeout=SHOWN_WITHIN_MS)
    row = page.locator("#sessions tbody tr[data-id='page-head']")
    head, lag = row.locator("td").nth(1), row.locator("td").nth(2)
    assert (head.inner_text(), lag.inner_text()) == ("2", "0")
    repl.ok("send", "page-head", "three")
    page.wait_for_selector("#firings li[data-seq='3']", timeout=SHOWN_WITHIN_MS)
    # no wait: the row moved with the live view, and the page's clock has not moved
    assert (head.inner_text(), lag.inner_text()) == ("3", "1")
    page.context.close()


def test_sessions_started_and_stopped_elsewhere_come_and_go(browser: Any, web: DaemonProc) -> None:
    """The shown session stopped elsewhere leaves the table as its stream says so (the
    page's clock stopped); a session started elsewhere, and another stopped, are in the
    table once the page has listed again, which it does by itself while visible; a row
    the user is on keeps the focus through it."""
    from playwright.sync_api import expect

    repl = Repl(web)
    for name in ("page-shown", "page-kept", "page-gone"):
        repl.ok("start", name)
    page = logged_in(browser, web, at="page-shown", stopped=True)
    rows = page.locator("#sessions tbody tr")
    kept = page.locator("#sessions tbody tr[data-id='page-kept']")
    kept.wait_for(timeout=SHOWN_WITHIN_MS)
    page.wait_for_selector("#status:has-text('Following page-shown')", timeout=SHOWN_WITHIN_MS)
    kept.focus()
    repl.ok("stop", "page-shown")
    page.locator("#sessions tbody tr[data-id='page-shown']").wait_for(
        state="detached", timeout=SHOWN_WITHIN_MS
    )
    repl.ok("start", "page-new")
    repl.ok("stop", "page-gone")
    page.clock.run_for(LISTS_WITHIN_MS)
    page.locator("#sessions tbody tr[data-id='page-new']").wait_for(timeout=SHOWN_WITHIN_MS)
    expect(rows.filter(has_text="page-gone")).to_have_count(0, timeout=SHOWN_WITHIN_MS)
    assert page.evaluate("document.activeElement.dataset.id") == "page-kept"
    page.context.close()


def test_a_firing_shows_who_sent_it(browser: Any, web: DaemonProc) -> None:
    """``by`` beside the firing: a scoped token's name for what it sent, ``root`` for the
    root's. It is the daemon's record, not the client's say, shown as text."""
    repl = Repl(web)
    repl.ok("start", "page-by")
    made = repl.ok("token", "add", "page-sender", "--sessions", "page-by", "--can", "send")
    scoped = repl.run("send", "page-by", "from the token", env={**repl.env, "REPL_TOKEN": made})
    assert scoped.returncode == 0, scoped.stderr
    repl.ok("send", "page-by", "from the root")
    page = logged_in(browser, web, at="page-by")
    page.wait_for_selector("#firings li[data-seq='2']", timeout=SHOWN_WITHIN_MS)
    assert page.locator("#firings li[data-seq='1'] .by").inner_text() == "by page-sender"
    assert page.locator("#firings li[data-seq='2'] .by").inner_text() == "by root"
    page.context.close()


def test_the_approvals_pane_shows_a_prompt_and_allow_records_the_verdict(
    browser: Any, web: DaemonProc, tmp_path: Path
) -> None:
    """On a phone: a prompt recorded (as ``repl mcp --approvals`` records it) is in the
    pane with its request id, tool, description, preview, who asked and its age; Allow
    records the verdict as the page's token, and the prompt moves to the audit. A prompt
    recorded while the page is open comes in on the session's stream: the page's clock is
    stopped, so nothing of the page's own timing read anything."""
    from playwright.sync_api import expect

    from tests.http.test_http_approvals import ask

    repl = Repl(web)
    repl.ok("start", "page-asks")
    ask(web, "page-asks", "tbxkq")
    errors: list[str] = []
    page = logged_in(
        browser,
        web,
        errors,
        at="page-asks",
        stopped=True,
        viewport={"width": 390, "height": 844},
        is_mobile=True,
    )
    item = page.locator("#pending li[data-request='tbxkq']")
    item.wait_for(timeout=SHOWN_WITHIN_MS)
    assert item.locator(".request").inner_text() == "tbxkq"
    assert item.locator(".tool").inner_text() == "Bash"
    assert item.locator(".description").inner_text() == "run the tests"
    assert item.locator(".preview").inner_text() == '{"command": "pytest -q"}'
    assert item.locator(".by").inner_text() == "asked by root"
    assert item.locator(".age").inner_text() == "0 s"  # the page's clock is before it
    assert item.locator(".stale").is_hidden()
    assert page.title() == "(1) repl"
    long = '{"file_path": "/' + "x" * 300 + '"}'  # a preview no wider than the phone
    ask(web, "page-asks", "mnopq", tool="Write", preview=long)
    page.locator("#pending li[data-request='mnopq']").wait_for(timeout=SHOWN_WITHIN_MS)
    assert page.locator("#pending li").evaluate_all("l => l.map(e => e.dataset.request)") == [
        "tbxkq",
        "mnopq",
    ]
    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, f"the page is {wide} px wider than the phone"
    item.locator(".reason").fill("tests only")
    item.locator("button.allow").click()
    item.wait_for(state="detached", timeout=SHOWN_WITHIN_MS)
    (entry, _) = json.loads(repl.ok("approvals", "page-asks", "--all", "--json"))
    assert (entry["verdict"]["behavior"], entry["verdict"]["by"]) == ("allow", "root")
    assert entry["verdict"]["reason"] == "tests only"
    expect(page.locator("#status")).to_have_text("tbxkq: allow by root")
    page.locator("#audit-box summary").click()
    answered = page.locator("#audit li[data-request='tbxkq']")
    expect(answered.locator(".behavior")).to_have_text("allow")
    assert answered.locator(".by").inner_text() == "by root"
    assert answered.locator(".reason").inner_text() == "tests only"
    assert page.locator("#audit-count").inner_text() == "1"
    assert page.title() == "(1) repl"
    page.screenshot(path=str(tmp_path / "approvals.png"), full_page=True)
    assert errors == []
    page.context.close()


def test_the_pages_verdict_reaches_the_agent_through_repl_mcp(
    browser: Any, web: DaemonProc
) -> None:
    """End to end: ``repl mcp --follow ID --approvals SESSION --approvers page-phone`` on
    stdio as Claude Code runs it, its prompt sent as Claude Code sends it. The root's page
    is no approver: its Allow is refused on the prompt (kept, and sent nowhere); the
    phone's page (its own token) denies with a reason, and the server sends the agent the
    permission notification. The phone's page runs 11 minutes ahead: the prompt says it
    may have been answered at the terminal."""
    import datetime

    from playwright.sync_api import expect

    from tests.e2e.test_mcp_approvals import ask
    from tests.e2e.test_mcp_push import harness

    repl = Repl(web)
    repl.ok("start", "page-inbox")
    repl.ok("start", "page-approvals")
    phone = repl.ok(
        "token", "add", "page-phone", "--sessions", "page-approvals", "--can", "read,send"
    ).strip()
    with harness(
        web,
        "--follow",
        "page-inbox",
        "--approvals",
        "page-approvals",
        "--approvers",
        "page-phone",
    ) as h:
        h.initialize()
        ask(h, "qrstu", tool="Edit")
        rooted = logged_in(browser, web, at="page-approvals")
        mine = rooted.locator("#pending li[data-request='qrstu']")
        mine.wait_for(timeout=SHOWN_WITHIN_MS)
        mine.locator("button.allow").click()
        expect(mine.locator(".error")).to_contain_text("recorded but does not count")
        expect(mine.locator(".error")).to_contain_text("its approvers are page-phone")
        rooted.context.close()
        ahead = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=11)
        page = browser.new_context().new_page()
        page.clock.install(time=ahead)
        page.goto(url(web) + "#page-approvals")
        page.fill("#token", phone)
        page.click("#login button[type=submit]")
        item = page.locator("#pending li[data-request='qrstu']")
        item.wait_for(timeout=SHOWN_WITHIN_MS)
        expect(item.locator(".stale")).to_have_text(
            "No verdict yet: it may have been answered at the terminal."
        )
        assert item.locator(".age").inner_text().startswith("11m ")
        item.locator(".reason").fill("not on main")
        item.locator("button.deny").click()
        # the next line the agent reads: the root's verdict sent nothing
        assert h.push() == {
            "jsonrpc": "2.0",
            "method": "notifications/claude/channel/permission",
            "params": {"request_id": "qrstu", "behavior": "deny"},
        }
        item.wait_for(state="detached", timeout=SHOWN_WITHIN_MS)
        page.locator("#audit-box summary").click()
        answered = page.locator("#audit li[data-request='qrstu']")
        expect(answered.locator(".by")).to_have_text("by page-phone")
        assert answered.locator(".others").inner_text() == "Did not count: allow by root."
        page.context.close()


def test_the_approvals_pane_is_the_shown_sessions(browser: Any, web: DaemonProc) -> None:
    """Each session its own pane: one agent's approvals session, then another's picked in
    the table (its prompts, not the first's), then a session with no prompt (no pane)."""
    from playwright.sync_api import expect

    from tests.http.test_http_approvals import ask

    repl = Repl(web)
    for name in ("page-asks-a", "page-asks-b", "page-plain"):
        repl.ok("start", name)
    ask(web, "page-asks-a", "aaaaa")
    ask(web, "page-asks-b", "bbbbb")
    page = logged_in(browser, web, at="page-asks-a")
    page.locator("#pending li[data-request='aaaaa']").wait_for(timeout=SHOWN_WITHIN_MS)
    page.locator("#sessions tbody tr[data-id='page-asks-b']").click()
    page.locator("#pending li[data-request='bbbbb']").wait_for(timeout=SHOWN_WITHIN_MS)
    expect(page.locator("#pending li")).to_have_count(1)
    page.locator("#sessions tbody tr[data-id='page-plain']").click()
    page.wait_for_selector("#status:has-text('Following page-plain')", timeout=SHOWN_WITHIN_MS)
    expect(page.locator("#approvals")).to_be_hidden()
    assert page.title() == "repl"
    page.context.close()
