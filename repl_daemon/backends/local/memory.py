"""The store that keeps nothing: ``repl daemon --memory``."""

from __future__ import annotations

from collections.abc import Collection

from session.delta import Delta
from session.ring import Image
from session.scopes import TokenRecord
from session.session import Snapshot


class MemoryStore:
    """Every write succeeds at once, and a restart starts with no sessions."""

    name = "memory"
    durable = False

    def load(self) -> list[Snapshot]:
        return []

    def load_sessions(self, session_ids: Collection[str]) -> dict[str, Snapshot | None]:
        return dict.fromkeys(session_ids)

    def write(self, batch: list[Delta]) -> None:
        pass

    def keep_images(self, images: list[tuple[str, Image]]) -> int:
        return 0

    def load_tokens(self) -> list[TokenRecord]:
        return []

    def put_token(self, record: TokenRecord) -> None:
        pass

    def drop_token(self, name: str) -> None:
        pass

    def close(self) -> None:
        pass
