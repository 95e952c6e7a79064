"""Groups and claims across crashes (SPEC §16): what a worker was told stays true.

Four worker threads claim and finish jobs through the Python API while the
daemon (SQLite, a real process) is killed with SIGKILL and started again on
its home: claim then done, and again as ``done(next=True)`` (``repl done
--next``: the done and the next claim in one request), whose answer the crash
may lose as a claim's and a done's (the done is asked again alone). A ``done``
that was answered is durable: its job is never offered again, and no job's
``done`` is answered twice. A claim whose answer the crash
lost is held by nobody live: its lease runs out and the job comes again, with
its attempt one higher. A worker killed while it holds a job loses it the
same way. Leases here are real seconds (the daemon is a process of its own, on
the real clock): the tests wait for the redelivery, bounded, never for a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from repl_cli import api
from repl_daemon import protocol as p
from tests.helpers import DaemonProc, Repl, eventually

WORKERS = 4
LEASE = 1.0  # seconds: how long a claim the crash lost is held by nobody


@dataclass
class Ledger:
    """What the workers were told, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    claims: list[tuple[int, int]] = field(default_factory=list)  # (seq, attempt), as answered
    dones: dict[int, list[int]] = field(default_factory=dict)  # seq -> attempts answered done
    refused: Counter[int] = field(default_factory=Counter)  # seq -> dones refused
    errors: list[BaseException] = field(default_factory=list)
    before_crash: int = 0  # the dones answered when the daemon was killed

    def done_count(self) -> int:
        with self.lock:
            return len(self.dones)


def work(
    d: DaemonProc,
    session: str,
    jobs: int,
    ledger: Ledger,
    stop: threading.Event,
    take_next: bool = False,
) -> None:
    """A worker's loop: claim, done; with ``take_next``, ``done(next=True)`` on the claim
    it holds, claiming only when it holds none."""
    try:
        with api.connect(d.addr, d.home, reconnect=60) as repl:
            claimed: p.Claimed | None = None
            while not stop.is_set():
                if claimed is None:
                    claimed = took(repl.claim(session, lease=LEASE, timeout=0.5), ledger)
                    continue
                assert claimed.claim is not None
                if take_next:
                    claimed = finish_next(repl, session, claimed, ledger)
                    continue
                _finish(repl, session, claimed.claim, claimed.seq, claimed.attempt, ledger)
                claimed = None
    except BaseException as exc:  # the test reports it
        ledger.errors.append(exc)


def took(claimed: p.Claimed, ledger: Ledger) -> p.Claimed | None:
    """The claim answered, in the ledger; None when it took nothing."""
    if claimed.timed_out or claimed.claim is None:
        return None
    with ledger.lock:
        ledger.claims.append((claimed.seq, claimed.attempt))
    return claimed


def finish_next(
    repl: api.Repl, session: str, claimed: p.Claimed, ledger: Ledger
) -> p.Claimed | None:
    """``done(next=True)``: the done answered and the next claim, in the ledger. Its answer
    lost to the crash, the done is asked again alone (``_finish``: refused if the crash's
    last commit made it), and a claim it may have made is held by nobody until its lease
    runs out."""
    assert claimed.claim is not None
    try:
        following = repl.done(session, claimed.claim, next=True, lease=LEASE, timeout=0.5)
    except api.Error as exc:
        if exc.code == "lease_lost":  # it ran out: nothing was taken
            with ledger.lock:
                ledger.refused[claimed.seq] += 1
            return None
        if not isinstance(exc, api.Unavailable):
            raise
        repl.close()  # the daemon is away: the next call connects again
        _finish(repl, session, claimed.claim, claimed.seq, claimed.attempt, ledger)
        return None
    with ledger.lock:
        ledger.dones.setdefault(claimed.seq, []).append(claimed.attempt)
    return took(following, ledger)


def _finish(
    repl: api.Repl, session: str, token: str, seq: int, attempt: int, ledger: Ledger
) -> None:
    while True:
        try:
            repl.done(session, token)
        except api.Error as exc:
            if exc.code == "lease_lost":  # it ran out, or a done the crash did not answer
                with ledger.lock:
                    ledger.refused[seq] += 1
                return
            if not isinstance(exc, api.Unavailable):
                raise
            repl.close()  # the daemon is away: the next call connects again
            continue
        with ledger.lock:
            ledger.dones.setdefault(seq, []).append(attempt)
        return


def run_with_a_crash(d: DaemonProc, jobs: int, take_next: bool = False) -> tuple[Ledger, Repl]:
    repl = Repl(d)
    session = repl.session("jobs")
    repl.ok("buffer", session, str(jobs))
    # the jobs, one send each would take a while: one request a line, over one connection
    client = d.client()
    for n in range(1, jobs + 1):
        assert client.call({"op": "send", "session": session, "text": f"job {n}"})["ok"]
    ledger, stop = Ledger(), threading.Event()
    threads = [
        threading.Thread(target=work, args=(d, session, jobs, ledger, stop, take_next), daemon=True)
        for _ in range(WORKERS)
    ]
    for thread in threads:
        thread.start()
    try:
        eventually(lambda: ledger.done_count() >= jobs // 3, timeout=120, what="a third done")
        with ledger.lock:
            ledger.before_crash = len(ledger.dones)
            d.kill()  # SIGKILL, in the middle of claims and dones
        d.start(d.port)
        eventually(lambda: _all_done(repl, session, jobs), timeout=300, what="every job done")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not ledger.errors, ledger.errors
    return ledger, repl


def _all_done(repl: Repl, session: str, jobs: int) -> bool:
    (row,) = json.loads(repl.ok("groups", session, "--json"))
    return bool(row["done"] == jobs)


def check(ledger: Ledger, jobs: int) -> None:
    # no job's done was answered twice
    assert all(len(attempts) == 1 for attempts in ledger.dones.values()), {
        seq: a for seq, a in ledger.dones.items() if len(a) > 1
    }
    # every job was claimed, and a job answered done was never offered again after it
    claimed = {seq for seq, _ in ledger.claims}
    assert claimed == set(range(1, jobs + 1))
    for seq, attempt in ledger.claims:
        done = ledger.dones.get(seq)
        assert done is None or attempt <= done[0], (seq, attempt, done)
    # a job without an answered done had its done made durable by the crash's last commit
    # and refused when the worker asked again: at least once, never lost
    for seq in set(range(1, jobs + 1)) - set(ledger.dones):
        assert ledger.refused[seq] >= 1, seq


@pytest.mark.parametrize("take_next", [False, True], ids=["done", "done-next"])
def test_a_crash_under_four_workers_and_two_thousand_jobs(tmp_path: Path, take_next: bool) -> None:
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0", "--idle-timeout", "60")
    try:
        ledger, _ = run_with_a_crash(d, 2000, take_next)
        check(ledger, 2000)
        # the crash came in the middle: jobs were done before it and after it
        assert 0 < ledger.before_crash < 2000
    finally:
        d.close_clients()
        d.stop()


WORKER = """
import sys, time
import pytest

from repl_cli import api
from repl_daemon import protocol as p
with api.connect(sys.argv[1], sys.argv[2]) as repl:
    claimed = repl.claim(sys.argv[3], lease=1.0, timeout=30)
    print(claimed.claim, flush=True)
    time.sleep(600)
"""


def test_a_worker_killed_while_it_holds_a_job_loses_it_after_its_lease(
    durable_daemon: DaemonProc,
) -> None:
    repl = Repl(durable_daemon)
    s = repl.session("jobs")
    repl.ok("send", s, "job")
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, durable_daemon.addr, str(durable_daemon.home), s],
        stdout=subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        token = worker.stdout.readline().decode().strip()
        assert token == "work:1:1"
    finally:
        worker.kill()
        worker.communicate()
    # the next claimer blocks until the dead worker's lease runs out, then has the job
    out = repl.ok("claim", s, "--json", "--timeout", "30")
    assert json.loads(out.splitlines()[0])["attempt"] == 2
    assert "no longer the live lease" in repl.fails(1, "done", s, token)


def test_a_restart_keeps_groups_leases_and_dones(durable_daemon: DaemonProc) -> None:
    repl = Repl(durable_daemon)
    s = repl.session("jobs")
    for text in ("one", "two", "three"):
        repl.ok("send", s, text)
    repl.ok("group", s, "work", "--max-attempts", "3")
    first = json.loads(repl.ok("claim", s, "--json", "--lease", "10m").splitlines()[0])
    repl.ok("done", s, first["claim"])
    held = json.loads(repl.ok("claim", s, "--json", "--lease", "10m").splitlines()[0])
    for crash in (False, True):
        durable_daemon.restart(crash=crash)
        (row,) = json.loads(repl.ok("groups", s, "--json"))
        assert (row["done"], row["held"], row["ready"], row["max_attempts"]) == (1, 1, 1, 3)
        assert json.loads(repl.ok("claims", s, "--json"))[0]["seq"] == held["seq"]
    third = json.loads(repl.ok("claim", s, "--json", "--timeout", "0").splitlines()[0])
    assert third["seq"] == 3  # neither the done one nor the held one
    assert repl.run("claim", s, "--timeout", "0").returncode == 2
    repl.ok("done", s, held["claim"])  # its holder finishes it across both restarts
    repl.ok("done", s, third["claim"])
