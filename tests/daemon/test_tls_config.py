"""Which listen addresses count as loopback, and the one-line refusal beyond it (SPEC §12).

The daemon's start-up checks end to end are in ``tests/e2e/test_tls.py``; these are the
cases of the address itself, names included, which a test cannot bind.
"""

from __future__ import annotations

import pytest

from repl_daemon.tls import is_loopback, refuse_clear_text
from session.errors import ConfigError


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("192.168.1.1", False),
        ("no-such-host.invalid", False),  # a name that does not resolve: not loopback
    ],
)
def test_loopback_is_every_address_of_the_host(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_clear_text_is_refused_beyond_loopback_only_without_tls_or_insecure() -> None:
    listeners = [("--addr", "127.0.0.1"), ("--http", "0.0.0.0")]
    with pytest.raises(ConfigError) as refused:
        refuse_clear_text(listeners, tls=False, insecure=False)
    assert str(refused.value).startswith("refusing to listen on 0.0.0.0 (--http) without TLS")
    assert "--tls-cert FILE --tls-key FILE" in str(refused.value) and "--insecure" in str(
        refused.value
    )
    refuse_clear_text(listeners, tls=True, insecure=False)
    refuse_clear_text(listeners, tls=False, insecure=True)
    refuse_clear_text([("--addr", "127.0.0.1")], tls=False, insecure=False)
