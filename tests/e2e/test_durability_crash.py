"""A crash in the middle of concurrent sends loses nothing a client was told (SPEC rule 12).

Four client threads pipeline keyed sends and acks into one durable daemon;
it is SIGKILLed while they are at it, then started again on the same home.
Every send that was answered with a seq must be in the ring (or older than
the ring's bound, and so counted as lost), the seqs must run without a gap
or a repeat, each cursor must be at least where its last answered ack put
it, and sending an answered key again must answer the first seq.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import pytest

from tests.helpers import Client, DaemonProc

THREADS = 4
WINDOW = 8  # requests each thread keeps on the wire at once
LIMIT = 100


@dataclass
class Sender:
    """One client thread's view: what it was told."""

    n: int
    port: int
    token: str
    round_: int
    most: int
    answered: dict[str, int] = field(default_factory=dict)  # key -> seq
    sent: list[str] = field(default_factory=list)  # every key put on the wire
    acked: int = 0  # the cursor's position in the newest answered ack
    error: BaseException | None = None

    def run(self, stop: threading.Event) -> None:
        try:
            client = Client(self.port, self.token)
        except OSError as exc:  # the kill came before the thread connected
            self.error = exc
            return
        try:
            self._loop(client, stop)
        except (ConnectionError, OSError, json.JSONDecodeError):
            pass  # the daemon died under us: that is the test
        except BaseException as exc:
            self.error = exc
        finally:
            client.close()

    def _loop(self, client: Client, stop: threading.Event) -> None:
        i = 0
        while not stop.is_set() and len(self.sent) < self.most:
            keys = [f"r{self.round_}-t{self.n}-{i + j}" for j in range(WINDOW)]
            i += WINDOW
            top = max(self.answered.values(), default=0)
            lines: list[dict[str, object]] = [
                {"op": "send", "session": "crash", "text": key, "key": key, "id": key}
                for key in keys
            ]
            lines.append({"op": "ack", "session": "crash", "cursor": f"c{self.n}", "seq": top})
            self.sent.extend(keys)
            client.send_raw(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
            for key in keys:
                answer = client.recv()
                assert answer["ok"] and answer["id"] == key, answer
                assert not answer["duplicate"], answer
                self.answered[key] = answer["seq"]
            answer = client.recv()
            assert answer["ok"], answer
            self.acked = max(self.acked, answer["seq"])


def crash_round(daemon: DaemonProc, round_: int, kill_after: int, most: int) -> list[Sender]:
    """Run the senders until ``kill_after`` sends are answered, then SIGKILL the daemon."""
    senders = [Sender(n, daemon.port, daemon.token, round_, most) for n in range(THREADS)]
    stop = threading.Event()
    threads = [threading.Thread(target=s.run, args=(stop,), daemon=True) for s in senders]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    # a fine look at the senders' progress, not ``eventually``: the kill lands soon after the
    # kill_after-th answer, with sends still on their way, and a slow machine kills all the same
    while sum(len(s.answered) for s in senders) < kill_after and time.monotonic() < deadline:
        time.sleep(0.002)
    daemon.kill()
    stop.set()
    for thread in threads:
        thread.join(10)
    for sender in senders:
        if sender.error is not None and not isinstance(sender.error, OSError):
            raise sender.error
    return senders


def check_after_restart(c: Client, senders: list[Sender], dedup: list[Sender]) -> int:
    """Everything the senders were told is there; returns the head.

    ``dedup``: the senders whose keys must still dedup (the newest 1,024 are kept).
    """
    told = {key: seq for s in senders for key, seq in s.answered.items()}
    assert len(set(told.values())) == len(told), "a seq was given to two sends"
    ring = c.ok({"op": "read", "session": "crash", "after": 0})
    firings = ring["firings"]
    head: int = ring["next"]
    seqs = [f["seq"] for f in firings]
    assert seqs == list(range(head - len(seqs) + 1, head + 1)), "a gap in the ring"
    assert len(seqs) == min(LIMIT, head)
    texts = [f["result"] for f in firings]
    assert len(set(texts)) == len(texts), "a firing recorded twice"
    by_seq = {f["seq"]: f["result"] for f in firings}
    assert set(texts) <= {key for s in senders for key in s.sent}, "a firing nobody sent"
    for key, seq in told.items():
        assert seq <= head, f"{key} was told seq {seq}, but the head is {head}"
        if seq > head - LIMIT:
            assert by_seq[seq] == key, f"{key} was told seq {seq}, which holds {by_seq[seq]}"
    cursors = {
        row["name"]: row["seq"] for row in c.ok({"op": "cursors", "session": "crash"})["cursors"]
    }
    for s in senders:
        if s.acked:
            assert s.acked <= cursors[f"c{s.n}"] <= head
    # every answered key dedups to the seq it was told
    keys = [key for s in dedup for key in s.answered]
    if keys:
        c.send_raw(
            b"".join(
                json.dumps({"op": "send", "session": "crash", "text": k, "key": k}).encode() + b"\n"
                for k in keys
            )
        )
        for key in keys:
            answer = c.recv()
            assert answer["ok"] and answer["duplicate"], (key, answer)
            assert answer["seq"] == told[key]
    return head


def test_a_crash_mid_stream_keeps_every_answered_send(durable_daemon: DaemonProc) -> None:
    c = durable_daemon.client()
    c.ok({"op": "start", "session": "crash", "buffer": LIMIT})
    senders = crash_round(durable_daemon, 0, kill_after=240, most=200)
    assert sum(len(s.answered) for s in senders) >= 240
    durable_daemon.start()
    head = check_after_restart(durable_daemon.client(), senders, senders)
    assert head >= 240
    # and the daemon goes on from there
    after = durable_daemon.client().ok({"op": "send", "session": "crash", "text": "next"})
    assert after["seq"] == head + 1


@pytest.mark.slow
def test_crash_after_crash(durable_daemon: DaemonProc) -> None:
    c = durable_daemon.client()
    c.ok({"op": "start", "session": "crash", "buffer": LIMIT})
    everyone: list[Sender] = []
    for round_ in range(6):
        senders = crash_round(durable_daemon, round_, kill_after=150, most=60)
        everyone.extend(senders)
        durable_daemon.start()
        c = durable_daemon.client()
        # only the newest 1,024 keys dedup: the last two rounds sent at most 480
        check_after_restart(c, everyone, everyone[-2 * THREADS :])
        c.close()
