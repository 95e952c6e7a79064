"""Written by scripts/unasync.py from repl_cli/api/_async/operations.py: edit that one.

The blocking twin of the async source; ``python scripts/unasync.py`` writes
it again, and ``scripts/check`` fails while it is stale.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Generator, Mapping
from types import TracebackType
from typing import Literal, Self, overload

from msgspec import UNSET, UnsetType
from msgspec.structs import replace

from repl_cli.api._common import (
    REQUEST_TIMEOUT,
    MatchLike,
    R,
    as_match,
    lease_ms,
    no_firing,
    reply_tags,
    resendable,
    to_ms,
    wait_cursor,
)
from repl_cli.api.errors import AnswerLost, BadInput, Error, NotFound, from_wire
from repl_cli.api.reconnect import Outage
from repl_daemon import protocol as p
from session import approvals as ap
from session.errors import BadRequest, Code, ReplError
from session.firing import CursorInfo, Firing, GroupInfo
from session.rules import (
    ACK_CURSOR,
    DEFAULT_GROUP,
    DEFAULT_HANDLER,
    FOLLOW_CURSOR,
    WAIT_CURSOR,
    WEBHOOK_HANDLER,
)
from session.tags import CORR, REPLY_TO, correlation_id


class Operations(abc.ABC):
    """The daemon's operations as methods, with typed answers, over one connection."""

    #: how long ``wait`` and ``follow`` ride out an outage, in seconds (0: not at all)
    reconnect: float
    #: where an outage is told: the log, or stderr
    note: Callable[[str], None]

    # -- the primitives each side provides ------------------------------------------

    @property
    @abc.abstractmethod
    def addr(self) -> str:
        """The daemon's address, as given or found."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection; the next call connects again."""

    @abc.abstractmethod
    def _request(self, request: p.Request, expect: type[R]) -> R:
        """``request``'s answer, as an ``expect``, on the connection (a new one when there
        is none, or the daemon closed it: rule 1 of the module's docstring); a failure as an
        ``Error``, ``AnswerLost`` when the connection ended before the answer came."""

    @abc.abstractmethod
    def _blocking(self, request: p.Request, expect: type[R]) -> R:
        """``_request`` for a request that blocks (a wait, a claim), however long it does."""

    @abc.abstractmethod
    def _answered_once(self) -> bool:
        """Whether a daemon answered on this connection once (only then is a lost link an
        outage to ride out: a first connection that fails is refused at once)."""

    @abc.abstractmethod
    def _clock(self) -> float:
        """Seconds, from the clock the sleeps are measured against."""

    @abc.abstractmethod
    def _sleep(self, seconds: float) -> None:
        """Pause between two tries of a wait whose daemon is away."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    # -- the one reconnect path (the module's docstring) -----------------------------

    def _call(self, request: p.Request, expect: type[R]) -> R:
        """``request``'s answer, sent once more when the first try proves it may be (rules
        2 and 3); every failure as a typed ``Error``."""
        try:
            return self._request(request, expect)
        except Error as exc:
            if not _again(request, exc, blocking=False):
                raise
        self.close()
        return self._request(request, expect)

    def _woken(self, request: p.Request, expect: type[R]) -> R:
        """A blocking request's answer (a wait's, a claim's), sent once more after an
        ``idle_timeout`` answer (rule 2); any other failure goes to the caller, which
        rides out an outage (``Unavailable`` when the link is lost)."""
        try:
            return self._blocking(request, expect)
        except Error as exc:
            if not _again(request, exc, blocking=True):
                raise
        self.close()
        return self._blocking(request, expect)

    # -- the daemon ----------------------------------------------------------

    def op(self, request: p.Request, answer: type[R]) -> R:
        """``request`` as it is, one op of the protocol, and its answer as ``answer``: for a
        verb of the table that has no method of its own here (the MCP server's generic
        tools, ``repl_cli.mcp.verbs``), through the one reconnect path all calls take. A
        long poll (``p.Verb.long_poll``: a gather, a join) is answered however long it
        blocks, and a daemon restart meanwhile is ridden out within its ``timeout_ms``, as
        ``wait`` rides it out; one whose timeout passed while the daemon was away raises
        ``Unavailable`` (what it would have answered is not known)."""
        if not p.VERB_OF[type(request)].long_poll:
            return self._call(request, answer)
        timeout_ms: int | None = getattr(request, "timeout_ms")  # noqa: B009 - any long poll's

        def again(left_ms: int | None) -> p.Request:
            return replace(request, timeout_ms=left_ms)

        def nothing(exc: Error) -> R:
            raise exc

        timeout = None if timeout_ms is None else timeout_ms / 1000
        return self._ridden(again, answer, timeout, nothing)

    def ping(self) -> p.Pong:
        return self._call(p.Ping(), p.Pong)

    def shutdown(self) -> None:
        """Ask the daemon to stop as SIGTERM does (it answers first, then exits)."""
        self._call(p.Shutdown(), p.Done)
        self.close()

    def stats(self, session: str | None = None) -> p.StatsReply:
        return self._call(p.Stats(session=session), p.StatsReply)

    # -- sessions ------------------------------------------------------------

    def start(
        self, session: str | None = None, *, buffer: int | None = None, exist_ok: bool = False
    ) -> p.Started:
        request = p.Start(session=session, buffer=buffer, exist_ok=exist_ok)
        return self._call(request, p.Started)

    def stop(self, session: str) -> None:
        self._call(p.Stop(session=session), p.Done)

    def sessions(self) -> list[p.SessionInfo]:
        return (self._call(p.Sessions(), p.SessionList)).sessions

    def buffer(self, session: str, limit: int) -> p.Buffered:
        return self._call(p.Buffer(session=session, limit=limit), p.Buffered)

    def cursors(self, session: str) -> list[CursorInfo]:
        return (self._call(p.Cursors(session=session), p.CursorList)).cursors

    # -- firings -------------------------------------------------------------

    def send(
        self,
        session: str,
        text: str,
        *,
        handler: str = DEFAULT_HANDLER,
        key: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> p.Sent:
        request = p.Send(
            session=session, text=text, handler=handler, key=key, tags=dict(tags or {})
        )
        return self._call(request, p.Sent)

    def schedule(
        self,
        session: str,
        text: str = "",
        *,
        in_: str | None = None,
        at: str | None = None,
        every: str | None = None,
        handler: str | None = None,
        key: str | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> p.TimerSet:
        """Record a firing later: ``in_`` a duration (``"5m"``) or ``at`` an RFC 3339 time,
        and/or ``every`` an interval (``"1m"``; handler ``on-tick`` unless named); each of its
        firings carries ``tags``."""
        request = p.Schedule(
            session=session,
            text=text,
            handler=handler,
            in_=in_,
            at=at,
            every=every,
            key=key,
            tags=dict(tags or {}),
        )
        return self._call(request, p.TimerSet)

    def webhook(self, session: str, secret: str | None, *, handler: str = WEBHOOK_HANDLER) -> None:
        """Give the session a webhook secret (``POST /hooks/{id}``), or with None take it away."""
        self._call(p.SetWebhook(session=session, secret=secret, handler=handler), p.Done)

    def token_add(self, name: str, sessions: list[str], can: list[str]) -> p.TokenMade:
        """Make a scoped token (the root token's only): its secret is in the answer, once."""
        request = p.Token(action="add", name=name, sessions=sessions, can=can)
        return self._call(request, p.TokenMade)

    def token_list(self) -> list[p.TokenInfo]:
        return (self._call(p.Token(action="list"), p.TokenList)).tokens

    def token_revoke(self, name: str) -> None:
        self._call(p.Token(action="revoke", name=name), p.Done)

    def timers(self, session: str | None = None) -> list[p.TimerInfo]:
        """The pending timers of ``session``, or of every session: soonest first."""
        return (self._call(p.Timers(session=session), p.TimerList)).timers

    def cancel(self, session: str, timer: str) -> p.TimerInfo:
        """Cancel a pending timer; ``NotFound`` (code ``no_such_timer``) when there is none."""
        return (self._call(p.Cancel(session=session, timer=timer), p.Cancelled)).timer

    def read(
        self,
        session: str,
        *,
        cursor: str | None = None,
        after: int | None = None,
        max: int | None = None,
        peek: bool = False,
        match: MatchLike | None = None,
        last: int | None = None,
        since: str | None = None,
    ) -> p.Firings:
        """The firings after ``cursor`` (default ``read``) or after seq ``after``, or the
        newest ``last``, or those recorded ``since`` an RFC 3339 time (with ``last``: the
        newest N of them), each in one look of the daemon's.

        Like the wire's ``read`` it acknowledges nothing: ``ack`` the batch's
        ``next`` once it is handled (``repl read`` prints, then acknowledges).
        With ``match`` only the firings that match come back; given neither
        ``cursor`` nor ``after``, a matching read looks at the whole ring.
        """
        request = p.Read(
            session=session,
            cursor=cursor,
            after=after,
            max=max,
            peek=peek,
            match=as_match(match),
            last=last,
            since=since,
        )
        return self._call(request, p.Firings)

    def ack(self, session: str, seq: int, *, cursor: str = ACK_CURSOR) -> p.Acked:
        return self._call(p.Ack(session=session, cursor=cursor, seq=seq), p.Acked)

    def poll(self, session: str, *, max: int | None = None) -> p.Firings:
        return self._call(p.Poll(session=session, max=max), p.Firings)

    def wait(
        self,
        sessions: str | list[str],
        *,
        cursor: str | UnsetType | None = UNSET,
        timeout: float | None = None,
        max: int | None = None,
        ack: dict[str, int] | None = None,
        match: MatchLike | None = None,
        after: int | None = None,
        all: bool = False,
    ) -> p.Woken:
        """Block until a session has firings after ``cursor`` (default ``wait``);
        ``timeout`` seconds at most (then ``timed_out``). ``ack`` acknowledges the previous
        batch first. With ``match``, only firings that match end the wait, and with no
        ``cursor`` given it looks at the whole ring and acknowledges nothing (``after``
        goes on from a seq instead). With ``all`` (SPEC §18's join), it answers only once
        every session named has a batch, each in the order named; one that times out
        answers none. A daemon restart meanwhile is ridden out for ``reconnect`` seconds,
        then ``Unavailable``.

        ``timeout`` is the wait's own (the daemon answers ``timed_out``); in async
        code, cancelling it from outside drops the wait and moves nothing.
        """
        ids = [sessions] if isinstance(sessions, str) else list(sessions)
        chosen = None if after is not None else wait_cursor(cursor, match, WAIT_CURSOR)
        wanted = as_match(match)

        def request(timeout_ms: int | None) -> p.Wait:
            return p.Wait(
                sessions=ids,
                cursor=chosen,
                timeout_ms=timeout_ms,
                max=max,
                ack=ack or {},
                match=wanted,
                after=after,
                all=all,
            )

        def nothing(exc: Error) -> p.Woken:
            return p.Woken(batches=[], timed_out=True)

        return self._ridden(request, p.Woken, timeout, nothing)

    def _ridden(
        self,
        request: Callable[[int | None], p.Request],
        expect: type[R],
        timeout: float | None,
        nothing: Callable[[Error], R],
    ) -> R:
        """A blocking request's answer (``request(timeout_ms)``: a wait's, a claim's, a
        gather's, a join's), its ``timeout`` seconds bounding the whole call: a daemon
        restart meanwhile is ridden out (the request sent again, with what is left of the
        timeout) for ``reconnect`` seconds, then ``Unavailable``; ``nothing(error)``
        answers (or raises) when the timeout passed while the daemon was away."""
        deadline = None if timeout is None else self._clock() + timeout
        outage = Outage(self.reconnect, self.addr, self.note, deadline, clock=self._clock)
        while True:
            try:
                answer = self._woken(request(outage.remaining_ms()), expect)
            except Error as exc:
                self._ride_out(outage, exc)
                if outage.timed_out:
                    return nothing(exc)
                continue
            outage.back()
            return answer

    def follow(
        self,
        session: str,
        *,
        cursor: str | UnsetType | None = UNSET,
        max: int | None = None,
        match: MatchLike | None = None,
        count: int | None = None,
        start: int | None = None,
    ) -> Generator[p.SessionBatch, int | None, None]:
        """Every batch after ``cursor`` (default ``follow``), as it comes, for ever (break
        to stop), or until ``count`` firings have come.

        A batch is acknowledged when the caller asks for the next one, in the
        same request as the wait for it: one that was handed out and not
        finished (the loop broke, the program died) comes again to the next
        follower. A caller that handled only part of a batch sends the last seq
        it handled into the generator instead of asking with ``next``: that is
        what is acknowledged. With ``count`` the last batch is acknowledged when
        the caller asks past it, and then the iteration ends. A daemon restart is
        ridden out as in ``wait``. With ``match`` and no ``cursor``, it follows the
        matching firings from ``start`` on (None: the whole ring), acknowledging
        nothing.
        """
        chosen = wait_cursor(cursor, match, FOLLOW_CURSOR)
        carried: dict[str, int] = {}
        after = start
        left = count
        while True:
            bound = max if left is None else left if max is None else min(max, left)
            if chosen is None:
                woken = self.wait(session, cursor=None, max=bound, match=match, after=after)
            else:
                woken = self.wait(session, cursor=chosen, max=bound, ack=carried, match=match)
            for batch in woken.batches:
                taken = yield batch
                carried = {batch.session: batch.next if taken is None else taken}
                after = batch.next
                if left is not None:
                    left -= len(batch.firings)
            if left is not None and left <= 0:
                if chosen is not None:  # the last batch's ack goes alone
                    self._ack_riding_out(chosen, carried)
                return

    def _ack_riding_out(self, cursor: str, acks: dict[str, int]) -> None:
        """Acknowledge ``acks`` on ``cursor``, riding out an outage as ``wait`` does (a
        reader's last ack must not be lost to a restart of the daemon just then)."""
        outage = Outage(self.reconnect, self.addr, self.note, None, clock=self._clock)
        while True:
            try:
                for session, seq in acks.items():
                    self._call(p.Ack(session=session, cursor=cursor, seq=seq), p.Acked)
            except Error as exc:
                self._ride_out(outage, exc)
                continue
            outage.back()
            return

    def _ride_out(self, outage: Outage, exc: Error) -> None:
        """After ``exc``: raise it when it is no outage or the outage has lasted too long
        (``Outage.lost``), else close the link and pause before the next try."""
        pause = outage.lost(exc, was_there=self._answered_once())
        self.close()
        self._sleep(pause)

    # -- request and reply -------------------------------------------------------

    def request(
        self,
        session: str,
        text: str,
        *,
        reply_to: str,
        timeout: float | None = REQUEST_TIMEOUT,
        handler: str = DEFAULT_HANDLER,
        tags: Mapping[str, str] | None = None,
        key: str | None = None,
    ) -> Firing | None:
        """Send ``text`` to ``session`` tagged ``reply-to`` = ``reply_to`` and a ``corr``
        (fresh, or made from ``key``: see ``ask``), then wait on ``reply_to`` for the
        firing tagged with that ``corr`` (one that came before the wait is found too);
        the reply, or None at ``timeout``."""
        replies = self.request_all(
            [session],
            text,
            reply_to=reply_to,
            timeout=timeout,
            handler=handler,
            tags=tags,
            key=key,
        )
        return replies[session]

    def request_all(
        self,
        sessions: list[str],
        text: str,
        *,
        reply_to: str,
        timeout: float | None = REQUEST_TIMEOUT,
        handler: str = DEFAULT_HANDLER,
        tags: Mapping[str, str] | None = None,
        key: str | None = None,
    ) -> dict[str, Firing | None]:
        """``request`` to every one of ``sessions`` at once (SPEC §18's fan-out): ``ask_all``,
        then ``gather`` their replies in ``reply_to``; each session's reply, in the order
        named, None for one that had not answered at ``timeout``. With ``key``, a
        coordinator run again after a crash re-sends nothing and gets the same replies."""
        corrs = self.ask_all(sessions, text, reply_to=reply_to, handler=handler, tags=tags, key=key)
        gathered = self.gather(reply_to, list(corrs.values()), timeout=timeout)
        came = {firing.tags[CORR]: firing for firing in gathered.firings}
        return {session: came.get(corr) for session, corr in corrs.items()}

    def ask(
        self,
        session: str,
        text: str,
        *,
        reply_to: str,
        handler: str = DEFAULT_HANDLER,
        tags: Mapping[str, str] | None = None,
        key: str | None = None,
    ) -> str:
        """``request``'s first half: send the request (``reply_to`` must exist) and return
        its ``corr``, without waiting; its answer is the firing of ``reply_to`` that
        ``gather(reply_to, [corr])`` finds, even one that came before. With ``key``, the
        corr is ``KEY.SESSION`` and the send is keyed with it too: asked again with the
        same key, nothing is sent and the same corr comes back."""
        corrs = self.ask_all(
            [session], text, reply_to=reply_to, handler=handler, tags=tags, key=key
        )
        return corrs[session]

    def ask_all(
        self,
        sessions: list[str],
        text: str,
        *,
        reply_to: str,
        handler: str = DEFAULT_HANDLER,
        tags: Mapping[str, str] | None = None,
        key: str | None = None,
    ) -> dict[str, str]:
        """``ask`` each of ``sessions`` (in the order named, each once): their corrs, by
        session. ``reply_to`` is looked at once, before anything is sent."""
        for reserved in (REPLY_TO, CORR):
            if reserved in (tags or {}):
                raise BadInput(f"tag {reserved} is the request's own: leave it out")
        if not sessions:
            raise BadInput("a request names at least one session")
        named = list(dict.fromkeys(sessions))
        corrs = {s: correlation_id() if key is None else f"{key}.{s}" for s in named}
        self.stats(reply_to)  # where the reply goes must exist before the request leaves
        for session, corr in corrs.items():
            sent_tags = {**(tags or {}), REPLY_TO: reply_to, CORR: corr}
            keyed = None if key is None else corr
            self.send(session, text, handler=handler, tags=sent_tags, key=keyed)
        return corrs

    def gather(
        self,
        session: str,
        corrs: list[str],
        *,
        timeout: float | None = None,
    ) -> p.Gathered:
        """Block until ``session`` holds a firing tagged ``corr`` with each of ``corrs``
        (SPEC §18): one firing a corr, in the order asked, the first by seq of each (one
        that came before the call counts); ``timeout`` seconds at most (then
        ``timed_out``, with the ones that came and the ``missing`` corrs). It moves no
        cursor: asked again, it answers the same. A daemon restart meanwhile is ridden
        out as ``wait`` rides it out."""
        asked = list(corrs)

        def request(timeout_ms: int | None) -> p.Gather:
            return p.Gather(session=session, corrs=asked, timeout_ms=timeout_ms)

        def nothing(exc: Error) -> p.Gathered:
            return p.Gathered(firings=[], missing=list(dict.fromkeys(asked)), timed_out=True)

        return self._ridden(request, p.Gathered, timeout, nothing)

    def reply(self, session: str, seq: int, text: str, *, handler: str = DEFAULT_HANDLER) -> p.Sent:
        """Send ``text`` to the session named by the ``reply-to`` tag of firing ``seq`` of
        ``session``, tagged with its ``corr``; ``NotFound`` when it has no ``reply-to``."""
        firing = self.firing(session, seq)
        target, tags = reply_tags(firing, session)
        return self.send(target, text, handler=handler, tags=tags)

    # -- groups and claims (SPEC §16) ------------------------------------------------

    def claim(
        self,
        session: str,
        *,
        group: str = DEFAULT_GROUP,
        lease: float | None = None,
        timeout: float | None = None,
        match: MatchLike | None = None,
        from_now: bool = False,
    ) -> p.Claimed:
        """Block until ``group`` has a firing no other claimer holds, and take it under a
        lease of ``lease`` seconds (None: the rule's, 60 s); ``timeout`` seconds at most
        (then ``timed_out``, with nothing taken). Finish with ``done``, give it back with
        ``release``, keep it longer with ``extend``. A daemon restart meanwhile is ridden
        out as ``wait`` rides it out; in async code, cancelling the claim takes nothing."""
        wanted = as_match(match)

        def request(timeout_ms: int | None) -> p.Claim:
            return p.Claim(
                session=session,
                group=group,
                lease_ms=lease_ms(lease),
                timeout_ms=timeout_ms,
                match=wanted,
                from_now=from_now,
            )

        def nothing(exc: Error) -> p.Claimed:
            return p.Claimed(timed_out=True)

        return self._ridden(request, p.Claimed, timeout, nothing)

    def join(
        self,
        session: str,
        *,
        group: str = DEFAULT_GROUP,
        upto: int | None = None,
        timeout: float | None = None,
    ) -> p.Joined:
        """Block until every firing of ``session`` up to ``upto`` (None: the head now) is
        done or dead in ``group`` (SPEC §18): the counts of those firings (``done``,
        ``dead``, and what is left: ``ready``, ``held``, ``delayed``); ``timeout`` seconds
        at most (then ``timed_out``, saying what is left). It moves nothing. The head is
        read first when ``upto`` is None, so a daemon restart ridden out meanwhile waits
        for the same firings; one that outlasts the timeout raises ``Unavailable``."""
        if upto is None:
            upto = (self.stats(session)).sessions[0].head
        fixed = upto

        def request(timeout_ms: int | None) -> p.Join:
            return p.Join(session=session, group=group, upto=fixed, timeout_ms=timeout_ms)

        def nothing(exc: Error) -> p.Joined:
            raise exc  # what is left is not known: the daemon was away

        return self._ridden(request, p.Joined, timeout, nothing)

    @overload
    def done(self, session: str, claim: str, *, next: Literal[False] = False) -> int: ...

    @overload
    def done(
        self,
        session: str,
        claim: str,
        *,
        next: Literal[True],
        lease: float | None = None,
        timeout: float | None = None,
    ) -> p.Claimed: ...

    def done(
        self,
        session: str,
        claim: str,
        *,
        next: bool = False,
        lease: float | None = None,
        timeout: float | None = None,
    ) -> int | p.Claimed:
        """The claim's work is finished: its firing is never offered to its group again;
        answers its seq. ``lease_lost`` when the claim is no longer the live lease (nothing
        changes).

        With ``next``, the next job of the claim's group is taken in the same request,
        as ``claim(group=...)`` takes it (a lease of ``lease`` seconds, blocking up to
        ``timeout`` seconds, then ``timed_out`` with nothing taken; the done stands), and
        the answer is ``claim``'s: the done and the claim are one write of the daemon's
        store. A done refused takes nothing. Sent once: an outage meanwhile raises as
        ``done`` raises (``Unavailable``, ``AnswerLost``), and a worker claims again."""
        if not next:
            finished = self._call(p.Finish(session=session, claim=claim), p.Finished)
            return finished.seq
        request = p.FinishNext(
            session=session,
            claim=claim,
            lease_ms=lease_ms(lease),
            timeout_ms=None if timeout is None else to_ms(timeout),
        )
        return self._woken(request, p.Claimed)

    def release(self, session: str, claim: str, *, delay: float = 0) -> bool:
        """Give the claim's firing back, claimable again at once or after ``delay`` seconds;
        True when that was its last attempt (it went to the dead-letter session)."""
        request = p.Release(session=session, claim=claim, delay_ms=to_ms(delay))
        return (self._call(request, p.Released)).dead

    def extend(self, session: str, claim: str, *, lease: float | None = None) -> p.Extended:
        """Keep the claim's firing ``lease`` seconds from now (a heartbeat; None: the rule's
        lease, 60 s)."""
        request = p.Extend(session=session, claim=claim, lease_ms=lease_ms(lease))
        return self._call(request, p.Extended)

    def group(
        self,
        session: str,
        name: str,
        *,
        max_attempts: int | None = None,
        dead_letter: str | None = None,
        from_now: bool = False,
    ) -> GroupInfo:
        """Create group ``name`` (from the oldest firing, or with ``from_now`` after the
        head), or set its attempts and dead-letter session; its counts."""
        request = p.Group(
            session=session,
            group=name,
            max_attempts=max_attempts,
            dead_letter=dead_letter,
            from_now=from_now,
        )
        return (self._call(request, p.GroupRow)).group

    def groups(self, session: str) -> list[GroupInfo]:
        return (self._call(p.Groups(session=session), p.GroupList)).groups

    def claims(self, session: str, *, group: str | None = None) -> list[p.LeaseInfo]:
        return (self._call(p.Claims(session=session, group=group), p.ClaimList)).claims

    # -- approvals (SPEC §19) ----------------------------------------------------------

    def approve(self, session: str, request_id: str, *, reason: str = "") -> ap.Verdict:
        """Let the agent do what prompt ``request_id`` of ``session`` asks (``repl mcp
        --approvals SESSION`` recorded it): see ``verdict``."""
        return self.verdict(session, request_id, ap.ALLOW, reason=reason)

    def deny(self, session: str, request_id: str, *, reason: str = "") -> ap.Verdict:
        """Refuse what prompt ``request_id`` of ``session`` asks: see ``verdict``."""
        return self.verdict(session, request_id, ap.DENY, reason=reason)

    def verdict(
        self, session: str, request_id: str, behavior: str, *, reason: str = ""
    ) -> ap.Verdict:
        """Record the verdict ``behavior`` (``allow`` or ``deny``) on prompt ``request_id``
        as a firing of ``session``, sent as this connection's token (its ``by``); the
        server that recorded the prompt tells the agent. It is refused, and nothing is
        recorded, when the prompt is not there (``NotFound``) or has a verdict that counts
        already (``AlreadyAnswered``, naming it). Once recorded it is the one that counts
        only when it is the first by seq from one of the prompt's approvers: a verdict
        that came first meanwhile is ``AlreadyAnswered``, and this token not among the
        approvers ``Forbidden`` (the verdict stays in the session: the audit)."""
        try:
            ap.check_request_id(request_id)
            tags = ap.verdict_tags(request_id, behavior)
        except BadRequest as exc:
            raise BadInput(exc.message) from None
        try:
            ap.unanswered(self.approval(session, request_id))
            sent = self.send(session, reason, handler=ap.VERDICT_HANDLER, tags=tags)
            return ap.counted(self.approval(session, request_id), sent.seq)
        except ReplError as exc:  # the rule's refusals, as the daemon's would be
            raise from_wire(exc.code, exc.message) from None

    def approval(self, session: str, request_id: str) -> ap.Answered:
        """Prompt ``request_id`` of ``session``, the verdict that counts for it (None:
        pending) and every verdict given for it; ``NotFound`` when the ring holds no
        such prompt."""
        found = self.read(session, match={ap.APPROVAL: request_id})
        try:
            return ap.prompt_in(found.firings, session, request_id)
        except ReplError as exc:
            raise from_wire(exc.code, exc.message) from None

    def approvals(self, session: str) -> list[ap.Answered]:
        """Every prompt ``session`` holds, oldest first, each with the verdict that counts
        for it (None: pending) and every verdict given: the audit of who let the agent do
        what. ``pending`` of them: those without one."""
        found = self.read(session, match={ap.APPROVAL: None})
        return list(ap.answered(found.firings).values())

    def firing(self, session: str, seq: int) -> Firing:
        """Firing ``seq`` of ``session``, read without a cursor; ``NotFound`` when the ring
        does not hold it."""
        if seq < 1:
            raise NotFound(f"seq {seq} names no firing: seqs start at 1")
        try:
            batch = self._call(p.Read(session=session, seq=seq), p.Firings)
        except Error as exc:
            if exc.code == Code.CURSOR_AFTER_HEAD:  # no such firing yet
                raise NotFound(f"session {session!r} has {exc.message}") from None
            raise
        if not batch.firings:
            raise no_firing(session, seq, batch)
        return batch.firings[0]


def _again(request: p.Request, exc: Error, *, blocking: bool) -> bool:
    """Whether a request that failed with ``exc`` is sent once more (the module's rules 2
    and 3; a blocking one's lost answer is its caller's to ride out)."""
    if exc.code == Code.IDLE_TIMEOUT:
        return True
    return not blocking and isinstance(exc, AnswerLost) and resendable(request)
