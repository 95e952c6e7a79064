"""The cross-daemon wake alone, for profiling: ``python -m bench.cross_wake [ROUNDS] [--profile]``.

Two daemons (A and B) on one redis-server of its own (persistence off), a
waiter blocked on B and the sends through A, as the scale-out table's
cross-daemon wake row measures them (``bench.waiters.repl_rounds``), with
50 rounds of warm-up on a session of their own. Prints the p50 and p99 in
µs. With ``--profile`` py-spy records both daemons while the timed rounds
run (``py-spy record --format raw --rate 500 --nonblocking``, which must be
on PATH), into ``cross-wake-a.txt`` and ``cross-wake-b.txt`` in the
current directory: one line per stack, its sample count last.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.measure import percentiles_us
from bench.procs import Daemon, RedisServer
from bench.waiters import repl_rounds


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv and argv[0].isdigit() else 2000
    profile = "--profile" in argv
    exe = shutil.which("redis-server")
    if exe is None:
        print("no redis-server on PATH", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="repl-cross-wake-") as tmp:
        work = Path(tmp)
        redis = RedisServer(exe, work / "redis", durable=False).start()
        url = f"redis://127.0.0.1:{redis.port}/0"
        a = Daemon(work / "a", memory=False, store=url).start()
        b = Daemon(work / "b", memory=False, store=url).start()
        spies: list[subprocess.Popen[bytes]] = []
        try:
            asyncio.run(repl_rounds(a, "warm", 1, 50, on=b))
            if profile:
                for name, daemon in (("a", a), ("b", b)):
                    argv_ = ["py-spy", "record", "-p", str(daemon.pid), "-f", "raw"]
                    argv_ += ["-o", f"cross-wake-{name}.txt", "-r", "500", "--nonblocking"]
                    spies.append(subprocess.Popen(argv_, stdout=subprocess.DEVNULL))
                time.sleep(1)  # py-spy attaches
            times = asyncio.run(repl_rounds(a, "timed", 1, rounds, on=b))
        finally:
            for spy in spies:
                spy.send_signal(2)
                spy.wait(30)
            b.stop()
            a.stop()
            redis.stop()
    print(", ".join(f"{name} {value:,.0f} µs" for name, value in percentiles_us(times)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
