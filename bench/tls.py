"""TLS beside plain TCP (SPEC §12): what the same figure costs over TLS, in one run.

Every figure is measured on a pair of servers of the same kind, one serving
plain TCP and one TLS, alive side by side, the two driven alternately
(request by request, batch by batch, connection by connection) so that both
see the same machine: the row's repl cell is the daemon over TLS, its
reference the daemon over plain TCP, and the ratio says what TLS costs.

- repl: two ``python -m repl_daemon --memory --settle-ms 0`` daemons, one
  with ``--tls-cert`` and ``--tls-key`` (asyncio's TLS transport, uvloop's
  when it is installed, as the daemon's ``--loop auto``).
- the floor (the rows' floor column, over TLS): bench/floor.py's handler,
  which answers every line with a fixed one, served by this module run as a
  script (``python bench/tls.py --port 0 [--tls-cert F --tls-key F]``) on
  the daemon's kind of event loop, over plain TCP and over TLS: what Python's
  ``ssl`` and the event loop's TLS transport cost alone.
- Redis (in the notes, when redis-server was built with TLS): one
  redis-server listening on a plain port and a ``--tls-port``, driven by
  redis-py's asyncio client: what TLS costs a server written in C, through
  the same kind of Python client.

The certificates are a throwaway CA and a certificate for 127.0.0.1 and
localhost that it signed, EC P-256 as GUIDE.md's recipe, made with the
``cryptography`` package (the bench extra) or, without it, the ``openssl``
command. Clients verify the certificate and the host name as the CLI does
(``ssl.create_default_context(cafile=CA)``).

- send round trip: one ``send`` at a time on one connection to each daemon,
  alternating, after a warm-up (the roundtrip row's method); the floor: the
  same line; Redis: ``XADD`` (MAXLEN 256, exact). A note gives the p99s and
  the CPU a request took in this process and in its server (/proc).
- pipelined: ``batch`` sends written at once, their answers read, a batch
  on the plain connection then one on the TLS one, until ``pipelined`` sends
  each (the pipelined row's method); the server's CPU per send in a note.
- connection set-up: what a ``repl`` run pays before its request, with a
  blocking socket as the CLI's: connect, a fresh client ``SSLContext``
  loading the CA, the handshake, the ``auth`` line and its answer; Redis:
  ``PING`` instead of ``auth``.
- ``repl send``: the whole process, ``tls://`` and ``REPL_TLS_CA`` against
  a plain address, alternating, median of ``cli_runs`` after one of each; a
  note gives what ``import ssl`` and the process's first ``SSLContext`` cost
  a fresh interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Self

if __package__ in (None, ""):  # run as a script: the floor server (see main)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.clients import READ_LIMIT, LineClient, encode
from bench.floor import handle as floor_handle
from bench.measure import (
    PAYLOAD,
    RING,
    Group,
    Setup,
    Sizes,
    fill_percentiles,
    percentile,
    percentile_rows,
    pipeline,
    run_async,
    send_request,
    xadd_each,
)
from bench.procs import HOST, BenchError, Child, Daemon, RedisServer, cpu_seconds, free_port
from bench.table import Goal, Row, number

KEYS = ("tls_rt_p50", "tls_rt_p99", "tls_pipe", "tls_connect", "tls_cli")
GOAL = Goal("report", 0, "report (× plain TCP)")
NO_CERTS = "no cryptography or openssl"
CERT_HINT = (
    "the tls rows need a throwaway CA: the bench extra's `cryptography` "
    "(`pip install -e '.[bench]'`) or the `openssl` command (`apt-get install openssl`)"
)
PACKAGES = ("session", "repl_daemon", "repl_cli")


def connects(s: Sizes) -> int:
    """New connections timed on each side of a pair: 500, 20 in the quick mode."""
    return max(20, s.round_trips // 20)


# -- the certificates ------------------------------------------------------------


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path
    tool: str


def make_certs(directory: Path) -> Certs | None:
    """A CA and a server certificate for 127.0.0.1 and localhost; None without a tool."""
    directory.mkdir(parents=True, exist_ok=True)
    if find_spec("cryptography") is not None:
        return _certs_cryptography(directory)
    openssl = shutil.which("openssl")
    return None if openssl is None else _certs_openssl(openssl, directory)


def _certs_cryptography(d: Path) -> Certs:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def usage(*, sign: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=not sign,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=sign,
            crl_sign=sign,
            encipher_only=False,
            decipher_only=False,
        )

    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    issued = (
        x509.CertificateBuilder()
        .issuer_name(name("repl bench CA"))
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
    )
    ca = (
        issued.subject_name(name("repl bench CA"))
        .public_key(ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage(sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
    cert = (
        issued.subject_name(name("localhost"))
        .public_key(key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage(sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    certs = Certs(d / "ca.crt", d / "daemon.crt", d / "daemon.key", "cryptography")
    certs.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    certs.key.touch(0o600)
    certs.key.write_bytes(pem)
    return certs


def _certs_openssl(exe: str, d: Path) -> Certs:
    certs = Certs(d / "ca.crt", d / "daemon.crt", d / "daemon.key", "openssl")
    ca_key, csr, ext = d / "ca.key", d / "daemon.csr", d / "daemon.ext"
    ext.write_text(
        f"subjectAltName=DNS:localhost,IP:{HOST}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    commands = [
        [
            *(exe, "req", "-x509", *ec, "-keyout", ca_key, "-out", certs.ca, "-days", "1"),
            *("-subj", "/CN=repl bench CA", "-addext", "basicConstraints=critical,CA:TRUE"),
            *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        ],
        [exe, "req", *ec, "-keyout", certs.key, "-out", csr, "-subj", "/CN=localhost"],
        [
            *(exe, "x509", "-req", "-in", csr, "-CA", certs.ca, "-CAkey", ca_key),
            *("-CAcreateserial", "-out", certs.cert, "-days", "1", "-extfile", ext),
        ],
    ]
    for argv in commands:
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise BenchError(f"openssl {argv[1]} exited {done.returncode}: {done.stderr[-500:]}")
    return certs


def client_context(certs: Certs) -> ssl.SSLContext:
    """What the CLI makes: the system's defaults for a client, trusting the CA."""
    return ssl.create_default_context(cafile=str(certs.ca))


# -- the servers -------------------------------------------------------------------


def loop_name() -> str:
    return "uvloop" if find_spec("uvloop") is not None else "asyncio"


class TlsDaemon(Daemon):
    """The benchmark's daemon (--memory, settle 0), over TLS when given certificates."""

    def __init__(self, workdir: Path, certs: Certs | None) -> None:
        super().__init__(workdir, memory=True, settle_ms=0)
        self.certs = certs

    def argv(self) -> list[str]:
        argv = super().argv()
        if self.certs is not None:
            argv += ["--tls-cert", str(self.certs.cert), "--tls-key", str(self.certs.key)]
        return argv


class LineFloor(Child):
    """bench/floor.py's handler served by this module, over TLS when given certificates."""

    name = "floor"

    def __init__(self, workdir: Path, certs: Certs | None) -> None:
        super().__init__(workdir)
        self.certs = certs

    def start(self) -> Self:
        argv = [sys.executable, str(Path(__file__).resolve()), "--port", "0"]
        if self.certs is not None:
            argv += ["--tls-cert", str(self.certs.cert), "--tls-key", str(self.certs.key)]
        self._spawn(argv, announce=True)
        self.port = self._read_announced_port(30.0)
        return self


class TlsRedis(RedisServer):
    """redis-server (no persistence) on a plain port and a TLS port (``tls_port``)."""

    def __init__(self, exe: str, workdir: Path, certs: Certs) -> None:
        super().__init__(exe, workdir, durable=False)
        self.certs = certs
        self.tls_port = 0

    def argv(self) -> list[str]:
        self.tls_port = free_port()
        return [
            *super().argv(),
            *("--tls-port", str(self.tls_port), "--tls-auth-clients", "no"),
            *("--tls-cert-file", str(self.certs.cert), "--tls-key-file", str(self.certs.key)),
            *("--tls-ca-cert-file", str(self.certs.ca)),
        ]


def start_both(first: Daemon | LineFloor, second: Daemon | LineFloor) -> None:
    """Start two servers at once (each waits on its own child's announcement); the
    caller's ``with`` stops them, started or not."""
    with ThreadPoolExecutor(2) as pool:
        for started in [pool.submit(first.start), pool.submit(second.start)]:
            started.result()


# -- the clients -------------------------------------------------------------------


class LineSide:
    """One JSON-lines connection (to a daemon or a floor), sending to one session."""

    def __init__(self, client: LineClient, session: str) -> None:
        self.client = client
        self.request = send_request(session)

    @classmethod
    async def open(
        cls, port: int, token: str | None, context: ssl.SSLContext | None, session: str
    ) -> LineSide:
        reader, writer = await asyncio.open_connection(
            HOST, port, limit=READ_LIMIT, ssl=context, server_hostname=HOST if context else None
        )
        client = LineClient(reader, writer)
        if token is not None:
            await client.ok({"op": "auth", "token": token})
            for name in (session, "cli"):  # "cli": the session `repl send` sends to
                await client.ok({"op": "start", "session": name})
        return cls(client, session)

    def tls(self) -> str:
        """The negotiated version and cipher ("" over plain TCP)."""
        sslobj = self.client.writer.get_extra_info("ssl_object")
        return "" if sslobj is None else f"{sslobj.version()} {sslobj.cipher()[0]}"

    async def once(self) -> None:
        answer = await self.client.call(self.request)
        if not answer.get("ok"):
            raise BenchError(f"send failed: {answer}")

    async def batch(self, count: int) -> None:
        # encoding is the client's work, as in the pipelined row
        await pipeline(self.client, [encode(self.request) for _ in range(count)], count)

    async def close(self) -> None:
        await self.client.close()


class RedisSide:
    """One redis.asyncio connection (plain or TLS), XADD to one stream."""

    def __init__(self, port: int, certs: Certs | None) -> None:
        import redis.asyncio

        tls: dict[str, Any] = {}
        if certs is not None:
            tls = {"ssl": True, "ssl_ca_certs": str(certs.ca), "ssl_check_hostname": True}
        self.client = redis.asyncio.Redis(
            host=HOST, port=port, single_connection_client=True, **tls
        )

    async def once(self) -> None:
        await self.client.xadd("rt", {"text": PAYLOAD}, maxlen=RING, approximate=False)

    async def batch(self, count: int) -> None:
        await xadd_each(self.client, ["pipe"] * count, count)

    async def close(self) -> None:
        await self.client.aclose()


Side = LineSide | RedisSide


@dataclass
class RoundTrips:
    plain: list[int]  # ns per request
    tls: list[int]
    client_cpu: tuple[float, float]  # this process's CPU µs per request: plain, TLS
    server_cpu: tuple[float, float] | None = None  # the servers', when they are two processes


async def round_trips(
    plain: Side, tls: Side, s: Sizes, pids: tuple[int, int] | None = None
) -> RoundTrips:
    """Nanoseconds per request on each side, alternating request by request, after a
    warm-up; the CPU each request took here, and in its server when ``pids`` are given."""
    times: tuple[list[int], list[int]] = ([], [])
    cpu = [0, 0]
    server0: list[float] = []
    for i in range(s.warmup + s.round_trips):
        if i == s.warmup and pids:
            server0 = [cpu_seconds(pid) for pid in pids]
        for k, side in enumerate((plain, tls)):
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            await side.once()
            t1, c1 = time.perf_counter_ns(), time.process_time_ns()
            if i >= s.warmup:
                times[k].append(t1 - t0)
                cpu[k] += c1 - c0
    out = RoundTrips(*times, (cpu[0] / 1e3 / s.round_trips, cpu[1] / 1e3 / s.round_trips))
    if pids:
        spent = [
            (cpu_seconds(pid) - c0) * 1e6 / s.round_trips
            for pid, c0 in zip(pids, server0, strict=True)
        ]
        out.server_cpu = (spent[0], spent[1])
    return out


@dataclass
class Pipelined:
    plain: float  # requests/s
    tls: float
    cpu_plain: float | None = None  # server CPU µs per request
    cpu_tls: float | None = None


async def pipelined(
    plain: Side, tls: Side, s: Sizes, pids: tuple[int, int] | None = None
) -> Pipelined:
    """Requests/s on each side, a batch on one then on the other; the servers' CPU per
    request when they are two processes (``pids``)."""
    for side in (plain, tls):
        await side.batch(s.batch)  # warm-up
    elapsed = [0.0, 0.0]
    cpu0 = [cpu_seconds(pid) for pid in pids] if pids else []
    done = 0
    while done < s.pipelined:
        count = min(s.batch, s.pipelined - done)
        for k, side in enumerate((plain, tls)):
            t0 = time.perf_counter()
            await side.batch(count)
            elapsed[k] += time.perf_counter() - t0
        done += count
    out = Pipelined(s.pipelined / elapsed[0], s.pipelined / elapsed[1])
    if pids:
        cpu = [
            (cpu_seconds(pid) - c0) * 1e6 / s.pipelined for pid, c0 in zip(pids, cpu0, strict=True)
        ]
        out.cpu_plain, out.cpu_tls = cpu
    return out


@dataclass
class Figures:
    """One pair's figures: ns per round trip and per new connection, each side."""

    rt: RoundTrips
    pipe: Pipelined
    connect: tuple[list[int], list[int]] = ([], [])
    tls: str = ""


async def line_pair(
    plain: Child, secure: Child, tokens: tuple[str | None, str | None], certs: Certs, s: Sizes
) -> Figures:
    """The round trips and pipelined sends of a plain server and its TLS twin."""
    sides = (
        await LineSide.open(plain.port, tokens[0], None, "tls-plain"),
        await LineSide.open(secure.port, tokens[1], client_context(certs), "tls-tls"),
    )
    try:
        pids = (plain.pid, secure.pid)
        rt = await round_trips(*sides, s, pids)
        pipe = await pipelined(*sides, s, pids)
        return Figures(rt, pipe, tls=sides[1].tls())
    finally:
        for side in sides:
            await side.close()


async def redis_pair(redis: TlsRedis, certs: Certs, s: Sizes) -> Figures:
    sides = (RedisSide(redis.port, None), RedisSide(redis.tls_port, certs))
    try:
        return Figures(await round_trips(*sides, s), await pipelined(*sides, s))
    finally:
        for side in sides:
            await side.close()


# -- connection set-up ---------------------------------------------------------------


def connect_once(
    port: int, certs: Certs | None, hello: bytes, check: Callable[[bytes], bool]
) -> int:
    """Nanoseconds from connecting to holding the answer to ``hello``, as a ``repl`` run
    does it: a blocking socket, and over TLS a fresh client context loading the CA."""
    t0 = time.perf_counter_ns()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(10)
        sock.connect((HOST, port))
        if certs is not None:
            sock = client_context(certs).wrap_socket(sock, server_hostname=HOST)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(hello)
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                raise BenchError(f"the server on port {port} closed the connection")
            data += chunk
        t1 = time.perf_counter_ns()
    finally:
        sock.close()
    if not check(data):
        raise BenchError(f"the server on port {port} answered {data!r}")
    return t1 - t0


def connections(
    ports: tuple[int, int],
    certs: Certs,
    hellos: tuple[bytes, bytes],
    check: Callable[[bytes], bool],
    s: Sizes,
) -> tuple[list[int], list[int]]:
    """New connections to the plain port then the TLS one, alternating, after a warm-up."""
    times: tuple[list[int], list[int]] = ([], [])
    warm = max(2, connects(s) // 10)
    for i in range(warm + connects(s)):
        for port, side_certs, hello, out in zip(ports, (None, certs), hellos, times, strict=True):
            took = connect_once(port, side_certs, hello, check)
            if i >= warm:
                out.append(took)
    return times


def answered_ok(data: bytes) -> bool:
    return bool(json.loads(data).get("ok"))


def context_ns(certs: Certs, count: int) -> float:
    """The median cost of a client context loading the CA (part of a TLS set-up)."""
    times = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        client_context(certs)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times)


# -- repl send, the whole process ----------------------------------------------------


def run_cli(argv: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}")
    return done.stdout


def cli_runs(setup: Setup, plain: Daemon, secure: Daemon, certs: Certs) -> tuple[float, float]:
    """Median ms of ``repl send`` to the plain daemon and to the TLS one, alternating."""
    assert setup.cli is not None
    # as an installed copy would be: compiled to bytecode (see bench/cli.py)
    packages = [str(Path(__file__).resolve().parent.parent / n) for n in PACKAGES]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)
    envs = [plain.env(), secure.env()]
    envs[0].pop("REPL_TLS_CA", None)
    envs[1] |= {"REPL_ADDR": f"tls://{HOST}:{secure.port}", "REPL_TLS_CA": str(certs.ca)}
    command = [str(setup.cli), "send", "cli", "hello"]
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(setup.sizes.cli_runs + 1):  # the first of each warms caches
        for env, out in zip(envs, times, strict=True):
            t0 = time.perf_counter()
            printed = run_cli(command, env)
            out.append((time.perf_counter() - t0) * 1000)
            if not printed.strip().isdigit():
                raise BenchError(f"repl send printed {printed!r}, not a seq")
    return statistics.median(times[0][1:]), statistics.median(times[1][1:])


# what a TLS run of the CLI loads beyond a plain one, timed in a fresh interpreter
SSL_START = """
import sys, time
import repl_cli.cli.main
t0 = time.perf_counter()
import ssl
t1 = time.perf_counter()
ssl.create_default_context(cafile=sys.argv[1])
t2 = time.perf_counter()
print((t1 - t0) * 1000, (t2 - t1) * 1000)
"""


def ssl_start_ms(certs: Certs, runs: int) -> tuple[float, float]:
    """Median ms of ``import ssl`` after the CLI's own imports, and of the first client
    context of the process (OpenSSL's first use), in fresh interpreters."""
    found: tuple[list[float], list[float]] = ([], [])
    for _ in range(runs):
        argv = [sys.executable, "-c", SSL_START, str(certs.ca)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        for value, out in zip(done.stdout.split(), found, strict=True):
            out.append(float(value))
    return statistics.median(found[0]), statistics.median(found[1])


# -- the rows --------------------------------------------------------------------------


def tls_rows(s: Sizes) -> list[Row]:
    return [
        *percentile_rows("tls_rt", "TLS send round trip {} (one connection, --memory), µs", GOAL),
        Row("tls_pipe", "TLS pipelined sends/s, one client, --memory", GOAL),
        Row(
            "tls_connect",
            f"TLS connection set-up p50 (connect, handshake, auth; {connects(s):,} new), µs",
            GOAL,
        ),
        Row("tls_cli", f"`repl send` over TLS, whole process (median of {s.cli_runs}), ms", GOAL),
    ]


def us(times: list[int], fraction: float) -> float:
    return percentile(times, fraction) / 1000


def pair_text(what: str, tls: list[float], plain: list[float]) -> str:
    """``what A / B TLS, C / D plain (× A/C / B/D)``."""
    ratios = " / ".join(f"{t / p:.2f}" for t, p in zip(tls, plain, strict=True))
    return (
        f"{what} {' / '.join(map(number, tls))} TLS, "
        f"{' / '.join(map(number, plain))} plain (× {ratios})"
    )


def latencies(what: str, times: tuple[list[int], list[int]]) -> str:
    plain, tls = times
    fractions = (0.5, 0.99)
    return pair_text(what, [us(tls, f) for f in fractions], [us(plain, f) for f in fractions])


def round_trip_text(what: str, rt: RoundTrips) -> str:
    """The latencies, and the CPU per request of the client (and of the server)."""
    text = latencies(what, (rt.plain, rt.tls))
    client = rt.client_cpu
    if rt.server_cpu is None:
        return f"{text}, client CPU per request {client[1]:.0f} µs TLS, {client[0]:.0f} plain"
    server = rt.server_cpu
    return (
        f"{text}, CPU per request {client[1]:.0f} µs client + {server[1]:.0f} server TLS, "
        f"{client[0]:.0f} + {server[0]:.0f} plain"
    )


def throughput(what: str, pipe: Pipelined) -> str:
    text = pair_text(what, [pipe.tls], [pipe.plain])
    if pipe.cpu_tls is not None and pipe.cpu_plain is not None:
        text += f", server CPU per send {pipe.cpu_tls:.1f} µs TLS, {pipe.cpu_plain:.1f} plain"
    return text


def tls(setup: Setup, rows: dict[str, Row]) -> None:
    s = setup.sizes
    certs = make_certs(setup.dir("tls-certs"))
    if certs is None:
        setup.cannot_run([rows[key] for key in KEYS], NO_CERTS, CERT_HINT)
        return
    with (
        TlsDaemon(setup.dir("tls-daemon-plain"), None) as plain,
        TlsDaemon(setup.dir("tls-daemon-tls"), certs) as secure,
    ):
        start_both(plain, secure)
        tokens = (plain.token, secure.token)  # each home has its own
        repl = run_async(line_pair(plain, secure, tokens, certs, s), s.deadline_s)
        hellos = tuple(encode({"op": "auth", "token": token}) for token in tokens)
        ports = (plain.port, secure.port)
        repl.connect = connections(ports, certs, (hellos[0], hellos[1]), answered_ok, s)
        cli, cli_note = None, ""
        if setup.cli is None:
            setup.cannot_run([rows["tls_cli"]], "CLI missing")
        else:
            cli = cli_runs(setup, plain, secure, certs)
            imports, first = ssl_start_ms(certs, max(1, s.cli_runs // 4))
            cli_note = (
                f"TLS `repl send`: of what TLS adds, `import ssl` (beyond the CLI's imports) "
                f"{imports:.1f} ms and the process's first client context {first:.1f} ms "
                "(median in fresh interpreters), then the handshake"
            )
    with (
        LineFloor(setup.dir("tls-floor-plain"), None) as floor_plain,
        LineFloor(setup.dir("tls-floor-tls"), certs) as floor_tls,
    ):
        start_both(floor_plain, floor_tls)
        floor = run_async(line_pair(floor_plain, floor_tls, (None, None), certs, s), s.deadline_s)
        ports = (floor_plain.port, floor_tls.port)
        floor.connect = connections(ports, certs, (hellos[0], hellos[0]), answered_ok, s)
    redis = redis_figures(setup, certs) if setup.redis_exe else None

    fill_percentiles(rows, "tls_rt", "repl", repl.rt.tls)
    fill_percentiles(rows, "tls_rt", "reference", repl.rt.plain)
    fill_percentiles(rows, "tls_rt", "floor", floor.rt.tls)
    rows["tls_pipe"].repl = repl.pipe.tls
    rows["tls_pipe"].reference = repl.pipe.plain
    rows["tls_pipe"].floor = floor.pipe.tls
    rows["tls_connect"].repl = us(repl.connect[1], 0.5)
    rows["tls_connect"].reference = us(repl.connect[0], 0.5)
    rows["tls_connect"].floor = us(floor.connect[1], 0.5)
    if cli is not None:
        rows["tls_cli"].reference, rows["tls_cli"].repl = cli

    pairs = [("repl", repl), (f"floor ({loop_name()})", floor)]
    if redis is not None:
        pairs.append(("Redis", redis))
    notes = setup.notes
    notes.append(
        f"TLS: {repl.tls}, EC P-256 certificate from a throwaway CA ({certs.tool}); "
        f"daemons and floor on {loop_name()}, clients on asyncio (set-up: blocking sockets); "
        "reference column: the same server over plain TCP, the two driven alternately"
    )
    notes.append(
        "TLS send round trip p50 / p99, µs: "
        + "; ".join(round_trip_text(name, f.rt) for name, f in pairs)
        + ("; Redis: XADD" if redis else "")
    )
    notes.append(
        "TLS pipelined sends/s: " + "; ".join(throughput(name, f.pipe) for name, f in pairs)
    )
    notes.append(
        "TLS connection set-up p50 / p99, µs: "
        + "; ".join(latencies(name, f.connect) for name, f in pairs)
        + ("; Redis: PING for auth" if redis else "")
        + f"; of it, a client context loading the CA: {context_ns(certs, 50) / 1000:.0f} µs"
    )
    if cli_note:
        notes.append(cli_note)


def redis_figures(setup: Setup, certs: Certs) -> Figures | None:
    """The Redis pair's figures, or None (and a note) when redis-server does not serve TLS."""
    assert setup.redis_exe is not None
    s = setup.sizes
    try:
        with TlsRedis(setup.redis_exe, setup.dir("tls-redis"), certs) as server:
            server.start()
            redis = run_async(redis_pair(server, certs, s), s.deadline_s)
            ports = (server.port, server.tls_port)
            ping = b"PING\r\n"
            redis.connect = connections(ports, certs, (ping, ping), is_pong, s)
            return redis
    except BenchError as exc:
        lines = str(exc).splitlines() or [""]  # its first line and the log's last
        said = lines[0] + (f" {lines[-1].strip()}" if len(lines) > 1 else "")
        setup.notes.append(f"TLS: no Redis figures (a redis-server built without TLS?): {said}")
        return None


def is_pong(data: bytes) -> bool:
    return data.startswith(b"+PONG")


TLS = Group("tls", tls_rows, tls)


# -- the floor server (this module run as a script) -----------------------------------


async def serve_floor(host: str, port: int, context: ssl.SSLContext | None) -> None:
    server = await asyncio.start_server(
        floor_handle, host, port, limit=1 << 20, backlog=4096, ssl=context
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on {host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python bench/tls.py")
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tls-cert", default=None)
    parser.add_argument("--tls-key", default=None)
    args = parser.parse_args()
    context = None
    if args.tls_cert:  # as the daemon's (repl_daemon/tls.py): Python's server defaults, TLS 1.2+
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(args.tls_cert, args.tls_key)
    if find_spec("uvloop") is not None:  # the daemon's --loop auto
        import uvloop

        uvloop.run(serve_floor(args.host, args.port, context))
    else:
        asyncio.run(serve_floor(args.host, args.port, context))


if __name__ == "__main__":
    main()
