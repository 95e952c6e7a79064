"""Who sent each firing (SPEC §17), through the CLI as a user runs it.

The root token's sends are ``root``'s, a scoped token's are its name's, a
timer's firings ``timer``'s; ``--json`` shows it, ``--match by=NAME`` selects by
it, and nothing a sender does can set it: a ``by`` tag is refused and records
nothing, and no new token may take one of the daemon's own names.
"""

from __future__ import annotations

import json
from itertools import count
from typing import Any

from tests.helpers import Client, Repl

_names = count()


def call(repl: Repl, request: dict[str, Any]) -> dict[str, Any]:
    client = Client(repl.daemon.port, repl.daemon.token)
    try:
        return client.call(request)
    finally:
        client.close()


def json_firings(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()[1:]]


def test_each_firing_says_who_sent_it_root_a_token_or_a_timer(repl: Repl, s: str) -> None:
    agent = f"by-agent-{next(_names)}"
    token = repl.ok("token", "add", agent, "--sessions", s, "--can", "send").strip()
    repl.ok("send", s, "from root")
    done = repl.run("send", s, "from the agent", env={**repl.env, "REPL_TOKEN": token})
    assert done.returncode == 0, done.stderr
    repl.ok("send", s, "from a timer", "--at", "2000-01-01T00:00:00Z")  # due: fires now
    repl.ok("wait", s, "--cursor", "c", "--timeout", "30", "--max", "3")  # waits for the 3rd
    got = json_firings(repl.ok("read", s, "--after", "0", "--json"))
    by_text = {f["result"]: f["by"] for f in got}
    assert by_text == {"from root": "root", "from the agent": agent, "from a timer": "timer"}
    matched = json_firings(repl.ok("read", s, "--after", "0", "--match", f"by={agent}", "--json"))
    assert [f["result"] for f in matched] == ["from the agent"]
    assert "by" not in repl.ok("read", s, "--after", "0")  # text is as it was


def test_a_by_tag_is_refused_and_records_nothing(repl: Repl, s: str) -> None:
    err = repl.fails(64, "send", s, "forged", "--tag", "by=root")
    assert "tag 'by' is the daemon's" in err
    answer = call(repl, {"op": "send", "session": s, "text": "forged", "tags": {"by": "root"}})
    assert answer["ok"] is False and answer["code"] == "bad_tag"
    assert repl.ok("read", s, "--after", "0", "--json").splitlines() == ['{"next": 0, "lost": 0}']


def test_a_new_token_may_not_be_named_as_the_daemons_own_senders(repl: Repl) -> None:
    for name in ("root", "timer", "webhook"):
        err = repl.fails(64, "token", "add", name, "--sessions", "x", "--can", "send")
        assert "the daemon's own word for a firing's sender" in err
        answer = call(
            repl,
            {"op": "token", "action": "add", "name": name, "sessions": ["x"], "can": ["send"]},
        )
        assert answer["ok"] is False and answer["code"] == "bad_request"
    names = [row["name"] for row in json.loads(repl.ok("token", "list", "--json"))]
    assert not {"root", "timer", "webhook"} & set(names)
