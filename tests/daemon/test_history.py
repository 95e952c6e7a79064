"""A model-checked history (issue 7): many clients do random sends, reads,
acks, waits, polls and cancelled waits against one daemon, which is
restarted (cleanly and with SIGKILL) under them; every answer is logged and
a checker verifies SPEC §3 afterwards:

- seqs are gapless and unique per session; every send a client was told was
  stored is in the ring with its text, or counted as lost by the bound;
- a dedup key answered twice gives the same seq;
- a client's own cursor never moves back, survives restarts at the last
  acknowledged position, and is not moved by a timed-out or cancelled wait;
- no read or wait returns a firing its cursor had already passed, and each
  batch is in seq order without skipping a retained seq;
- the shared ``poll`` cursor hands each firing to at most one client;
- cursor positions seen by different clients never go back in real time.

The run is bounded in operations and time and stops by itself.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from session.rules import MAX_KEYS
from tests.helpers import Client, Daemon, DaemonProc

SESSIONS = ("h0", "h1", "h2")
LIMIT = 64


@dataclass
class Log:
    lock: threading.Lock = field(default_factory=threading.Lock)
    stored: dict[tuple[str, int], str] = field(default_factory=dict)  # (session, seq) -> text
    keys: dict[tuple[str, str], int] = field(default_factory=dict)
    polled: list[tuple[str, int]] = field(default_factory=list)
    # (session, cursor) -> (start, end, position) observations of shared cursors
    seen: dict[tuple[str, str], list[tuple[float, float, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    errors: list[str] = field(default_factory=list)
    ops: int = 0
    restarts: int = 0

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)


class Actor:
    """One client thread with its own cursor on every session."""

    def __init__(self, n: int, daemon: Daemon, log: Log, seed: int, deadline: float) -> None:
        self.n = n
        self.daemon = daemon
        self.log = log
        self.rng = random.Random(seed)
        self.deadline = deadline
        self.cursor = f"c{n}"
        self.position: dict[str, int] = dict.fromkeys(SESSIONS, 0)
        self.client: Client | None = None
        self.count = 0
        # the keys it retries: only its newest, well inside every session's dedup window
        # however long the run (12 actors x 40 keys < MAX_KEYS)
        self.my_keys: deque[tuple[str, str]] = deque(maxlen=40)
        # acks whose answer was lost with the daemon: they may or may not have happened
        self.unsure: dict[str, int] = {}
        self.resync = False

    def connect(self) -> Client:
        while True:
            try:
                if self.client is None:
                    self.client = Client(self.daemon.port, self.daemon.token, timeout=5)
                return self.client
            except (OSError, ConnectionError, AssertionError):
                self.client = None
                if time.monotonic() > self.deadline + 20:
                    raise
                time.sleep(0.05)  # the daemon is restarting: a pause before connecting again

    def call(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The answer, or None when the daemon went away mid-request (outcome unknown)."""
        try:
            return self.connect().call(request)
        except (OSError, ConnectionError, ValueError):
            if self.client is not None:
                self.client.close()
            self.client = None
            self.resync = True
            return None

    def run(self, ops: int, chaos_over: threading.Event) -> None:
        """``ops`` steps, and on until the restarts are all made (a fast machine is done first)."""
        try:
            while self.count < ops or not chaos_over.is_set():
                if time.monotonic() > self.deadline:
                    break
                self.step()
                self.count += 1
        except Exception as exc:  # a failed check or a crash of the actor itself
            self.log.fail(f"actor {self.n}: {type(exc).__name__}: {exc}")
        finally:
            if self.client is not None:
                self.client.close()

    def step(self) -> None:
        if self.resync:
            self.resync = False
            for s in SESSIONS:
                self.check_own_cursor(s)
            if self.resync:
                return
            self.unsure.clear()
        session = self.rng.choice(SESSIONS)
        choice = self.rng.random()
        if choice < 0.35:
            self.send(session)
        elif choice < 0.55:
            self.read(session)
        elif choice < 0.65:
            self.wait(session)
        elif choice < 0.72:
            self.poll(session)
        elif choice < 0.82:
            self.shared_ack(session)
        elif choice < 0.88:
            self.cancelled_wait(session)
        else:
            self.check_own_cursor(session)

    def send(self, session: str) -> None:
        self.count += 1
        text = f"a{self.n}-{self.count}"
        request: dict[str, Any] = {"op": "send", "session": session, "text": text}
        key = None
        if self.my_keys and self.rng.random() < 0.2:
            session, key = self.rng.choice(self.my_keys)
            request = {"op": "send", "session": session, "text": "retry", "key": key}
        elif self.rng.random() < 0.3:
            key = f"k{self.n}-{self.count}"
            request["key"] = key
        answer = self.call(request)
        if answer is None:
            return
        if not answer["ok"]:
            self.log.fail(f"send failed: {answer}")
            return
        seq = answer["seq"]
        with self.log.lock:
            if key is not None:
                first = self.log.keys.setdefault((session, key), seq)
                if first != seq:
                    self.log.errors.append(f"key {key} gave {seq}, first {first}")
                if (session, key) not in self.my_keys:
                    self.my_keys.append((session, key))
            if not answer["duplicate"]:
                if (session, seq) in self.log.stored:
                    self.log.errors.append(f"seq {seq} of {session} given twice")
                self.log.stored[(session, seq)] = text
            elif key is None:
                self.log.errors.append(f"duplicate without a key: {answer}")

    def check_batch(self, session: str, after: int, batch: dict[str, Any], what: str) -> None:
        firings = batch["firings"]
        seqs = [f["seq"] for f in firings]
        if seqs and seqs[0] <= after:
            self.log.fail(f"{what} on {session} returned {seqs[0]}, cursor was at {after}")
        if seqs != list(range(after + batch["lost"] + 1, after + batch["lost"] + 1 + len(seqs))):
            self.log.fail(f"{what} on {session} after {after}: seqs {seqs} lost {batch['lost']}")
        expected_next = seqs[-1] if seqs else after + batch["lost"]
        if batch["next"] != expected_next:
            self.log.fail(f"{what}: next {batch['next']} != {expected_next}")

    def read(self, session: str) -> None:
        answer = self.call(
            {
                "op": "read",
                "session": session,
                "cursor": self.cursor,
                "max": self.rng.randint(1, 20),
            }
        )
        if answer is None or not answer["ok"]:
            if answer is not None:
                self.log.fail(f"read failed: {answer}")
            return
        self.check_batch(session, self.position[session], answer, "read")
        self.ack(session, answer["next"])

    def ack(self, session: str, seq: int) -> None:
        answer = self.call({"op": "ack", "session": session, "cursor": self.cursor, "seq": seq})
        if answer is None:  # unknown: settled by reading the cursor after reconnecting
            self.unsure[session] = max(seq, self.unsure.get(session, 0))
            return
        if not answer["ok"]:
            self.log.fail(f"ack failed: {answer}")
            return
        if answer["seq"] != max(self.position[session], seq):
            self.log.fail(f"ack to {seq} from {self.position[session]} gave {answer['seq']}")
        self.position[session] = answer["seq"]

    def wait(self, session: str) -> None:
        before = self.position[session]
        answer = self.call(
            {"op": "wait", "sessions": [session], "cursor": self.cursor, "timeout_ms": 50}
        )
        if answer is None:
            return
        if not answer["ok"]:
            if answer["code"] != "shutting_down":
                self.log.fail(f"wait failed: {answer}")
            return
        if answer["timed_out"]:
            self.check_own_cursor(session, before)
            return
        batch = answer["batches"][0]
        self.check_batch(session, before, batch, "wait")
        self.ack(session, batch["next"])

    def cancelled_wait(self, session: str) -> None:
        try:
            other = Client(self.daemon.port, self.daemon.token, timeout=5)
        except (OSError, ConnectionError, AssertionError):
            return
        try:
            other.send({"op": "wait", "sessions": [session], "cursor": self.cursor})
        except OSError:
            pass
        finally:
            other.close()
        self.check_own_cursor(session)

    def check_own_cursor(self, session: str, expected: int | None = None) -> None:
        answer = self.call({"op": "cursors", "session": session})
        if answer is None or not answer["ok"]:
            return
        rows = {row["name"]: row["seq"] for row in answer["cursors"]}
        # the cursor may have been evicted (17th cursor): then it reads from 0, which
        # is a duplicate, never a loss; all actors' cursors fit in 16 here
        got = rows.get(self.cursor, 0)
        want = self.position[session] if expected is None else expected
        # an ack whose answer was lost may have happened: anything up to it is right
        ceiling = max(want, self.unsure.get(session, want))
        if not want <= got <= ceiling:
            self.log.fail(f"cursor {self.cursor} on {session} is {got}, acknowledged {want}")
        self.position[session] = max(got, self.position[session])

    def poll(self, session: str) -> None:
        answer = self.call({"op": "poll", "session": session, "max": 5})
        if answer is None or not answer["ok"]:
            return
        with self.log.lock:
            self.log.polled.extend((session, f["seq"]) for f in answer["firings"])

    def shared_ack(self, session: str) -> None:
        start = time.monotonic()
        listing = self.call({"op": "sessions"})
        if listing is None or not listing["ok"]:
            return
        head = next(row["head"] for row in listing["sessions"] if row["id"] == session)
        target = self.rng.randint(max(0, head - 30), head)
        answer = self.call({"op": "ack", "session": session, "cursor": "shared", "seq": target})
        if answer is None or not answer["ok"]:
            return
        with self.log.lock:
            self.log.seen[(session, "shared")].append((start, time.monotonic(), answer["seq"]))


def chaos(
    daemon: DaemonProc, stop: threading.Event, over: threading.Event, restarts: int, log: Log
) -> None:
    try:
        for i in range(restarts):
            if stop.wait(0.3):
                return
            try:
                daemon.restart(crash=i % 2 == 0)
            except Exception as exc:
                log.fail(f"restart failed: {exc}")
                return
            log.restarts += 1
    finally:
        over.set()


def run_history(daemon: Daemon, *, actors: int, ops: int, restarts: int, seed: int) -> Log:
    """Run the crew against ``daemon``; restarts need a daemon process to kill or stop."""
    assert not restarts or isinstance(daemon, DaemonProc), "restarts need a DaemonProc"
    log = Log()
    setup = Client(daemon.port, daemon.token)
    for session in SESSIONS:
        setup.ok({"op": "start", "session": session, "buffer": LIMIT})
    setup.close()
    deadline = time.monotonic() + 40
    crew = [Actor(n, daemon, log, seed * 1000 + n, deadline) for n in range(actors)]
    stop, chaos_over = threading.Event(), threading.Event()
    threads = [threading.Thread(target=a.run, args=(ops, chaos_over)) for a in crew]
    monkey = threading.Thread(target=chaos, args=(daemon, stop, chaos_over, restarts, log))
    for t in threads:
        t.start()
    monkey.start()
    for t in threads:
        t.join(90)
    stop.set()
    monkey.join(60)
    log.ops = sum(a.count for a in crew)
    final = Client(daemon.port, daemon.token)
    try:
        check_final(final, log, crew)
    finally:
        final.close()
    return log


def check_final(c: Client, log: Log, crew: list[Actor]) -> None:
    for session in SESSIONS:
        ring = c.ok({"op": "read", "session": session, "after": 0})
        head = ring["next"]
        seqs = [f["seq"] for f in ring["firings"]]
        first = seqs[0] if seqs else head + 1
        if seqs != list(range(first, head + 1)) or ring["lost"] != first - 1:
            log.fail(f"{session}: ring {seqs[:3]}..{seqs[-3:]} lost {ring['lost']} head {head}")
        if len(seqs) > LIMIT:
            log.fail(f"{session}: {len(seqs)} firings retained, limit {LIMIT}")
        by_seq = {f["seq"]: f["result"] for f in ring["firings"]}
        for (s, seq), text in log.stored.items():
            if s != session:
                continue
            if seq > head:
                log.fail(f"{session}: stored seq {seq} is after the head {head}")
            elif seq >= first and by_seq.get(seq) != text:
                log.fail(f"{session}: seq {seq} is {by_seq.get(seq)!r}, was told {text!r}")
        # the session remembers its newest MAX_KEYS keys: each of the newest half of those
        # the log knows must be a duplicate (the other half leaves room for the keys whose
        # answers a restart lost, which the session has and the log does not)
        keyed = sorted((seq, key) for (s, key), seq in log.keys.items() if s == session)
        for seq, key in keyed[-MAX_KEYS // 2 :]:
            again = c.ok({"op": "send", "session": session, "text": "x", "key": key})
            if not again["duplicate"] or again["seq"] != seq:
                log.fail(f"{session}: key {key} gave {again}, first {seq}")
        cursors = {
            r["name"]: r["seq"] for r in c.ok({"op": "cursors", "session": session})["cursors"]
        }
        for actor in crew:
            if cursors.get(actor.cursor, 0) != actor.position[session]:
                log.fail(
                    f"{session}: {actor.cursor} at {cursors.get(actor.cursor, 0)}, "
                    f"acknowledged {actor.position[session]}"
                )
    polled = log.polled
    if len(polled) != len(set(polled)):
        log.fail(f"poll handed {len(polled) - len(set(polled))} firings out twice")
    for key, observations in log.seen.items():
        for a in observations:
            for b in observations:
                if a[1] < b[0] and a[2] > b[2]:
                    log.fail(f"{key}: cursor went back from {a[2]} to {b[2]}")


def test_a_random_history_on_a_memory_daemon_keeps_every_rule(daemon: DaemonProc) -> None:
    # a process of its own: in the test's process the six client threads and
    # the daemon share one interpreter, and the run takes longer
    log = run_history(daemon, actors=6, ops=250, restarts=0, seed=1)
    print(f"\nhistory (memory): {log.ops} operations, {len(log.stored)} sends stored")
    assert not log.errors, log.errors[:10]
    assert len(log.stored) > 100


def test_a_random_history_with_restarts_and_crashes_keeps_every_rule(
    durable_daemon: DaemonProc,
) -> None:
    log = run_history(durable_daemon, actors=6, ops=600, restarts=6, seed=2)
    print(
        f"\nhistory (durable): {log.ops} operations, {len(log.stored)} sends stored, "
        f"{log.restarts} restarts (every other one a SIGKILL)"
    )
    assert log.restarts >= 3
    assert not log.errors, log.errors[:10]
    assert len(log.stored) > 100


@pytest.mark.slow
def test_a_long_history_with_restarts(durable_daemon: DaemonProc, tmp_path: Path) -> None:
    log = run_history(durable_daemon, actors=12, ops=3000, restarts=30, seed=3)
    print(f"\nhistory (long): {log.ops} ops, {len(log.stored)} stored, {log.restarts} restarts")
    assert not log.errors, log.errors[:10]
