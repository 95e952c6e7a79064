"""TLS for the daemon's listeners (rules L1-L3): one certificate, reloadable, and no clear
text beyond loopback unless asked for.

The standard library's ``ssl`` does the work: the line protocol is served by
asyncio's own TLS transport (``loop.create_server(ssl=...)``) and HTTP by
uvicorn's, over the same ``SSLContext``. Its defaults are Python's for a
server (``ssl.PROTOCOL_TLS_SERVER``: the system's ciphers, no compression),
with TLS 1.2 as the oldest version spoken.

``Certificate.reload`` (SIGHUP) loads the files again into that context: a
handshake from then on presents the new certificate, and connections already
made keep theirs, so nobody is dropped. A pair that does not load (a key
that does not match, a file half written) is refused whole, and the daemon
keeps serving the old one.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
from pathlib import Path

from session.errors import ConfigError

log = logging.getLogger("repl.daemon")


class Certificate:
    """The daemon's certificate and key, as one server ``SSLContext`` both listeners share."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = cert
        self.key = key
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load(self.context)

    def _load(self, context: ssl.SSLContext) -> None:
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
            raise ConfigError(
                f"cannot load the TLS certificate {self.cert} with its key {self.key}: {reason}"
            ) from None

    def reload(self) -> bool:
        """Load the files again (SIGHUP); False, the old pair kept, when they do not load."""
        try:
            self._load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))  # the new pair, tried first
            self._load(self.context)
        except ConfigError as exc:
            log.error("%s; still serving the certificate loaded before", exc)
            return False
        log.info("reloaded the TLS certificate %s", self.cert)
        return True


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (a name is resolved)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False  # the bind will say that it does not resolve
    return bool(found) and all(ipaddress.ip_address(row[4][0]).is_loopback for row in found)


def refuse_clear_text(listeners: list[tuple[str, str]], *, tls: bool, insecure: bool) -> None:
    """Refuse, in one line, to listen beyond loopback without TLS (unless ``insecure``).

    ``listeners`` are (the option that named it, host): ``--addr`` and ``--http``.
    """
    if tls or insecure:
        return
    for option, host in listeners:
        if not is_loopback(host):
            raise ConfigError(
                f"refusing to listen on {host} ({option}) without TLS: tokens would cross the "
                "network in clear text; give --tls-cert FILE --tls-key FILE, or --insecure "
                "if this network is yours alone"
            )
