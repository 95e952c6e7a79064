"""Groups and claims through the CLI as a user runs it (SPEC §16).

Each firing of a session goes to one claimer of a group at a time, under a
lease; readers and other groups see every firing as before. A lease that runs
out, a delay that ends, a last attempt that dies: each is the daemon's timer,
on a clock the test moves (``MovedClock``), so no test waits for time to pass.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    InProcDaemon,
    MovedClock,
    Repl,
    daemon_config,
    eventually,
    inproc_daemon,
)


def claimed(out: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``repl claim --json``'s claim line, and the firing lines after its header."""
    first, _header, *firings = out.splitlines()
    return json.loads(first), [json.loads(line) for line in firings]


def claim(repl: Repl, s: str, *args: str) -> dict[str, Any]:
    head, (firing,) = claimed(repl.ok("claim", s, "--json", "--timeout", "30", *args))
    head["text"] = firing["result"]
    head["tags"] = firing["tags"]
    return head


def groups(repl: Repl, s: str) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in json.loads(repl.ok("groups", s, "--json"))}


def test_concurrent_claimers_each_get_a_different_job(repl: Repl, s: str) -> None:
    claimers = [repl.popen("claim", s, "--json", "--timeout", "60") for _ in range(4)]
    try:
        eventually(lambda: repl.waiters(s) == 4, what="four claimers to block")
        for n in range(1, 5):
            repl.ok("send", s, f"job {n}")
        outs = [c.communicate(timeout=30) for c in claimers]
    finally:
        for c in claimers:
            c.kill()
    assert [c.returncode for c in claimers] == [0, 0, 0, 0], [err for _, err in outs]
    heads = [claimed(out.decode())[0] for out, _ in outs]
    assert sorted(h["seq"] for h in heads) == [1, 2, 3, 4]
    assert {h["attempt"] for h in heads} == {1}
    assert len({h["claim"] for h in heads}) == 4
    assert groups(repl, s)["work"] | {} == {
        "name": "work",
        "done": 0,
        "ready": 0,
        "held": 4,
        "delayed": 0,
        "dead": 0,
        "max_attempts": 5,
        "dead_letter": f"{s}.dead",
    }


def test_an_early_job_is_found_and_done_is_never_offered_again(repl: Repl, s: str) -> None:
    repl.ok("send", s, "early")
    out = repl.ok("claim", s)
    token, text = out.splitlines()
    assert token == "work:1:1" and text == "on-message: early"  # as `wait` prints it
    assert repl.ok("done", s, token) == ""
    assert repl.run("claim", s, "--timeout", "0").returncode == 2
    assert groups(repl, s)["work"]["done"] == 1
    err = repl.fails(1, "done", s, token)  # a done answered once is never answered again
    assert "no longer the live lease" in err


def test_from_now_starts_after_the_head(repl: Repl, s: str) -> None:
    repl.ok("send", s, "before")
    assert repl.run("claim", s, "--group", "late", "--from-now", "--timeout", "0").returncode == 2
    repl.ok("send", s, "after")
    assert claim(repl, s, "--group", "late")["text"] == "after"


def test_a_timed_out_or_interrupted_claim_takes_nothing(repl: Repl, s: str) -> None:
    done = repl.run("claim", s, "--timeout", "0.05")
    assert (done.returncode, done.stdout) == (2, "")
    blocked = repl.popen("claim", s)
    eventually(lambda: repl.waiters(s) == 1, what="the claim to block")
    blocked.send_signal(signal.SIGINT)
    blocked.communicate(timeout=30)
    assert blocked.returncode == 130
    eventually(lambda: repl.waiters(s) == 0, what="the claim to go")
    repl.ok("send", s, "job")
    assert json.loads(repl.ok("claims", s, "--json")) == []
    got = claim(repl, s)
    assert (got["seq"], got["attempt"]) == (1, 1)  # nobody took it before


def test_a_match_claims_only_what_matches(repl: Repl, s: str) -> None:
    repl.ok("send", s, "for b", "--tag", "to=b")
    repl.ok("send", s, "for a", "--tag", "to=a")
    got = claim(repl, s, "--match", "to=a")
    assert (got["seq"], got["text"]) == (2, "for a")
    assert claim(repl, s)["seq"] == 1  # the one that did not match is still there


def test_cursor_readers_and_a_second_group_are_unaffected(repl: Repl, s: str) -> None:
    for text in ("one", "two"):
        repl.ok("send", s, text)
    for _ in range(2):
        repl.ok("done", s, claim(repl, s)["claim"])
    assert repl.ok("read", s) == "on-message: one\non-message: two\n"  # the read cursor: all
    assert [claim(repl, s, "--group", "other")["seq"] for _ in range(2)] == [1, 2]
    assert repl.ok("cursors", s).count("\n") == 2  # the header and `read`: no claim moved one
    assert groups(repl, s)["work"]["done"] == 2 and groups(repl, s)["other"]["held"] == 2


def test_a_claimer_that_cannot_write_gives_the_job_back(repl: Repl, s: str) -> None:
    repl.ok("send", s, "job")
    gone = repl.shell(f"$REPL claim {s} --timeout 30 | true")
    assert gone.returncode == 0, gone.stderr
    assert json.loads(repl.ok("claims", s, "--json")) == []  # given back at once
    got = claim(repl, s)
    assert (got["seq"], got["attempt"]) == (1, 2)


def test_a_bad_claim_or_token_is_refused_and_changes_nothing(repl: Repl, s: str) -> None:
    assert "--lease" in repl.fails(64, "claim", s, "--lease", "soon")
    assert "lease 0.5 s is not between 1 s and 24 h" in repl.fails(
        64, "claim", s, "--lease", "500ms"
    )
    bad_name = "repl: group name 'a b' is not 1-64 printable characters without whitespace\n"
    for args in (
        ["claim", s, "--group", "a b", "--timeout", "0"],
        ["group", s, "a b"],
        ["claims", s, "--group", "a b"],
    ):
        assert repl.fails(64, *args) == bad_name, args
    assert "not a claim token" in repl.fails(64, "done", s, "nonsense")
    assert "no group" in repl.fails(1, "done", s, "nobody:1:1")
    assert "no session" in repl.fails(1, "claim", "no-such-session-here", "--timeout", "0")
    assert (
        repl.ok("groups", s) == "group\tdone\tready\theld\tdelayed\tdead\tattempts\tdead letters\n"
    )


def test_a_read_token_claims_and_finishes_but_makes_no_group(repl: Repl, s: str) -> None:
    """A worker's token that sees its session alone claims from a group made for it; its
    first claim makes none (the group's dead letters would go to s.dead, which it does
    not see: tests/e2e/test_tokens.py), and `repl group` needs admin."""
    token = repl.ok("token", "add", f"worker-{s}", "--sessions", s, "--can", "read").strip()
    env = {**repl.env, "REPL_TOKEN": token}
    repl.ok("send", s, "job")
    refused = repl.run("claim", s, "--timeout", "30", env=env)
    assert refused.returncode == 77 and "make the group first" in refused.stderr
    repl.ok("group", s, "work")  # by the root, who sees s.dead
    out = repl.run("claim", s, "--timeout", "30", env=env)
    assert out.returncode == 0, out.stderr
    assert repl.run("done", s, out.stdout.splitlines()[0], env=env).returncode == 0
    refused = repl.run("group", s, "work", "--max-attempts", "2", env=env)
    assert refused.returncode == 77 and "admin" in refused.stderr


@pytest.mark.parametrize("inproc", ["memory", "durable"], indirect=True)
def test_a_lease_that_runs_out_is_offered_again_and_the_stale_done_is_refused(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    repl = Repl(inproc)
    s = repl.session("s")
    repl.ok("send", s, "job")
    first = claim(repl, s, "--lease", "5s")
    assert (
        first["lease_until"] == clock.at(clock.ms + 5000).replace("+00:00", "Z")[:-1] + ".000Z"
        or first["attempt"] == 1
    )
    waiting = repl.popen("claim", s, "--json", "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(s) == 1, what="the second claimer to block")
        clock.advance(4999)
        assert json.loads(repl.ok("claims", s, "--json"))[0]["attempt"] == 1  # still live
        clock.advance(1)  # the lease runs out: the daemon's timer offers it again
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    second, _ = claimed(out.decode())
    assert (second["seq"], second["attempt"]) == (1, 2)
    before = repl.ok("claims", s, "--json")
    for verb in (["done"], ["release"], ["extend", "--lease", "1m"]):
        refusal = repl.fails(1, *verb[:1], s, first["claim"], *verb[1:])
        assert "no longer the live lease" in refusal
    assert repl.ok("claims", s, "--json") == before  # the stale worker changed nothing
    repl.ok("done", s, second["claim"])
    assert groups(repl, s)["work"]["done"] == 1


def test_extend_keeps_the_lease(inproc: InProcDaemon, clock: MovedClock) -> None:
    repl = Repl(inproc)
    s = repl.session("s")
    repl.ok("send", s, "job")
    token = claim(repl, s, "--lease", "5s")["claim"]
    clock.advance(4000)
    until = repl.ok("extend", s, token, "--lease", "10s").strip()
    assert until == json.loads(repl.ok("claims", s, "--json"))[0]["lease_until"]
    clock.advance(9000)  # past the first lease, within the second
    assert repl.run("claim", s, "--timeout", "0").returncode == 2
    repl.ok("done", s, token)


def test_release_with_a_delay(inproc: InProcDaemon, clock: MovedClock) -> None:
    repl = Repl(inproc)
    s = repl.session("s")
    repl.ok("send", s, "job")
    repl.ok("release", s, claim(repl, s)["claim"], "--delay", "10s")
    assert groups(repl, s)["work"]["delayed"] == 1
    assert repl.run("claim", s, "--timeout", "0").returncode == 2  # not before the delay
    waiting = repl.popen("claim", s, "--json", "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(s) == 1, what="the claimer to block")
        clock.advance(10_000)  # the delay ends: the blocked claimer is woken
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert claimed(out.decode())[0]["attempt"] == 2


def test_release_at_once_wakes_a_blocked_claimer(repl: Repl, s: str) -> None:
    repl.ok("send", s, "job")
    token = claim(repl, s)["claim"]
    waiting = repl.popen("claim", s, "--json", "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(s) == 1, what="the claimer to block")
        repl.ok("release", s, token)
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert claimed(out.decode())[0]["attempt"] == 2, err


def test_the_last_attempt_lands_in_the_dead_letter_session_with_its_tags(
    inproc: InProcDaemon, clock: MovedClock
) -> None:
    repl = Repl(inproc)
    s = repl.session("s")
    info = json.loads(repl.ok("group", s, "work", "--max-attempts", "2", "--json"))
    assert (info["max_attempts"], info["dead_letter"]) == (2, f"{s}.dead")
    repl.ok("send", s, "given back twice", "--tag", "kind=resize")
    repl.ok("send", s, "runs out twice")
    repl.ok("release", s, claim(repl, s, "--match", "kind")["claim"])
    last = repl.run("release", s, claim(repl, s, "--match", "kind")["claim"])
    assert last.returncode == 0 and "dead-letter session" in last.stderr
    for attempt in (1, 2):
        got = claim(repl, s, "--lease", "1s")
        assert (got["seq"], got["attempt"]) == (2, attempt)
        clock.advance(1000)  # the lease runs out; the second time, it is dead
    eventually(lambda: groups(repl, s)["work"]["dead"] == 2, what="the second to die")
    dead = [
        json.loads(x)
        for x in repl.ok("read", f"{s}.dead", "--after", "0", "--json").splitlines()[1:]
    ]
    assert [(d["result"], d["tags"]) for d in dead] == [
        (
            "given back twice",
            {
                "kind": "resize",
                "dead.session": s,
                "dead.seq": "1",
                "dead.group": "work",
                "dead.attempts": "2",
            },
        ),
        (
            "runs out twice",
            {"dead.session": s, "dead.seq": "2", "dead.group": "work", "dead.attempts": "2"},
        ),
    ]
    assert dead[0]["by"] == "root"
    row = groups(repl, s)["work"]
    assert (row["done"], row["ready"], row["held"], row["dead"]) == (2, 0, 0, 2)
    assert repl.run("claim", s, "--timeout", "0").returncode == 2  # neither is offered again


def test_groups_and_claims_list_as_tables(repl: Repl, s: str) -> None:
    repl.ok("send", s, "job")
    token = claim(repl, s)["claim"]
    header, row = repl.ok("claims", s).splitlines()
    assert header == "group\tseq\tattempt\tlease until"
    assert row.split("\t")[:3] == ["work", "1", "1"]
    assert json.loads(repl.ok("claims", s, "--group", "other", "--json")) == []
    assert repl.ok("groups", s).splitlines()[1].split("\t")[:6] == ["work", "0", "0", "1", "0", "0"]
    repl.ok("done", s, token)


def test_claims_ride_nothing_out_when_the_session_is_stopped(repl: Repl, s: str) -> None:
    blocked = repl.popen("claim", s)
    eventually(lambda: repl.waiters(s) == 1, what="the claim to block")
    repl.ok("stop", s)
    _, err = blocked.communicate(timeout=30)
    assert blocked.returncode == 1 and b"stopped" in err


def test_a_lease_that_ran_out_while_the_daemon_was_down_expires_once_at_start(
    tmp_path: Path,
) -> None:
    """The expiry is a durable timer: a lease that ran out while no daemon ran is expired
    by the next one's first turn (here a last attempt: one dead letter, exactly)."""
    clock = MovedClock()
    config = daemon_config(tmp_path / "home", durable=True)
    with inproc_daemon(config, clock) as d:
        repl = Repl(d)
        s = repl.session("s")
        repl.ok("group", s, "work", "--max-attempts", "1")
        repl.ok("send", s, "the job")
        claim(repl, s, "--lease", "5s")
        claim(repl, s, "--lease", "5s", "--group", "retry")  # another lane, 5 attempts
    clock.advance(60_000)  # both leases run out while the daemon is down
    with inproc_daemon(config, clock) as d:
        repl = Repl(d)
        eventually(lambda: groups(repl, s)["work"]["dead"] == 1, what="the last attempt to die")
        row = groups(repl, s)["retry"]
        assert (row["held"], row["ready"], row["dead"]) == (0, 1, 0)
        lines = repl.ok("read", f"{s}.dead", "--after", "0", "--json").splitlines()
        assert [json.loads(x)["result"] for x in lines[1:]] == ["the job"]
        got = claim(repl, s, "--group", "retry")
        assert (got["seq"], got["attempt"]) == (1, 2)


@pytest.mark.parametrize("text", ["1s", "250ms", "90s", "5m", "1h30m", "23h59m59s999ms", "1d"])
def test_a_duration_is_read_once_into_seconds_and_reaches_the_wire_as_its_milliseconds(
    text: str,
) -> None:
    """Units at the edge: ``--lease`` and ``--delay`` are read where they come in into the
    API's one unit (seconds), which the API makes the wire's milliseconds when it builds
    the request: no millisecond is lost or gained on the way."""
    import click

    from repl_cli.api._common import lease_ms, to_ms
    from repl_cli.cli.options import DURATION
    from session.rules import DEFAULT_LEASE_MS
    from session.schedule import parse_duration

    option = click.Option(["--lease"])
    seconds = DURATION.convert(text, option, None)
    assert isinstance(seconds, float)
    assert to_ms(seconds) == lease_ms(seconds) == parse_duration(text)
    assert lease_ms(None) == DEFAULT_LEASE_MS  # no lease given: the rule's
    with pytest.raises(click.UsageError, match=r"^--lease: duration 'soon' is not a number"):
        DURATION.convert("soon", option, None)


# -- done --next (docs/semantics.md G11) -------------------------------------------------


def test_done_next_finishes_and_prints_the_next_job_as_claim_prints_it(repl: Repl, s: str) -> None:
    for n in range(1, 4):
        repl.ok("send", s, f"job {n}")
    token = repl.ok("claim", s).splitlines()[0]
    out = repl.ok("done", s, token, "--next")
    assert out.splitlines() == ["work:2:1", "on-message: job 2"]  # as `claim` prints it
    head, firings = claimed(repl.ok("done", s, "work:2:1", "--next", "--json"))
    assert head == {
        "claim": "work:3:1",
        "seq": 3,
        "attempt": 1,
        "lease_until": head["lease_until"],
        "lost": 0,
    }
    assert [f["result"] for f in firings] == ["job 3"]
    assert groups(repl, s)["work"]["done"] == 2
    assert groups(repl, s)["work"]["held"] == 1


def test_done_next_with_nothing_left_times_out_as_claim_with_the_done_made(
    repl: Repl, s: str
) -> None:
    repl.ok("send", s, "only")
    token = repl.ok("claim", s).splitlines()[0]
    ran = repl.run("done", s, token, "--next", "--timeout", "0")
    assert (ran.returncode, ran.stdout) == (2, "")  # claim's status: nothing taken
    assert groups(repl, s)["work"]["done"] == 1
    assert repl.run("claim", s, "--timeout", "0").returncode == 2


def test_done_next_blocks_until_a_job_comes(repl: Repl, s: str) -> None:
    repl.ok("send", s, "first")
    token = repl.ok("claim", s).splitlines()[0]
    blocked = repl.popen("done", s, token, "--next", "--timeout", "60")
    try:
        eventually(lambda: repl.waiters(s) == 1, what="done --next to block")
        assert groups(repl, s)["work"]["done"] == 1  # the done is made before it blocks
        repl.ok("send", s, "second")
        out, err = blocked.communicate(timeout=30)
    finally:
        blocked.kill()
    assert blocked.returncode == 0, err
    assert out.decode().splitlines() == ["work:2:1", "on-message: second"]


def test_a_refused_done_next_takes_nothing(repl: Repl, s: str) -> None:
    repl.ok("send", s, "one")
    repl.ok("send", s, "two")
    token = repl.ok("claim", s).splitlines()[0]
    repl.ok("done", s, token)
    err = repl.fails(1, "done", s, token, "--next")  # done already: the done's error
    assert "no longer the live lease" in err
    assert json.loads(repl.ok("claims", s, "--json")) == []  # nothing was taken
    assert repl.fails(1, "done", s, "work:9:1", "--next", "--timeout", "0")
    assert json.loads(repl.ok("claims", s, "--json")) == []
