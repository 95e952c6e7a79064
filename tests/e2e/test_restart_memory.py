"""A restart loads a durable daemon's state into the memory it had (issue 29).

The store's loader streams one session at a time (``SqliteStore.load``), so the
daemon that comes back from a restart with many full rings holds what the one
before it held, not every row as Python objects at once on top (it used to come
back at 2 x and stay there). Slow: it fills 500 rings of 256 firings.
"""

from __future__ import annotations

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
        d.restart()
        after = rss(d)
        client = d.client()
        for session, read in sample.items():  # the sample's rings, firing by firing
            again = client.ok({"op": "read", "session": session, "after": 0})
            assert again == read, session
        client.close()
        assert after <= 1.15 * before, (after / before, before, after)
    finally:
        d.close_clients()
        d.stop()
