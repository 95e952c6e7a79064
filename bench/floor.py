"""The floor: a bare asyncio JSON-lines server, to show what Python itself costs.

It answers every request line with the same small JSON object, without
decoding the request, authenticating, or keeping any state. Whatever the
daemon costs above this server is the daemon's own work (framing, msgspec,
anyio, the session core); what this server costs is the interpreter and
asyncio. Standard library only, run as a script:
``python bench/floor.py --port 0`` prints ``listening on HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio

ANSWER = b'{"ok":true,"seq":1}\n'


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            line = await reader.readline()
            if not line:
                break
            writer.write(ANSWER)
            await writer.drain()
    except (ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def serve(host: str, port: int) -> None:
    server = await asyncio.start_server(handle, host, port, limit=1 << 20, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on {host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/floor.py")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
