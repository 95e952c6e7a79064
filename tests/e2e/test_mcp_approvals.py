"""Approvals through the inbox (SPEC §19, docs/semantics.md P1-P3): ``repl mcp --follow ID
--approvals SESSION`` driven by a raw JSON-RPC harness on its stdio that sends Claude
Code's exact permission notification, and verdicts given with ``repl approve`` and
``repl deny`` from a shell, as a person does.

Every wait is for an event: a line read with a deadline, the session's state looked at
until it holds. A notification that must not come is proved absent by what comes after
it: a later verdict's notification is the next line read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_mcp_push import harness, sender
from tests.helpers import DaemonProc, Repl, eventually

PERMISSION_REQUEST = "notifications/claude/channel/permission_request"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("mcp-approvals") / "home", "--memory")
    yield d
    d.close_clients()
    d.stop()


def ask(h: Any, request_id: str, tool: str = "Bash", preview: str = '{"command": "ls"}') -> None:
    """Claude Code's prompt, as it writes it on the server's stdin."""
    h.send(
        {
            "jsonrpc": "2.0",
            "method": PERMISSION_REQUEST,
            "params": {
                "request_id": request_id,
                "tool_name": tool,
                "description": f"run {tool} for {request_id}",
                "input_preview": preview,
            },
        }
    )


def prompts(repl: Repl, session: str) -> list[dict[str, Any]]:
    out = repl.ok("read", session, "--after", "0", "--json", "--match", "approval")
    return [json.loads(line) for line in out.splitlines()[1:]]


def test_the_capability_is_declared_only_with_approvals(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    inbox, asks = repl.session("inbox"), repl.session("asks")
    with harness(daemon, "--follow", inbox) as h:
        assert h.initialize()["capabilities"]["experimental"] == {"claude/channel": {}}
    with harness(daemon, "--follow", inbox, "--approvals", asks) as h:
        assert h.initialize()["capabilities"]["experimental"] == {
            "claude/channel": {},
            "claude/channel/permission": {},
        }


def test_a_prompt_is_recorded_and_the_first_approvers_verdict_is_sent_once(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    inbox, asks = repl.session("inbox"), repl.session("asks")
    with harness(daemon, "--follow", inbox, "--approvals", asks) as h:
        h.initialize()
        ask(h, "tbxkq", preview='{"command": "rm -rf build/"}')
        eventually(lambda: len(prompts(repl, asks)) == 1, what="the prompt recorded")
        (prompt,) = prompts(repl, asks)
        assert prompt["event"] == "Bash: run Bash for tbxkq"  # no handler of its name
        assert prompt["tags"] == {
            "approval": "tbxkq",
            "tool": "Bash",
            "preview": '{"command": "rm -rf build/"}',
            "approvers": "root",
        }
        assert prompt["by"] == "root" and prompt["ts"]
        listed = json.loads(repl.ok("approvals", asks, "--json"))
        assert [e["prompt"]["request_id"] for e in listed] == ["tbxkq"]
        # a plain message with the right words is no verdict
        repl.ok("send", asks, "yes tbxkq")
        said = repl.ok("approve", asks, "tbxkq")
        assert said.startswith("tbxkq: allow by root at ")
        assert h.push() == {
            "jsonrpc": "2.0",
            "method": "notifications/claude/channel/permission",
            "params": {"request_id": "tbxkq", "behavior": "allow"},
        }
        # a second verdict is refused, says who answered, and records nothing
        refused = repl.run("deny", asks, "tbxkq")
        assert refused.returncode == 1
        assert refused.stderr.startswith("repl: tbxkq already answered: allow by root at ")
        assert json.loads(repl.ok("approvals", asks, "--json")) == []
        ask(h, "mnopq", tool="Write")
        eventually(lambda: len(prompts(repl, asks)) == 3, what="the second prompt")
        repl.ok("deny", asks, "mnopq", "--reason", "not on main")
        assert h.push()["params"] == {"request_id": "mnopq", "behavior": "deny"}
        audit = json.loads(repl.ok("approvals", asks, "--all", "--json"))
        assert [(e["prompt"]["request_id"], e["verdict"]["behavior"]) for e in audit] == [
            ("tbxkq", "allow"),
            ("mnopq", "deny"),
        ]
        assert audit[1]["verdict"]["reason"] == "not on main"
        assert [v["by"] for e in audit for v in e["verdicts"]] == ["root", "root"]


def test_a_verdict_by_a_token_that_is_not_an_approver_sends_nothing(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    inbox, asks = repl.session("inbox"), repl.session("asks")
    mallory = sender(repl, "mallory", asks)
    alice = sender(repl, "alice", asks)
    with harness(daemon, "--follow", inbox, "--approvals", asks, "--approvers", "alice") as h:
        h.initialize()
        ask(h, "abcde")
        eventually(lambda: len(prompts(repl, asks)) == 1, what="the prompt recorded")
        for client in (mallory, repl.daemon.client()):  # a non-approver, and root
            client.ok(
                {
                    "op": "send",
                    "session": asks,
                    "text": "",
                    "handler": "on-verdict",
                    "tags": {"approval": "abcde", "verdict": "allow"},
                }
            )
        refused = repl.run("approve", asks, "abcde")  # root: not an approver here
        assert refused.returncode == 77 and "does not count" in refused.stderr
        alice.ok(
            {
                "op": "send",
                "session": asks,
                "text": "looked at it",
                "handler": "on-verdict",
                "tags": {"approval": "abcde", "verdict": "deny"},
            }
        )
        # the next line is alice's: nothing was sent for the others
        assert h.push()["params"] == {"request_id": "abcde", "behavior": "deny"}


def test_the_options_of_the_relay_are_checked(daemon: DaemonProc) -> None:
    repl = Repl(daemon)
    asks = repl.session("asks")
    assert "give --follow ID too" in repl.fails(64, "mcp", "--approvals", asks)
    assert "give --approvals" in repl.fails(64, "mcp", "--follow", asks, "--approvers", "alice")
    assert "--approvals" in repl.fails(64, "mcp", "--follow", asks, "--approvals", "bad id!")


def test_verdicts_on_what_is_not_a_prompt_are_refused_and_record_nothing(
    daemon: DaemonProc,
) -> None:
    repl = Repl(daemon)
    asks = repl.session("asks")
    assert "no approval request 'zzzzz'" in repl.fails(1, "approve", asks, "zzzzz")
    assert "five letters" in repl.fails(64, "approve", asks, "TBXKQ")
    assert repl.ok("read", asks, "--after", "0") == ""


@pytest.mark.anyio
async def test_a_supervising_agent_answers_over_mcp(daemon: DaemonProc) -> None:
    """The tools approvals, approve and deny, called through the official SDK's client by
    an agent whose token is the approver: the worker's server sends its verdict."""
    import os
    import sys

    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    repl = Repl(daemon)
    inbox, asks = repl.session("inbox"), repl.session("asks")
    (made,) = repl.ask(
        {
            "op": "token",
            "action": "add",
            "name": "boss",
            "sessions": [asks],
            "can": ["read", "send"],
        }
    )
    environment = {
        "REPL_ADDR": daemon.addr,
        "REPL_HOME": str(daemon.home),
        "REPL_TOKEN": made["token"],
    }
    environment.update({k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")})
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "repl_cli", "mcp"], env=environment
    )
    with harness(daemon, "--follow", inbox, "--approvals", asks, "--approvers", "boss") as h:
        h.initialize()
        ask(h, "qrstu", tool="Edit")
        eventually(lambda: len(prompts(repl, asks)) == 1, what="the prompt recorded")
        with open(daemon.home.parent / "mcp-approvals-sdk.log", "a") as errlog:  # noqa: ASYNC230
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as agent,
            ):
                await agent.initialize()
                listed = await agent.call_tool("approvals", {"session": asks})
                assert listed.structured_content is not None
                (entry,) = listed.structured_content["approvals"]
                assert entry["prompt"]["request_id"] == "qrstu" and entry["verdict"] is None
                assert entry["prompt"]["tool"] == "Edit"
                given = await agent.call_tool(
                    "deny", {"session": asks, "request_id": "qrstu", "reason": "no"}
                )
                assert given.structured_content is not None
                assert (given.structured_content["behavior"], given.structured_content["by"]) == (
                    "deny",
                    "boss",
                )
                again = await agent.call_tool("approve", {"session": asks, "request_id": "qrstu"})
                assert again.is_error and "already answered: deny by boss" in again.content[0].text  # type: ignore[union-attr]
                audit = await agent.call_tool("approvals", {"session": asks, "all": True})
                assert audit.structured_content is not None
                assert audit.structured_content["approvals"][0]["verdict"]["reason"] == "no"
        assert h.push()["params"] == {"request_id": "qrstu", "behavior": "deny"}


def test_a_prompt_that_cannot_be_recorded_is_told_and_left_to_the_terminal(
    daemon: DaemonProc,
) -> None:
    """An approvals session that is not there: the relay says it cannot follow it, and each
    prompt is still tried, in the order asked, and told on stderr as not recorded (Claude
    Code's own dialog still asks); a request id that is none is told too. Before, a prompt
    waited for a follow that never began, and nothing was said of it."""
    repl = Repl(daemon)
    inbox = repl.session("inbox")
    with harness(daemon, "--follow", inbox, "--approvals", "nowhere") as h:
        h.initialize()
        ask(h, "TBXKQ")
        ask(h, "tbxkq")
        ask(h, "mnopq")

        def told() -> list[str]:
            return [line for line in h.log.read_text().splitlines() if "permission" in line]

        eventually(lambda: len(told()) == 4, what="four lines on stderr")
        said = "\n".join(told())
        assert "repl: a permission request not recorded: request id 'TBXKQ'" in said
        assert "repl: cannot relay permission prompts through nowhere: no session" in said
        tbxkq = said.index("repl: permission request tbxkq not recorded in nowhere: ")
        mnopq = said.index("repl: permission request mnopq not recorded in nowhere: ")
        assert tbxkq < mnopq and said.endswith("(answer it at the terminal)")


def test_the_listing_a_person_reads_in_the_morning(daemon: DaemonProc) -> None:
    """``repl approvals`` as text: what waits (request, tool, description, age) and, with
    ``--all``, every prompt with its verdict, who gave it and when (pending ones say so);
    ``repl approve --json`` prints the verdict that counts."""
    from session import approvals as ap

    repl = Repl(daemon)
    asks = repl.session("asks")
    for rid, tool in (("abcde", "Bash"), ("fghij", "Write")):
        repl.daemon.client().ok(
            {
                "op": "send",
                "session": asks,
                "text": ap.prompt_text(tool, f"do {rid}"),
                "handler": ap.PROMPT_HANDLER,
                "tags": ap.prompt_tags(rid, tool, "{}", ap.DEFAULT_APPROVERS),
            }
        )
    given = json.loads(repl.ok("approve", asks, "abcde", "--reason", "fine", "--json"))
    assert (given["request_id"], given["behavior"], given["by"]) == ("abcde", "allow", "root")
    header, row = repl.ok("approvals", asks).splitlines()
    assert header.split("\t") == ["request", "tool", "description", "age"]
    assert row.split("\t")[:3] == ["fghij", "Write", "do fghij"]
    assert row.split("\t")[3].endswith(" s")  # asked a moment ago
    header, *rows = repl.ok("approvals", asks, "--all").splitlines()
    assert header.split("\t") == ["request", "tool", "description", "asked", "verdict", "by", "at"]
    answered, waiting = (r.split("\t") for r in rows)
    assert answered[:3] + answered[4:6] == ["abcde", "Bash", "do abcde", "allow", "root"]
    assert answered[6] == given["ts"]
    assert waiting[:3] + waiting[4:] == ["fghij", "Write", "do fghij", "pending", "", ""]
