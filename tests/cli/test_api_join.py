"""The join through the Python API (SPEC §18): ``wait(all=True)``, ``gather``,
``request_all`` with a key, and ``join``, on real daemons; each blocked one rides out a
``kill -9`` of the daemon and answers what an uninterrupted run would have."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from repl_cli import aio, api
from repl_daemon import protocol as p
from tests.helpers import DaemonProc, InProcDaemon, eventually


def test_request_all_with_a_key_sends_once_and_gathers_the_same(inproc: InProcDaemon) -> None:
    with api.connect(inproc.addr, inproc.home) as repl:
        for s in ("co", "w1", "w2", "w3"):
            repl.start(s)
        corrs = repl.ask_all(["w1", "w2", "w3"], "what is 6*7?", reply_to="co", key="run-1")
        assert corrs == {"w1": "run-1.w1", "w2": "run-1.w2", "w3": "run-1.w3"}
        # a coordinator run again with the same key re-sends nothing
        assert repl.ask_all(["w1", "w2", "w3"], "what is 6*7?", reply_to="co", key="run-1") == corrs
        assert [repl.stats(w).sessions[0].head for w in ("w1", "w2", "w3")] == [1, 1, 1]
        for n, worker in enumerate(("w3", "w1")):
            request = repl.read(worker).firings[0]
            repl.reply(worker, request.seq, f"answer {n}")
        partial = repl.gather("co", list(corrs.values()), timeout=0.05)
        assert partial.timed_out and partial.missing == ["run-1.w2"]
        assert [f.result for f in partial.firings] == ["answer 1", "answer 0"]  # order asked
        repl.reply("w2", 1, "answer 2")
        replies = repl.request_all(
            ["w1", "w2", "w3"], "what is 6*7?", reply_to="co", key="run-1", timeout=5
        )
        assert {w: f.result if f else None for w, f in replies.items()} == {
            "w1": "answer 1",
            "w2": "answer 2",
            "w3": "answer 0",
        }
        assert list(replies) == ["w1", "w2", "w3"]
        assert repl.request("w1", "again?", reply_to="co", key="run-1", timeout=5) == replies["w1"]
        with pytest.raises(api.BadInput, match="at least one session"):
            repl.ask_all([], "x", reply_to="co")
        with pytest.raises(api.NotFound):
            repl.ask_all(["w1"], "x", reply_to="nobody")
        assert repl.stats("w1").sessions[0].head == 1  # refused before anything was sent


def test_join_and_wait_all_answer_their_structs(inproc: InProcDaemon) -> None:
    with api.connect(inproc.addr, inproc.home) as repl:
        repl.start("jobs")
        repl.start("a")
        repl.start("b")
        assert repl.join("jobs", timeout=0) == p.Joined(
            upto=0, done=0, dead=0, ready=0, held=0, delayed=0
        )
        for n in range(2):
            repl.send("jobs", f"job {n}")
        claimed = repl.claim("jobs", timeout=0)
        left = repl.join("jobs", timeout=0.05)
        assert (left.timed_out, left.upto, left.held, left.ready) == (True, 2, 1, 1)
        assert claimed.claim is not None
        repl.done("jobs", claimed.claim)
        assert repl.join("jobs", upto=1, timeout=0).done == 1
        repl.send("a", "from a")
        assert repl.wait(["a", "b"], all=True, cursor="c", timeout=0.05).timed_out
        repl.send("b", "from b")
        woken = repl.wait(["a", "b"], all=True, cursor="c", timeout=5)
        assert [b.session for b in woken.batches] == ["a", "b"]


@pytest.mark.anyio
async def test_the_async_api_joins_the_same(inproc: InProcDaemon) -> None:
    async with aio.connect(inproc.addr, inproc.home) as repl:
        await repl.start("aj")
        await repl.send("aj", "reply", tags={"corr": "x"})
        gathered = await repl.gather("aj", ["x"], timeout=0)
        assert [f.result for f in gathered.firings] == ["reply"]
        joined = await repl.join("aj", group="g", timeout=0)
        assert (joined.ready, joined.timed_out) == (1, True)


def blocked(repl: api.Repl, sessions: list[str]) -> bool:
    waiting = {s.id: s.waiters for s in repl.sessions()}
    return all(waiting.get(s, 0) >= 1 for s in sessions)


def test_a_blocked_join_gather_and_wait_all_ride_out_a_kill_9(durable_daemon: DaemonProc) -> None:
    addr = f"127.0.0.1:{durable_daemon.port}"
    home = durable_daemon.home
    with api.connect(addr, home) as setup:
        for s in ("jobs", "co", "w1", "w2", "a", "b"):
            setup.start(s)
        for n in range(3):
            setup.send("jobs", f"job {n}")
        held = [setup.claim("jobs", lease=600, timeout=0).claim for _ in range(3)]
        assert None not in held
        setup.done("jobs", str(held[0]))
        corrs = list(setup.ask_all(["w1", "w2"], "q", reply_to="co", key="k").values())
        setup.reply("w1", 1, "w1's answer")
        setup.send("a", "a before")

    answers: dict[str, Any] = {}

    def run(name: str, call: Callable[[api.Repl], Any]) -> threading.Thread:
        def body() -> None:
            with api.connect(addr, home, reconnect=60) as repl:
                answers[name] = call(repl)

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    threads = [
        run("join", lambda r: r.join("jobs", timeout=60)),
        run("gather", lambda r: r.gather("co", corrs, timeout=60)),
        run("all", lambda r: r.wait(["a", "b"], all=True, cursor="c", timeout=60)),
    ]
    with api.connect(addr, home) as look:
        eventually(lambda: blocked(look, ["jobs", "co", "a"]), what="three blocked calls")
    durable_daemon.restart(crash=True)
    with api.connect(addr, home) as after:
        eventually(lambda: blocked(after, ["jobs", "co", "a"]), what="the three back")
        after.send("jobs", "job 3: after the join began, not waited for")
        for token in held[1:]:
            after.done("jobs", str(token))
        after.reply("w2", 1, "w2's answer")
        after.send("b", "b after")
        for thread in threads:
            thread.join(30)
        assert answers["join"] == p.Joined(upto=3, done=3, dead=0, ready=0, held=0, delayed=0)
        assert [f.result for f in answers["gather"].firings] == ["w1's answer", "w2's answer"]
        woken = answers["all"]
        assert [[f.result for f in b.firings] for b in woken.batches] == [["a before"], ["b after"]]
        assert after.cursors("a") == []  # wait acknowledges on the next call, as ever
