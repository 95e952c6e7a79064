"""Faults under load (issue 7): the disk fills up while several clients send.

Every send is answered either with a seq or with ``store_failed``; nothing
answered with a seq is lost, the database is not corrupted, and once space
returns the daemon takes writes again without a restart.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import threading
from pathlib import Path

from tests.helpers import (
    Client,
    InProcDaemon,
    LoggedElsewhere,
    Repl,
    eventually,
    repl_argv,
    small_disk,
    unread,
)


def test_the_disk_filling_up_while_sends_arrive(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "3m") as home:
        d = LoggedElsewhere(home, tmp_path / "daemon.log")
        try:
            setup = d.client()
            setup.ok({"op": "start", "session": "a", "buffer": 65536})
            # something else on the disk takes half of it; deleting it is "space returns"
            other = home / "other-program.dat"
            other.write_bytes(b"\0" * (1536 * 1024))
            told: dict[int, str] = {}
            refused: list[str] = []
            lock = threading.Lock()

            def sender(n: int) -> None:
                c = Client(d.port, d.token)
                try:
                    for i in range(400):
                        text = f"{n}-{i}-" + "z" * 4000
                        answer = c.call({"op": "send", "session": "a", "text": text})
                        with lock:
                            if answer["ok"]:
                                told[answer["seq"]] = text
                            else:
                                assert answer["code"] == "store_failed", answer
                                refused.append(answer["message"])
                        if len(refused) > 20:
                            return
                finally:
                    c.close()

            threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert refused, "the disk never filled: the test proved nothing"
            assert any("full" in m for m in refused), refused[:3]
            print(f"\ndisk full: {len(told)} sends stored, {len(refused)} refused")

            # reads go on; what was told stored is there, with no gap
            ring = setup.ok({"op": "read", "session": "a", "after": 0})
            assert {f["seq"]: f["result"] for f in ring["firings"]} == told
            assert sorted(told) == list(range(1, len(told) + 1))

            # space returns: the daemon writes again without a restart
            other.unlink()
            db = home / "repl.db"
            seq = setup.ok({"op": "send", "session": "a", "text": "after"})["seq"]
            assert seq == len(told) + 1
            d.close_clients()
            d.stop()
            with sqlite3.connect(db) as check:
                assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            check.close()
            d.start()
            again = d.client().ok({"op": "read", "session": "a", "after": 0})
            assert again["firings"][-1]["result"] == "after"
            assert again["next"] == seq
        finally:
            d.close_clients()
            d.stop()


def test_a_cli_reader_killed_between_printing_and_acknowledging_loses_nothing(
    inproc: InProcDaemon,
) -> None:
    """SIGKILL ``repl wait`` while its output sits untaken in the pipe: no ack, redelivery."""
    repl = Repl(inproc)
    session = repl.session("k")
    repl.ok("send", session, "first")
    repl.ok("send", session, "second")
    proc = subprocess.Popen(repl_argv("wait", session), stdout=subprocess.PIPE, env=repl.env)
    assert proc.stdout is not None
    try:
        # it printed (the bytes are in the pipe) and now waits for us to take them
        eventually(lambda: unread(proc) > 0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.stdout.close()
    assert repl.ok("read", session, "--cursor", "wait", "--peek") == "on-message: first\n" + (
        "on-message: second\n"
    )
    assert repl.ok("wait", session) == "on-message: first\non-message: second\n"
    nothing = repl.run("wait", session, "--timeout", "0.2")
    assert (nothing.returncode, nothing.stdout) == (2, "")
