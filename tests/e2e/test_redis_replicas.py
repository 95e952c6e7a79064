"""How many replicas a change waits for when the store URL does not say (issue 24, item 6).

Without ``WAIT`` a failover can lose answered firings and give their seqs
to later ones, so a daemon whose Redis primaries all have a replica waits
for one (``replicas=1``) unless the URL says ``?replicas=0``; with no
replica it waits for none, and with replicas on some primaries only it
waits for none and says which primaries have none (``WAIT 1`` would refuse
every change on those). It says at start, in one line, which it uses and
how to change it, and ``repl ping`` shows it in the store's name. Checked
on the 3 + 3 cluster of the test session and on one redis-server with a
replica of its own; ``INFO commandstats`` of the session's primary shows
every send followed by a ``WAIT``, or none at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from repl_daemon.backends.redis.keys import session_keys
from tests.helpers import DaemonProc, RedisClusterProcs, RedisProc, eventually

SENDS = 20


@contextlib.contextmanager
def daemon(home: Path, url: str) -> Iterator[DaemonProc]:
    """A daemon on ``url``, stopped (its clients closed) when the block ends."""
    d = DaemonProc(home, "--store", url, "--settle-ms", "0", "--idle-timeout", "30")
    try:
        yield d
    finally:
        d.close_clients()
        d.stop()


def said(d: DaemonProc, start: str) -> list[str]:
    """The daemon's log lines whose message starts with ``start`` (level and message)."""
    found = []
    for line in d.log.read_text().splitlines():
        _, _, rest = line.partition("] ")  # after "TIME repl[PID] "
        level, _, message = rest.partition(" ")
        if message.startswith(start):
            found.append(f"{level} {message}")
    return found


def waits_of_sends(d: DaemonProc, primary: RedisProc, session: str) -> int:
    """How many WAITs the session's primary ran during ``SENDS`` sends to it through ``d``."""
    c = d.client()
    c.ok({"op": "start", "session": session, "exist_ok": True})
    before = primary.commands("wait")
    for n in range(SENDS):
        c.ok({"op": "send", "session": session, "text": f"sent {n}"})
    return primary.commands("wait") - before


def cluster_primary(cluster: RedisClusterProcs, session: str) -> RedisProc:
    return cluster.node(cluster.primary_of_slot(cluster.keyslot(session_keys(session)[0])))


def test_a_cluster_whose_primaries_have_replicas_waits_for_one_unless_the_url_says_0(
    tmp_path: Path, redis_cluster_replicated: RedisClusterProcs
) -> None:
    cluster = redis_cluster_replicated
    cluster.flush()
    primary = cluster_primary(cluster, "a")
    with daemon(tmp_path / "safe", cluster.url) as safe:  # no ?replicas
        assert safe.client().ok({"op": "ping"})["store"] == f"redis:{cluster.url}?replicas=1"
        assert said(safe, "redis: ") == [
            "INFO redis: every change waits for 1 replica, as every primary has one; "
            "?replicas=0 in the --store URL turns it off"
        ]
        # every send answered once its primary's WAIT was: the daemon's own work may add some
        assert waits_of_sends(safe, primary, "a") >= SENDS
    with daemon(tmp_path / "off", f"{cluster.url}?replicas=0") as off:
        assert off.client().ok({"op": "ping"})["store"] == f"redis:{cluster.url}?replicas=0"
        assert said(off, "redis: ") == [
            "INFO redis: changes wait for no replica (?replicas=0 in the --store URL): "
            "a failover can lose answered firings and give their seqs to later ones"
        ]
        assert waits_of_sends(off, primary, "a") == 0


def test_a_cluster_with_a_primary_without_replica_waits_for_none_and_says_which(
    tmp_path: Path, redis_cluster_replicated: RedisClusterProcs
) -> None:
    """``WAIT 1`` would refuse every change on that primary: the daemon does not wait, and
    warns, naming it (the replica is started again after, for the tests that follow)."""
    cluster = redis_cluster_replicated
    cluster.flush()
    lone = cluster.primaries()[0]
    (replica,) = (port for port, row in cluster.topology().items() if row["primary"] == lone)
    cluster.node(replica).kill()
    try:

        def alone() -> bool:
            with cluster.node(lone).admin() as admin:
                return int(admin.info("replication")["connected_slaves"]) == 0

        eventually(alone, 15, f"{lone} to see its replica gone")
        with daemon(tmp_path / "d", cluster.url) as d:
            assert d.client().ok({"op": "ping"})["store"] == f"redis:{cluster.url}?replicas=0"
            assert said(d, "redis: ") == [
                f"WARNING redis: changes wait for no replica, as the primary 127.0.0.1:{lone} "
                "has none (WAIT would refuse its changes): a failover of another primary can "
                "lose answered firings and give their seqs to later ones; give every primary a "
                "replica, or say ?replicas=0 in the --store URL"
            ]
            assert waits_of_sends(d, cluster_primary(cluster, "a"), "a") == 0
    finally:
        cluster.node(replica).start()
        cluster.wait_ready()


def test_a_single_redis_waits_for_its_replica_once_it_has_one_unless_the_url_says_0(
    tmp_path: Path, redis_server: RedisProc
) -> None:
    with daemon(tmp_path / "alone", redis_server.url) as alone:
        assert alone.client().ok({"op": "ping"})["store"] == f"redis:{redis_server.url}?replicas=0"
        assert said(alone, "redis: ") == [
            "INFO redis: changes wait for no replica, as the primary has none; with replicas a "
            "daemon waits for one (?replicas=N in the --store URL sets how many)"
        ]
        assert waits_of_sends(alone, redis_server, "a") == 0
    replica = RedisProc(tmp_path / "replica", replica_of=redis_server.port)
    try:
        replica.wait_synced()
        with daemon(tmp_path / "safe", redis_server.url) as safe:
            pong = safe.client().ok({"op": "ping"})
            assert pong["store"] == f"redis:{redis_server.url}?replicas=1"
            assert said(safe, "redis: ") == [
                "INFO redis: every change waits for 1 replica, as the primary has one; "
                "?replicas=0 in the --store URL turns it off"
            ]
            assert waits_of_sends(safe, redis_server, "a") >= SENDS
            with replica.admin() as admin:  # answered, so the replica has it
                assert int(admin.hget(session_keys("a")[0], "head")) == 2 * SENDS
        with daemon(tmp_path / "off", f"{redis_server.url}?replicas=0") as off:
            assert waits_of_sends(off, redis_server, "a") == 0
    finally:
        replica.stop()
