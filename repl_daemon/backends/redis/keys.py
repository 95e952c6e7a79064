"""The Redis store's keys and channels: which a session, a timer partition and the tokens use.

Each session lives under keys with the hash tag ``{ID}`` (one hash slot, so
the same layout runs on one Redis and on a Redis Cluster); the scripts
(``scripts``) take them in the order ``session_keys`` gives. The timer
partitions (``~t0`` to ``~t7``) and the tokens (``~auth``) have keys of the
same shape under names no session id can take (``~`` is not allowed in one).
"""

from __future__ import annotations

import zlib

#: the partitions of the timer index (``repl:{~tN}:due``); every daemon sharing a store
#: must agree on it, so it is fixed. On a cluster they spread over the primaries.
PARTITIONS = 8

# groups and outbox (SPEC §16) after the rest, so that every older script's KEYS hold
_PARTS: tuple[str, ...] = ("meta", "ring", "cursors", "keys", "keyorder", "wake", "timers", "due")
_PARTS += ("groups", "outbox")


def session_keys(session_id: str) -> list[str]:
    """A session's keys, in the order every script takes them."""
    tag = f"repl:{{{session_id}}}"
    return [f"{tag}:{part}" for part in _PARTS]


def partition_of(session_id: str) -> str:
    """The timer partition a session's timers are indexed in: ``~t0`` to ``~t7``.

    A partition's name is no session id (``~`` is not allowed in one), so its
    keys and its wake channel (``repl:{~tN}:wake``) never meet a session's.
    """
    return f"~t{zlib.crc32(session_id.encode()) % PARTITIONS}"


PARTITION_IDS = tuple(f"~t{n}" for n in range(PARTITIONS))


def partition_keys(partition: str) -> list[str]:
    """A partition's index of due timers and its channel, as ``CLAIM`` and ``INDEX`` take them."""
    return [f"repl:{{{partition}}}:due", wake_channel(partition)]


#: where the scoped tokens are kept (``auth_keys``); as the timer partitions, no session id
AUTH = "~auth"


def auth_keys(_: str) -> list[str]:
    """The tokens' keys and channel, as the ``TOKEN_*`` scripts take them."""
    return [f"repl:{{{AUTH}}}:names", f"repl:{{{AUTH}}}:tokens", wake_channel(AUTH)]


def is_partition(name: str) -> bool:
    return name.startswith("~t")


def wake_channel(session_id: str) -> str:
    return f"repl:{{{session_id}}}:wake"


def channel_session(channel: str) -> str | None:
    """The session id a wake channel belongs to; None for any other channel."""
    if channel.startswith("repl:{") and channel.endswith("}:wake"):
        return channel[len("repl:{") : -len("}:wake")]
    return None
