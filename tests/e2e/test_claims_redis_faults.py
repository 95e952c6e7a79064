"""Groups and claims across faults on Redis (SPEC §16): what a worker was told stays true.

The Redis twin of ``test_claims_faults.py`` (its Ledger and checks, made for
several daemons): worker threads claim and finish jobs through the Python API
while a fault strikes, and what the workers were answered is checked after.
A ``done`` that was answered is never answered again for that job, and its
job is never offered again (no claim of it with a higher attempt); every job is
done in the end; a job without an answered ``done`` had one made that the
worker's retry was refused as ``lease_lost`` (at least once, never lost).

- Two daemon processes over one redis-server, two workers on each; one daemon
  SIGKILLed mid-run and started again on its port. Its workers ride the outage
  out by reconnecting to it (``reconnect``; a ``done`` whose answer the crash
  lost is asked again), and finish jobs after it; the group ends with every job
  done, nothing held, nothing dead. (``-m slow``: 12,000 jobs, the daemons
  killed in turn six times.) Again with ``done(next=True)`` for the workers' dones
  (``test_claims_faults.finish_next``). The workers claim with a 0.5 s timeout, so each
  looks again that often and a claim's own look expires what ran out: the
  expiry by the timer alone is the next tests'.
- A worker killed while it holds a job: a claimer blocked on the other daemon
  gets it once the lease runs out, attempt 2 (woken by the expiry, which the
  timer index fires on whichever daemon: nobody polls). With the worker's own
  daemon killed too, the other daemon's timer alone fires it: the group's
  counts show the job ready again with no claimer asking. With
  ``--max-attempts 1``, jobs whose holders never finish land in ``ID.dead``
  exactly once each, though both daemons fire expiries and record dead letters.
- A Redis Cluster (3 primaries, a replica each, ``?replicas=1``) whose primary
  holding the jobs' session is SIGKILLed under four workers on two daemons:
  its replica is promoted and the old primary brought back as its replica (as
  ``test_redis_cluster_faults.py`` does: until the promoted primary has a replica
  again, every change of its sessions is answered ``store_failed``, which a
  worker rides out). Every change answered was on the replica first, so the
  Ledger's checks hold in full across the failover; claims whose answers were
  lost (or answered ``store_failed``) are held by nobody and come again after
  their lease, with a higher attempt. No window is excepted: as that module's
  replicated test asserts of sends, nothing answered is lost.

Leases are 1 s of the real clock (real processes): the tests wait for the
events (a redelivery, the counts, the dead letters), bounded, never for a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from repl_cli import api
from repl_daemon import protocol as p
from repl_daemon.backends.redis.keys import partition_keys, partition_of, session_keys
from session.firing import GroupInfo
from session.rules import GROUPS_TIMER
from tests.e2e import test_claims_faults as faults
from tests.e2e.test_claims_faults import check
from tests.helpers import (
    DaemonProc,
    RedisClusterProcs,
    RedisProc,
    Repl,
    SharedDaemons,
    eventually,
    pipelined,
    require_redis,
)

WORKERS = 4
LEASE = 1.0  # seconds: how long a claim whose answer was lost is held by nobody


@dataclass
class Ledger(faults.Ledger):
    """What the workers were told, under one lock (``test_claims_faults.Ledger``), and which
    worker was told what."""

    by_worker: Counter[int] = field(default_factory=Counter)  # worker -> dones answered
    outages: Counter[int] = field(default_factory=Counter)  # worker -> dones asked again

    def done_by(self, workers: tuple[int, ...]) -> int:
        """The dones answered to ``workers``."""
        with self.lock:
            return sum(self.by_worker[n] for n in workers)


class Crew:
    """``WORKERS`` threads claiming and finishing the jobs of ``session`` in group ``work``,
    worker ``n`` through daemon ``n % len(daemons)``, until stopped."""

    def __init__(self, daemons: list[DaemonProc], session: str, take_next: bool = False) -> None:
        self.session = session
        #: each worker finishes with ``done(next=True)``, claiming only when it holds none
        self.take_next = take_next
        self.ledger = Ledger()
        self.stopping = threading.Event()
        #: workers that wait before their next step (the other daemon's, while a killed
        #: one restarts: else they may drain every job left before its workers are back)
        self.held: set[int] = set()
        self.threads = [
            threading.Thread(target=self._work, args=(n, daemons[n % len(daemons)]), daemon=True)
            for n in range(WORKERS)
        ]
        for thread in self.threads:
            thread.start()

    def _work(self, n: int, d: DaemonProc) -> None:
        ledger = self.ledger
        try:
            with api.connect(d.addr, d.home, reconnect=60) as repl:
                claimed: p.Claimed | None = None
                while not self.stopping.is_set():
                    if n in self.held:
                        time.sleep(0.01)
                        continue
                    if claimed is None:
                        claimed = faults.took(
                            repl.claim(self.session, lease=LEASE, timeout=0.5), ledger
                        )
                        continue
                    assert claimed.claim is not None
                    if self.take_next:
                        claimed = self._finish_next(n, repl, claimed)
                        continue
                    self._finish(n, repl, claimed.claim, claimed.seq, claimed.attempt)
                    claimed = None
        except BaseException as exc:  # the test reports it
            ledger.errors.append(exc)

    def _finish(self, n: int, repl: api.Repl, token: str, seq: int, attempt: int) -> None:
        ledger = self.ledger
        while not self.stopping.is_set():
            try:
                repl.done(self.session, token)
            except api.Error as exc:
                if exc.code == "lease_lost":  # it ran out, or a done whose answer was lost
                    with ledger.lock:
                        ledger.refused[seq] += 1
                    return
                if not isinstance(exc, api.Unavailable):  # no daemon, or its store failed
                    raise
                with ledger.lock:
                    ledger.outages[n] += 1
                repl.close()  # the next call connects again
                time.sleep(0.05)  # a worker's pause before it asks again: it rides the outage
                continue
            with ledger.lock:
                ledger.dones.setdefault(seq, []).append(attempt)
                ledger.by_worker[n] += 1
            return

    def _finish_next(self, n: int, repl: api.Repl, claimed: p.Claimed) -> p.Claimed | None:
        """``done(next=True)`` (``faults.finish_next``): its answer lost to an outage, the
        done is asked again alone (``_finish``)."""
        ledger = self.ledger
        assert claimed.claim is not None
        try:
            following = repl.done(self.session, claimed.claim, next=True, lease=LEASE, timeout=0.5)
        except api.Error as exc:
            if exc.code == "lease_lost":  # it ran out: nothing was taken
                with ledger.lock:
                    ledger.refused[claimed.seq] += 1
                return None
            if not isinstance(exc, api.Unavailable):
                raise
            with ledger.lock:
                ledger.outages[n] += 1
            repl.close()
            time.sleep(0.05)
            self._finish(n, repl, claimed.claim, claimed.seq, claimed.attempt)
            return None
        with ledger.lock:
            ledger.dones.setdefault(claimed.seq, []).append(claimed.attempt)
            ledger.by_worker[n] += 1
        return faults.took(following, ledger)

    def stop(self) -> Ledger:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in self.threads)
        assert not self.ledger.errors, self.ledger.errors
        return self.ledger


def post(d: DaemonProc, session: str, jobs: int) -> dict[int, str]:
    """Start ``session`` (a ring of ``jobs`` firings) and send it ``jobs`` jobs, pipelined a
    few hundred at a time; each job's text by its seq (a daemon on a cluster with replicas
    answers a pipeline's sends as each is replicated, not in their order)."""
    c = d.client()
    c.ok({"op": "start", "session": session, "buffer": jobs})
    texts: dict[int, str] = {}
    for low in range(1, jobs + 1, 250):
        requests = [
            {"op": "send", "session": session, "text": f"job {n}"}
            for n in range(low, min(low + 250, jobs + 1))
        ]
        for request, answer in zip(requests, pipelined(c, requests), strict=True):
            texts[answer["seq"]] = str(request["text"])
    assert sorted(texts) == list(range(1, jobs + 1))
    return texts


def row(d: DaemonProc, session: str) -> GroupInfo:
    """The session's one group, as ``d`` counts it (store_failed meanwhile is retried)."""
    found: list[GroupInfo] = []
    with api.connect(d.addr, d.home, reconnect=30) as repl:

        def counted() -> bool:
            try:
                found[:] = repl.groups(session)
            except api.Error as exc:
                if not isinstance(exc, api.Unavailable):  # its store failed: asked again
                    raise
                return False
            return True

        eventually(counted, 30, f"the group counts of {session}")
    (group,) = found
    return group


def all_done(d: DaemonProc, session: str, jobs: int) -> bool:
    return row(d, session).done == jobs


def finished(group: GroupInfo) -> tuple[int, int, int, int, int]:
    assert group.name == "work"
    return (group.done, group.ready, group.held, group.delayed, group.dead)


# -- two daemons over one redis-server ------------------------------------------


@pytest.fixture
def pair(tmp_path: Path, redis_server: RedisProc) -> Iterator[SharedDaemons]:
    """Two daemon processes over a redis-server of the test's own."""
    two = SharedDaemons(tmp_path, redis_server.url, 2)
    yield two
    two.close()


def crash_under_workers(
    pair: SharedDaemons, jobs: int, kills: int = 1, take_next: bool = False
) -> None:
    """Four workers (0 and 2 on daemon 0, 1 and 3 on daemon 1) and ``jobs`` jobs; the
    daemons SIGKILLed in turn ``kills`` times, each started again on its port at once."""
    post(pair.daemons[1], "jobs", jobs)
    crew = Crew(pair.daemons, "jobs", take_next)
    ledger = crew.ledger
    marks: list[int] = []
    try:
        for k in range(kills):
            share = jobs * (k + 1) // (kills + 2)
            eventually(partial(_at_least, ledger.done_count, share), 120, f"{share} done")
            doomed = pair.daemons[k % 2]
            mine = (k % 2, k % 2 + 2)  # its workers
            marks.append(ledger.done_by(mine))
            # SIGKILL, in the middle of claims and dones (not under the ledger's lock:
            # workers waiting for it would have nothing in flight)
            doomed.kill()
            # the other daemon's workers wait from their next step until the killed one's
            # are back (a job they hold meanwhile runs out its lease and comes again)
            crew.held = {n for n in range(WORKERS) if n not in mine}
            doomed.start(doomed.port)  # its workers reconnect to it, on its address
            # its workers rode the crash out and finish jobs again
            more = partial(_at_least, partial(ledger.done_by, mine), marks[-1] + 1)
            try:
                eventually(more, 120, "a done through the restarted daemon")
            finally:
                crew.held = set()
        eventually(lambda: all_done(pair.daemons[0], "jobs", jobs), 120, "every job done")
    finally:
        crew.stop()
    check(ledger, jobs)
    assert min(marks) > 0, marks  # each daemon's workers had finished jobs before its kill
    for d in pair.daemons:  # both count the group alike: all done, nothing held or dead
        assert finished(row(d, "jobs")) == (jobs, 0, 0, 0, 0)
    summary(ledger)


def _at_least(count: Callable[[], int], least: int) -> bool:
    return count() >= least


def summary(ledger: Ledger) -> None:
    """What the fault cost, for the record (``-s``): claims answered, those of a job
    offered again (its earlier claim's answer lost, or its lease run out), dones refused
    (made, their answer lost), dones asked again after an outage."""
    again = sum(1 for _, attempt in ledger.claims if attempt > 1)
    print(
        f"claims {len(ledger.claims)}, again {again}, done refused "
        f"{sum(ledger.refused.values())}, dones asked again {sum(ledger.outages.values())}"
    )


@pytest.mark.parametrize("take_next", [False, True], ids=["done", "done-next"])
def test_a_daemon_killed_under_four_workers_on_two_daemons_and_two_thousand_jobs(
    pair: SharedDaemons, take_next: bool
) -> None:
    crash_under_workers(pair, 2000, take_next=take_next)


@pytest.mark.slow
def test_each_daemon_killed_in_turn_under_workers_six_times(pair: SharedDaemons) -> None:
    crash_under_workers(pair, 12_000, kills=6)


WORKER = """
import sys, time
from repl_cli import api
with api.connect(sys.argv[1], sys.argv[2]) as repl:
    claimed = repl.claim(sys.argv[3], lease=1.0, timeout=30)
    print(claimed.claim, flush=True)
    time.sleep(600)
"""


def killed_holding(d: DaemonProc, session: str) -> str:
    """A worker process that claims a job of ``session`` through ``d`` and is SIGKILLed
    while it holds it; its claim token."""
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, d.addr, str(d.home), session], stdout=subprocess.PIPE
    )
    try:
        assert worker.stdout is not None
        return worker.stdout.readline().decode().strip()
    finally:
        worker.kill()
        worker.communicate()


def test_a_worker_killed_holding_a_job_loses_it_to_a_claimer_on_the_other_daemon(
    pair: SharedDaemons,
) -> None:
    a, b = pair.daemons
    assert post(a, "jobs", 1) == {1: "job 1"}
    got: list[p.Claimed | BaseException] = []

    def claim_on_b() -> None:  # blocked: nothing is claimable until the lease runs out
        try:
            with api.connect(b.addr, b.home) as repl:
                got.append(repl.claim("jobs", lease=30, timeout=60))
        except BaseException as exc:
            got.append(exc)

    token = killed_holding(a, "jobs")
    assert token == "work:1:1"
    claimer = threading.Thread(target=claim_on_b, daemon=True)
    claimer.start()
    claimer.join(60)
    (claimed,) = got
    assert isinstance(claimed, p.Claimed), claimed
    assert (claimed.seq, claimed.attempt, claimed.timed_out) == (1, 2, False)
    assert claimed.firing is not None and claimed.firing.result == "job 1"
    for d in (a, b):  # the dead worker's token finishes nothing, on either daemon
        assert "no longer the live lease" in Repl(d).fails(1, "done", "jobs", token)
    assert claimed.claim is not None
    Repl(a).ok("done", "jobs", claimed.claim)  # its holder finishes it through the other
    assert finished(row(b, "jobs")) == (1, 0, 0, 0, 0)


def test_a_worker_and_its_daemon_killed_the_other_daemon_fires_the_expiry(
    pair: SharedDaemons,
) -> None:
    """Nobody claims after the kills: the expiry is the timer index's entry, fired by the
    daemon left (the counts say so: a lease that ran out but was not expired still counts
    as held)."""
    a, b = pair.daemons
    post(b, "jobs", 2)
    token = killed_holding(a, "jobs")
    a.kill()
    assert token == "work:1:1"
    eventually(lambda: row(b, "jobs").held == 0, 60, "the expiry, fired by b's timer")
    assert finished(row(b, "jobs")) == (0, 2, 0, 0, 0)
    out = Repl(b).ok("claim", "jobs", "--json", "--timeout", "0")
    again = json.loads(out.splitlines()[0])
    assert (again["seq"], again["attempt"]) == (1, 2)
    assert "no longer the live lease" in Repl(b).fails(1, "done", "jobs", token)
    Repl(b).ok("done", "jobs", again["claim"])


def test_a_last_attempt_run_out_is_dead_once_though_two_daemons_fire_expiries(
    pair: SharedDaemons, redis_server: RedisProc
) -> None:
    """Jobs claimed through both daemons, staggered, their holders never finishing: the
    expiries come while claims go on through both (either may record a dead letter the
    other's step left), and every job is dead once, in ``jobs.dead``."""
    jobs = 24
    a, b = pair.daemons
    texts = post(a, "jobs", jobs)
    Repl(a).ok("group", "jobs", "work", "--max-attempts", "1")  # admin: the root token
    tokens: list[str] = []
    with api.connect(a.addr, a.home) as on_a, api.connect(b.addr, b.home) as on_b:
        for n in range(jobs):
            claimed = (on_b if n % 2 else on_a).claim("jobs", lease=LEASE, timeout=5)
            assert (claimed.seq, claimed.attempt) == (n + 1, 1), claimed
            assert claimed.claim is not None
            tokens.append(claimed.claim)
            time.sleep(0.05)  # spread over the lease: expiries and claims interleave

    def dead_done() -> bool:
        group = row(b, "jobs")
        return (group.done, group.dead) == (jobs, jobs)

    eventually(dead_done, 60, "every job dead")
    with redis_server.admin() as admin:  # each dead letter recorded and taken off the outbox
        outbox = session_keys("jobs")[-1]
        eventually(lambda: admin.llen(outbox) == 0, 30, "an empty outbox")
        due, entry = partition_keys(partition_of("jobs"))[0], f"jobs{GROUPS_TIMER}"
        eventually(lambda: admin.zscore(due, entry) is None, 30, "no expiry to come")
    read = a.client().ok({"op": "read", "session": "jobs.dead", "after": 0})
    letters = sorted(int(f["tags"]["dead.seq"]) for f in read["firings"])
    assert letters == list(range(1, jobs + 1))  # once each
    for f in read["firings"]:
        assert f["result"] == texts[int(f["tags"]["dead.seq"])]
        assert (f["tags"]["dead.group"], f["tags"]["dead.attempts"]) == ("work", "1")
    assert finished(row(a, "jobs")) == (jobs, 0, 0, 0, jobs)
    assert "no longer the live lease" in Repl(b).fails(1, "done", "jobs", tokens[0])
    assert Repl(a).run("claim", "jobs", "--timeout", "0").returncode == 2


# -- a Redis Cluster failover, with replicas=1 ------------------------------------


@pytest.fixture(scope="module")
def failover_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcs]:
    """3 primaries with a replica each, for the module's failovers."""
    require_redis(cluster=True)
    cluster = RedisClusterProcs(
        tmp_path_factory.mktemp("claims-failover") / "cluster", primaries=3, replicas=1
    )
    yield cluster
    cluster.stop()


@pytest.fixture
def replicated(tmp_path: Path, failover_cluster: RedisClusterProcs) -> Iterator[SharedDaemons]:
    """Two daemons over the whole, empty cluster, with ``?replicas=1``."""
    cluster = failover_cluster
    for node in cluster.nodes:
        if not node.running:
            node.start()
    cluster.wait_ready()
    cluster.flush()
    two = SharedDaemons(tmp_path, f"{cluster.url}?replicas=1", 2)
    yield two
    two.close()


def kill_a_primary(cluster: RedisClusterProcs, victim: int) -> Callable[[], None]:
    """SIGKILL the primary on port ``victim``; what brings its shard back: once its replica
    is promoted, the victim started again to rejoin as that replica's replica (until then
    the promoted primary's changes are answered ``store_failed``: WAIT finds no replica)."""
    (replica,) = (port for port, r in cluster.topology().items() if r["primary"] == victim)
    cluster.node(victim).kill()

    def back() -> None:
        eventually(lambda: cluster.topology()[replica]["role"] == "primary", 30, "the promotion")
        cluster.node(victim).start()
        cluster.wait_ready()
        eventually(
            lambda: cluster.topology()[victim]["primary"] == replica, 30, "the old primary's return"
        )

    return back


def failover_under_workers(cluster: RedisClusterProcs, group: SharedDaemons, jobs: int) -> None:
    """Four workers, two on each daemon, on a session of the first primary, which is killed
    once a third of the jobs are done."""
    spread = cluster.by_primary([f"jobs{n}" for n in range(12)])
    victim, sessions = next(iter(spread.items()))
    session = sessions[0]
    post(group.daemons[0], session, jobs)
    crew = Crew(group.daemons, session)
    try:
        eventually(lambda: crew.ledger.done_count() >= jobs // 3, 120, "a third done")
        back = kill_a_primary(cluster, victim)
        killed = crew.ledger.done_count()  # no more done is answered until its replica's
        back()
        eventually(lambda: all_done(group.daemons[1], session, jobs), 120, "every job done")
    finally:
        ledger = crew.stop()
    check(ledger, jobs)
    assert killed < jobs  # the kill came in the middle
    for d in group.daemons:
        assert finished(row(d, session)) == (jobs, 0, 0, 0, 0)
    for d in group.daemons:  # nothing answered was lost, so no head went back
        assert "went back" not in d.log.read_text()
    print(f"done when the primary was killed: {killed} of {jobs}")
    summary(ledger)


def test_a_primary_killed_under_workers_with_replicas_breaks_no_answer(
    failover_cluster: RedisClusterProcs, replicated: SharedDaemons
) -> None:
    failover_under_workers(failover_cluster, replicated, 600)
