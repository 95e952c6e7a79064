"""Join over the wire (SPEC §18): a wait on every one of several sessions, and a gather of
correlation ids, each decided by the record, against a daemon in this process.

A blocked request is sent on a connection of its own and its answer read only after
what should complete it was sent on another: every wait is for an answer, with the
client's own timeout as the bound, never for time to pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import (
    Client,
    InProcDaemon,
    RedisClusterProcs,
    RedisProc,
    daemon_config,
    examples,
    store_url,
)

#: every store a daemon runs on (a cluster's sessions on several primaries: see below)
STORES = ["memory", "sqlite", "redis", "cluster"]


@pytest.fixture(scope="module", params=STORES)
def d(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcDaemon]:
    """A daemon on each store in turn; the module's tests each use sessions of their own."""
    home: Path = tmp_path_factory.mktemp(f"join-{request.param}") / "home"
    url = None
    if request.param in ("redis", "cluster"):
        fixture = "redis_single" if request.param == "redis" else "redis_cluster"
        server: RedisProc | RedisClusterProcs = request.getfixturevalue(fixture)
        server.flush()
        url = store_url(server)
    daemon = InProcDaemon(daemon_config(home, durable=request.param == "sqlite", store_url=url))
    yield daemon
    daemon.close_clients()
    daemon.stop()


def test_a_clusters_join_spans_its_primaries(redis_cluster: RedisClusterProcs) -> None:
    """The sessions the tests above join live on more than one primary of a cluster: a wait
    on all of them, and a gather's replies and their requests, cross slots."""
    assert len(redis_cluster.by_primary(["ja", "jb", "jc"])) > 1
    assert len(redis_cluster.by_primary(["je1", "je2"])) > 1


def sessions(c: Client, *names: str) -> None:
    for name in names:
        c.ok({"op": "start", "session": name})


def send(c: Client, session: str, text: str, **tags: str) -> int:
    seq: int = c.ok({"op": "send", "session": session, "text": text, "tags": tags})["seq"]
    return seq


def cursor(c: Client, session: str, name: str) -> int | None:
    for row in c.ok({"op": "cursors", "session": session})["cursors"]:
        if row["name"] == name:
            seq: int = row["seq"]
            return seq
    return None


def evaluations(c: Client, session: str) -> int:
    count: int = c.ok({"op": "stats", "session": session})["sessions"][0]["evaluations"]
    return count


def test_a_wait_on_all_answers_once_the_last_session_has_a_firing(d: InProcDaemon) -> None:
    c, waiter = d.client(), d.client()
    sessions(c, "ja", "jb", "jc")
    send(c, "jb", "b first")
    send(c, "ja", "a second")
    waiter.send({"op": "wait", "sessions": ["ja", "jb", "jc"], "all": True, "id": 1})
    assert not waiter.pending(0.2)  # two of three: still blocked (a bounded look, no sleep)
    before = [evaluations(c, s) for s in ("ja", "jb", "jc")]
    send(c, "ja", "a again")  # a session that has a batch already: still not all of them
    assert not waiter.pending(0.2)
    send(c, "jc", "c last")
    woken = waiter.recv()
    assert woken["id"] == 1 and not woken["timed_out"]
    assert [b["session"] for b in woken["batches"]] == ["ja", "jb", "jc"]  # in the order named
    texts = [[f["result"] for f in b["firings"]] for b in woken["batches"]]
    assert texts == [["a second", "a again"], ["b first"], ["c last"]]
    assert [cursor(c, s, "wait") for s in ("ja", "jb", "jc")] == [None, None, None]
    # two wakes, each looking at every session once, and the two sends: nothing else
    after = [evaluations(c, s) for s in ("ja", "jb", "jc")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 2, 3]


def test_early_arrivals_count_and_the_acks_go_together(d: InProcDaemon) -> None:
    c = d.client()
    sessions(c, "je1", "je2")
    send(c, "je1", "x")
    send(c, "je2", "y")
    woken = c.ok({"op": "wait", "sessions": ["je1", "je2"], "all": True, "timeout_ms": 0})
    acks = {b["session"]: b["next"] for b in woken["batches"]}
    assert acks == {"je1": 1, "je2": 1}
    again = c.ok(
        {"op": "wait", "sessions": ["je1", "je2"], "all": True, "ack": acks, "timeout_ms": 0}
    )
    assert again == {"ok": True, "batches": [], "timed_out": True}
    assert (cursor(c, "je1", "wait"), cursor(c, "je2", "wait")) == (1, 1)


def test_a_wait_on_all_that_times_out_consumes_nothing(d: InProcDaemon) -> None:
    c = d.client()
    sessions(c, "jt1", "jt2")
    send(c, "jt1", "only one")
    timed = c.ok(
        {"op": "wait", "sessions": ["jt1", "jt2"], "all": True, "cursor": "co", "timeout_ms": 50}
    )
    assert timed["timed_out"] and timed["batches"] == []
    assert cursor(c, "jt1", "co") is None  # looked at, never acknowledged


def test_a_stopped_session_ends_a_wait_on_all(d: InProcDaemon) -> None:
    c, waiter = d.client(), d.client()
    sessions(c, "js1", "js2")
    waiter.send({"op": "wait", "sessions": ["js1", "js2"], "all": True})
    assert not waiter.pending(0.2)
    c.ok({"op": "stop", "session": "js2"})
    refused = waiter.recv()
    assert refused["code"] == "session_stopped" and "js2" in refused["message"]


# -- gather ----------------------------------------------------------------------------


def test_gather_answers_one_reply_a_corr_in_the_order_asked(d: InProcDaemon) -> None:
    c, waiter = d.client(), d.client()
    sessions(c, "jg")
    send(c, "jg", "early reply from w2", corr="c-2")
    send(c, "jg", "not a reply")
    ask: dict[str, Any] = {"op": "gather", "session": "jg", "corrs": ["c-1", "c-2", "c-3"]}
    waiter.send(ask)
    assert not waiter.pending(0.2)
    send(c, "jg", "reply from w3", corr="c-3")
    send(c, "jg", "a retry's duplicate of w2's", corr="c-2")
    assert not waiter.pending(0.2)
    send(c, "jg", "reply from w1", corr="c-1")
    got = waiter.recv()
    assert [f["result"] for f in got["firings"]] == [
        "reply from w1",
        "early reply from w2",  # the first by seq of c-2, not the retry's
        "reply from w3",
    ]
    assert got["missing"] == [] and got["timed_out"] is False
    # it moved nothing: asked again, the same answer
    again = c.ok(ask)
    assert again["firings"] == got["firings"]
    assert c.ok({"op": "cursors", "session": "jg"})["cursors"] == []


def test_a_gather_that_times_out_says_what_came_and_what_did_not(d: InProcDaemon) -> None:
    c = d.client()
    sessions(c, "jgt")
    send(c, "jgt", "b's", corr="b")
    got = c.ok({"op": "gather", "session": "jgt", "corrs": ["a", "b", "a", "c"], "timeout_ms": 30})
    assert [f["tags"]["corr"] for f in got["firings"]] == ["b"]
    assert got["missing"] == ["a", "c"] and got["timed_out"] is True


#: a send's corr: one of a small pool (so corrs repeat: retries), or none
corr_of = st.sampled_from([None, "a", "b", "c", "d"])
_gathers = itertools.count()


@settings(
    max_examples=examples(25, "GATHER_EXAMPLES"),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    deadline=None,
)
@given(
    limit=st.integers(1, 6),
    before=st.lists(corr_of, max_size=12),
    after=st.lists(corr_of, max_size=8),
    asked=st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=1, max_size=6),
)
def test_gather_answers_as_a_naive_reading_of_the_ring_does(
    d: InProcDaemon, limit: int, before: list[str | None], after: list[str | None], asked: list[str]
) -> None:
    """A model: a gather answers, for each corr asked, the first firing by seq that carries
    it, among what the ring held when it began and what came after; the corrs with none
    are missing. Sent before (a ring of ``limit`` that drops the oldest) and while it is
    blocked (then the last corrs missing are sent, so that it completes)."""
    c, waiter = d.client(), d.client()
    session = f"jg-model-{next(_gathers)}"
    c.ok({"op": "start", "session": session, "buffer": limit})
    recorded: list[tuple[int, str | None]] = []

    def record(corr: str | None) -> None:
        tags = {} if corr is None else {"corr": corr}
        seq = send(c, session, f"#{len(recorded) + 1}", **tags)
        recorded.append((seq, corr))

    def naive(firings: list[tuple[int, str | None]]) -> tuple[list[int], list[str]]:
        first: dict[str, int] = {}
        for seq, corr in sorted(firings):
            if corr is not None and corr not in first:
                first[corr] = seq
        wanted = list(dict.fromkeys(asked))
        return [first[k] for k in wanted if k in first], [k for k in wanted if k not in first]

    for corr in before:
        record(corr)
    held = recorded[-limit:]  # what the ring holds when the gather begins
    now = c.ok({"op": "gather", "session": session, "corrs": asked, "timeout_ms": 0})
    seqs, missing = naive(held)
    assert ([f["seq"] for f in now["firings"]], now["missing"]) == (seqs, missing)
    # now blocked, while more come (the ring made large enough to drop none of them)
    c.ok({"op": "buffer", "session": session, "limit": 1000})
    waiter.send({"op": "gather", "session": session, "corrs": asked})
    for corr in after:
        record(corr)
    for corr in naive(held + recorded[len(before) :])[1]:
        record(corr)
    got = waiter.recv()
    seqs, missing = naive(held + recorded[len(before) :])
    assert missing == [] and got["missing"] == [] and got["timed_out"] is False
    assert [f["seq"] for f in got["firings"]] == seqs
    assert [f["tags"]["corr"] for f in got["firings"]] == list(dict.fromkeys(asked))


def test_gather_refuses_what_it_cannot_take(d: InProcDaemon) -> None:
    c = d.client()
    sessions(c, "jgr")
    for request, code, words in (
        ({"corrs": []}, "bad_request", "at least one corr"),
        ({"corrs": [str(i) for i in range(1025)]}, "bad_request", "1,025 corrs"),
        ({"corrs": ["x" * 1025]}, "bad_tag", "over 1,024 characters"),
        ({"corrs": ["a"], "timeout_ms": -1}, "bad_request", "negative"),
        ({"corrs": ["a"], "session": "jg-none"}, "no_such_session", "jg-none"),
    ):
        refused = c.call({"op": "gather", "session": "jgr", **request})
        assert refused["code"] == code and words in refused["message"], refused


# -- join ------------------------------------------------------------------------------


def claim(c: Client, session: str, group: str = "work") -> str:
    token: str = c.ok({"op": "claim", "session": session, "group": group, "timeout_ms": 0})["claim"]
    return token


def test_a_join_answers_when_the_last_job_is_done(d: InProcDaemon) -> None:
    c, waiter = d.client(), d.client()
    sessions(c, "jj")
    for n in range(3):
        send(c, "jj", f"job {n}")
    first, second = claim(c, "jj"), claim(c, "jj")
    waiter.send({"op": "join", "session": "jj", "group": "work", "id": 7})
    assert not waiter.pending(0.2)  # three jobs, none done
    before = evaluations(c, "jj")
    c.ok({"op": "done", "session": "jj", "claim": first})
    send(c, "jj", "a job after the join began: not waited for")
    third = claim(c, "jj")
    c.ok({"op": "done", "session": "jj", "claim": second})
    assert not waiter.pending(0.2)
    c.ok({"op": "done", "session": "jj", "claim": third})
    joined = waiter.recv()
    assert joined == {
        "ok": True,
        "id": 7,
        "upto": 3,
        "done": 3,
        "dead": 0,
        "ready": 0,
        "held": 0,
        "delayed": 0,
        "timed_out": False,
    }
    # it read nothing: a look a move of the group (three dones, one claim) and the send
    assert evaluations(c, "jj") - before <= 5
    # the fourth job is still there, claimable: a join takes nothing
    assert c.ok({"op": "groups", "session": "jj"})["groups"][0]["ready"] == 1


def test_a_dead_letter_finishes_a_job_and_is_counted(d: InProcDaemon) -> None:
    c, waiter = d.client(), d.client()
    sessions(c, "jd", "jd.dlq")
    c.ok({"op": "group", "session": "jd", "group": "work", "max_attempts": 1})
    c.ok({"op": "group", "session": "jd", "group": "work", "dead_letter": "jd.dlq"})
    send(c, "jd", "fine")
    send(c, "jd", "poison")
    fine, poison = claim(c, "jd"), claim(c, "jd")
    c.ok({"op": "done", "session": "jd", "claim": fine})
    waiter.send({"op": "join", "session": "jd", "group": "work"})
    assert not waiter.pending(0.2)
    assert c.ok({"op": "release", "session": "jd", "claim": poison})["dead"] is True
    joined = waiter.recv()
    assert (joined["done"], joined["dead"], joined["timed_out"]) == (2, 1, False)


def test_a_join_that_times_out_says_what_is_left(d: InProcDaemon) -> None:
    c = d.client()
    sessions(c, "jl")
    for n in range(4):
        send(c, "jl", f"job {n}")
    held = claim(c, "jl")
    c.ok({"op": "release", "session": "jl", "claim": claim(c, "jl"), "delay_ms": 60_000})
    c.ok({"op": "done", "session": "jl", "claim": claim(c, "jl")})
    joined = c.ok({"op": "join", "session": "jl", "group": "work", "timeout_ms": 20})
    assert joined["timed_out"] is True
    assert (joined["upto"], joined["done"], joined["ready"]) == (4, 1, 1)
    assert (joined["held"], joined["delayed"]) == (1, 1)
    c.ok({"op": "done", "session": "jl", "claim": held})
    # up to a seq: only those are waited for
    upto = c.ok({"op": "join", "session": "jl", "group": "work", "upto": 1, "timeout_ms": 0})
    assert upto["timed_out"] is False and upto["done"] == 1


def test_a_join_on_a_group_not_made_yet_counts_every_firing_as_ready(d: InProcDaemon) -> None:
    c = d.client()
    sessions(c, "jn")
    empty = c.ok({"op": "join", "session": "jn", "group": "later", "timeout_ms": 0})
    assert (empty["upto"], empty["timed_out"]) == (0, False)  # nothing to wait for
    send(c, "jn", "x")
    joined = c.ok({"op": "join", "session": "jn", "group": "later", "timeout_ms": 0})
    assert (joined["ready"], joined["timed_out"]) == (1, True)
    assert c.ok({"op": "groups", "session": "jn"})["groups"] == []  # a join makes no group


def test_a_stopped_session_ends_a_join(d: InProcDaemon) -> None:
    c, waiter = d.client(), d.client()
    sessions(c, "jx")
    send(c, "jx", "never done")
    waiter.send({"op": "join", "session": "jx"})
    assert not waiter.pending(0.2)
    c.ok({"op": "stop", "session": "jx"})
    assert waiter.recv()["code"] == "session_stopped"


def test_join_refuses_what_it_cannot_take(d: InProcDaemon) -> None:
    c = d.client()
    sessions(c, "jr")
    send(c, "jr", "one")
    for request, code, words in (
        ({"upto": 2}, "bad_seq", "upto 2"),
        ({"upto": -1}, "bad_seq", "-1"),
        ({"timeout_ms": -1}, "bad_request", "negative"),
        ({"group": "bad name!"}, "bad_group_name", "bad name!"),
        ({"session": "jr-none"}, "no_such_session", "jr-none"),
    ):
        refused = c.call({"op": "join", "session": "jr", "timeout_ms": 0, **request})
        assert refused["code"] == code and words in refused["message"], refused
    assert c.ok({"op": "groups", "session": "jr"})["groups"] == []
