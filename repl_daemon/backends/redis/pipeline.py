"""Sending the Redis store's scripts: pipelined, one connection a node, and answered.

Every operation of ``RedisStore`` is one script's call (``run``): packed at once
(RESP, ``_pack``), queued, and sent with whatever else is queued by the one sending
task (``_send_all``), so that under load a round trip carries up to ``MAX_BATCH``
calls. On a Redis Cluster a pipeline is split by node (the cluster client's slot
table), and a MOVED, ASK or TRYAGAIN answer sends the call again where the cluster
says. With ``?replicas=N`` a change is answered only once ``WAIT`` says N replicas
have it: on one Redis one ``WAIT`` ends the pipeline; on a cluster each change goes
on a connection of its own with its ``WAIT`` (``_replicate``). What a script answers
is the caller's to read (``then``); a broken link, a timeout or a lost change is
``StoreFailed``, worded once (``backends.redis.target.failed``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar, cast

import anyio

from repl_daemon.backends.redis import group_scripts as group_lua
from repl_daemon.backends.redis import scripts as lua
from repl_daemon.backends.redis.group_scripts import GROUP_SCRIPTS
from repl_daemon.backends.redis.keys import session_keys
from repl_daemon.backends.redis.target import Target, failed, reason
from repl_daemon.metrics import Counts
from session.errors import ReplError, StoreFailed

log = logging.getLogger("repl.daemon")

T = TypeVar("T")

#: how long a change waits for its replicas (``?replicas=N``) before it fails
REPLICA_TIMEOUT_MS = 2000
#: how long one pipeline's round trip may take before the store fails it
PIPELINE_TIMEOUT = 5.0

#: every script ``open`` loads (``scripts``, then ``group_scripts``)
SCRIPTS: tuple[str, ...] = ("RECORD", "READ", "ACK", "CHECK_ACK", "SET_LIMIT", "DESCRIBE")
SCRIPTS += ("START", "STOP", "SCHEDULE", "CANCEL", "TIMERS", "FIRE", "CLAIM", "INDEX")
SCRIPTS += ("SET_WEBHOOK", "GET_WEBHOOK", "TOKEN_ADD", "TOKEN_REVOKE", "TOKEN_FIND", "LOOKED")
SCRIPTS += GROUP_SCRIPTS
#: the most operations one pipeline carries
MAX_BATCH = 512
#: how often one call is sent again where a cluster redirects it (MOVED, ASK, TRYAGAIN)
MAX_REDIRECTS = 5
#: how long before a call answered TRYAGAIN is sent again
REDIRECT_PAUSE = 0.05
#: the most (script, session) command starts kept packed
MAX_HEADS = 4096
#: the most changes on their way at once on a cluster with ``?replicas=N``
REPLICATED_IN_FLIGHT = 64


class _Call:
    """One operation on its way to Redis; ``future`` gets its answer, ``then(reply)``.

    ``command`` is already packed (RESP bytes), so a value Redis cannot take
    fails that one call when it is made, never the pipeline it would ride.
    On a cluster ``slot`` is the hash slot of its keys (the node it goes to
    is looked up in the cluster client's table when it is sent), and
    ``redirects`` counts the MOVED, ASK and TRYAGAIN answers it had.
    """

    __slots__ = ("change", "command", "future", "redirects", "slot", "then")

    def __init__(
        self, command: bytes, change: bool, then: Callable[[Any], Any], slot: int = 0
    ) -> None:
        self.command = command
        self.change = change
        self.then = then
        self.slot = slot
        self.redirects = 0
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def finish(self, result: Any = None, error: Exception | None = None) -> None:
        """Answer the caller (``then(result)``, or ``error``); nothing if it went away."""
        future = self.future
        if future.done():  # cancelled: its caller went away
            return
        if error is None:
            try:
                result = self.then(result)
            except Exception as exc:  # the script's refusal, or a reply that is not one
                error = exc
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _pack(command: tuple[object, ...], count: int | None = None) -> bytes:
    """``command`` as RESP, the form every Redis takes: an array of bulk strings.

    What redis-py's encoder does, without its per-argument machinery (a
    fifth of a daemon's CPU on the send path). Arguments are str (UTF-8),
    bytes or int. ``count``: the array's length when ``command`` is only its
    start (the rest packed later, ``_pack_tail``).
    """
    head = b"*%d\r\n" % (len(command) if count is None else count)
    return head + _pack_tail(command)


def _pack_tail(args: tuple[object, ...]) -> bytes:
    parts = []
    for arg in args:
        raw = cast(
            bytes, arg.encode() if type(arg) is str else b"%d" % arg if type(arg) is int else arg
        )
        parts.append(b"$%d\r\n%b\r\n" % (len(raw), raw))
    return b"".join(parts)


class Pipeline:
    """The store's connections to one Redis or a Redis Cluster, from ``open`` to
    ``close``, and the one task that sends what is queued on them."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.client: Any = None
        self._scripts: dict[str, Any] = {}
        self._heads: dict[tuple[str, str], tuple[bytes, int, int]] = {}
        # the operations waiting for the next pipeline, those on their way, and the
        # one task that sends them (from ``open`` to ``close``), asleep on ``_idle``
        self._queue: list[_Call] = []
        self._in_flight: list[_Call] = []
        self._sender: asyncio.Task[None] | None = None
        self._idle: asyncio.Future[None] | None = None
        # the pipelines' own connections, with no timeout per reply: one Redis's, or
        # one a cluster node (by name)
        self._line: Any = None
        self._lines: dict[str, Any] = {}
        # a cluster with ``?replicas=N``: the changes on their way, a task each
        self._replicating: set[asyncio.Task[Any]] = set()
        self._replicated: anyio.CapacityLimiter | None = None  # made in the loop, by ``open``
        #: where the pipelines' round trips and failures are counted (``/metrics``)
        self.counts = Counts()

    # -- connecting -------------------------------------------------------------

    async def open(self) -> tuple[int, str]:
        """Connect and check that Redis answers, and settle the replicas a change waits for
        (the log level and the line that says so, ``_choose_replicas``); ``StoreFailed`` (one
        line) when it does not answer."""
        import redis.asyncio as aioredis
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        target = self.target
        options = target.client_options()
        self._replicated = anyio.CapacityLimiter(REPLICATED_IN_FLIGHT)
        try:
            if target.cluster:
                self.client = RedisCluster(
                    startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
                    socket_timeout=5,
                    **options,
                )
                await self.client.initialize()
            else:
                host, port = target.nodes[0]
                self.client = aioredis.Redis(
                    host=host, port=port, db=target.db, socket_timeout=5, **options
                )
            await self.client.ping()
        except Exception as exc:
            await self.close()
            raise StoreFailed(
                f"cannot reach Redis at {target.name}: {reason(exc)} "
                "(check that it runs and that --store names it)"
            ) from None
        for name in SCRIPTS:
            source = getattr(lua, name, None) or getattr(group_lua, name)
            self._scripts[name] = self.client.register_script(source)
        try:
            await self._load_scripts()
        except Exception as exc:
            await self.close()
            raise StoreFailed(
                f"redis at {target.name} refused the scripts: {reason(exc)}"
            ) from None
        replication = await self._choose_replicas()
        if not target.cluster:
            # a connection of the client's own kind (TCP or TLS, same credentials), but
            # with no timeout on each reply: a pipeline has one timeout in all
            pool = self.client.connection_pool
            self._line = pool.connection_class(**{**pool.connection_kwargs, "socket_timeout": None})
        self._sender = asyncio.get_running_loop().create_task(self._send_all())
        return replication

    async def _choose_replicas(self) -> tuple[int, str]:
        """Settle how many replicas each change waits for; (log level, the line that says so).

        The URL's ``?replicas=N`` when it has one. Otherwise the safe setting:
        one when every primary has a replica (``connected_slaves`` in ``INFO
        replication``), since without ``WAIT`` a failover can lose answered
        firings and hand their seqs to later ones. When only some primaries
        have one it stays 0, with a warning naming the others: ``WAIT 1``
        would refuse every change on a primary without a replica.
        """
        target = self.target
        turn_off = "?replicas=0 in the --store URL turns it off"
        if target.asked is not None:
            target.settled = True
            if target.asked:
                return logging.INFO, (
                    f"redis: every change waits for {_replicas(target.asked)} "
                    f"(?replicas={target.asked} in the --store URL)"
                )
            return logging.INFO, (
                "redis: changes wait for no replica (?replicas=0 in the --store URL): "
                "a failover can lose answered firings and give their seqs to later ones"
            )
        try:
            counts = await self._replica_counts()
        except Exception as exc:
            target.replicas, target.settled = 0, True
            which = "the primaries have" if target.cluster else "the primary has"
            return logging.WARNING, (
                f"redis: changes wait for no replica: cannot tell whether {which} any "
                f"({reason(exc)}); say ?replicas=1 or ?replicas=0 in the --store URL"
            )
        without = sorted(name for name, count in counts.items() if count == 0)
        target.replicas = 0 if without else 1
        target.settled = True
        if not without:
            what = "every primary has one" if target.cluster else "the primary has one"
            return logging.INFO, f"redis: every change waits for 1 replica, as {what}; {turn_off}"
        if len(without) == len(counts):
            what = "the primaries have none" if target.cluster else "the primary has none"
            return logging.INFO, (
                f"redis: changes wait for no replica, as {what}; with replicas a daemon "
                "waits for one (?replicas=N in the --store URL sets how many)"
            )
        named = ", ".join(without)
        what = f"the primaries {named} have" if len(without) > 1 else f"the primary {named} has"
        return logging.WARNING, (
            f"redis: changes wait for no replica, as {what} none (WAIT would refuse its "
            "changes): a failover of another primary can lose answered firings and give their "
            "seqs to later ones; give every primary a replica, or say ?replicas=0 in the "
            "--store URL"
        )

    async def _replica_counts(self) -> dict[str, int]:
        """The replicas connected to each primary, by its HOST:PORT."""
        if not self.target.cluster:
            host, port = self.target.nodes[0]
            info = await self.client.info("replication")
            return {f"{host}:{port}": int(info.get("connected_slaves", 0))}
        counts = {}
        for node in self.client.get_primaries():
            info = await node.execute_command("INFO", "replication")
            counts[node.name] = int(info.get("connected_slaves", 0))
        return counts

    async def _load_scripts(self) -> None:
        """SCRIPT LOAD every script (on every primary of a cluster), so EVALSHA finds them."""
        for script in self._scripts.values():
            await self.client.script_load(script.script)

    async def close(self) -> None:
        """Disconnect; an operation still queued or on its way fails with ``StoreFailed``."""
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        closed = StoreFailed(f"the connection to redis at {self.target.name} was closed")
        for call in [*self._in_flight, *self._queue]:
            call.finish(error=closed)
        self._queue.clear()
        for task in list(self._replicating):
            task.cancel()
        lines = [self._line, *self._lines.values()]
        self._line, self._lines = None, {}
        for line in lines:
            if line is not None:
                await line.disconnect(nowait=True)
        client, self.client = self.client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception as exc:  # closing a broken connection may fail; it is closed
                log.debug("closing the Redis client: %s", exc)

    # -- sending ----------------------------------------------------------------

    def run(
        self,
        script: str,
        session_id: str,
        args: tuple[object, ...],
        *,
        change: bool,
        then: Callable[[Any], T],
        keys: Callable[[str], list[str]] = session_keys,
    ) -> asyncio.Future[T]:
        """Run ``script`` on the session's keys; the future answers ``then(its reply)``.

        No task of its own: the call joins the next pipeline, and the one sending task
        answers it (a change on a cluster with ``?replicas=N`` goes its own way,
        ``_replicate``).
        """
        # the same start for every call of a script on a session: packed once
        known = self._heads.get((script, session_id))
        if known is None:
            if len(self._heads) >= MAX_HEADS:
                self._heads.clear()
            named = keys(session_id)
            start = ("EVALSHA", self._scripts[script].sha, len(named), *named)
            slot = self.client.keyslot(named[0]) if self.target.cluster else 0
            known = self._heads[script, session_id] = (_pack_tail(start), len(start), slot)
        head, length, slot = known
        # the array's length is the call's own: a script's ARGV may vary (FIRE, INDEX)
        command = b"*%d\r\n%b%b" % (length + len(args), head, _pack_tail(args))
        call = _Call(command, change, then, slot)
        if change and self.target.replicas and self.target.cluster:
            self._replicate(call, script, keys(session_id), args)
            return call.future
        self._queued(call)
        return call.future

    def command(
        self, command: tuple[object, ...], key: str, then: Callable[[Any], T]
    ) -> asyncio.Future[T]:
        """Send a plain command on ``key`` (its slot's node) with the next pipeline."""
        slot = self.client.keyslot(key) if self.target.cluster else 0
        call = _Call(_pack(command), False, then, slot)
        self._queued(call)
        return call.future

    def _queued(self, call: _Call) -> None:
        """Queue ``call`` for the next pipeline, waking the sender if it sleeps."""
        if self._sender is None:
            raise StoreFailed(f"redis at {self.target.name} is not connected")
        self._queue.append(call)
        idle = self._idle
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _send_all(self) -> None:
        """The store's sending task: every operation queued meanwhile shares one pipeline.

        While one pipeline is on its way the next fills up, so under load a
        round trip carries up to ``MAX_BATCH`` operations; alone, one goes at
        once. A caller that went away before its pipeline left is dropped
        from it (nothing of it is sent).
        """
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            if not queue:
                self._idle = loop.create_future()
                await self._idle
                self._idle = None
            batch = [call for call in queue[:MAX_BATCH] if not call.future.done()]
            del queue[:MAX_BATCH]
            if batch:
                self._in_flight = batch
                try:
                    await self._flush(batch)
                except Exception as exc:  # a bug here must not stop every later call
                    log.exception("the Redis pipeline failed")
                    failure = failed(self.target, exc)
                    for call in batch:
                        call.finish(error=failure)
                self._in_flight = []

    async def _flush(self, batch: list[_Call]) -> None:
        """One pipeline for ``batch`` (on a cluster, a part for each node, ``_send_cluster``)."""
        from redis.exceptions import NoScriptError

        waits = bool(self.target.replicas) and any(call.change for call in batch)
        began = time.perf_counter()
        try:
            results = await self._send(batch, waits)
            missing = [
                c for c, r in zip(batch, results, strict=False) if isinstance(r, NoScriptError)
            ]
            if missing:  # Redis lost its scripts (a restart, SCRIPT FLUSH): load them, once
                await self._load_scripts()
                again = await self._send(missing, waits)
                for call, result in zip(missing, again, strict=False):
                    results[batch.index(call)] = result
        except Exception as exc:
            self.counts.store_failures += 1
            failure = failed(self.target, exc)
            for call in batch:
                call.finish(error=failure)
            return
        self.counts.commits.observe(time.perf_counter() - began)
        if waits and (lost := unreplicated(self.target, results[len(batch)])) is not None:
            for call in batch:
                if call.change:
                    call.finish(error=lost)
        for call, result in zip(batch, results, strict=False):
            if isinstance(result, Exception):
                call.finish(error=failed(self.target, result))
            else:
                call.finish(result)

    async def _send(self, batch: list[_Call], waits: bool) -> list[Any]:
        """The replies to ``batch`` (an error reply as its exception), then ``WAIT``'s."""
        if self.target.cluster:
            return await self._send_cluster(batch)
        packed = [call.command for call in batch]
        if waits:  # WAIT counts every write before it on the pipeline's one connection
            packed.append(_pack(("WAIT", self.target.replicas, REPLICA_TIMEOUT_MS)))
        with anyio.fail_after(PIPELINE_TIMEOUT):
            return await _exchange(self._line, packed)

    async def _send_cluster(self, batch: list[_Call]) -> list[Any]:
        """``batch`` split by node, each part one pipeline on that node's connection.

        Every part is written before any reply is read, so the round trips
        overlap. A part whose node fails (a broken link, a timeout) answers
        its calls with that error, and the others keep theirs: nothing is
        sent twice. The nodes come from the cluster client's slot table; a
        MOVED, ASK or TRYAGAIN answer (nothing was run) sends the call again
        where the cluster says, up to ``MAX_REDIRECTS`` times, after reading
        the table again (a MOVED, a failover) or with ASKING (a slot on the move).
        """
        from redis import exceptions as rx

        results: list[Any] = [None] * len(batch)
        todo = list(range(len(batch)))
        asking: dict[int, tuple[str, int]] = {}
        while todo:
            parts: dict[str, tuple[Any, list[int]]] = {}
            for i in todo:
                try:
                    node = self._node(batch[i].slot, asking.get(i))
                except Exception as exc:  # no node serves the slot: the cluster is down
                    results[i] = exc
                    continue
                parts.setdefault(node.name, (node, []))[1].append(i)
            await self._exchange_parts(batch, parts, asking, results)
            todo, asking, refresh = [], {}, False
            for i, call in enumerate(batch):
                result = results[i]
                if isinstance(result, (rx.MovedError, rx.AskError, rx.TryAgainError)):
                    call.redirects += 1
                    if call.redirects > MAX_REDIRECTS:
                        continue  # answered with the redirect, as a failure
                    todo.append(i)
                    if isinstance(result, rx.AskError):
                        asking[i] = (result.host, result.port)
                    else:
                        refresh = True
                elif isinstance(result, (rx.ClusterDownError, rx.ReadOnlyError)) or (
                    isinstance(result, Exception) and not isinstance(result, rx.ResponseError)
                ):
                    refresh = True  # perhaps a failover: the next call goes to the new primary
            if refresh:
                await self._refresh()
            if todo and not asking:
                await anyio.sleep(REDIRECT_PAUSE)  # TRYAGAIN: a slot's keys are on the move
        return results

    def _node(self, slot: int, ask: tuple[str, int] | None) -> Any:
        """The node for ``slot``: its primary in the client's table, or where ASK points."""
        manager = self.client.nodes_manager
        if ask is None:
            return manager.get_node_from_slot(slot)
        host, port = ask
        node = manager.get_node(host, port)
        if node is None:  # a node the table does not know yet
            from redis.asyncio.cluster import ClusterNode

            node = ClusterNode(host, port, **manager.connection_kwargs)
        return node

    async def _exchange_parts(
        self,
        batch: list[_Call],
        parts: dict[str, tuple[Any, list[int]]],
        asking: dict[int, tuple[str, int]],
        results: list[Any],
    ) -> None:
        """Write every node's part, then read each node's replies into ``results``.

        One deadline for the round trip, but each node keeps its own: the
        parts are read at once (a task each when there are several), so a
        node that does not answer fails only its own calls. A line whose
        replies were not all read, or whose write was cut short, is dropped;
        a call that was never sent fails too, and nothing of it ran.
        """
        asking_command = _pack(("ASKING",))
        deadline = anyio.current_time() + PIPELINE_TIMEOUT
        failure = TimeoutError(f"no answer within {PIPELINE_TIMEOUT} s")
        sent: list[tuple[Any, list[int], list[bytes]]] = []

        async def by_deadline(
            line: Any, indexes: list[int], work: Awaitable[T]
        ) -> tuple[bool, T | None]:
            """``work`` on ``line`` by the round trip's deadline: (True, what it gave); when
            it fails or the deadline passes, the line is dropped and the calls ``indexes``
            are answered with why: (False, None)."""
            error: Exception | None = None
            with anyio.move_on_after(deadline - anyio.current_time()):
                try:
                    return True, await work
                except Exception as exc:
                    error = exc
            await line.disconnect(nowait=True)
            for i in indexes:
                results[i] = error or failure
            return False, None

        for name, (node, indexes) in parts.items():
            line = self._lines.get(name)
            if line is None:
                kwargs = {**node.connection_kwargs, "socket_timeout": None}
                line = self._lines[name] = node.connection_class(**kwargs)
            packed = []
            for i in indexes:
                if i in asking:  # its reply is not the call's: skipped below
                    packed.append(asking_command)
                packed.append(batch[i].command)
            written = line.send_packed_command(packed, check_health=False)
            if (await by_deadline(line, indexes, written))[0]:
                sent.append((line, indexes, packed))

        async def read(line: Any, indexes: list[int], packed: list[bytes]) -> None:
            done, replies = await by_deadline(line, indexes, _read_replies(line, len(packed)))
            if not done:
                return
            assert replies is not None  # what _read_replies gave
            answers = iter(replies)
            for i in indexes:
                if i in asking:
                    next(answers)  # ASKING's OK
                results[i] = next(answers)

        if len(sent) == 1:
            await read(*sent[0])
        else:
            async with anyio.create_task_group() as tg:
                for part in sent:
                    tg.start_soon(read, *part)

    def _replicate(
        self, call: _Call, script: str, keys: list[str], args: tuple[object, ...]
    ) -> None:
        """A change on a cluster with ``?replicas=N``: on its own connection, in a task."""
        if self._sender is None:
            raise StoreFailed(f"redis at {self.target.name} is not connected")
        task = asyncio.get_running_loop().create_task(self._run_replicated(script, keys, args))
        self._replicating.add(task)

        def replicated(task: asyncio.Task[Any]) -> None:
            self._replicating.discard(task)
            if task.cancelled():
                call.finish(error=StoreFailed(f"the connection to {self.target.name} was closed"))
                return
            error = task.exception()
            if error is None:
                call.finish(task.result())
            elif isinstance(error, ReplError):
                call.finish(error=error)
            else:
                call.finish(error=failed(self.target, error))

        task.add_done_callback(replicated)

    async def _run_replicated(self, script: str, keys: list[str], args: tuple[object, ...]) -> Any:
        """On a cluster: the script, then ``WAIT`` for the replicas on the same connection.

        It sends the script's text (``EVAL``): one round trip, and no
        ``NOSCRIPT`` to recover from on a primary that never ran it (a promoted
        replica has no scripts: Redis does not replicate its script cache).
        One Redis takes the pipeline's path instead, with one WAIT a batch.
        """
        # each change takes a connection of its own here (WAIT counts its writes): at most
        # REPLICATED_IN_FLIGHT at once, so a burst waits for one rather than being refused
        assert self._replicated is not None, "open() makes it"
        async with self._replicated:
            answer, acked = await self._on_primary(self._scripts[script], keys, args)
        failure = unreplicated(self.target, acked) if answer[0] == b"ok" else None
        if failure is not None:
            raise failure
        return answer

    async def _on_primary(
        self, script: Any, keys: list[str], args: tuple[object, ...]
    ) -> tuple[Any, Any]:
        """``_on_node`` on the primary of the session's slot, as the cluster's table says.

        This path goes around the cluster client, so it refreshes the table itself:
        after a broken link, a refused write or a cluster that is down (a failover)
        the table is read again before the error is raised, so the next change goes
        to the new primary; a MOVED, which ran nothing, is tried once more at once.
        """
        from redis import exceptions as rx

        for attempt in (1, 2):
            try:
                node = self.client.get_node_from_key(keys[0])
                # a node that stops answering (frozen, DEBUG SLEEP) fails the change as a
                # pipeline's would, rather than holding it until the node is back
                with anyio.fail_after(PIPELINE_TIMEOUT + REPLICA_TIMEOUT_MS / 1000):
                    replies = await _on_node(node, script, keys, args, self.target.replicas)
                answer, acked = replies
                if isinstance(acked, Exception):
                    # WAIT refused (UNBLOCKED: the node was made a replica while it waited, a
                    # failover): the change is answered as not replicated, and the next one
                    # goes where the cluster's table says now
                    await self._refresh()
                return answer, acked
            except rx.MovedError:
                await self._refresh()
                if attempt == 2:
                    raise
            except (rx.AskError, rx.ClusterDownError, rx.ReadOnlyError, rx.TryAgainError):
                await self._refresh()
                raise
            except rx.ResponseError:
                raise  # the script's own refusal (a missing permission, out of memory)
            except Exception:
                await self._refresh()
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _refresh(self) -> None:
        """Read the cluster's slot table again (best effort: it may be down)."""
        try:
            await self.client.nodes_manager.initialize()
        except Exception as exc:
            log.debug("refreshing the cluster's slots: %s", reason(exc))

    # -- the operations -------------------------------------------------------------
    #
    # Each returns a future (await it, or give it a callback): its answer, or the
    # core's error for a refusal, or ``StoreFailed``.


async def _on_node(
    node: Any, script: Any, keys: list[str], args: tuple[object, ...], replicas: int
) -> tuple[Any, Any]:
    """The script and ``WAIT`` on one connection of a cluster node.

    ``WAIT`` counts the writes of its own connection, so both must go on
    the one connection: a cluster client would route a keyless WAIT anywhere.
    """
    from redis.exceptions import ResponseError

    connection = node.acquire_connection()
    try:
        await connection.connect()
        await connection.send_packed_command(
            connection.pack_commands(
                [
                    ("EVAL", script.script, len(keys), *keys, *args),
                    ("WAIT", replicas, REPLICA_TIMEOUT_MS),
                ]
            )
        )
        replies = []
        for _ in range(2):
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:  # an error reply (MOVED too) is a reply
                replies.append(exc)
            except BaseException:  # a broken link or a cancel: the replies are unread
                await connection.disconnect(nowait=True)  # does not yield, even cancelled
                raise
        answer, acked = replies
        if isinstance(answer, Exception):
            raise answer
        return answer, acked
    finally:
        node.release(connection)


@contextlib.contextmanager
def let_go(futures: Iterable[asyncio.Future[Any]]) -> Iterator[None]:
    """Await ``futures`` one by one in the block; on the way out (a failure that ended it
    early, most often), each one still unanswered is cancelled (a call not sent yet is
    dropped from its pipeline) and each answered one's error is taken, so that an answer
    nobody wanted any more is never logged as "Future exception was never retrieved"
    (a failover used to log several)."""
    try:
        yield
    finally:
        for future in futures:
            if not future.cancel() and not future.cancelled():
                future.exception()


def unreplicated(target: Target, acked: Any) -> StoreFailed | None:
    """What ``WAIT``'s reply makes of the changes before it: None when enough replicas
    have them; else their answer, ``store_failed`` (they are in Redis, perhaps on no
    replica). An error reply is read as one, never as a count."""
    replicas = target.replicas
    if isinstance(acked, Exception):
        return StoreFailed(
            f"redis at {target.name} did not confirm that {_replicas(replicas)} "
            f"have the change (WAIT answered: {reason(acked)}): it may be lost in a failover"
        )
    if int(acked) < replicas:
        return StoreFailed(
            f"only {int(acked)} of {replicas} replicas confirmed the change within "
            f"{REPLICA_TIMEOUT_MS} ms: it may be lost in a failover (?replicas={replicas})"
        )
    return None


async def _exchange(line: Any, packed: list[bytes]) -> list[Any]:
    """Send ``packed`` on ``line`` and read one reply each; on a failure the line is dropped."""
    try:
        await line.send_packed_command(packed, check_health=False)
        return await _read_replies(line, len(packed))
    except BaseException:  # a broken link, a timeout: the rest is unread, start afresh
        await line.disconnect(nowait=True)
        raise


async def _read_replies(line: Any, count: int) -> list[Any]:
    """``count`` replies from ``line``; an error reply is a reply (its exception)."""
    from redis.exceptions import ResponseError

    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await line.read_response(timeout=math.inf))
        except ResponseError as exc:
            replies.append(exc)
    return replies


def _replicas(count: int) -> str:
    return "1 replica" if count == 1 else f"{count:,} replicas"
