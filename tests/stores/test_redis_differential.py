"""The Redis scripts agree with the core: the same operations, the same answers, the same state.

Redis applies every operation itself (``repl_daemon.backends.redis.scripts``),
so each rule of the core that a script restates (the read after N of rule
3, the ring's bound, monotonic acks, the LRU of cursors, the dedup window,
the evaluation count) is checked here against ``session/``: hypothesis runs
random sequences of operations through a core ``Session`` and through the
shared committer on a real Redis, and requires every answer (value or
error, message included) and the final state to be equal. Tags (SPEC §15)
ride along: tagged sends, webhook-like handled sends and timers (good tags
and refused ones), matching reads after a seq, over the whole ring (``after``
None) and through a cursor, with and without ``max``, and a matching wait's
looks (``Look``: each goes on after the ``next`` of the last look that found
nothing, as ``repl_daemon.engine.wait`` does), so the Lua's filter, its
``next`` and its ``lost`` are the core's. The bounds are
made small (3 cursors, 4 dedup keys) so that random runs reach them; the
scripts are handed whatever the core has, so they agree for any bound.

Each test runs on one redis-server, on a Redis Cluster of 3 primaries, and
on one of 3 primaries with a replica each through ``?replicas=1`` (every
change followed by ``WAIT`` on its primary's connection). The session is
``a``, ``b`` or ``c``, whose slots are on the three different primaries of
the clusters: every primary runs the scripts, each loading them itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from repl_daemon.backends.redis import entries as redis_entries
from repl_daemon.backends.redis import store as redis_store
from repl_daemon.backends.redis.claims import group_of, letter_of
from repl_daemon.backends.redis.committer import SharedCommitter
from repl_daemon.backends.redis.keys import session_keys
from repl_daemon.backends.redis.store import RedisStore
from repl_daemon.metrics import Counts
from session import session as core_session
from session.delta import CursorState, Webhook
from session.errors import ReplError, StoreFailed
from session.firing import Firing
from session.groups import DeadLetter
from session.ops import (
    Ack,
    AckRead,
    AddTimer,
    CancelTimer,
    ClaimFiring,
    ClaimTable,
    ConfigureGroup,
    CursorTable,
    Describe,
    ExpireGroups,
    Extend,
    Finish,
    FinishNext,
    FireTimers,
    GetWebhook,
    GroupProgress,
    GroupTable,
    Op,
    Poll,
    ReadAfter,
    ReadCursor,
    ReadRecent,
    ReadSeq,
    Record,
    Release,
    SetLimit,
    SetWebhook,
    TimerList,
)
from session.schedule import Timer
from session.session import Session, Snapshot
from session.tags import Match
from tests.helpers import RedisClusterProcs, RedisProc, examples, store_url

TS = "2026-12-01T06:00:00.000Z"
EARLIER = "2026-12-01T05:59:59.999Z"
LATER = "2026-12-01T06:00:00.001Z"


class Quiet:
    """A listener that hears nothing: the differential test has no waiters."""

    def __init__(self) -> None:
        self.counts = Counts()

    def changed(self, session_id: str, heard: Firing | None = None) -> None:
        pass

    def stopped(self, session_id: str) -> None:
        pass

    def claimable(self, session_id: str) -> None:
        pass

    def grouped(self, session_id: str) -> None:
        pass

    def revoked(self, digest: str) -> None:
        pass

    def link(self, error: StoreFailed | None) -> None:
        pass

    def fired(self, count: int) -> None:
        pass


#: sessions whose slots are on the three primaries of a 3-primary cluster (checked below)
SESSIONS = ("a", "b", "c")


@pytest.fixture
def redis_url(redis_any: RedisProc | RedisClusterProcs) -> str:
    if isinstance(redis_any, RedisClusterProcs):
        assert len(redis_any.by_primary(list(SESSIONS))) == 3
    return store_url(redis_any)


@pytest.fixture(autouse=True)
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 cursors, 4 dedup keys and 3 timers, in the core and in what the store hands its
    scripts."""
    for module in (core_session, redis_store):
        monkeypatch.setattr(module, "MAX_CURSORS", 3)
        monkeypatch.setattr(module, "MAX_KEYS", 4)
        monkeypatch.setattr(module, "MAX_TIMERS", 3)


names = st.sampled_from(["c1", "c2", "c3", "c4", "read", "", "a b"])
counts = st.none() | st.integers(-1, 4)
seqs = st.integers(-1, 12)
handlers = st.sampled_from(["on-message", "on-message", "on-tick", "on-build", "", "a b"])
tag_keys = st.sampled_from(["corr", "reply-to", "n", "a.b"])
#: the senders a daemon records (none known: a firing stored before senders were)
senders = st.sampled_from([None, "root", "agent-1", "agent-2"])
#: a match's keys: a tag's, or ``by`` (the sender, which no tag is)
match_keys = st.sampled_from(["corr", "reply-to", "n", "a.b", "by"])
# values JSON escapes (and cjson must give back byte for byte), and a few that repeat
tag_values = st.sampled_from(["", "1", "2", "2", 'é"\\/\n\x00☃\U0001f600']) | st.text(max_size=2)
good_tags = st.dictionaries(tag_keys, tag_values, max_size=3)
bad_tags = st.sampled_from(
    [{"Bad": "v"}, {"k": "v" * 1025}, {f"k{n}": "" for n in range(17)}, {"n": 7}, {"by": "x"}]
)
tag_sets = st.one_of(good_tags, good_tags, good_tags, bad_tags)
matches = st.builds(
    Match,
    tags=st.dictionaries(match_keys, st.none() | tag_values | senders, max_size=2),
    handler=st.none() | st.sampled_from(["on-message", "on-tick", "on-build", "a b"]),
)
#: firing times around TS, out of order too, for the reads ``since`` a time
times = st.sampled_from([TS, TS, EARLIER, LATER])
records = st.builds(
    Record,
    handler=handlers,
    text=st.text(max_size=6),
    ts=times,
    key=st.sampled_from([None, "k1", "k2", "k3", "k4", "k5", "k6", ""]),
    tags=tag_sets,
    by=senders,
)


#: the compound reads: the newest N, those since a time (and the newest N of them), any
#: of them matching or not
recent_reads = st.one_of(
    st.builds(ReadRecent, last=st.integers(-1, 6), max=counts, match=st.none() | matches),
    st.builds(
        ReadRecent,
        last=st.none() | st.integers(1, 5),
        since=times,
        max=counts,
        match=st.none() | matches,
    ),
)


class Look(msgspec.Struct, frozen=True):
    """A matching wait's look (``Wait._looked``): after the ``next`` of the last look that
    found nothing, else (the first, or after a look that found some) over the whole ring."""

    match: Match
    max: int | None = None


class Looked(msgspec.Struct, frozen=True):
    """A wait's look answered from the firing its wake carried: no script runs, the daemon
    owes Redis one evaluation (``SharedCommitter.looked``) and hands it over with its
    next read of the session; the core counts it at once."""


timer_ids = st.sampled_from(["t1", "t2", "t3", "t4", "", "a b"])


@st.composite
def timers(draw: st.DrawFn, session_id: str = "?") -> AddTimer:
    return AddTimer(
        Timer(
            id=draw(timer_ids),
            session=session_id,  # the run puts its own session in
            due_ms=draw(st.integers(-1, 6000)),
            every_ms=draw(st.sampled_from([None, None, 999, 1000, 1500])),
            handler=draw(st.sampled_from(["on-message", "on-tick", "on-build", "a b"])),
            text=draw(st.text(max_size=4)),
            key=draw(st.sampled_from([None, None, "k1", "k2", "k5", ""])),
            tags=draw(st.none() | good_tags.filter(bool) | bad_tags),
        )
    )


# sends, cursor reads and acks weigh more: the bounds are reached only by many of them
kinds = {
    "record": records,
    "timer": timers(),
    "cancel": st.builds(CancelTimer, timer=timer_ids),
    "fire": st.builds(
        FireTimers,
        timers=st.lists(timer_ids, max_size=4),
        now_ms=st.integers(0, 9000),
        ts=st.just(TS),
    ),
    "timers": st.just(TimerList()),
    "hook": st.builds(
        SetWebhook,
        webhook=st.none()
        | st.builds(
            Webhook,
            secret=st.sampled_from(["k", "", "s" * 257]),
            handler=st.sampled_from(["on-webhook", "on-ci", "a b"]),
        ),
    ),
    "get_hook": st.just(GetWebhook()),
    "handled": st.builds(
        Record,
        handler=st.sampled_from(["on-ci", "on-message"]),
        text=st.text(max_size=4),
        ts=st.just(TS),
        key=st.sampled_from([None, "k1", "k9"]),
        handled=st.sampled_from([True, False]),
        tags=st.sampled_from([{}, {"event": "push", "delivery": "d-1"}]),
        by=st.just("webhook"),
    ),
    "after": st.builds(ReadAfter, after=seqs, max=counts),
    "cursor": st.builds(ReadCursor, cursor=names, max=counts, touch=st.booleans()),
    "match_after": st.builds(
        ReadAfter, after=st.none() | seqs, max=counts, match=st.none() | matches
    ),
    "match_cursor": st.builds(
        ReadCursor, cursor=names, max=counts, touch=st.booleans(), match=matches
    ),
    "look": st.builds(Look, match=matches, max=st.none() | st.integers(1, 3)),
    "recent": recent_reads,
    "seq": st.builds(ReadSeq, seq=seqs),
    "ack": st.builds(Ack, cursor=names, seq=seqs),
    "ack_read": st.builds(
        AckRead, cursor=names, seq=seqs, max=counts, match=st.none() | st.none() | matches
    ),
    "poll": st.builds(Poll, max=counts),
    "looked": st.just(Looked()),
    "limit": st.builds(SetLimit, limit=st.sampled_from([-1, 0, 1, 2, 3, 5, 70_000])),
    "table": st.just(CursorTable()),
    "describe": st.just(Describe()),
}
weights = ["record"] * 4 + ["cursor"] * 3 + ["ack"] * 3 + ["after", "poll", "limit"]
weights += ["timer"] * 3 + ["fire"] * 2 + ["cancel", "timers", "hook", "get_hook", "handled"]
weights += ["match_after"] * 2 + ["match_cursor"] * 2 + ["look"] * 2 + ["ack_read"] * 2
weights += ["looked"] * 2 + ["recent"] * 2 + ["seq"]
ops = st.sampled_from([*weights, "table", "describe"]).flatmap(lambda kind: kinds[kind])


def answer_of(run: Any) -> Any:
    """A value, or the error's wire code and message."""
    try:
        return ("ok", run())
    except ReplError as exc:
        return ("error", exc.code.value, exc.message)


async def redis_answer(committer: SharedCommitter, session_id: str, op: Op[Any]) -> Any:
    try:
        return ("ok", await committer.execute(session_id, op).result())
    except ReplError as exc:
        return ("error", exc.code.value, exc.message)


async def stored(store: RedisStore, session_id: str) -> tuple[Snapshot, int]:
    """The session as Redis holds it, in the core's snapshot form."""
    client = store.client
    meta_key, ring_key, cursors_key, keys_key, order_key, _, timers_key, due_key, groups_key, _ = (
        session_keys(session_id)
    )
    meta = await client.hgetall(meta_key)
    entries = await client.xrange(ring_key)
    firings = [redis_entries.firing_of(entry) for entry in entries]
    cursors = []
    for name, value in (await client.hgetall(cursors_key)).items():
        seq, _, use = value.decode().partition(":")
        cursors.append(CursorState(name.decode(), int(seq), int(use)))
    cursors.sort(key=lambda c: c.last_use)
    order = await client.lrange(order_key, 0, -1)
    keys = [(k.decode(), int(await client.hget(keys_key, k))) for k in order]
    definitions = await client.hgetall(timers_key)
    pending = [
        redis_entries.timer_of(session_id, timer_id.decode(), due, definitions[timer_id])
        for timer_id, due in await client.zrange(due_key, 0, -1, withscores=True)
    ]
    pending.sort(key=lambda t: (t.due_ms, t.id))
    hook = None
    if b"hook_secret" in meta:
        hook = Webhook(meta[b"hook_secret"].decode(), meta[b"hook_handler"].decode())
    held = await client.hgetall(groups_key)
    groups = [group_of(session_id, name.decode(), held[name]) for name in sorted(held)]
    snapshot = Snapshot(
        session_id,
        int(meta[b"limit"]),
        int(meta[b"head"]),
        firings,
        cursors,
        int(meta[b"uses"]),
        keys,
        pending,
        hook,
        groups=groups,
    )
    return snapshot, int(meta[b"evals"])


async def dead_letters(store: RedisStore, session_id: str) -> list[DeadLetter]:
    """The dead letters waiting in the session's outbox (no drain runs in these tests)."""
    raws = await store.client.lrange(session_keys(session_id)[9], 0, -1)
    return [letter_of(session_id, raw).letter for raw in raws]


class Both:
    """The committer of a test, open on an event loop thread of its own for all its examples
    (connecting to a cluster costs more than an example); ``run`` runs a script on both."""

    def __init__(self, portal: BlockingPortal, committer: SharedCommitter) -> None:
        self.portal = portal
        self.committer = committer
        #: matching reads of the last run that found some firings (for ``event``)
        self.matched = 0
        #: what the last run's steps of groups did (for ``event``)
        self.seen: Counter[str] = Counter()

    def run(self, session_id: str, limit: int, script: list[Any]) -> None:
        self.matched = 0
        self.seen.clear()
        self.portal.call(self._run, session_id, limit, script)

    async def _run(self, session_id: str, limit: int, script: list[Any]) -> None:
        core = Session(session_id, limit)
        committer = self.committer
        await committer.store.client.delete(*session_keys(session_id))
        started = await committer.start(session_id, limit, False).result()
        assert started == (session_id, True)
        looked: int | None = None  # where the next ``Look`` goes on from
        clock = Clock()
        for step, item in enumerate(script):
            if isinstance(item, Looked):
                committer.looked(session_id)
                core.evaluations += 1
                continue
            if isinstance(item, Tick):
                clock.now += item.ms
                continue
            op = (
                clock.op(item)
                if isinstance(item, GroupStep)
                else ReadAfter(looked, item.max, item.match)
                if isinstance(item, Look)
                else item
            )
            if isinstance(op, AddTimer):  # generated for no session in particular
                op = AddTimer(msgspec.structs.replace(op.timer, session=session_id))
            expected = answer_of(lambda op=op: (op.check(), op.run(core, None))[1])
            got = await redis_answer(committer, session_id, op)
            assert got == expected, (step, op)
            if getattr(op, "match", None) is not None and expected[0] == "ok":
                self.matched += bool(getattr(expected[1], "firings", None))
            if isinstance(item, Look) and expected[0] == "ok":
                batch = expected[1]
                looked = None if batch.firings or batch.lost else batch.next
            took = isinstance(op, ClaimFiring | FinishNext) and expected[0] == "ok"
            if took and expected[1] is not None:
                clock.tokens.append(expected[1].claim.token)
                self.seen["claims that took a firing"] += 1
                self.seen["retries"] += expected[1].claim.attempt > 1
            if expected[0] == "error" and expected[1] == "lease_lost":
                self.seen["stale claims refused"] += 1
        owed = committer._owed.pop(session_id, 0)  # what no read of the script handed over
        if owed:
            await committer.store.looked(session_id, owed)
        snapshot, evaluations = await stored(committer.store, session_id)
        assert snapshot == core.snapshot()
        assert evaluations == core.evaluations
        assert await dead_letters(committer.store, session_id) == core.groups.outbox
        self.seen["dead letters"] += len(core.groups.outbox)


@pytest.fixture
def both(redis_url: str) -> Iterator[Both]:
    with start_blocking_portal("asyncio") as portal:
        committer = SharedCommitter(RedisStore(redis_url), Quiet())
        portal.call(committer.load)
        try:
            yield Both(portal, committer)
        finally:
            portal.call(committer.close)


#: a random script on a random session: the same for the suite's run and the long one
SCRIPTS = {
    "session_id": st.sampled_from(SESSIONS),
    "limit": st.integers(0, 4),
    "script": st.lists(ops, min_size=15, max_size=60),
}
FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


# 60 scripts a kind of Redis in the suite (some 3 s each); DIFFERENTIAL_EXAMPLES=N for more
@settings(max_examples=examples(60, "DIFFERENTIAL_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**SCRIPTS)
def test_redis_answers_as_the_core_does(
    both: Both, session_id: str, limit: int, script: list[Op[Any]]
) -> None:
    both.run(session_id, limit, script)
    event(f"matching reads that found firings: {min(both.matched, 3)}+")


# tags and matches drawn from a tiny pool, so that most matches hold for some firing
pool_tags = st.dictionaries(tag_keys, st.sampled_from(["1", "2"]) | tag_values, max_size=3)
pool_matches = st.builds(
    Match,
    tags=st.dictionaries(
        match_keys, st.sampled_from([None, None, "1", "2", "root", "agent-1"]), max_size=2
    ),
    handler=st.sampled_from([None, None, None, "on-message", "on-build"]),
)
tag_kinds = {
    "record": st.builds(
        Record,
        handler=st.sampled_from(["on-message", "on-message", "on-build"]),
        text=st.text(max_size=3),
        ts=st.just(TS),
        key=st.sampled_from([None, None, "k1", "k2"]),
        tags=pool_tags,
        by=senders,
    ),
    "timer": timers(),
    "fire": kinds["fire"],
    "after": st.builds(
        ReadAfter, after=st.none() | st.none() | seqs, max=counts, match=pool_matches
    ),
    "cursor": st.builds(
        ReadCursor,
        cursor=st.sampled_from(["c1", "c2", "c1", "a b"]),
        max=counts,
        touch=st.booleans(),
        match=pool_matches,
    ),
    "look": st.builds(Look, match=pool_matches, max=st.none() | st.integers(1, 3)),
    "recent": recent_reads,
    "seq": st.builds(ReadSeq, seq=seqs),
    "ack": st.builds(Ack, cursor=names, seq=seqs),
    "ack_read": st.builds(
        AckRead, cursor=st.sampled_from(["c1", "c2"]), seq=seqs, max=counts, match=pool_matches
    ),
    "limit": st.builds(SetLimit, limit=st.sampled_from([0, 2, 5, 12])),
}
tag_weights = ["record"] * 5 + ["after"] * 2 + ["cursor"] * 2 + ["look"] * 3
tag_weights += ["timer", "fire", "ack", "ack", "ack_read", "ack_read", "limit"]
tag_ops = st.sampled_from(tag_weights).flatmap(lambda kind: tag_kinds[kind])


#: a script of tagged sends and matching reads, whose matches mostly hold for some firing
MATCH_SCRIPTS = {
    "session_id": st.sampled_from(SESSIONS),
    "limit": st.integers(0, 12),
    "script": st.lists(tag_ops, min_size=15, max_size=60),
}


@settings(max_examples=examples(60, "DIFFERENTIAL_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**MATCH_SCRIPTS)
def test_redis_matches_as_the_core_does(
    both: Both, session_id: str, limit: int, script: list[Op[Any] | Look]
) -> None:
    """Tagged sends and timers, and matching reads and looks that mostly find something."""
    both.run(session_id, limit, script)
    event(f"matching reads that found firings: {min(both.matched, 3)}+")


# -- groups and claims (SPEC §16) -------------------------------------------------------


class Tick(msgspec.Struct, frozen=True):
    """The clock moves on: leases run out, delays end."""

    ms: int


class GroupStep(msgspec.Struct, frozen=True):
    """A step of the groups at the script's clock: ``kind`` claim, done, release, extend,
    expire, configure, groups, claims or progress; ``pick`` chooses among the claims
    answered so far (None, or none answered: a made-up token), or is a join's upto."""

    kind: str
    group: str = "work"
    ms: int = 0  # a claim's or an extend's lease, a release's delay
    match: Match | None = None
    from_now: bool = False
    pick: int | None = None
    max_attempts: int | None = None
    dead_letter: str | None = None
    #: whether whoever asks sees the default dead-letter session (False: a scoped token
    #: that does not, whose claim or configure must make no group)
    sees: bool = True


class Clock:
    """A script's clock and the claims it was answered."""

    def __init__(self) -> None:
        self.now = 1_800_000_000_000
        self.tokens: list[str] = []

    def token(self, step: GroupStep) -> str:
        if step.pick is None or not self.tokens:
            return f"{step.group}:{(step.pick or 0) + 1}:1"
        return self.tokens[step.pick % len(self.tokens)]

    def op(self, step: GroupStep) -> Op[Any]:
        now = self.now
        match step.kind:
            case "claim":
                return ClaimFiring(step.group, now, step.ms, step.match, step.from_now, step.sees)
            case "done":
                return Finish(self.token(step), now)
            case "done_next":
                return FinishNext(self.token(step), now, step.ms)
            case "release":
                return Release(self.token(step), now, step.ms)
            case "extend":
                return Extend(self.token(step), now, step.ms)
            case "expire":
                return ExpireGroups(now)
            case "configure":
                return ConfigureGroup(
                    step.group, now, step.max_attempts, step.dead_letter, step.from_now, step.sees
                )
            case "groups":
                return GroupTable(now)
            case "progress":
                return GroupProgress(step.group, now, step.pick)
        return ClaimTable(None if step.group == "*" else step.group)


group_names = st.sampled_from(["work", "work", "work", "other", "a b"])
#: mostly a claim answered before (its token live or stale by now), at times a made-up one
picks = st.one_of(st.integers(0, 9), st.integers(0, 9), st.integers(0, 9), st.none())
leases = st.sampled_from([1000] * 6 + [3000] * 2 + [999, 86_400_001])
sees = st.sampled_from([True, True, True, False])
group_kinds = {
    "record": tag_kinds["record"],
    "limit": st.builds(SetLimit, limit=st.sampled_from([0, 2, 5, 12])),
    "tick": st.builds(Tick, ms=st.sampled_from([0, 500, 1000, 2500, 5000])),
    "claim": st.builds(
        GroupStep,
        kind=st.just("claim"),
        group=group_names,
        ms=leases,
        match=st.none() | st.none() | pool_matches,
        from_now=st.booleans(),
        sees=sees,
    ),
    "done": st.builds(GroupStep, kind=st.just("done"), pick=picks),
    "done_next": st.builds(GroupStep, kind=st.just("done_next"), ms=leases, pick=picks),
    "release": st.builds(
        GroupStep,
        kind=st.just("release"),
        ms=st.sampled_from([0, 0, 1500, -1]),
        pick=picks,
    ),
    "extend": st.builds(GroupStep, kind=st.just("extend"), ms=leases, pick=picks),
    "expire": st.just(GroupStep(kind="expire")),
    "configure": st.builds(
        GroupStep,
        kind=st.just("configure"),
        group=group_names,
        max_attempts=st.sampled_from([None, 1, 1, 2, 2, 0]),
        dead_letter=st.sampled_from([None, "dead", "a", "b", "c", "bad id"]),
        from_now=st.booleans(),
        sees=sees,
    ),
    "groups": st.just(GroupStep(kind="groups")),
    "claims": st.builds(GroupStep, kind=st.just("claims"), group=st.sampled_from(["*", "work"])),
    # a join's look: up to the head (pick None), or up to a seq (one after the head too)
    "progress": st.builds(
        GroupStep,
        kind=st.just("progress"),
        group=st.sampled_from(["work", "other", "none"]),
        pick=st.none() | st.integers(0, 9),
    ),
}
group_weights = ["record"] * 4 + ["claim"] * 5 + ["tick"] * 3 + ["done"] * 2
group_weights += ["done_next"] * 2 + ["release"] * 2 + ["configure"] * 2
group_weights += ["extend", "expire", "groups", "claims", "limit", "progress"]
group_ops = st.sampled_from(group_weights).flatmap(lambda kind: group_kinds[kind])

#: a script of sends and the steps of groups at a clock that moves on
GROUP_SCRIPTS = {
    "session_id": st.sampled_from(SESSIONS),
    "limit": st.integers(0, 8),
    "script": st.lists(group_ops, min_size=15, max_size=60),
}


@settings(max_examples=examples(60, "DIFFERENTIAL_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**GROUP_SCRIPTS)
def test_redis_groups_claim_as_the_core_does(
    both: Both, session_id: str, limit: int, script: list[Any]
) -> None:
    """Claims, dones, dones with the next claim (``FinishNext``), releases, extends and
    expiries (stale and made-up tokens too), a group's settings, its counts and its
    claims, against the ring's bound and a clock that moves: the same answers, the same
    groups, the same dead letters left to record."""
    both.run(session_id, limit, script)
    for what, count in both.seen.items():
        event(f"{what}: {min(count, 3)}+")


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=examples(200, "DIFFERENTIAL_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**GROUP_SCRIPTS)
def test_redis_groups_claim_as_the_core_does_over_a_long_search(
    both: Both, session_id: str, limit: int, script: list[Any]
) -> None:
    both.run(session_id, limit, script)


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=examples(200, "DIFFERENTIAL_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**SCRIPTS)
def test_redis_answers_as_the_core_does_over_a_long_search(
    both: Both, session_id: str, limit: int, script: list[Op[Any]]
) -> None:
    both.run(session_id, limit, script)


@pytest.mark.slow
@pytest.mark.timeout(900)
@settings(max_examples=examples(200, "DIFFERENTIAL_EXAMPLES"), suppress_health_check=FIXTURES)
@given(**MATCH_SCRIPTS)
def test_redis_matches_as_the_core_does_over_a_long_search(
    both: Both, session_id: str, limit: int, script: list[Op[Any] | Look]
) -> None:
    both.run(session_id, limit, script)


def test_a_long_run_reaches_every_bound(both: Both) -> None:
    """More than 4 keys, more than 3 cursors, limits lowered and raised, in one run."""
    script: list[Op[Any]] = []
    for n in range(60):
        script.append(Record("on-message", f"m{n}", TS, key=f"k{n % 7}"))
        script.append(ReadCursor(f"c{n % 5}"))
        script.append(Ack(f"c{(n + 2) % 5}", n // 2))
        if n % 9 == 0:
            script.append(SetLimit(n % 4))
        if n % 11 == 0:
            script.append(Poll(max=2))
    script += [ReadAfter(0), CursorTable(), Describe()]
    for session_id in SESSIONS:
        both.run(session_id, 3, script)


def test_firing_text_comes_back_exactly(both: Both) -> None:
    texts = ["", "a\nb", "é ☃ \U0001f600", "\x00 nul", "x" * 5000, '{"json": true}']
    script: list[Op[Any]] = [Record("on-message", t, TS) for t in texts]
    script += [Record("on-tick", t, TS) for t in texts]
    script.append(ReadAfter(0))
    both.run("a", 20, script)
    assert Firing(1, "on-message", "", None, TS).result == ""


def test_timers_fire_as_the_core_fires_them(both: Both) -> None:
    """Due, not due, missed periods, keys pending and fired, the limit, cancels: one run."""

    def timer(name: str, due: int, every: int | None = None, key: str | None = None) -> AddTimer:
        return AddTimer(
            Timer(
                id=name,
                session="?",
                due_ms=due,
                every_ms=every,
                handler="on-message",
                text=name,
                key=key,
            )
        )

    script: list[Op[Any]] = [
        timer("t1", 100),
        timer("t2", 200, every=1000),
        timer("t3", 300, key="k1"),
        timer("t4", 400, key="k1"),  # its key's timer is pending: a duplicate
        timer("t4", 400),  # the fourth: over the limit of 3
        FireTimers(["t1", "t2", "t3", "t9"], 250, TS),  # t1 and t2 fire, t3 is not due
        FireTimers(["t2", "t3"], 5600, TS),  # t2 missed five periods: once; t3 with its key
        timer("t5", 100, key="k1"),  # k1 fired: a duplicate of that firing
        TimerList(),
        CancelTimer("t2"),
        CancelTimer("t2"),
        FireTimers(["t2"], 99_999, TS),
        ReadAfter(0),
        Describe(),
    ]
    for session_id in SESSIONS:
        both.run(session_id, 8, script)


def test_matching_reads_over_a_long_ring_agree(both: Both) -> None:
    """A ring of 600 with a match every 150th seq and a few at the end: a read with ``max``
    goes through the ring's entries in pieces (128 at least) and stops at its last match; the
    same looks without ``max``, over the whole ring, after a seq, through a cursor."""
    script: list[Op[Any] | Look] = []
    for n in range(1, 650):
        tags = {"corr": f"c{n}"} if n % 150 == 0 or n > 640 else {"n": str(n % 3)}
        script.append(Record("on-message" if n % 7 else "on-build", f"m{n}", TS, tags=tags))
    corr, third = Match({"corr": None}), Match({"n": "2"}, "on-build")
    for max in (None, 1, 2, 5, 200):
        script += [ReadAfter(None, max, corr), ReadAfter(0, max, corr), ReadAfter(300, max, corr)]
        script += [ReadCursor("c1", max, match=corr), ReadAfter(None, max, third)]
        script += [Look(corr, max), Look(Match({"corr": "c641"}), max), Look(corr, max)]
    script += [ReadAfter(None, None, Match({"absent": None})), Look(Match({"absent": None}))]
    script += [Record("on-message", "late", TS, tags={"absent": "now"})]
    script += [Look(Match({"absent": None})), Look(Match({"absent": "now"}), 1)]
    both.run("b", 600, script)


def test_tagged_timers_fire_with_their_tags(both: Both) -> None:
    """A one-shot and a recurring timer with tags, and one without: their firings carry the
    timer's tags in every store, and a matching read finds them by tag and by handler."""

    def timer(
        name: str, due: int, tags: dict[str, str] | None, every: int | None = None
    ) -> AddTimer:
        return AddTimer(
            Timer(
                id=name,
                session="?",
                due_ms=due,
                every_ms=every,
                handler="on-tick" if every else "on-message",
                text=name,
                tags=tags,
            )
        )

    script: list[Op[Any] | Look] = [
        timer("t1", 100, {"corr": "c-1", "reply-to": "me"}),
        timer("t2", 200, {"kind": "beat", "z": 'ä\n"/'}, every=1000),
        timer("t3", 300, None),
        TimerList(),
        FireTimers(["t1", "t2", "t3"], 350, TS),
        FireTimers(["t2"], 2500, TS),
        TimerList(),
        ReadAfter(None, match=Match({"kind": "beat"})),
        ReadAfter(None, match=Match({}, "on-tick")),
        ReadAfter(0, 1, Match({"corr": "c-1"})),
        ReadAfter(0, match=Match({"reply-to": "you"})),
        ReadAfter(0),
    ]
    for session_id in SESSIONS:
        both.run(session_id, 8, script)


def test_a_refused_step_forgets_a_dead_seq_the_ring_dropped(both: Both) -> None:
    """Found by the long search: a firing dead in a group, then dropped by the ring, then a
    refused done: the core forgets its dead seq (the ring no longer holds it), and so must
    Redis, though nothing else of the group changed."""
    record = Record("on-message", "", TS)
    script: list[Any] = [record] * 7 + [SetLimit(2)] + [record] * 4
    script += [
        GroupStep(kind="claim", ms=1000),
        GroupStep(kind="configure", max_attempts=1),
        GroupStep(kind="release", pick=0),
        record,
        GroupStep(kind="done", pick=None),
    ]
    both.run("a", 0, script)
