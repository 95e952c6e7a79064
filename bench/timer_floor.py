"""The timer floor: a bare event loop that fires timers at wall-clock times, for the lateness row.

Each request line is ``{"id": N, "at_ms": MS}`` (milliseconds since the
epoch, UTC, as a daemon's ``due_ms``). The server turns the wall time into
a delay on the loop's clock, as the daemon does (``loop.call_later`` of
``at_ms`` minus now), and when the callback runs writes ``{"id": N,
"fired_ms": MS}`` back on the same connection: no store, no session, no
framing beyond one JSON line. A callback that runs before its due time (the
loop's clock and the wall clock differ by rounding) waits again for the
rest, as the daemon does, so that no timer fires early. What this costs is
the event loop's own timer and the socket, the floor under any Python
daemon's timer.

On uvloop when it is installed, as the daemon's ``--loop auto`` is;
``--loop asyncio`` forces the standard loop. Standard library (and uvloop)
only, run as a script: ``python bench/timer_floor.py --port 0`` prints
``listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from importlib.util import find_spec


def fire(writer: asyncio.StreamWriter, ident: int, at_ms: int) -> None:
    """Write the timer's line, or wait again if the loop woke before its due time."""
    now = time.time() * 1000
    if now < at_ms:  # uvloop's timers are whole ms on a clock read once a turn: early by < 1 ms
        asyncio.get_running_loop().call_later((at_ms - now) / 1000, fire, writer, ident, at_ms)
    elif not writer.is_closing():
        writer.write(json.dumps({"id": ident, "fired_ms": now}).encode() + b"\n")


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    handles: list[asyncio.TimerHandle] = []
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            request = json.loads(line)
            at_ms = request["at_ms"]
            delay = (at_ms - time.time() * 1000) / 1000
            handles.append(loop.call_later(max(delay, 0.0), fire, writer, request["id"], at_ms))
    except (ConnectionError, ValueError, KeyError):
        pass
    finally:
        for handle in handles:
            handle.cancel()
        writer.close()


async def serve(host: str, port: int) -> None:
    server = await asyncio.start_server(handle, host, port, limit=1 << 20)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on {host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/timer_floor.py")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--loop", choices=("auto", "asyncio"), default="auto")
    args = parser.parse_args()
    if args.loop == "auto" and find_spec("uvloop") is not None:
        import uvloop

        uvloop.run(serve(args.host, args.port))
    else:
        asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
