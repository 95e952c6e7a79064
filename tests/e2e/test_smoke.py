"""The daemon starts, answers ping and round-trips a firing."""

from tests.helpers import DaemonProc


def test_ping_and_send_read(daemon: DaemonProc) -> None:
    c = daemon.client()
    assert c.ok({"op": "ping"})["version"]
    c.ok({"op": "start", "session": "a"})
    assert c.ok({"op": "send", "session": "a", "text": "hi"})["seq"] == 1
    got = c.ok({"op": "read", "session": "a"})
    assert [f["result"] for f in got["firings"]] == ["hi"]
    assert daemon.stop() == 0
