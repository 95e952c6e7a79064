"""A restart loads a durable daemon's state into the memory it had (issue 29).

The store's loader streams one session at a time (``SqliteStore.load``), so the
daemon that comes back from a restart with many full rings holds what the one
before it held, not every row as Python objects at once on top (it used to come
back at 2 x and stay there). Slow: it fills 500 rings of 256 firings.

A clean stop keeps each ring's image (``Ring.image``) beside the log, so the next
start reads a ring as one blob; a crash leaves the images of the last clean stop,
and the start reads them and the log after them. Both restarts serve the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import Client, DaemonProc

SESSIONS, FIRINGS, BATCH = 500, 256, 1_000


def rss(daemon: DaemonProc) -> int:
    assert daemon.proc is not None
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def pipelined(client: Client, requests: list[dict[str, object]]) -> None:
    """``requests`` written ``BATCH`` at a time, each answer insisted ok."""
    for first in range(0, len(requests), BATCH):
        chunk = requests[first : first + BATCH]
        for request in chunk:
            client.send(request)
        for _ in chunk:
            answer = client.recv()
            assert answer["ok"], answer


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_restart_of_many_full_rings_holds_the_memory_it_had(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0")
    try:
        client = d.client()
        ids = [f"r{n:04d}" for n in range(SESSIONS)]
        pipelined(client, [{"op": "start", "session": s} for s in ids])
        for i in range(FIRINGS):  # a round over every session, 256 times: full rings
            pipelined(client, [{"op": "send", "session": s, "text": f"{s} {i:03d}"} for s in ids])
        assert client.ok({"op": "stats", "session": ids[-1]})["sessions"][0]["head"] == FIRINGS
        before = rss(d)
        sample = {s: client.ok({"op": "read", "session": s, "after": 0}) for s in ids[::47]}
        client.close()
        for crash in (False, True):  # from the images, then from them and the log after them
            d.restart(crash=crash)
            after = rss(d)
            client = d.client()
            for session, read in sample.items():  # the sample's rings, firing by firing
                again = client.ok({"op": "read", "session": session, "after": 0})
                assert again == read, session
            client.close()
            assert after <= 1.15 * before, (crash, after / before, before, after)
        assert f"kept the images of {SESSIONS} of {SESSIONS} ring(s)" in d.log.read_text()
    finally:
        d.close_clients()
        d.stop()


def test_a_clean_stop_keeps_the_rings_images_and_a_crash_after_it_loses_nothing(
    tmp_path: Path,
) -> None:
    """A clean stop writes every ring's image; the start after it serves every ring and
    cursor as before. Then sends, a trim, a session stopped and started again, and a
    crash: the start reads the images and the log after them, and serves exactly what
    every client was told was stored."""
    d = DaemonProc(tmp_path / "home", "--settle-ms", "0")
    try:
        client = d.client()
        ids = [f"s{n}" for n in range(6)]
        pipelined(client, [{"op": "start", "session": s} for s in ids])
        for i in range(40):
            pipelined(client, [{"op": "send", "session": s, "text": f"{s} {i}"} for s in ids])
        client.ok({"op": "send", "session": "s0", "text": "tagged", "tags": {"corr": "c-1"}})
        client.ok({"op": "buffer", "session": "s1", "limit": 10})
        client.ok({"op": "read", "session": "s2", "cursor": "monitor", "max": 15})

        def everything() -> dict[str, object]:
            return {
                s: (
                    client.ok({"op": "read", "session": s, "after": 0}),
                    client.ok({"op": "cursors", "session": s}),
                )
                for s in ids
            }

        before = everything()
        client.close()
        d.restart()
        kept = re.findall(r"kept the images of (\d+) of (\d+) ring", d.log.read_text())
        assert kept == [("6", "6")]
        client = d.client()
        assert everything() == before
        pipelined(client, [{"op": "send", "session": s, "text": f"{s} after"} for s in ids])
        client.ok({"op": "buffer", "session": "s3", "limit": 2})
        client.ok({"op": "stop", "session": "s4"})
        client.ok({"op": "start", "session": "s4"})
        client.ok({"op": "send", "session": "s4", "text": "a new s4"})
        client.ok({"op": "ack", "session": "s5", "cursor": "monitor", "seq": 12})
        before = everything()
        client.close()
        d.restart(crash=True)
        client = d.client()
        assert everything() == before
        client.close()
    finally:
        d.close_clients()
        d.stop()
