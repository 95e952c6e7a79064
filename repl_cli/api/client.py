"""A blocking client of the daemon's wire protocol: one socket, JSON lines.

The CLI runs once per command (a monitor runs ``repl wait`` again after
every wake), so this module stays cheap to import: a plain socket,
msgspec and the shared ``repl_daemon.protocol``, never anyio. It connects
on first use, sends ``auth`` with the token from the daemon's home, and
turns error answers and socket failures into the library's typed errors
(``repl_cli.api.errors``).
"""

from __future__ import annotations

import os
import select
import socket
import time
from pathlib import Path
from typing import Any, Self, TypeVar

import msgspec

from repl_cli.api.errors import (
    AnswerLost,
    BadInput,
    Error,
    Misconfigured,
    ProtocolError,
    TooLong,
    Unauthorized,
    Unavailable,
    from_wire,
)
from repl_daemon import protocol as p
from repl_daemon.locations import DEFAULT_ADDR, TLS_SCHEME, default_home, split_addr
from session.errors import Code

# how long an ordinary request may take; a wait has no client-side limit
CALL_TIMEOUT = 30.0

R = TypeVar("R", bound=p.Response)

#: ``receive``'s default timeout: the client's own ``timeout`` (None waits for ever)
OWN_TIMEOUT = -1.0

_decode_any = msgspec.json.Decoder().decode


__all__ = ["DEFAULT_ADDR", "Client", "default_home", "parse_addr"]


def parse_addr(addr: str, where: str = "") -> tuple[str, int]:
    """``HOST:PORT`` or ``tls://HOST:PORT``; ``where`` names where it came from
    (" (from REPL_ADDR)") in the error."""
    split = split_addr(addr.removeprefix(TLS_SCHEME))
    if split is None:
        raise BadInput(f"address {addr!r}{where} is not HOST:PORT (for example {DEFAULT_ADDR})")
    return split


#: a first answer this late makes the client ask whether an HTTP server is what answers
#: there (the daemon's ``--http`` port given as ``--addr``): one would wait for the rest of
#: a request head until the client's own timeout
HTTP_PROBE_AFTER = 1.0


def encoded(request: p.Request) -> bytes:
    """``request`` on the wire; a request over the daemon's line limit is refused here,
    before anything is sent (the daemon would close the connection part-way)."""
    data = p.encode(request)
    if len(data) - 1 > p.MAX_LINE:
        raise TooLong(
            f"the request is {len(data) - 1:,} bytes, over the {p.MAX_LINE:,} bytes (1 MiB) a "
            "request may take: the text must fit in that with its JSON escaping (a quote or "
            "a newline takes 2 bytes, a control character 6); send it in parts, for example "
            "with `--lines`",
            Code.LINE_TOO_LONG,
        )
    return data


def decode_answer(line: bytes, expect: type[R], addr: str, from_env: str = "") -> R:
    """One answer line as ``expect``; an error answer, or one that is not, as an ``Error``."""
    if line.startswith(b"HTTP/"):
        raise not_a_daemon(addr, from_env)
    try:
        raw: Any = _decode_any(line)
        if not isinstance(raw, dict):
            raise msgspec.ValidationError("an answer must be a JSON object")
        if raw.get("ok") is not True:
            raise from_wire(str(raw.get("code")), str(raw.get("message")))
        return msgspec.convert(raw, expect)
    except msgspec.ValidationError as exc:
        raise ProtocolError(
            f"the daemon at {addr} answered something this client cannot read ({exc}): "
            "are the daemon and the CLI the same version?"
        ) from None
    except msgspec.DecodeError:  # not JSON at all (a ValidationError is one too)
        raise Misconfigured(
            f"what answers at {addr}{from_env} is not a repl daemon "
            f"(it answered {bytes(line[:40])!r}): is the address right?"
        ) from None


def _connect(host: str, port: int, timeout: float = CALL_TIMEOUT) -> socket.socket:
    """Connect; an IP address skips getaddrinfo, whose idna codec costs every run ms."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
        except OSError:
            continue
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect((host, port))
        except BaseException:
            sock.close()
            raise
        return sock
    return socket.create_connection((host, port), timeout=timeout)


def no_daemon(addr: str, reason: str, from_env: str = "") -> Unavailable:
    """Nothing answers at ``addr``: the one wording of both APIs and the CLI."""
    return Unavailable(f"no daemon at {addr}{from_env} ({reason}): start one with `repl daemon`")


def no_answer(addr: str, seconds: float) -> Unavailable:
    """The daemon took longer than a request may."""
    return Unavailable(
        f"the daemon at {addr} did not answer within {seconds:g} s: "
        "see its log (daemon.log in its state directory)"
    )


def connection_closed(addr: str, reason: str = "") -> AnswerLost:
    """The daemon closed the connection, or it broke, before an answer came; ``reason`` the
    system's words."""
    because = f" ({reason})" if reason else ""
    return AnswerLost(
        f"the daemon at {addr} closed the connection{because}: "
        "check it with `repl ping` and run the command again"
    )


def closed_by_daemon(sock: Any, buffered: int) -> bool:
    """Whether the daemon wrote to, or closed, a connection that owes no answer: looked at
    before a request is written on it, without blocking, by both APIs (``sock`` the socket,
    the raw one under anyio's; ``buffered`` the bytes the client read and did not use).

    The daemon writes nothing unasked but the line it closes a connection with (its idle
    timeout's ``idle_timeout``, a revoked token's refusal), and a daemon that stopped or
    died left an end of stream: whatever there is to read, the connection is finished,
    and is replaced before anything is sent on it (the request is then certainly not
    run twice: it was never written on the old one). TLS's own records (a session ticket
    that came after the auth's answer) would look the same and cost one needless
    reconnect, never a wrong answer.
    """
    pending = getattr(sock, "pending", None)  # what TLS decrypted already is not polled
    if buffered or (pending is not None and pending()):
        return True
    return bool(select.select([sock], [], [], 0)[0])


class Where:
    """Where a daemon is and who we are to it: its address (``REPL_ADDR``, else the
    default), its home (whose ``token`` file is the root token), the token (given,
    ``--token-file``, ``REPL_TOKEN``, else the root's), and TLS. Both APIs connect by
    it: ``Client`` (blocking, a socket) is one, ``repl_cli.api.aio.AsyncRepl`` holds one."""

    def __init__(
        self,
        addr: str | None = None,
        home: str | Path | None = None,
        *,
        addr_from_env: bool = False,
        token: str | None = None,
        token_file: str | Path | None = None,
        tls_ca: str | Path | None = None,
    ) -> None:
        from_env = addr_from_env or (not addr and bool(os.environ.get("REPL_ADDR")))
        #: a scoped token (rules K1-K5): given, read from ``token_file``, or ``REPL_TOKEN``;
        #: with none of them, the root token in ``home``
        self.token = token
        self.token_file = Path(token_file) if token_file else None
        self.addr = addr or os.environ.get("REPL_ADDR") or DEFAULT_ADDR
        #: how an error names where the address came from
        self._from_env = " (from REPL_ADDR)" if from_env else ""
        self.home = Path(home) if home else default_home()
        #: TLS (rules L1-L3): with an address written tls://HOST:PORT, or a CA to trust given
        #: (``--tls-ca``, ``REPL_TLS_CA``); without a CA, the system's trusted ones
        ca = tls_ca or os.environ.get("REPL_TLS_CA") or None
        self.tls_ca = Path(ca) if ca else None
        self.tls = self.addr.startswith(TLS_SCHEME) or self.tls_ca is not None
        self._tls_context: Any = None
        self._addr_from_env = addr_from_env

    @property
    def token_path(self) -> Path:
        return self.home / "token"

    def tls_context(self) -> Any:
        """The ``ssl.SSLContext`` that checks the daemon's certificate and host name."""
        if self._tls_context is None:
            import ssl  # only with TLS: the CLI's plain runs need not load it

            try:
                ca = None if self.tls_ca is None else str(self.tls_ca)
                self._tls_context = ssl.create_default_context(cafile=ca)
            except (OSError, ssl.SSLError) as exc:
                reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
                raise Misconfigured(
                    f"cannot load the CA certificate {self.tls_ca} (--tls-ca, REPL_TLS_CA): "
                    f"{reason}"
                ) from None
        return self._tls_context

    def token_source(self) -> str:
        """Which token this is, for a refusal of it (never the token itself)."""
        if self.token:
            return "given to the client"
        if self.token_file is not None:
            return f"read from {self.token_file} (--token-file)"
        if os.environ.get("REPL_TOKEN", "").strip():
            return "REPL_TOKEN"
        return (
            f"the root token read from {self.token_path}: point --home (or REPL_HOME) "
            "at the daemon's state directory"
        )

    def auth_token(self) -> str:
        """The token to authenticate with: the one given, ``--token-file``'s, ``REPL_TOKEN``,
        else the daemon's root token in its home."""
        if self.token:
            return self.token
        if self.token_file is not None:
            return _read_token(self.token_file, "check the --token-file path")
        given = os.environ.get("REPL_TOKEN", "").strip()
        if given:
            return given
        return _read_token(
            self.token_path, "point --home (or REPL_HOME) at the daemon's state directory"
        )

    def refused(self, exc: Error) -> Error:
        """An ``auth``'s refusal as both APIs tell it: which token was refused."""
        if exc.code == Code.UNAUTHORIZED:
            return Unauthorized(f"{exc.message}; this one was {self.token_source()}", exc.code)
        return exc


class Opening:
    """How a connection is opened, authenticated and probed, with no I/O of its own: the
    blocking client (a socket) and the async API (an anyio stream) both drive it, so each
    step's failure has one meaning and one wording under both (h11's way: the rules
    here, the I/O with the caller).

    The steps: connect to ``host:port`` (over TLS when ``where`` says); send ``auth()``;
    when its answer is slow (``HTTP_PROBE_AFTER``), ask whether an HTTP server answers
    there and hand the finding to ``slow``; when the daemon refuses without a code (the
    connection closed), ask whether TLS is spoken there if ``probe_tls`` says to, and hand
    both to ``failed``.
    """

    def __init__(self, where: Where) -> None:
        self.where = where
        self.host, self.port = parse_addr(where.addr, where._from_env)

    def connect_failed(self, exc: OSError, handshake: bool = False) -> Error:
        """The connect failed (no daemon there), or the TLS handshake did."""
        where = self.where
        if handshake:
            return tls_failure(exc, where.addr, where._from_env)
        reason = exc.strerror or str(exc) or type(exc).__name__
        return no_daemon(where.addr, reason, where._from_env)

    def auth(self) -> p.Auth:
        return p.Auth(token=self.where.auth_token())

    def slow(self, http_answers: bool) -> Error | None:
        """The auth's answer is slow: what an HTTP server answering there means (None: wait
        on for the daemon)."""
        return not_a_daemon(self.where.addr, self.where._from_env) if http_answers else None

    def probe_tls(self, exc: Error) -> bool:
        """Whether to ask if TLS is spoken there: a plain connection closed before its
        first answer."""
        return exc.code is None and not self.where.tls

    def failed(self, exc: Error, speaks_tls: bool = False) -> Error:
        """The auth failed: a daemon that speaks TLS, or which token was refused."""
        if speaks_tls:
            return plain_to_tls(self.where.addr, self.where._from_env)
        return self.where.refused(exc)


class Client(Where):
    """One connection to the daemon, opened on the first request (blocking, a socket)."""

    def __init__(
        self,
        addr: str | None = None,
        home: str | Path | None = None,
        *,
        addr_from_env: bool = False,
        token: str | None = None,
        token_file: str | Path | None = None,
        tls_ca: str | Path | None = None,
    ) -> None:
        super().__init__(
            addr,
            home,
            addr_from_env=addr_from_env,
            token=token,
            token_file=token_file,
            tls_ca=tls_ca,
        )
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._scanned = 0
        self._outstanding = 0  # requests sent and not yet answered
        #: how long connecting, and an ordinary request, may take (not a wait)
        self.timeout = CALL_TIMEOUT
        #: a daemon answered this client once: only then is a lost connection an outage to
        #: ride out (rules C10); a first connection that fails is 75 at once
        self.connected_once = False

    def fresh(self) -> Self:
        """A new client of this kind with this one's identity (address, home, token, TLS),
        unconnected."""
        twin = type(self)(
            self.addr,
            self.home,
            addr_from_env=self._addr_from_env,
            token=self.token,
            token_file=self.token_file,
            tls_ca=self.tls_ca,
        )
        twin.timeout = self.timeout
        twin.connected_once = self.connected_once
        return twin

    # -- the connection ----------------------------------------------------

    def connect(self) -> None:
        """Open, authenticate and probe (``Opening``), over a socket."""
        opening = Opening(self)
        host, port = opening.host, opening.port
        try:
            sock = _connect(host, port, self.timeout)
        except OSError as exc:
            raise opening.connect_failed(exc) from None
        if self.tls:
            try:
                sock = self._handshake(sock, host)
            except OSError as exc:
                raise opening.connect_failed(exc, handshake=True) from None
        sock.settimeout(None)  # deadlines are kept by _fill (a subclass may watch more there)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        try:  # a token that cannot be read is no reason to probe for TLS
            auth = opening.auth()
        except Error:
            self.close()
            raise
        try:
            self._write(encoded(auth))  # not send: the connection is the one just opened
            if not self._readable(HTTP_PROBE_AFTER):
                slow = opening.slow(http_answers(host, port, self.tls))
                if slow is not None:
                    self.close()
                    raise slow
            self.receive(p.Done)
        except Error as exc:
            tls = opening.probe_tls(exc) and speaks_tls(host, port)
            raise opening.failed(exc, tls) from None
        self.connected_once = True

    def _handshake(self, sock: socket.socket, host: str) -> socket.socket:
        try:
            return self.tls_context().wrap_socket(sock, server_hostname=host)  # type: ignore[no-any-return]
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf.clear()
        self._scanned = 0
        self._outstanding = 0

    # -- requests ----------------------------------------------------------

    def call(
        self, request: p.Request, expect: type[R], *, timeout: float | None = OWN_TIMEOUT
    ) -> R:
        """Send one request and decode its answer as ``expect`` (``receive`` says what
        ``timeout`` is)."""
        if self._outstanding:  # a call cut off (Ctrl-C, a reader gone) left its answer owed
            self.close()
        self.send(request)
        return self.receive(expect, timeout=timeout)

    def send(self, request: p.Request) -> None:
        self.send_raw(encoded(request))

    def send_raw(self, data: bytes) -> None:
        """Put encoded requests on the wire (several at once when pipelining), on a new
        connection when the daemon closed this one meanwhile (``closed_by_daemon``)."""
        sock = self._sock
        if sock is not None and not self._outstanding and closed_by_daemon(sock, len(self._buf)):
            self.close()
        if self._sock is None:
            self.connect()
        self._write(data)

    def _write(self, data: bytes) -> None:
        assert self._sock is not None
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise self._lost(exc) from None
        self._outstanding += data.count(b"\n")

    def receive(self, expect: type[R], *, timeout: float | None = OWN_TIMEOUT) -> R:
        """The next answer as ``expect``, or its error as an ``Error``. ``timeout`` None
        waits for ever (a wait op); by default it is the client's own ``timeout``."""
        line = self._line(self.timeout if timeout == OWN_TIMEOUT else timeout)
        self._outstanding -= 1
        return decode_answer(line, expect, self.addr, self._from_env)

    def _line(self, timeout: float | None) -> bytes:
        buf = self._buf
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            end = buf.find(b"\n", self._scanned)
            if end >= 0:
                line = bytes(buf[:end])
                del buf[: end + 1]
                self._scanned = 0
                return line
            self._scanned = len(buf)
            self._fill(deadline)

    def _readable(self, within: float) -> bool:
        """Whether an answer (or the connection's end) arrives within ``within`` s."""
        sock = self._sock
        assert sock is not None
        pending = getattr(sock, "pending", None)  # what TLS decrypted already
        if self._buf or (pending is not None and pending()):
            return True
        return bool(select.select([sock], [], [], within)[0])

    def _fill(self, deadline: float | None) -> None:
        sock = self._sock
        assert sock is not None, "receive before send"  # send_raw connects; _lost raises
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        pending = getattr(sock, "pending", None)  # what TLS decrypted already is not polled
        while not (pending is not None and pending()):
            wait_ms = None
            if deadline is not None:
                wait_ms = max(0, int((deadline - time.monotonic()) * 1000) + 1)
            if self._readable_within(poller, wait_ms):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise no_answer(self.addr, self.timeout)
        try:
            data = sock.recv(1 << 16)
        except OSError as exc:
            raise self._lost(exc) from None
        if not data:
            raise self._lost(None)
        self._buf += data

    def _readable_within(self, poller: select.poll, wait_ms: int | None) -> bool:
        """One wait of at most ``wait_ms`` (None: for ever) for the socket to be readable,
        and whether it is. A subclass may watch more meanwhile (the CLI's client ends a
        blocked wait when the reader of its stdout leaves)."""
        return bool(poller.poll(wait_ms))

    def _lost(self, exc: OSError | None) -> AnswerLost:
        self.close()
        return connection_closed(self.addr, "" if exc is None else str(exc.strerror or exc))


def _read_token(path: Path, hint: str) -> str:
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise Misconfigured(f"cannot read the token {path} ({reason}): {hint}") from None
    if not token:
        raise Misconfigured(f"the token file {path} is empty")
    return token


#: what an OpenSSL verification code means, and what to do (``tls_failure``)
_VERIFY = {
    10: "its certificate has expired: renew it, then send the daemon SIGHUP",
    9: "its certificate is not valid yet: check the clocks",
    18: "its certificate is self-signed: give it (or its CA) with --tls-ca FILE",
    19: "its certificate was signed by a CA this client does not trust: "
    "give the CA with --tls-ca FILE (or REPL_TLS_CA)",
    20: "its certificate was signed by a CA this client does not trust: "
    "give the CA with --tls-ca FILE (or REPL_TLS_CA)",
    21: "its certificate was signed by a CA this client does not trust: "
    "give the CA with --tls-ca FILE (or REPL_TLS_CA)",
    62: "its certificate is for another host name: connect by a name it holds",
    64: "its certificate is for another address: connect by a name or address it holds",
}


def tls_failure(exc: OSError, addr: str, from_env: str = "") -> Error:
    """The one line for a TLS handshake that failed: a certificate refused, no TLS at the
    other end (both ``Misconfigured``), or the daemon away (``Unavailable``)."""
    import ssl

    where = f"{addr}{from_env}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = getattr(exc, "verify_code", 0)
        message = (getattr(exc, "verify_message", "") or exc.reason or str(exc)).rstrip(".")
        what = _VERIFY.get(code, "give the CA that signed it with --tls-ca FILE")
        return Misconfigured(
            f"refused the certificate of the daemon at {where} ({message}): {what}"
        )
    if isinstance(exc, ssl.SSLError | ConnectionResetError | BrokenPipeError):
        reason = getattr(exc, "reason", None) or exc.strerror or type(exc).__name__
        return Misconfigured(
            f"the daemon at {where} does not speak TLS ({reason}): connect without tls:// "
            "and --tls-ca, or start the daemon with --tls-cert and --tls-key"
        )
    if isinstance(exc, TimeoutError):
        return Unavailable(f"the daemon at {where} did not finish the TLS handshake in time")
    return Unavailable(
        f"no daemon at {where} ({exc.strerror or exc}): start one with `repl daemon`"
    )


def speaks_tls(host: str, port: int, timeout: float = 2.0) -> bool:
    """Whether a TLS handshake succeeds at ``host:port`` (no certificate checked): asked
    only once a plain connection was closed before its first answer."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with _connect(host, port, timeout) as sock, context.wrap_socket(sock):
            return True
    except OSError:
        return False


def http_answers(host: str, port: int, tls: bool, timeout: float = 2.0) -> bool:
    """Whether an HTTP server answers at ``host:port`` (over TLS, no certificate checked):
    asked only when the first answer of a connection is slow to come."""
    request = f"HEAD / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode()
    try:
        with _connect(host, port, timeout) as raw:
            sock = raw
            if tls:
                import ssl

                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(raw)
            sock.sendall(request)
            return sock.recv(5) == b"HTTP/"
    except OSError:
        return False


def not_a_daemon(addr: str, from_env: str = "") -> Misconfigured:
    return Misconfigured(
        f"what answers at {addr}{from_env} is not a repl daemon (an HTTP server answers "
        "there): give the daemon's own address, not its --http one"
    )


def plain_to_tls(addr: str, from_env: str = "") -> Misconfigured:
    return Misconfigured(
        f"the daemon at {addr}{from_env} speaks TLS: connect with tls://{addr} "
        "(and --tls-ca FILE when a private CA signed its certificate)"
    )
