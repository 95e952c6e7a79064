"""TLS end to end (SPEC §12, §5): real daemons, the real ``repl``, a throwaway CA.

The module makes its own small PKI once, with ``cryptography``: a CA, a
certificate for ``localhost`` and 127.0.0.1, one for another host name only,
an expired one, and a second, unrelated CA with a certificate of its own
(keys mode 0600). Over it:

- the CLI round trip over ``tls://`` (``--tls-ca`` and ``REPL_TLS_CA``), a
  blocked ``wait`` woken, ``follow`` printing firings as they come, and the
  sync and async Python APIs;
- each refusal in one line, no traceback, with its exit status: an unknown
  CA, another host, an expired certificate, TLS to a plain daemon, plain to a
  TLS one (1), and no daemon at a ``tls://`` address (75);
- the start-up checks: clear text beyond loopback refused unless
  ``--insecure``, a certificate without its key, a file missing, a key that
  does not match, ``tls://`` without a certificate;
- HTTPS on ``--http`` with the same certificate;
- SIGHUP: a new certificate for new connections, the served ones kept (a
  blocked wait is still woken), and a broken pair refused, the old one kept.

One TLS daemon (with ``--http``) serves the tests that do not disturb it;
each test has its own session ids.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from repl_cli import aio, api
from repl_cli.cli import client as cli
from repl_cli.cli.deliver import Printer, follow
from repl_cli.cli.options import firing_format
from tests.helpers import (
    DaemonProc,
    Repl,
    assert_one_error_line,
    eventually,
    free_port,
    read_line,
    repl_argv,
)

# -- a throwaway PKI -------------------------------------------------------------

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """A private key in PEM, readable by its owner only."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


@dataclass(frozen=True)
class Pair:
    """A server certificate and its key, as files; its serial, to tell which one is served."""

    cert: Path
    key: Path
    serial: int


class Authority:
    """A CA: its key, and its self-signed certificate written to ``dir/NAME-ca.pem``."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(f"repl test CA {name}")
        self.ski = x509.SubjectKeyIdentifier.from_public_key(self.key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - DAY)
            .not_valid_after(NOW + 30 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(self.ski, critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.path = directory / f"{name}-ca.pem"
        self.path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, hosts: list[str], *, not_after: datetime.datetime | None = None
    ) -> Pair:
        """A server certificate for ``hosts`` (names, or IP addresses), as ``name``.pem and
        ``name``.key."""
        key = ec.generate_private_key(ec.SECP256R1())
        alt: list[x509.GeneralName] = []
        for host in hosts:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                alt.append(x509.DNSName(host))
        after = not_after or NOW + 30 * DAY
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(hosts[0]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(min(NOW - DAY, after - DAY))
            .not_valid_after(after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self.ski),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        pair = Pair(self.directory / f"{name}.pem", self.directory / f"{name}.key", serial)
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(pair.key, key)
        return pair


@dataclass(frozen=True)
class Pki:
    ca: Path
    #: a CA that signed none of the daemon's certificates but ``second``
    other_ca: Path
    #: localhost and 127.0.0.1, signed by ``ca``
    good: Pair
    #: elsewhere.example only, signed by ``ca``
    other_host: Pair
    #: localhost and 127.0.0.1, signed by ``ca``, expired yesterday
    expired: Pair
    #: localhost and 127.0.0.1, signed by ``other_ca``
    second: Pair


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = Authority(directory, "main"), Authority(directory, "other")
    loopback = ["localhost", "127.0.0.1"]
    made = Pki(
        ca=ca.path,
        other_ca=other.path,
        good=ca.issue("good", loopback),
        other_host=ca.issue("other-host", ["elsewhere.example"]),
        expired=ca.issue("expired", loopback, not_after=NOW - DAY),
        second=other.issue("second", loopback),
    )
    assert (made.good.key.stat().st_mode & 0o777) == 0o600
    return made


# -- daemons and clients ---------------------------------------------------------

#: the environment of a ``repl`` or daemon run told everything by its options
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("REPL_")}

#: what every daemon of the module runs with: no disk, settle 0
QUICK = ("--memory", "--settle-ms", "0", "--idle-timeout", "30")


def tls_daemon(home: Path, pair: Pair, *extra: str) -> DaemonProc:
    """A daemon child serving TLS with ``pair`` on a loopback port of its own."""
    return DaemonProc(
        home, *QUICK, "--tls-cert", str(pair.cert), "--tls-key", str(pair.key), *extra
    )


@pytest.fixture
def stopped() -> Iterator[list[DaemonProc]]:
    """Daemons a test starts itself, each stopped when it ends."""
    daemons: list[DaemonProc] = []
    yield daemons
    for d in daemons:
        d.close_clients()
        if d.proc is not None and d.proc.poll() is None:
            d.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[DaemonProc]:
    """The module's TLS daemon, with ``--http`` over the same certificate."""
    d = tls_daemon(tmp_path_factory.mktemp("tls") / "home", pki.good, "--http", "127.0.0.1:0")
    yield d
    d.stop()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    """A daemon without TLS."""
    d = DaemonProc(tmp_path_factory.mktemp("plain") / "home", *QUICK)
    yield d
    d.stop()


def tls_repl(d: DaemonProc, *, addr: str | None = None, ca: Path | None = None) -> Repl:
    """``repl`` pointed at ``d`` by ``addr`` (default ``tls://localhost:PORT``), trusting
    ``ca`` through REPL_TLS_CA (no CA at all unless given)."""
    r = Repl(d)
    r.env["REPL_ADDR"] = addr or f"tls://localhost:{d.port}"
    r.env.pop("REPL_TLS_CA", None)
    if ca is not None:
        r.env["REPL_TLS_CA"] = str(ca)
    return r


def connect(d: DaemonProc, ca: Path, host: str = "localhost") -> api.Repl:
    """The sync API over TLS to ``d``, trusting ``ca``."""
    return api.connect(f"tls://{host}:{d.port}", d.home, tls_ca=ca)


def waiters(r: api.Repl, session: str) -> int:
    return next(s.waiters for s in r.sessions() if s.id == session)


async def async_waiters(r: aio.AsyncRepl, session: str) -> int:
    return next(s.waiters for s in await r.sessions() if s.id == session)


def served_serial(port: int, ca: Path) -> int:
    """The serial of the certificate a new TLS connection to ``port`` is shown (verified
    against ``ca`` and the name localhost)."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("localhost", port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def finished(proc: subprocess.Popen[bytes], timeout: float = 15) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


# -- 1. the round trip -----------------------------------------------------------


def test_start_send_read_over_tls_with_tls_ca(shared: DaemonProc, pki: Pki) -> None:
    r = tls_repl(shared)
    ca = ("--tls-ca", str(pki.ca))
    assert r.ok(*ca, "start", "rt1") == "rt1\n"
    assert r.ok(*ca, "send", "rt1", "hello over TLS") == "1\n"
    assert r.ok(*ca, "read", "rt1") == "on-message: hello over TLS\n"
    assert r.ok(*ca, "ping").startswith("repl ")


def test_start_send_read_over_tls_with_repl_tls_ca(shared: DaemonProc, pki: Pki) -> None:
    r = tls_repl(shared, ca=pki.ca)
    assert r.ok("start", "rt2") == "rt2\n"
    assert r.ok("send", "rt2", "from the environment") == "1\n"
    assert r.ok("read", "rt2") == "on-message: from the environment\n"
    # a CA given makes it TLS without the tls:// scheme too, and 127.0.0.1 is in the certificate
    bare = tls_repl(shared, addr=f"127.0.0.1:{shared.port}", ca=pki.ca)
    assert bare.ok("send", "rt2", "no scheme") == "2\n"
    assert bare.ok("read", "rt2") == "on-message: no scheme\n"


def test_a_blocked_wait_over_tls_is_woken_by_a_send(shared: DaemonProc, pki: Pki) -> None:
    r = tls_repl(shared, ca=pki.ca)
    r.ok("start", "w1")
    waiting = r.popen("wait", "w1")
    try:
        with connect(shared, pki.ca) as client:
            eventually(lambda: waiters(client, "w1") == 1, what="the wait to block")
            assert waiting.poll() is None
            client.send("w1", "wake up")
        assert finished(waiting) == (0, "on-message: wake up\n", "")
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()


def test_follow_over_tls_prints_firings_as_they_come(shared: DaemonProc, pki: Pki) -> None:
    r = tls_repl(shared, ca=pki.ca)
    r.ok("start", "f1")
    follower = r.popen("follow", "f1")
    try:
        with connect(shared, pki.ca) as client:
            eventually(lambda: waiters(client, "f1") == 1, what="follow to block")
            client.send("f1", "first")
            assert read_line(follower) == b"on-message: first\n"
            eventually(lambda: waiters(client, "f1") == 1, what="follow to block again")
            client.send("f1", "second")
            assert read_line(follower) == b"on-message: second\n"
        assert follower.poll() is None  # still following
    finally:
        os.kill(follower.pid, signal.SIGTERM)
        follower.communicate(timeout=15)


def test_an_interrupted_follow_acks_as_the_same_token_over_the_same_tls(
    shared: DaemonProc, pki: Pki, tmp_path: Path
) -> None:
    """Ctrl-C after a batch is printed and before the wait that carries its ack goes out:
    the ack is sent again on a fresh connection, which must be this follow's own (its
    token file, its CA), not the root token over clear text, or it fails in silence and
    the batch comes again."""
    with connect(shared, pki.ca) as root:
        root.start("f13")
        token = root.token_add("f13-agent", ["f13"], ["read"]).token
        root.send("f13", "one")
    token_file = tmp_path / "agent.token"
    token_file.write_text(token)
    # a home with no root token in it: the agent has only its own
    client = cli.Client(
        f"tls://localhost:{shared.port}",
        tmp_path / "no-home",
        token_file=token_file,
        tls_ca=pki.ca,
    )
    repl = cli.Repl(client)
    real_wait, calls = repl.wait, []

    def interrupted_second_time(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("ack"))
        if len(calls) == 2:
            raise KeyboardInterrupt  # before the wait carrying the ack was sent
        return real_wait(*args, **kwargs)

    repl.wait = interrupted_second_time  # type: ignore[method-assign]
    printer = Printer(client, firing_format(False, False, True), "follow")
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(KeyboardInterrupt):
            follow(printer, repl, "f13", "follow")
    finally:
        signal.signal(signal.SIGINT, sigint)  # the way out ignores a second Ctrl-C
        repl.close()
    assert calls == [{}, {"f13": 1}]
    with connect(shared, pki.ca) as root:
        assert {c.name: c.seq for c in root.cursors("f13")} == {"follow": 1}


def test_the_sync_api_over_tls(shared: DaemonProc, pki: Pki) -> None:
    with connect(shared, pki.ca) as client:
        assert client.start("sync1").created
        assert client.send("sync1", "one").seq == 1
        batch = client.read("sync1")
        assert [f.result for f in batch.firings] == ["one"]
        woken = client.wait("sync1", timeout=10)
        assert [f.result for b in woken.batches for f in b.firings] == ["one"]
        assert shared.proc is not None and client.ping().pid == shared.proc.pid


def test_the_sync_api_refuses_an_unknown_ca_in_one_message(shared: DaemonProc, pki: Pki) -> None:
    with connect(shared, pki.other_ca) as client, pytest.raises(api.Misconfigured) as refused:
        client.ping()
    assert "--tls-ca" in refused.value.message and "\n" not in refused.value.message


@pytest.mark.anyio
async def test_the_async_api_over_tls(shared: DaemonProc, pki: Pki) -> None:
    addr = f"tls://localhost:{shared.port}"
    async with (
        aio.connect(addr, shared.home, tls_ca=pki.ca) as client,
        aio.connect(addr, shared.home, tls_ca=pki.ca) as other,
    ):
        assert (await client.start("async1")).created
        assert (await client.send("async1", "one")).seq == 1
        batch = await client.read("async1")
        assert [f.result for f in batch.firings] == ["one"]
        # a wait that blocks, woken by a send on another connection
        woken: list[Any] = []
        await other.start("async2")
        async with anyio.create_task_group() as tg:

            async def blocked() -> None:
                woken.append(await client.wait("async2", timeout=20))

            tg.start_soon(blocked)
            with anyio.fail_after(15):  # a bounded look at the daemon's state
                while await async_waiters(other, "async2") != 1:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert not woken
            await other.send("async2", "woken")
        (answer,) = woken
        assert [f.result for b in answer.batches for f in b.firings] == ["woken"]


@pytest.mark.anyio
async def test_the_async_api_refuses_an_unknown_ca(shared: DaemonProc, pki: Pki) -> None:
    addr = f"tls://localhost:{shared.port}"
    async with aio.connect(addr, shared.home, tls_ca=pki.other_ca) as client:
        with pytest.raises(api.Misconfigured) as refused:
            await client.ping()
    assert "--tls-ca" in refused.value.message


@pytest.mark.anyio
async def test_the_async_api_says_which_end_speaks_tls(
    shared: DaemonProc, plain: DaemonProc, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REPL_TLS_CA", raising=False)
    to_plain = aio.connect(f"tls://localhost:{plain.port}", plain.home, tls_ca=pki.ca)
    async with to_plain as client:
        with pytest.raises(api.Misconfigured) as refused:
            await client.ping()
    assert "does not speak TLS" in refused.value.message
    async with aio.connect(f"127.0.0.1:{shared.port}", shared.home) as client:
        with pytest.raises(api.Misconfigured) as refused:
            await client.ping()
    assert "speaks TLS" in refused.value.message
    nobody = aio.connect(f"tls://localhost:{free_port()}", plain.home, tls_ca=pki.ca)
    async with nobody as client:
        with pytest.raises(api.Unavailable):
            await client.ping()


# -- 2. refusals, one line each ----------------------------------------------------


def test_an_unknown_ca_is_one_line_that_says_to_give_it(shared: DaemonProc, pki: Pki) -> None:
    err = tls_repl(shared, ca=pki.other_ca).fails(1, "ping")
    assert "does not trust" in err and "--tls-ca" in err, err
    # no CA given: the system's CAs do not know this one either
    err = tls_repl(shared).fails(1, "ping")
    assert "--tls-ca" in err, err
    # a reader is refused at once too: a certificate refused is no outage to ride out
    err = tls_repl(shared, ca=pki.other_ca).fails(1, "wait", "nobody", "--timeout", "20")
    assert "does not trust" in err, err


def test_a_certificate_for_another_host_is_one_line(
    tmp_path: Path, pki: Pki, stopped: list[DaemonProc]
) -> None:
    d = tls_daemon(tmp_path / "home", pki.other_host)
    stopped.append(d)
    err = tls_repl(d, ca=pki.ca).fails(1, "ping")
    assert "another host" in err, err
    # by an address the certificate does not hold
    err = tls_repl(d, addr=f"tls://127.0.0.1:{d.port}", ca=pki.ca).fails(1, "ping")
    assert "another address" in err, err


def test_an_expired_certificate_is_one_line(
    tmp_path: Path, pki: Pki, stopped: list[DaemonProc]
) -> None:
    d = tls_daemon(tmp_path / "home", pki.expired)
    stopped.append(d)
    err = tls_repl(d, ca=pki.ca).fails(1, "ping")
    assert "expired" in err, err


def test_tls_to_a_plain_daemon_is_one_line(plain: DaemonProc, pki: Pki) -> None:
    err = tls_repl(plain, ca=pki.ca).fails(1, "ping")
    assert "does not speak TLS" in err, err
    err = tls_repl(plain, addr=f"tls://127.0.0.1:{plain.port}").fails(1, "send", "x", "y")
    assert "does not speak TLS" in err, err
    assert Repl(plain).ok("ping").startswith("repl ")  # the plain daemon is still there


def test_plain_to_a_tls_daemon_is_one_line(shared: DaemonProc) -> None:
    r = tls_repl(shared, addr=f"127.0.0.1:{shared.port}")
    err = r.fails(1, "ping")
    assert "speaks TLS" in err and f"tls://127.0.0.1:{shared.port}" in err, err


def test_no_daemon_at_a_tls_address_is_75(pki: Pki, tmp_path: Path) -> None:
    done = subprocess.run(
        repl_argv("--addr", f"tls://localhost:{free_port()}", "--tls-ca", str(pki.ca), "ping"),
        capture_output=True,
        text=True,
        env={**CLEAN_ENV, "REPL_HOME": str(tmp_path)},
        timeout=30,
    )
    assert done.returncode == 75, (done.returncode, done.stderr)
    assert_one_error_line(done.stderr)
    assert "no daemon at" in done.stderr


# -- 3. start-up -----------------------------------------------------------------


def refused_at_start(home: Path, *args: str, cli: bool = False) -> str:
    """Start a daemon (``python -m repl_daemon``, or ``repl daemon`` with ``cli``) that
    must refuse: its one line on stderr, nothing on stdout, a non-zero exit."""
    home.mkdir(parents=True, exist_ok=True)
    if cli:
        argv = repl_argv("--home", str(home), *args)
    else:
        argv = [sys.executable, "-m", "repl_daemon", "--home", str(home), *args]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL, env=CLEAN_ENV
    )
    assert done.returncode == 1, (args, done.stdout, done.stderr)
    assert done.stdout == "", done.stdout  # never announced as listening
    assert done.stderr.startswith("repl daemon: "), done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


def nothing_listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_clear_text_beyond_loopback_is_refused(tmp_path: Path) -> None:
    port = free_port()
    err = refused_at_start(tmp_path / "a", "--memory", "--addr", f"0.0.0.0:{port}")
    assert "--tls-cert" in err and "--insecure" in err, err
    assert nothing_listens(port)
    err = refused_at_start(
        tmp_path / "b", "--memory", "--addr", "127.0.0.1:0", "--http", f"0.0.0.0:{port}"
    )
    assert "--http" in err and "--tls-cert" in err and "--insecure" in err, err
    assert nothing_listens(port)


def test_insecure_allows_clear_text_beyond_loopback(
    tmp_path: Path, stopped: list[DaemonProc]
) -> None:
    # the last --addr is the one used: beyond loopback, on a port the system chooses
    d = DaemonProc(tmp_path / "home", *QUICK, "--addr", "0.0.0.0:0", "--insecure")
    stopped.append(d)
    assert Repl(d).ok("ping").startswith("repl ")
    assert d.stop() == 0
    assert "without TLS (--insecure)" in d.log.read_text()


#: a daemon that would start listens on loopback, on a port the system chooses
LOCAL = ("--memory", "--addr", "127.0.0.1:0")


def test_tls_options_are_checked_at_start(tmp_path: Path, pki: Pki) -> None:
    good = pki.good
    err = refused_at_start(tmp_path / "a", *LOCAL, "--tls-cert", str(good.cert))
    assert "--tls-cert FILE and --tls-key FILE together" in err, err
    err = refused_at_start(tmp_path / "a2", *LOCAL, "--tls-key", str(good.key))
    assert "--tls-cert FILE and --tls-key FILE together" in err, err
    missing = tmp_path / "missing.pem"
    err = refused_at_start(
        tmp_path / "b", *LOCAL, "--tls-cert", str(missing), "--tls-key", str(good.key)
    )
    assert f"cannot load the TLS certificate {missing}" in err, err
    err = refused_at_start(
        tmp_path / "c", *LOCAL, "--tls-cert", str(good.cert), "--tls-key", str(pki.second.key)
    )
    assert f"cannot load the TLS certificate {good.cert}" in err and "MISMATCH" in err, err
    # a tls:// address without a certificate, through `repl daemon`
    err = refused_at_start(
        tmp_path / "d", "--addr", "tls://127.0.0.1:0", "daemon", "--memory", cli=True
    )
    assert "asks for TLS" in err and "--tls-cert" in err, err


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited child not yet reaped by its new parent has not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")


def test_repl_daemon_detached_with_tls_and_shut_down_over_tls(tmp_path: Path, pki: Pki) -> None:
    home, env = tmp_path / "home", CLEAN_ENV
    started = subprocess.run(
        repl_argv(
            *("--addr", "tls://127.0.0.1:0", "--home", str(home), "daemon", "--detach"),
            *("--memory", "--http", "127.0.0.1:0"),
            *("--tls-cert", str(pki.good.cert), "--tls-key", str(pki.good.key)),
        ),
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert (started.returncode, started.stderr) == (0, ""), started
    said = re.fullmatch(
        r"repl daemon listening on tls://127\.0\.0\.1:(\d+), HTTP on https://127\.0\.0\.1:\d+ "
        r"\(pid (\d+)\); log: .*\n",
        started.stdout,
    )
    assert said is not None, started.stdout
    port, pid = int(said[1]), int(said[2])
    try:
        over_tls = (f"--addr=tls://localhost:{port}", f"--tls-ca={pki.ca}", f"--home={home}")
        shut = subprocess.run(
            repl_argv(*over_tls, "shutdown"), capture_output=True, text=True, env=env, timeout=60
        )
        assert (shut.returncode, shut.stderr) == (0, ""), shut
        assert shut.stdout.startswith(f"stopped the daemon at tls://localhost:{port} "), shut
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)


# -- 4. HTTP over TLS ------------------------------------------------------------


def test_https_on_the_http_listener(shared: DaemonProc, pki: Pki) -> None:
    assert shared.http_port is not None
    context = ssl.create_default_context(cafile=str(pki.ca))
    url = f"https://localhost:{shared.http_port}/healthz"
    with urllib.request.urlopen(url, context=context, timeout=10) as answer:
        assert answer.status == 200
    # plain HTTP to it is not served
    plain_http = http.client.HTTPConnection("127.0.0.1", shared.http_port, timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            plain_http.request("GET", "/healthz")
            plain_http.getresponse()
    finally:
        plain_http.close()
    # and one that trusts another CA is refused
    other = ssl.create_default_context(cafile=str(pki.other_ca))
    with pytest.raises(urllib.error.URLError) as refused:
        urllib.request.urlopen(url, context=other, timeout=10)
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)


# -- 5. SIGHUP -------------------------------------------------------------------


def install(pair: Pair, cert: Path, key: Path, *, key_of: Pair | None = None) -> None:
    """Put ``pair`` at the daemon's fixed paths (each file replaced whole); ``key_of``
    another pair puts that one's key instead, a pair that does not match."""
    for source, target in ((pair.cert, cert), ((key_of or pair).key, key)):
        staged = target.with_name(f"{target.name}.new")
        staged.write_bytes(source.read_bytes())
        staged.chmod(0o600)
        os.replace(staged, target)


def _uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


# uvloop is an optional extra, not in the test extra: where it is installed (a developer's
# venv, the benchmark's) its TLS transport is tested too; CI runs the default loop's
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"] if _uvloop() else ["asyncio"])
def test_sighup_reloads_the_certificate_without_dropping_a_blocked_wait(
    tmp_path: Path, pki: Pki, stopped: list[DaemonProc], loop: str
) -> None:
    """On both event loops: their TLS transports are not the same code."""
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    install(pki.good, cert, key)
    d = DaemonProc(
        tmp_path / "home",
        *QUICK,
        *("--loop", loop, "--http", "127.0.0.1:0"),
        *("--tls-cert", str(cert), "--tls-key", str(key)),
    )
    stopped.append(d)
    assert d.proc is not None and d.http_port is not None
    assert served_serial(d.port, pki.ca) == pki.good.serial
    assert served_serial(d.http_port, pki.ca) == pki.good.serial
    before = tls_repl(d, ca=pki.ca)
    before.ok("start", "hup1")
    waiting = before.popen("wait", "hup1")
    try:
        with connect(d, pki.ca) as old:  # a connection made before the reload, kept open
            eventually(lambda: waiters(old, "hup1") == 1, what="the wait to block")
            install(pki.second, cert, key)
            os.kill(d.proc.pid, signal.SIGHUP)
            eventually(lambda: "reloaded the TLS certificate" in d.log.read_text(), what="reload")
            # new connections see the new certificate, from the other CA
            assert served_serial(d.port, pki.other_ca) == pki.second.serial
            assert served_serial(d.http_port, pki.other_ca) == pki.second.serial  # HTTP too
            err = before.fails(1, "ping")
            assert "does not trust" in err, err
            # the served connections are still there: the old client, and the blocked wait
            assert waiters(old, "hup1") == 1 and waiting.poll() is None
            after = tls_repl(d, ca=pki.other_ca)
            assert after.ok("send", "hup1", "after the reload") == "1\n"
        assert finished(waiting) == (0, "on-message: after the reload\n", "")
    finally:
        if waiting.poll() is None:
            waiting.kill()
        # its pipes closed too: left open, a failure here fails a later test of the worker
        # (an unclosed file, warned of when it is collected, is an error)
        waiting.communicate()


def test_sighup_without_tls_changes_nothing(plain: DaemonProc) -> None:
    assert plain.proc is not None
    os.kill(plain.proc.pid, signal.SIGHUP)
    eventually(
        lambda: "received SIGHUP: no TLS certificate to reload" in plain.log.read_text(),
        what="the SIGHUP in the log",
    )
    assert Repl(plain).ok("ping").startswith("repl ")


def test_sighup_with_a_broken_pair_keeps_the_old_certificate(
    tmp_path: Path, pki: Pki, stopped: list[DaemonProc]
) -> None:
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    install(pki.good, cert, key)
    d = DaemonProc(tmp_path / "home", *QUICK, "--tls-cert", str(cert), "--tls-key", str(key))
    stopped.append(d)
    assert d.proc is not None
    install(pki.second, cert, key, key_of=pki.good)  # B's certificate with A's key
    os.kill(d.proc.pid, signal.SIGHUP)
    eventually(
        lambda: "still serving the certificate loaded before" in d.log.read_text(),
        what="the refused reload in the log",
    )
    assert f"cannot load the TLS certificate {cert}" in d.log.read_text()
    assert served_serial(d.port, pki.ca) == pki.good.serial
    r = tls_repl(d, ca=pki.ca)
    assert r.ok("start", "hup2") == "hup2\n"
    assert r.ok("send", "hup2", "still served") == "1\n"
    assert d.stop() == 0
