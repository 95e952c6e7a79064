"""Webhooks (SPEC §10): ``repl webhook ID --secret-file FILE``, then ``POST /hooks/{id}`` signed
as GitHub signs it. A valid signature records the body as a handled firing; a redelivery
(the same ``X-GitHub-Delivery``) records nothing; a wrong or missing signature is 401 and
records nothing, and so is a session without a webhook, or a missing one, byte for byte
(issue 24.3: the route needs no token, so it must not tell which sessions have webhooks).
The real CLI gives the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from pathlib import Path

import pytest

from repl_cli import aio
from repl_cli import api as python_api
from repl_daemon.http.answers import MAX_BODY
from tests.helpers import DaemonProc, Repl
from tests.http.test_http_api import Web

PUSH = json.dumps({"ref": "refs/heads/main", "after": "4f2a", "pusher": {"name": "ada"}})


def signed(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@pytest.fixture
def hooked(web: DaemonProc, tmp_path: Path) -> tuple[Web, str, str]:
    """A session with a webhook whose secret was given through `repl webhook`."""
    api = Web(web)
    session = api.session()
    secret = "s3cret-from-github"
    path = tmp_path / "secret"
    path.write_text(secret + "\n")  # as `openssl rand -hex 20 > FILE` leaves it
    Repl(web).ok("webhook", session, "--secret-file", str(path))
    return api, session, secret


def deliver(api: Web, session: str, body: bytes, **headers: str) -> tuple[int, object]:
    status, _, answer = api.request(
        "POST",
        f"/hooks/{session}",
        body,
        {"Content-Type": "application/json", **headers},
        token=None,
    )
    return status, answer


def firings(api: Web, session: str) -> list[dict[str, object]]:
    got: list[dict[str, object]] = api.daemon.client().ok(
        {"op": "read", "session": session, "after": 0}
    )["firings"]
    return got


def test_a_signed_delivery_is_recorded_once_and_a_redelivery_is_a_duplicate(
    hooked: tuple[Web, str, str],
) -> None:
    api, session, secret = hooked
    body = PUSH.encode()
    headers = {"X-Hub-Signature-256": signed(secret, body), "X-GitHub-Delivery": "72d3162e"}
    assert deliver(api, session, body, **headers) == (201, {"seq": 1, "duplicate": False})
    assert deliver(api, session, body, **headers) == (200, {"seq": 1, "duplicate": True})
    (firing,) = firings(api, session)
    assert (firing["handler"], firing["result"], firing["event"]) == ("on-webhook", PUSH, None)
    assert firing["by"] == "webhook"  # who sent it: the daemon's word, never the body's


@pytest.mark.parametrize(
    "signature",
    [None, "", "sha256=", "sha256=" + "0" * 64, "sha1=abc", "SHA256=deadbeef", "wrong-secret"],
)
def test_a_wrong_or_missing_signature_is_401_and_records_nothing(
    hooked: tuple[Web, str, str], signature: str | None
) -> None:
    api, session, _ = hooked
    body = PUSH.encode()
    headers = {"X-GitHub-Delivery": "d-1"}
    if signature == "wrong-secret":
        headers["X-Hub-Signature-256"] = signed("not-the-secret", body)
    elif signature is not None:
        headers["X-Hub-Signature-256"] = signature
    status, answer = deliver(api, session, body, **headers)
    assert status == 401 and isinstance(answer, dict) and answer["code"] == "unauthorized"
    assert "X-Hub-Signature-256" in answer["message"]
    assert firings(api, session) == []


def test_a_signature_of_another_body_is_refused(hooked: tuple[Web, str, str]) -> None:
    api, session, secret = hooked
    status, _ = deliver(
        api, session, b'{"ref": "evil"}', **{"X-Hub-Signature-256": signed(secret, PUSH.encode())}
    )
    assert status == 401 and firings(api, session) == []


def test_a_session_without_a_webhook_is_401_as_a_wrong_signature_and_the_token_is_no_substitute(
    web: DaemonProc,
) -> None:
    api = Web(web)
    session = api.session()
    status, answer = deliver(api, session, b"{}", Authorization=f"Bearer {web.token}")
    assert status == 401 and isinstance(answer, dict) and answer["code"] == "unauthorized"
    assert "repl webhook ID --secret-file FILE" in answer["message"]
    assert session not in answer["message"]
    assert deliver(api, "nosuch", b"{}")[0] == 401
    assert firings(api, session) == []


def raw_delivery(api: Web, session: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The whole answer to a delivery, as it came off the socket, but a ``Date`` line. A
    ``Content-Length`` in ``headers`` is sent instead of the body's (and the body not)."""
    lines = [f"POST /hooks/{session} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    if "Content-Length" in headers:
        body = b""  # a length past 1 MiB is refused before the body: none is sent
    lines += [f"{k}: {v}" for k, v in {"Content-Length": str(len(body)), **headers}.items()]
    with socket.create_connection(("127.0.0.1", api.port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        with sock.makefile("rb") as reader:
            answer = reader.read()  # to the close
    head, _, rest = answer.partition(b"\r\n\r\n")
    kept = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return b"\r\n".join(kept) + b"\r\n\r\n" + rest


@pytest.mark.parametrize("signature", ["wrong", "none", "over 1 MiB"])
def test_a_wrong_signature_no_webhook_and_no_session_get_one_answer_byte_for_byte(
    hooked: tuple[Web, str, str], signature: str
) -> None:
    """``POST /hooks/{id}`` needs no token, so it must not tell anyone who can reach the port
    which sessions exist or have a webhook: a wrong (or no) signature on a session with a
    webhook, a session without one, a session that does not exist and an id that is not
    one get the very same bytes (status, headers, body). It was 401 for the first and 404
    for the others. A body declared over 1 MiB is 413 for all of them alike (before, a
    session without a webhook answered 404)."""
    api, session, secret = hooked
    bare = api.session()
    body = PUSH.encode()
    headers = {"Content-Type": "application/json", "X-GitHub-Delivery": "d-same"}
    if signature == "over 1 MiB":
        headers["Content-Length"] = str(MAX_BODY + 1)
    if signature == "wrong":
        headers["X-Hub-Signature-256"] = signed("not-the-secret", body)
    answers = {
        name: raw_delivery(api, target, body, headers)
        for name, target in [
            ("a wrong signature", session),
            ("no webhook", bare),
            ("no session", "nosuch-hooked"),
            ("not an id", "bad%20id"),
            ("an id too long", "a" * 65),
        ]
    }
    first = answers["a wrong signature"]
    assert {name: got for name, got in answers.items() if got != first} == {}, first
    status = 413 if signature == "over 1 MiB" else 401
    assert first.startswith(f"HTTP/1.1 {status} ".encode()), first
    assert firings(api, session) == [] and firings(api, bare) == []
    # and the secret still works: the refusals changed nothing
    good = {"X-Hub-Signature-256": signed(secret, PUSH.encode())}
    assert deliver(api, session, PUSH.encode(), **good) == (201, {"seq": 1, "duplicate": False})


def test_a_custom_handler_the_idempotency_key_and_remove(web: DaemonProc, tmp_path: Path) -> None:
    api, repl = Web(web), Repl(web)
    session = api.session()
    (tmp_path / "s").write_text("k")
    repl.ok("webhook", session, "--secret-file", str(tmp_path / "s"), "--handler", "on-ci")
    body = b"build 42 passed"
    headers = {"X-Hub-Signature-256": signed("k", body), "Idempotency-Key": "b42"}
    assert deliver(api, session, body, **headers)[0] == 201
    assert deliver(api, session, body, **headers)[0] == 200
    assert [(f["handler"], f["result"]) for f in firings(api, session)] == [
        ("on-ci", "build 42 passed")
    ]
    repl.ok("webhook", session, "--remove")
    assert deliver(api, session, body, **headers)[0] == 401


def test_the_webhook_outlives_a_restart(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "home", "--http", "127.0.0.1:0", "--settle-ms", "0")
    try:
        api, repl = Web(d), Repl(d)
        session = api.session()
        (tmp_path / "s").write_text("kept")
        repl.ok("webhook", session, "--secret-file", str(tmp_path / "s"))
        d.close_clients()
        d.restart(crash=True)
        api = Web(d)
        body = b"after the crash"
        assert (
            deliver(api, session, body, **{"X-Hub-Signature-256": signed("kept", body)})[0] == 201
        )
    finally:
        d.close_clients()
        d.stop()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "give --secret-file FILE, or --remove"),
        (("--remove", "--secret-file", "x"), "give --secret-file FILE, or --remove"),
        (("--secret-file", "/nonexistent/secret"), "cannot read the secret"),
        (("--secret-file", "EMPTY"), "is empty"),
    ],
)
def test_repl_webhook_refuses_what_it_cannot_use(
    web: DaemonProc, tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    api, repl = Web(web), Repl(web)
    session = api.session()
    (tmp_path / "empty").write_text("")
    argv = [str(tmp_path / "empty") if a == "EMPTY" else a for a in args]
    assert says in repl.fails(64, "webhook", session, *argv)
    assert deliver(api, session, b"{}")[0] == 401  # no webhook was given


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["api", "aio"])
async def test_both_python_apis_give_and_take_away_a_webhook(web: DaemonProc, kind: str) -> None:
    """``Repl.webhook`` and ``AsyncRepl.webhook`` (one signature, checked in test_api): the
    secret given is the one a delivery is signed with; None takes the webhook away."""
    api = Web(web)
    session = api.session()
    body = PUSH.encode()
    headers = {"X-Hub-Signature-256": signed("from-python", body), "X-GitHub-Delivery": "d-1"}

    async def give(secret: str | None) -> None:
        if kind == "api":
            with python_api.connect(web.addr, web.home) as repl:
                repl.webhook(session, secret, handler="on-push")
        else:
            async with aio.connect(web.addr, web.home) as arepl:
                await arepl.webhook(session, secret, handler="on-push")

    await give("from-python")
    assert deliver(api, session, body, **headers) == (201, {"seq": 1, "duplicate": False})
    assert [f["handler"] for f in firings(api, session)] == ["on-push"]
    await give(None)
    assert deliver(api, session, body, **headers)[0] == 401
    assert len(firings(api, session)) == 1
