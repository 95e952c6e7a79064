"""The raw client: the wire protocol over a plain blocking socket, as a user's program speaks it."""

from __future__ import annotations

import json
import select
import socket
import time
from typing import Any

# -- the raw client ------------------------------------------------------------


class Client:
    """A blocking JSON-lines client, one request at a time unless told otherwise."""

    def __init__(self, port: int, token: str | None = None, timeout: float = 10) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer = b""
        if token is not None:
            try:
                answer = self.call({"op": "auth", "token": token})
            except BaseException:
                self.sock.close()
                raise
            if not answer["ok"]:
                self.sock.close()
                raise AssertionError(answer)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(request).encode() + b"\n")

    def readline(self) -> bytes:
        """One line from the daemon, or b"" once it closed the connection."""
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                line, self.buffer = self.buffer, b""
                return line
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    def recv(self) -> dict[str, Any]:
        line = self.readline()
        if not line:
            raise ConnectionError("daemon closed the connection")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def pending(self, seconds: float) -> bool:
        """True when an answer arrives within ``seconds`` (without reading it)."""
        if self.buffer:
            return True
        ready, _, _ = select.select([self.sock], [], [], seconds)
        return bool(ready)

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self.send(request)
        return self.recv()

    def ok(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = self.call(request)
        assert answer["ok"], answer
        return answer

    def closed(self) -> bool:
        """True once the daemon has closed this connection (reads what is left)."""
        try:
            while self.readline():
                pass
        except (ConnectionResetError, TimeoutError):
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def answered(clients: list[Client], seconds: float = 0.2) -> list[Client]:
    """The clients that have an answer waiting after ``seconds`` (one wait for them all)."""
    time.sleep(seconds)
    return [c for c in clients if c.pending(0)]


def pipelined(c: Client, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every request, then read every answer (one commit takes many)."""
    c.send_raw(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
    return [c.recv() for _ in requests]
