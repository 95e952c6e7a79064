"""What a ``--store`` URL names (``Target``), and the one way a failure of Redis is told."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from session.errors import StoreFailed


class Target:
    """What a ``--store`` URL names, with the password kept out of ``name``.

    ``asked`` is the URL's ``?replicas=N``, None when it has none; ``replicas``
    is the number in use, which ``RedisStore.open`` settles when none was asked
    (``choose_replicas``).
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme
        if scheme not in ("redis", "rediss", "redis+cluster", "rediss+cluster"):
            raise StoreFailed(
                f"store URL scheme {scheme!r} is not one of redis://, rediss://, "
                "redis+cluster:// (see `repl daemon --help`)"
            )
        self.cluster = scheme.endswith("+cluster")
        self.tls = scheme.startswith("rediss")
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        query = parse_qs(parts.query)
        replicas = query.pop("replicas", [None])[-1]
        if replicas is not None and not replicas.isdigit():
            raise StoreFailed(f"?replicas={replicas} in the store URL is not a number")
        self.asked = None if replicas is None else int(replicas)
        #: how many replicas each change waits for (``WAIT``)
        self.replicas = self.asked or 0
        if query:
            raise StoreFailed(
                f"the store URL has options repl does not know: {', '.join(sorted(query))}"
            )
        hostports = parts.netloc.rpartition("@")[2]
        self.nodes: list[tuple[str, int]] = []
        for hostport in hostports.split(","):
            host, _, port = hostport.rpartition(":")
            if not host or not port.isdigit():
                raise StoreFailed(f"{hostport!r} in the store URL is not HOST:PORT")
            self.nodes.append((host.strip("[]"), int(port)))
        if not self.cluster and len(self.nodes) != 1:
            raise StoreFailed("a redis:// URL names one HOST:PORT; redis+cluster:// takes several")
        path = parts.path.strip("/") or "0"
        if not path.isdigit():
            raise StoreFailed(f"the database {path!r} in the store URL is not a number")
        self.db = int(path)
        if self.cluster and self.db != 0:
            raise StoreFailed("a Redis Cluster has database 0 only: leave /DB out of the URL")
        user = f"{quote(self.username)}:***@" if self.username else ":***@" if self.password else ""
        where = ",".join(f"{h}:{p}" for h, p in self.nodes)
        tail = "" if self.cluster else f"/{self.db}"
        self._bare = f"{scheme}://{user}{where}{tail}"
        #: settled: ``replicas`` is the number in use (the URL's, or what ``open`` chose)
        self.settled = self.asked is not None

    @property
    def name(self) -> str:
        """The URL as logs, ``ping`` and ``stats`` show it: never with the password, and with
        the replicas each change waits for once that is settled."""
        return f"{self._bare}?replicas={self.replicas}" if self.settled else self._bare

    def client_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "username": self.username,
            "password": self.password,
            "socket_keepalive": True,
            "socket_connect_timeout": 2,
            "decode_responses": False,
        }
        if self.tls:
            options["ssl"] = True
        return options


def reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def failed(target: Target, exc: BaseException) -> StoreFailed:
    """What a call that Redis (or the link to it) failed is answered."""
    return StoreFailed(f"redis at {target.name} failed: {reason(exc)}")
