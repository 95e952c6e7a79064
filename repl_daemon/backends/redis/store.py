"""The Redis store: several daemons share sessions, and Redis is the only copy.

Each method here is one script's call and the reading of its answer. The calls
go through ``pipeline.py`` (the connections, a pipeline a round trip, the cluster's
routing of each slot, the replicated path with ``WAIT``); what the keys hold is
read back by ``entries.py``. The scripts themselves are in ``scripts.py``, the
wakes in ``wakes.py``, the timers in ``timers.py``.

Each session lives under keys with the hash tag ``{ID}`` (one hash slot, so
the same layout runs on one Redis and on a Redis Cluster; the keys are
listed in ``repl_daemon.backends.redis.scripts``), and every operation on a
session is one Lua script on those keys: one round trip, one atomic step,
no version check and no retry. The daemon keeps no copy: every answer is
what Redis holds at that moment.

Wakes go over sharded pub/sub: each new firing is published, inside the
script that records it, on the session's own shard channel
(``repl:{ID}:wake``). A channel a script publishes on must hash to the
script's own slot, so the finest partition, the session, is also the only
one that keeps the publish atomic with the change; a daemon subscribes to
the channels of the sessions it has waiters on, one subscriber connection
per node, and an idle waiter costs it no work and Redis no command.

The client is redis-py's asyncio one (``redis.asyncio``), in the daemon's
event loop. URLs (rules D9):

- ``redis://[USER:PASSWORD@]HOST:PORT/DB``, ``rediss://...`` (TLS): one Redis,
  or its primary;
- ``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`` (and
  ``rediss+cluster://``): a Redis Cluster, found from any of its nodes;
- ``?replicas=N`` on either: a change is answered only once N replicas
  have it (Redis ``WAIT``), so a failover loses nothing that was answered.
  Without it, ``open`` makes it 1 when every primary has a replica (else 0):
  a failover that loses answered firings also hands their seqs to later
  ones. Should one happen anyway, the heads the answers carry show it
  (``repl_daemon.backends.redis.heads``): it is logged and counted.

A password never appears in ``name``, in a log line or in an error.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec

from repl_daemon.backends.redis.entries import (
    Definition,
    definition_bytes,
    description,
    firing_of,
    score,
    timer_of,
)
from repl_daemon.backends.redis.heads import Heads, Known
from repl_daemon.backends.redis.keys import (
    AUTH,
    auth_keys,
    partition_keys,
    session_keys,
)
from repl_daemon.backends.redis.pipeline import Pipeline
from repl_daemon.backends.redis.target import Target, failed
from repl_daemon.metrics import Counts
from session.delta import Webhook
from session.errors import (
    BY_CODE,
    NoSuchSession,
    ReplError,
    StoreFailed,
    no_such_session,
)
from session.firing import NO_TAGS, Batch, CursorInfo
from session.rules import HANDLERS, MAX_CURSORS, MAX_KEYS, MAX_TIMERS
from session.schedule import Timer, timer_order
from session.scopes import (
    MAX_TOKENS,
    TokenRecord,
    no_such_token,
    token_exists,
    too_many_tokens,
)
from session.session import (
    Fired,
    Recorded,
    Scheduled,
    Summary,
    no_such_timer,
    timer_exists,
    too_many_timers,
)
from session.tags import Match, Tags

log = logging.getLogger("repl.daemon")

_json = msgspec.json.Encoder()
_token_record = msgspec.json.Decoder(TokenRecord)

T = TypeVar("T")

# the timer scripts' refusals, with the core's own words (the script names the timer)
_TIMER_ERRORS: dict[str, Callable[[str, str], ReplError]] = {
    "bad_time": timer_exists,
    "too_many": lambda session_id, _: (
        too_many_tokens() if session_id == AUTH else too_many_timers(session_id)
    ),
    "no_such_timer": no_such_timer,
    "token_exists": lambda _, name: token_exists(name),
    "no_such_token": lambda _, name: no_such_token(name),
}


class RedisStore:
    """Sessions in Redis, shared by every daemon pointed at the same Redis or Cluster."""

    durable = True

    def __init__(self, url: str) -> None:
        """Check the URL; ``open`` connects. ``StoreFailed`` for a URL that is not one."""
        try:
            import redis.asyncio  # noqa: F401 - the extra must be there before anything else
        except ImportError:
            raise StoreFailed(
                "--store redis:// needs the redis client: pip install 'repl-inbox[redis]'"
            ) from None
        self.target = Target(url)
        # names this daemon in what it publishes, so it can skip its own wakes
        self.origin = secrets.token_hex(8)
        #: the connections every script goes by
        self.pipeline = Pipeline(self.target)
        #: the heads Redis answered, per session: to notice one going back (a failover)
        self.heads = Heads()
        #: what ``open`` settled of the replicas, for the daemon's log: (level, one line)
        self.replication: tuple[int, str] = (logging.INFO, "")

    @property
    def name(self) -> str:
        """The store as logs, ``ping`` and ``stats`` show it (the replicas in use, once open)."""
        return f"redis:{self.target.name}"

    @property
    def client(self) -> Any:
        """redis-py's client, once open: for what goes around the pipelines (the wakes)."""
        return self.pipeline.client

    @property
    def counts(self) -> Counts:
        """Where the round trips, failures and heads that went back are counted."""
        return self.pipeline.counts

    @counts.setter
    def counts(self, counts: Counts) -> None:
        self.pipeline.counts = counts

    async def open(self) -> None:
        """Connect and check that Redis answers; ``StoreFailed`` (one line) when it does not."""
        self.replication = await self.pipeline.open()

    async def close(self) -> None:
        """Disconnect; an operation still queued or on its way fails with ``StoreFailed``."""
        await self.pipeline.close()

    def subscriber_options(self) -> tuple[bool, dict[str, Any]]:
        """How a wake subscriber connects: no socket timeout, it waits as long as its waiters."""
        return self.target.cluster, self.target.client_options()

    # -- running one script ---------------------------------------------------------

    def script(
        self,
        script: str,
        session_id: str,
        args: tuple[object, ...],
        *,
        change: bool,
        then: Callable[[list[Any]], T],
        keys: Callable[[str], list[str]] = session_keys,
        refusal: Callable[[str, str], ReplError | None] | None = None,
    ) -> asyncio.Future[T]:
        """Run ``script`` on the session's keys; the future answers ``then(its answer)``.

        ``then`` gets the script's answer after its status; a refusal (``err CODE
        MESSAGE``) raises the core's error, or what ``refusal(CODE, MESSAGE)`` words it as
        (when it answers one).
        """

        def answer(reply: Any) -> T:
            if reply[0] == b"err":
                code, message = reply[1].decode(), reply[2].decode()
                worded = None if refusal is None else refusal(code, message)
                if worded is not None:
                    raise worded
                timer_error = _TIMER_ERRORS.get(code)
                if timer_error is not None:
                    raise timer_error(session_id, message)
                error = BY_CODE.get(code, StoreFailed)  # the core's class of the code
                if error is NoSuchSession:
                    raise no_such_session(session_id)
                raise error(message)
            return then(reply[1:])

        return self.pipeline.run(script, session_id, args, change=change, then=answer, keys=keys)

    # -- the operations -------------------------------------------------------------
    #
    # Each returns a future (await it, or give it a callback): its answer, or the
    # core's error for a refusal, or ``StoreFailed``.

    def record(
        self,
        session_id: str,
        handler: str,
        text: str,
        ts: str,
        *,
        handled: bool,
        key: str | None = None,
        tags: Tags = NO_TAGS,
        by: str | None = None,
    ) -> asyncio.Future[Recorded]:
        """Record a firing sent by ``by`` (None: no one known); ``tags`` (checked by the
        caller) go into its entry as JSON."""
        encoded = _json.encode(tags) if tags else ""
        args = (handler, text, "1" if handled else "0", ts, key or "", MAX_KEYS, self.origin)
        before = self.heads.before(session_id)

        def recorded(answer: list[Any]) -> Recorded:
            seq, duplicate, head, incarnation, retained = answer
            found = int(head) if duplicate else int(seq) - 1
            self._learned(session_id, before, incarnation, found, int(head))
            return Recorded(int(seq), duplicate=bool(duplicate), retained=bool(retained))

        return self.script(
            "RECORD", session_id, (*args, encoded, by or ""), change=True, then=recorded
        )

    def read(
        self,
        session_id: str,
        mode: str,
        start: str | int | None,
        max: int | None,
        *,
        touch: bool = False,
        match: Match | None = None,
        ack: int | None = None,
        owed: int = 0,
    ) -> asyncio.Future[Batch]:
        """``mode`` "after" (``start`` a seq, None for the whole retained ring), "cursor" or
        "poll" (``start`` a cursor's name); with ``match`` only the firings it holds for.
        ``ack`` (mode "cursor"): ack the cursor to that seq first, in the same script.
        ``owed``: evaluations of this daemon's to count with it (looks it answered from
        published firings)."""
        change = mode == "poll" or (mode == "cursor" and touch) or ack is not None
        args = (
            mode,
            "" if start is None else start,
            "" if max is None else max,
            "1" if touch else "0",
            MAX_CURSORS,
            "" if match is None else _json.encode(match),
            "" if ack is None else ack,
            owed,
        )
        before = self.heads.before(session_id)

        def batch(answer: list[Any]) -> Batch:
            next, lost, entries, head, incarnation = answer
            self._learned(session_id, before, incarnation, int(head), int(head))
            return Batch(int(next), int(lost), [firing_of(entry) for entry in entries])

        return self.script("READ", session_id, args, change=change, then=batch)

    def _learned(
        self,
        session_id: str,
        before: Known | None,
        incarnation: bytes | None,
        found: int,
        head: int,
    ) -> None:
        """An answer carried the session's head: say so, once a session, if it went back."""
        went = self.heads.learned(session_id, before, incarnation or b"", found, head)
        if went is None:
            return
        self.counts.heads_went_back += 1
        if not went.first:
            return
        if self.target.replicas:
            why = (
                "a failover to a replica that did not have them, or Redis restarted from older data"
            )
        else:
            why = (
                "a failover to a replica that lagged, or Redis restarted from older data; "
                "?replicas=1 makes each change wait for a replica"
            )
        first, last = went.head + 1, went.highest
        gone = f"seq {last:,}" if first == last else f"seqs {first:,} to {last:,}"
        log.warning(
            "session %r: its head went back from %s to %s: Redis lost answered firings (%s), "
            "and new firings take their seqs again (%s); logged once a session, counted in "
            "repl_heads_went_back_total",
            session_id,
            f"{went.highest:,}",
            f"{went.head:,}",
            gone,
            why,
        )

    def ack(self, session_id: str, cursor: str, seq: int) -> asyncio.Future[int]:
        args = (cursor, seq, MAX_CURSORS)
        return self.script("ACK", session_id, args, change=True, then=_number)

    def looked(self, session_id: str, owed: int) -> asyncio.Future[None]:
        """Count ``owed`` evaluations in the session (none if it is gone)."""
        return self.script("LOOKED", session_id, (owed,), change=True, then=_nothing)

    def check_ack(self, session_id: str, seq: int) -> asyncio.Future[None]:
        return self.script("CHECK_ACK", session_id, (seq,), change=False, then=_nothing)

    def set_limit(self, session_id: str, limit: int) -> asyncio.Future[int]:
        return self.script("SET_LIMIT", session_id, (limit,), change=True, then=_number)

    def summary(self, session_id: str) -> asyncio.Future[Summary]:
        """The session's figures."""

        def summary(answer: list[Any]) -> Summary:
            return description(session_id, answer)[0]

        return self.script("DESCRIBE", session_id, (), change=False, then=summary)

    def cursor_table(self, session_id: str) -> asyncio.Future[list[CursorInfo]]:
        """The session's cursor table, most recently used first."""

        def table(answer: list[Any]) -> list[CursorInfo]:
            return description(session_id, answer)[1]

        return self.script("DESCRIBE", session_id, (), change=False, then=table)

    def start(self, session_id: str, limit: int) -> asyncio.Future[bool]:
        """Create the session, a new incarnation of it; False when it exists already."""
        args = (limit, secrets.token_hex(8))
        return self.script("START", session_id, args, change=True, then=_yes)

    def stop(self, session_id: str) -> asyncio.Future[list[tuple[str, int]]]:
        """Remove the session and all of it; answers the (id, due time) of its timers."""

        def stopped(answer: list[Any]) -> list[tuple[str, int]]:
            self.heads.forget(session_id)
            flat = answer[0]
            return [(flat[i].decode(), int(float(flat[i + 1]))) for i in range(0, len(flat), 2)]

        return self.script("STOP", session_id, (self.origin,), change=True, then=stopped)

    # -- the webhook (rules H1-H7) ----------------------------------------------------

    def set_webhook(self, session_id: str, webhook: Webhook | None) -> asyncio.Future[None]:
        args = ("", "") if webhook is None else (webhook.secret, webhook.handler)
        return self.script("SET_WEBHOOK", session_id, args, change=True, then=_nothing)

    def webhook(self, session_id: str) -> asyncio.Future[Webhook | None]:
        def found(answer: list[Any]) -> Webhook | None:
            secret, handler = answer
            return Webhook(secret.decode(), handler.decode()) if secret else None

        return self.script("GET_WEBHOOK", session_id, (), change=False, then=found)

    # -- timers (rules T1-T6) ---------------------------------------------------------
    #
    # A timer lives with its session (``timers``, ``due``); the partitions' index
    # says which sessions have timers due, and is a hint: see ``scripts``.

    def schedule(self, timer: Timer) -> asyncio.Future[Scheduled]:
        """Add the timer to its session (or find what its key made): ``Session.schedule``."""
        handled = timer.handler in HANDLERS
        tags = _json.encode(timer.tags).decode() if timer.tags else None
        definition = definition_bytes(
            Definition(
                timer.every_ms, timer.handler, timer.text, timer.key, "r" if handled else "e", tags
            )
        )
        args = (timer.id, timer.due_ms, definition, timer.key or "", MAX_TIMERS)

        def scheduled(answer: list[Any]) -> Scheduled:
            timer_id, due, duplicate, seq, raw = answer
            if seq:
                return Scheduled(None, duplicate=True, seq=int(seq))
            made = timer_of(timer.session, timer_id.decode(), due, raw)
            return Scheduled(made, duplicate=bool(duplicate))

        return self.script("SCHEDULE", timer.session, args, change=True, then=scheduled)

    def cancel_timer(self, session_id: str, timer_id: str) -> asyncio.Future[Timer]:
        def cancelled(answer: list[Any]) -> Timer:
            raw, due = answer
            return timer_of(session_id, timer_id, due, raw)

        return self.script("CANCEL", session_id, (timer_id,), change=True, then=cancelled)

    def timer_list(self, session_id: str) -> asyncio.Future[list[Timer]]:
        """The session's pending timers, soonest first (then by id)."""

        def listed(answer: list[Any]) -> list[Timer]:
            timers = [
                timer_of(session_id, answer[i].decode(), answer[i + 2], answer[i + 1])
                for i in range(0, len(answer), 3)
            ]
            timers.sort(key=timer_order)
            return timers

        return self.script("TIMERS", session_id, (), change=False, then=listed)

    def fire_timers(
        self, session_id: str, timer_ids: list[str], now_ms: int, ts: str
    ) -> asyncio.Future[list[Fired]]:
        """Fire those still due: the firing and the timer's move are one script (``FIRE``)."""
        args = (now_ms, ts, MAX_KEYS, self.origin, *timer_ids)

        def fired(answer: list[Any]) -> list[Fired]:
            return [
                Fired(
                    timer_id.decode(),
                    None if int(seq) < 0 else int(seq),
                    None if int(due) < 0 else int(due),
                )
                for timer_id, seq, due in answer[0]
            ]

        return self.script("FIRE", session_id, args, change=True, then=fired)

    def claim(
        self, partition: str, now_ms: int, lease_until: int, max: int
    ) -> asyncio.Future[tuple[list[tuple[str, str]], int | None]]:
        """Claim the partition's entries due at ``now_ms``: (session, timer) each, and the
        earliest due time left in the partition."""

        def claimed(answer: list[Any]) -> tuple[list[tuple[str, str]], int | None]:
            members, first = answer
            pairs = []
            for member in members:
                session_id, _, timer_id = member.decode().partition(" ")
                pairs.append((session_id, timer_id))
            return pairs, score(first)

        args = (now_ms, lease_until, max)
        return self.script("CLAIM", partition, args, change=True, then=claimed, keys=partition_keys)

    def index(
        self,
        partition: str,
        *,
        lower: Sequence[tuple[str, str, int]] = (),
        due: Sequence[tuple[str, str, int | None, int]] = (),
        gone: Sequence[tuple[str, str, int | None]] = (),
    ) -> asyncio.Future[int | None]:
        """Update the partition's index: entries (session, timer, due time) to ``lower``
        (added, or moved sooner only); entries (session, timer, expected, due time) to set
        and (session, timer, expected) to remove, each only while its score is still
        ``expected`` (None: whatever it is). Answers the partition's earliest due time
        after (published when it moved sooner)."""
        args: list[object] = [self.origin, len(lower), len(due)]
        for session_id, timer_id, when in lower:
            args += [f"{session_id} {timer_id}", when]
        for session_id, timer_id, expected, when in due:
            args += [f"{session_id} {timer_id}", "" if expected is None else expected, when]
        for session_id, timer_id, expected in gone:
            args += [f"{session_id} {timer_id}", "" if expected is None else expected]

        def earliest(answer: list[Any]) -> int | None:
            return score(answer[0])

        return self.script(
            "INDEX", partition, tuple(args), change=True, then=earliest, keys=partition_keys
        )

    # -- scoped tokens (rules K1-K5) ----------------------------------------------------

    def add_token(self, record: TokenRecord) -> asyncio.Future[None]:
        args = (record.name, record.digest, _json.encode(record).decode(), MAX_TOKENS)
        return self.script("TOKEN_ADD", AUTH, args, change=True, then=_nothing, keys=auth_keys)

    def revoke_token(self, name: str) -> asyncio.Future[TokenRecord | None]:
        def revoked(answer: list[Any]) -> TokenRecord | None:
            return _token_record.decode(answer[0]) if answer[0] else None

        return self.script("TOKEN_REVOKE", AUTH, (name,), change=True, then=revoked, keys=auth_keys)

    def find_tokens(self, digest: str = "") -> asyncio.Future[list[TokenRecord]]:
        """The token with this digest (none or one), or every token with ``""``."""

        def found(answer: list[Any]) -> list[TokenRecord]:
            return [_token_record.decode(raw) for raw in answer]

        return self.script("TOKEN_FIND", AUTH, (digest,), change=False, then=found, keys=auth_keys)

    def exists(self, session_id: str) -> asyncio.Future[bool]:
        key = session_keys(session_id)[0]
        return self.pipeline.command(("EXISTS", key), key, bool)

    async def ids(self) -> list[str]:
        """Every session's id: a scan of every primary for ``repl:{*}:meta`` keys.

        The keys themselves are the listing, so no crash can leave a session
        listed that is not there, or hide one that is.
        """
        found = set()
        try:
            async for raw in self.client.scan_iter(match="repl:{*}:meta", count=1000):
                key = raw.decode()
                found.add(key[len("repl:{") : -len("}:meta")])
        except Exception as exc:
            raise failed(self.target, exc) from None
        return sorted(found)


def _number(answer: list[Any]) -> int:
    return int(answer[0])


def _yes(answer: list[Any]) -> bool:
    return bool(answer[0])


def _nothing(answer: list[Any]) -> None:
    return None
