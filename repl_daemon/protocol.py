"""The wire: one JSON object a line, requests tagged by ``op``.

Shared by the daemon and the CLI, so it imports nothing heavier than
msgspec. Every request may carry an ``id`` that its response echoes. New
fields always get a default, so an older client keeps working against a
newer daemon; unknown fields are ignored for the same reason.
See docs/protocol.md for every op and error code.

Why one module: it is the one table of verbs (``VERBS``) and the requests and
answers its rows name. A new verb is a request, an answer and a row, written
side by side here; split, each verb would be spelled in three files again.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, NamedTuple, Union

import msgspec

from session.errors import BadRequest, ReplError, UnknownOp
from session.firing import CursorInfo, Firing, GroupInfo
from session.rules import (
    ACK_CURSOR,
    ADMIN,
    DEFAULT_GROUP,
    DEFAULT_HANDLER,
    DEFAULT_LEASE_MS,
    MAX_DELAY_MS,
    MAX_LEASE_MS,
    MIN_LEASE_MS,
    READ,
    SEND,
    WAIT_CURSOR,
    WEBHOOK_HANDLER,
)
from session.tags import Match

VERSION = "0.1.0"
MAX_LINE = 1 << 20

RequestId = str | int | None | msgspec.UnsetType


class Request(msgspec.Struct, tag_field="op", kw_only=True):
    id: RequestId = msgspec.UNSET


class Auth(Request, tag="auth"):
    token: str


class Ping(Request, tag="ping"):
    pass


class Start(Request, tag="start"):
    session: str | None = None
    buffer: int | None = None
    exist_ok: bool = False


class Stop(Request, tag="stop"):
    session: str


class Sessions(Request, tag="sessions"):
    pass


#: a session's id, as every request that names one takes it
SessionId = Annotated[str, msgspec.Meta(description="The session's id.")]


class Send(Request, tag="send"):
    session: SessionId
    text: Annotated[str, msgspec.Meta(description="The message.")]
    handler: Annotated[str, msgspec.Meta(description="What produced it.")] = DEFAULT_HANDLER
    key: Annotated[str | None, msgspec.Meta(description="A dedup key.")] = None
    #: what the firing carries: up to 16 ``KEY: VALUE`` (rules R1)
    tags: Annotated[
        dict[str, str],
        msgspec.Meta(description="Tags the firing carries, KEY: VALUE (at most 16)."),
    ] = {}


class Read(Request, tag="read"):
    """Read by ``cursor`` (default ``read``) or, with ``after``, without one. With
    ``match``, only the firings that match; with ``match`` and neither ``cursor`` nor
    ``after``, the whole ring, through no cursor.

    Compound reads, each one look of the daemon's (no stats first, no race): ``last``
    the newest N, ``since`` those recorded since a time (with ``last``: the newest N of
    them), ``seq`` one firing. They read through no cursor. Each field has a default,
    so a client that sends none of them is answered as before.
    """

    session: str
    cursor: str | None = None
    after: int | None = None
    max: int | None = None
    peek: bool = False
    match: Match | None = None
    last: int | None = None
    #: a time as a firing's ``ts`` is written (UTC, to the millisecond)
    since: str | None = None
    seq: int | None = None


class Wait(Request, tag="wait"):
    """Block until one of ``sessions`` has firings after ``cursor``.

    ``ack`` (session -> seq) acknowledges the previous batch first, so a
    follow loop costs one request a batch. ``timeout_ms`` None waits forever.
    """

    sessions: list[str]
    #: null: no cursor (with ``match``: the whole ring, as a matching reader looks)
    cursor: str | None = WAIT_CURSOR
    timeout_ms: int | None = None
    max: int | None = None
    ack: dict[str, int] = {}
    #: wait for firings after this seq instead of after a cursor: one session, no ack,
    #: no cursor touched (what an HTTP event stream does)
    after: int | None = None
    #: return only the firings that match; a firing that does not leaves the wait blocked
    match: Match | None = None
    #: join, not select (SPEC §18): return only once every session has a batch, all of
    #: them together, in the order named
    all: bool = False


class Gather(Request, tag="gather"):
    """Block until ``session`` holds, for each of ``corrs``, a firing tagged ``corr`` with
    it (the whole ring looked at, so a reply that came first counts; the first by seq of
    each), or ``timeout_ms`` passes; moves no cursor (SPEC §18)."""

    session: SessionId
    corrs: Annotated[
        list[str],
        msgspec.Meta(
            description="The correlation ids to wait for: a firing tagged corr with each.",
        ),
    ]
    timeout_ms: int | None = None


class Ack(Request, tag="ack"):
    session: str
    seq: int
    cursor: str = ACK_CURSOR


class Cursors(Request, tag="cursors"):
    session: SessionId


class Buffer(Request, tag="buffer"):
    session: str
    limit: int


class Poll(Request, tag="poll"):
    session: str
    max: int | None = None


class Stats(Request, tag="stats"):
    session: str | None = None


class Schedule(Request, tag="schedule"):
    """Record a firing later (rules T1-T6): ``in`` a duration or ``at`` a time, and/or
    ``every`` an interval (the first one ``in``/``at`` when given, else one interval
    from now). ``handler`` defaults to ``on-message``, or ``on-tick`` with ``every``."""

    session: str
    text: str = ""
    handler: str | None = None
    in_: str | None = msgspec.field(default=None, name="in")
    at: str | None = None
    every: str | None = None
    key: str | None = None
    #: what each of its firings carries
    tags: dict[str, str] = {}


class Timers(Request, tag="timers"):
    """The pending timers of one session, or of every session."""

    session: str | None = None


class Cancel(Request, tag="cancel"):
    session: str
    timer: str


class SetWebhook(Request, tag="webhook"):
    """Give a session a webhook secret (rules H1-H7), or with ``secret`` null take it away."""

    session: str
    secret: str | None
    handler: str = WEBHOOK_HANDLER


class Token(Request, tag="token"):
    """Manage the scoped tokens (rules K1-K5); the root token's only. ``add`` a token named
    ``name`` that sees the sessions matching ``sessions`` (globs) with the rights ``can``
    (``read``, ``send``, ``admin``); ``list`` them; ``revoke`` one by ``name``."""

    action: Literal["add", "list", "revoke"]
    name: str | None = None
    sessions: list[str] = []
    can: list[str] = []


class Claim(Request, tag="claim"):
    """Take the oldest firing of ``group`` that no other claimer holds, under a lease of
    ``lease_ms`` (SPEC §16); block until there is one, or ``timeout_ms``. ``from_now``: a
    group this claim creates starts after the head, not at the oldest firing."""

    session: str
    group: str = DEFAULT_GROUP
    lease_ms: int = DEFAULT_LEASE_MS
    timeout_ms: int | None = None
    match: Match | None = None
    from_now: bool = False


#: the claim token a claim answered, as done, release and extend take it
ClaimToken = Annotated[str, msgspec.Meta(description="The claim token that claim returned.")]
#: a lease, as claim and extend take it (its bounds shown, not checked here: the core's)
LeaseMs = Annotated[
    int,
    msgspec.Meta(
        description="How long the job is yours; then it is offered to another worker "
        "unless you extend it.",
        extra_json_schema={"minimum": MIN_LEASE_MS, "maximum": MAX_LEASE_MS},
    ),
]


class Finish(Request, tag="done"):
    """The claim's work is finished: its firing is never offered to its group again."""

    session: SessionId
    claim: ClaimToken


class FinishNext(Request, tag="done_next"):
    """``done`` and then ``claim`` in one request (``repl done --next``): the claim's work
    is finished, and the oldest firing of its group that no other claimer holds is taken
    under a lease of ``lease_ms``; blocks until there is one, or ``timeout_ms``, as a
    claim does. The done and the claim are one step of the session (one commit); a done
    refused claims nothing."""

    session: SessionId
    claim: ClaimToken
    lease_ms: LeaseMs = DEFAULT_LEASE_MS
    timeout_ms: int | None = None


class Release(Request, tag="release"):
    """Give the claim's firing back: claimable again at once, or after ``delay_ms``."""

    session: SessionId
    claim: ClaimToken
    delay_ms: Annotated[
        int,
        msgspec.Meta(
            description="Claimable again only after this long (0: at once).",
            extra_json_schema={"minimum": 0, "maximum": MAX_DELAY_MS},
        ),
    ] = 0


class Extend(Request, tag="extend"):
    """The holder keeps the claim's firing for ``lease_ms`` from now (a heartbeat)."""

    session: SessionId
    claim: ClaimToken
    lease_ms: LeaseMs = DEFAULT_LEASE_MS


class Group(Request, tag="group"):
    """Create a group, or set its ``max_attempts`` and ``dead_letter`` session."""

    session: str
    group: str
    max_attempts: int | None = None
    dead_letter: str | None = None
    from_now: bool = False


class Groups(Request, tag="groups"):
    """A session's groups, with their counts."""

    session: str


class Claims(Request, tag="claims"):
    """The held firings of a session's groups (``group``: of that one only)."""

    session: str
    group: str | None = None


class Join(Request, tag="join"):
    """Block until every firing of ``session`` up to ``upto`` (None: the head when the join
    began) is done or dead in ``group``, or ``timeout_ms``; moves nothing (SPEC §18)."""

    session: SessionId
    group: Annotated[
        str, msgspec.Meta(description="The group of workers whose jobs are waited for.")
    ] = DEFAULT_GROUP
    upto: Annotated[
        int | None,
        msgspec.Meta(
            description="The last seq waited for (null: the session's head when the join "
            "began, so jobs sent later are not waited for)."
        ),
    ] = None
    timeout_ms: int | None = None


class Shutdown(Request, tag="shutdown"):
    """Stop the daemon as SIGTERM does: answered ``done``, then waiters are told and it exits."""


# -- responses -------------------------------------------------------------


class Response(msgspec.Struct, kw_only=True):
    # UNSET is left out of the JSON: an answer echoes ``id`` only when given
    id: RequestId = msgspec.UNSET
    ok: bool = True


class Error(Response, kw_only=True):
    ok: bool = False
    code: str
    message: str


class Pong(Response, kw_only=True):
    version: str
    uptime_s: float
    pid: int = 0  # 0: a daemon older than these fields
    store: str = ""


class Started(Response, kw_only=True):
    session: str
    created: bool


class Done(Response, kw_only=True):
    pass


class SessionInfo(msgspec.Struct):
    id: str
    head: int
    retained: int
    limit: int
    cursors: int
    waiters: int


class SessionList(Response, kw_only=True):
    sessions: list[SessionInfo]


class Sent(Response, kw_only=True):
    seq: int
    duplicate: bool = False


class Firings(Response, kw_only=True):
    """A read's or a poll's answer: rule S3's next, lost and firings."""

    next: int
    lost: int
    firings: list[Firing]


class SessionBatch(msgspec.Struct):
    session: str
    next: int
    lost: int
    firings: list[Firing]


class Woken(Response, kw_only=True):
    """A wait's answer: the sessions that had firings, or ``timed_out``."""

    batches: list[SessionBatch]
    timed_out: bool = False


class Gathered(Response, kw_only=True):
    """A gather's answer: for each corr asked that came, its first firing, in the order
    asked; the corrs that did not come, and ``timed_out``, when the timeout passed first."""

    firings: Annotated[
        list[Firing],
        msgspec.Meta(description="For each corr that came, its first firing, in the order asked."),
    ]
    missing: Annotated[list[str], msgspec.Meta(description="The corrs that did not come.")] = []
    timed_out: Annotated[
        bool, msgspec.Meta(description="The timeout passed before every corr came.")
    ] = False


class Acked(Response, kw_only=True):
    cursor: str
    seq: int


class CursorList(Response, kw_only=True):
    cursors: list[CursorInfo]


class Buffered(Response, kw_only=True):
    limit: int
    trimmed: int


class TimerInfo(msgspec.Struct, kw_only=True):
    """A pending timer as ``timers`` lists it; ``every_ms`` None for a one-shot."""

    timer: str
    session: str
    due: str  # RFC 3339, UTC, with milliseconds
    due_ms: int
    every_ms: int | None
    handler: str
    text: str
    key: str | None = None
    #: what each of its firings carries
    tags: dict[str, str] = {}


class TimerSet(Response, kw_only=True):
    """A schedule's answer: the timer's id and when it is due. ``duplicate``: its key
    made this timer before; ``due`` None and ``seq`` set when that one has fired."""

    timer: str
    due: str | None
    due_ms: int | None
    every_ms: int | None = None
    duplicate: bool = False
    seq: int | None = None


class TimerList(Response, kw_only=True):
    timers: list[TimerInfo]


class Cancelled(Response, kw_only=True):
    timer: TimerInfo


class TokenInfo(msgspec.Struct, kw_only=True):
    """A scoped token as ``token list`` shows it: never its secret."""

    name: str
    sessions: list[str]
    can: list[str]


class TokenMade(Response, kw_only=True):
    """``token add``'s answer: the token itself, shown this once."""

    token: str
    name: str
    sessions: list[str]
    can: list[str]


class TokenList(Response, kw_only=True):
    tokens: list[TokenInfo]


class Claimed(Response, kw_only=True):
    """A claim's answer: the claim token, the firing's seq and attempt, the lease's end
    (``lease_until``, as a firing's ``ts``, and in ms), the firings ``lost`` to the group
    since the last claim told, and the firing; or ``timed_out`` with nothing taken."""

    claim: str | None = None
    seq: int = 0
    attempt: int = 0
    lease_until: str | None = None
    lease_until_ms: int = 0
    lost: int = 0
    firing: Firing | None = None
    timed_out: bool = False


class Finished(Response, kw_only=True):
    """``done``'s answer: the seq that is done for its group."""

    seq: int


class Released(Response, kw_only=True):
    """``release``'s answer: ``dead`` when that was the last attempt (the firing is in the
    dead-letter session now, and done for the group)."""

    dead: bool = False


class Extended(Response, kw_only=True):
    """``extend``'s answer: when the lease ends now."""

    lease_until: str
    lease_until_ms: int


class GroupRow(Response, kw_only=True):
    """``group``'s answer: the group with its counts."""

    group: GroupInfo


class GroupList(Response, kw_only=True):
    groups: list[GroupInfo]


class LeaseInfo(msgspec.Struct, kw_only=True):
    """A held firing as ``claims`` lists it."""

    group: str
    seq: int
    attempt: int
    lease_until: str
    lease_until_ms: int


class ClaimList(Response, kw_only=True):
    claims: list[LeaseInfo]


class Joined(Response, kw_only=True):
    """A join's answer: over the firings up to ``upto``, ``done`` finished (done, dead, or
    dropped by the ring before they were), ``dead`` of them dead letters (of those the
    ring holds), and what is left: ``ready``, ``held``, ``delayed``; ``timed_out`` when
    the timeout passed first."""

    upto: Annotated[int, msgspec.Meta(description="The last seq waited for.")]
    done: Annotated[
        int,
        msgspec.Meta(description="Finished: done, dead, or dropped by the ring before they were."),
    ]
    dead: Annotated[int, msgspec.Meta(description="Of those finished, the dead letters.")]
    ready: Annotated[int, msgspec.Meta(description="Left: claimable now.")]
    held: Annotated[int, msgspec.Meta(description="Left: claimed by a worker, under a lease.")]
    delayed: Annotated[int, msgspec.Meta(description="Left: given back, claimable later.")]
    timed_out: Annotated[
        bool, msgspec.Meta(description="The timeout passed before every one was finished.")
    ] = False


class SessionStats(msgspec.Struct):
    id: str
    head: int
    retained: int
    limit: int
    firings: int
    lost: int
    evaluations: int
    waiters: int
    cursors: int


class DaemonStats(msgspec.Struct):
    version: str
    uptime_s: float
    store: str
    sessions: int
    firings: int
    lost: int
    evaluations: int
    waiters: int
    connections: int
    requests: int


class StatsReply(Response, kw_only=True):
    daemon: DaemonStats
    sessions: list[SessionStats]


# -- the table of verbs -------------------------------------------------------------
#
# One row an op, from which every front end serves it: the line protocol's decoder and
# its list of ops (here), the scope check (the engine's ``_scoped``), one generic HTTP
# route for a plain verb (``repl_daemon.http.verbs``), one generic MCP tool
# (``repl_cli.mcp.verbs``), a long poll among them (``Verb.long_poll``: a gather, a join).
# What a front end serves by hand is marked ``HAND`` there, and says why where it is
# written: the long polls that acknowledge or take (wait, claim), the streams, a send's
# text body, a read's or a start's defaults that HTTP and MCP choose for themselves.


class Changes(enum.Enum):
    """What doing a verb changes, for a harness deciding whether to ask a person first."""

    #: nothing: a look (MCP's readOnlyHint)
    NOTHING = "nothing"
    #: only what doing it again leaves as it is (a cursor set to max(seq), a done)
    SETS = "sets"
    #: something new each time unless a dedup key says otherwise (a firing, a timer)
    RECORDS = "records"
    #: something again each time (a lease moved to a time from now)
    MOVES = "moves"


#: served by a route or a tool written for it alone
HAND: Literal["hand"] = "hand"


class Http(NamedTuple):
    """How the generic route serves a verb: its methods and path (the request's fields in
    braces, as Starlette writes them: ``{claim:path}`` takes a slash too), the fields its
    JSON body gives (``example`` shows that body in a refusal),
    the status of a success (204: no body), and the field of the answer that is the whole
    body (None: every field of the answer but ``id`` and ``ok``). The query gives the
    other fields, a field ``X_ms`` given as ``?X=`` in seconds or as a duration, a list
    as its word once for each item; ``query`` names the word of a field whose word is
    not its name (``("corrs", "corr")``: ``?corr=A&corr=B``). A long poll
    (``Verb.long_poll``) takes ``?timeout=`` as every long poll of HTTP does."""

    methods: tuple[str, ...]
    path: str
    body: tuple[str, ...] = ()
    example: str = ""
    status: int = 200
    answer: str | None = None
    query: tuple[tuple[str, str], ...] = ()


class Tool(NamedTuple):
    """How the generic tool serves a verb: its description for a model and what it
    changes. Its arguments are the request's fields (a field ``X_ms`` as ``X_s``, in
    seconds), its result the answer's. A long poll (``Verb.long_poll``) is bounded as
    every blocking tool is, below a client's request timeout."""

    description: str
    changes: Changes


class Verb(NamedTuple):
    """One op: its request and answer, the right a scoped token needs for it on each
    session it names ("": none, a listing its scope filters; None: the root token's
    alone), whether its answer waits for the store, how HTTP and MCP serve it (None:
    they do not), and whether it is ``repeatable``: sent again after its answer was
    lost, it changes nothing the first did not and answers as the first did (a look,
    or an ack: a cursor set to the greater of where it is and the seq), so a client
    may resend it on a new connection without asking its caller."""

    request: type[Request]
    answer: type[Response]
    right: str | None
    durable: bool
    http: Http | Literal["hand"] | None = None
    tool: Tool | Literal["hand"] | None = None
    repeatable: bool = False

    @property
    def op(self) -> str:
        return str(self.request.__struct_config__.tag)

    @property
    def long_poll(self) -> bool:
        """Whether the request blocks until its answer or its ``timeout_ms`` (a wait, a
        claim, a gather, a join), whose answer then says ``timed_out``: what a client
        waits for however long it blocks, and a front end bounds (HTTP's ``?timeout=``,
        an MCP tool's ``timeout_s``)."""
        return "timeout_ms" in self.request.__struct_fields__


#: a claim token, a cursor's or a group's name may hold a slash: ``:path`` takes it whole
_CLAIM_PATH = "/sessions/{session}/claims/{claim:path}"

VERBS: list[Verb] = [
    Verb(Auth, Done, "", False),
    Verb(Ping, Pong, "", False, repeatable=True),
    Verb(Start, Started, ADMIN, True, HAND, HAND),
    Verb(Stop, Done, ADMIN, True, Http(("DELETE",), "/sessions/{session}", status=204)),
    Verb(
        Sessions,
        SessionList,
        "",
        False,
        HAND,
        Tool("List the sessions: id, head, retained, limit, cursors, waiters.", Changes.NOTHING),
        repeatable=True,
    ),
    Verb(
        Send,
        Sent,
        SEND,
        True,
        HAND,
        Tool(
            "Send a message to a session; it is recorded as the next firing. "
            "Give a key to make a retry safe (a second send with it records nothing).",
            Changes.RECORDS,
        ),
    ),
    Verb(Read, Firings, READ, False, HAND, HAND, repeatable=True),
    Verb(Wait, Woken, READ, False, HAND, HAND),
    Verb(
        Gather,
        Gathered,
        READ,
        False,
        Http(("GET",), "/sessions/{session}/gather", query=(("corrs", "corr"),)),
        Tool(
            "Wait until the session holds a reply for every one of corrs (a firing tagged "
            "corr with it; one that came earlier counts): the first of each, in the order "
            "given. At timeout_s: timed_out, the ones that came and the missing. It moves "
            "nothing: called again, it answers the same.",
            Changes.NOTHING,
        ),
        repeatable=True,
    ),
    Verb(
        Ack,
        Acked,
        READ,
        True,
        Http(("POST",), "/sessions/{session}/cursors/{cursor:path}", ("seq",), '{"seq": N}'),
        HAND,
        repeatable=True,
    ),
    Verb(
        Cursors,
        CursorList,
        READ,
        False,
        Http(("GET",), "/sessions/{session}/cursors", answer="cursors"),
        Tool("List a session's cursors: name, seq, and lag behind the head.", Changes.NOTHING),
        repeatable=True,
    ),
    Verb(Buffer, Buffered, ADMIN, True),
    Verb(Poll, Firings, READ, True),
    Verb(Stats, StatsReply, "", False, repeatable=True),
    Verb(Shutdown, Done, None, False),
    Verb(Schedule, TimerSet, SEND, True, None, HAND),
    Verb(Timers, TimerList, ADMIN, False, repeatable=True),
    Verb(Cancel, Cancelled, ADMIN, True),
    Verb(SetWebhook, Done, ADMIN, True),
    Verb(Token, Response, None, True),
    Verb(Claim, Claimed, READ, True, HAND, HAND),
    Verb(
        Finish,
        Finished,
        READ,
        True,
        Http(("POST",), _CLAIM_PATH + "/done"),
        Tool(
            "Finish a claimed job: it is never offered to the group again. An error naming "
            "lease_lost means the claim is no longer yours (its lease ran out and another "
            "worker may have it, or it is done): nothing changed.",
            Changes.SETS,
        ),
    ),
    Verb(
        FinishNext,
        Claimed,
        READ,
        True,
        Http(("POST",), _CLAIM_PATH + "/next"),
        Tool(
            "Finish a claimed job and take the next one of its group in one call: done, then "
            "claim with lease_s, blocking as claim does up to timeout_s (then timed_out, "
            "nothing taken, the done made). lease_lost: the claim is no longer yours; "
            "nothing changed, nothing taken.",
            Changes.MOVES,
        ),
    ),
    Verb(
        Release,
        Released,
        READ,
        True,
        Http(("POST",), _CLAIM_PATH + "/release"),
        Tool(
            "Give a claimed job back to its group, claimable again at once or after delay_s. "
            "dead true: that was its last attempt, and it went to the dead-letter session. "
            "lease_lost: the claim is no longer yours.",
            Changes.SETS,
        ),
    ),
    Verb(
        Extend,
        Extended,
        READ,
        True,
        Http(("POST",), _CLAIM_PATH + "/extend"),
        Tool(
            "Keep a claimed job lease_s longer from now: a heartbeat for long work, before "
            "lease_until passes. Returns the new lease_until. lease_lost: the claim is no "
            "longer yours; stop working on it.",
            Changes.MOVES,
        ),
    ),
    Verb(
        Group,
        GroupRow,
        ADMIN,
        True,
        Http(
            ("POST", "PUT"),
            "/sessions/{session}/groups/{group:path}",
            ("max_attempts", "dead_letter", "from_now"),
            '{"max_attempts": N, "dead_letter": SESSION, "from_now": true}',
            answer="group",
        ),
    ),
    Verb(
        Groups,
        GroupList,
        READ,
        False,
        Http(("GET",), "/sessions/{session}/groups", answer="groups"),
        repeatable=True,
    ),
    Verb(
        Claims,
        ClaimList,
        READ,
        False,
        Http(("GET",), "/sessions/{session}/claims", answer="claims"),
        repeatable=True,
    ),
    Verb(
        Join,
        Joined,
        READ,
        False,
        Http(("GET",), "/sessions/{session}/join"),
        Tool(
            "Wait until every job of the session up to upto (default: its head now) is done "
            "or dead in the group (default work): the counts done, dead, ready, held, "
            "delayed. At timeout_s: timed_out, with what is left. It moves nothing: called "
            "again, it answers the same.",
            Changes.NOTHING,
        ),
        repeatable=True,
    ),
]

#: the verbs by op, and by their request's class
VERB: dict[str, Verb] = {}
VERB_OF: dict[type[Request], Verb] = {}
#: every op, in the table's order (the refusal of an unknown op lists them so)
OPS: tuple[str, ...] = ()


def register(verb: Verb) -> None:
    """Add ``verb`` to the table (a new row of ``VERBS`` is registered at import; a test's
    throwaway verb here); the next ``decode_request`` makes the decoder again to take it."""
    global OPS, _request_decoder
    if verb not in VERBS:
        VERBS.append(verb)
    VERB[verb.op] = verb
    VERB_OF[verb.request] = verb
    OPS = tuple(VERB)
    _request_decoder = None


def unregister(op: str) -> None:
    """Take ``op`` out of the table again (a test's throwaway verb)."""
    global OPS, _request_decoder
    verb = VERB.pop(op)
    VERBS.remove(verb)
    del VERB_OF[verb.request]
    OPS = tuple(VERB)
    _request_decoder = None


# -- codecs -----------------------------------------------------------------


class _IdOnly(msgspec.Struct):
    id: RequestId = msgspec.UNSET


# The decoders are made on first use, not at import: a client (the ``repl`` command, run
# anew for every read) encodes requests and never decodes one, and a decoder of every op
# costs a process that start-up several ms (docs/benchmarks.md, the CLI's start-up).
_request_decoder: msgspec.json.Decoder[Any] | None = None
_id_decoder: msgspec.json.Decoder[_IdOnly] | None = None
_encoder = msgspec.json.Encoder()

for _verb in list(VERBS):
    register(_verb)


def _requests() -> msgspec.json.Decoder[Any]:
    """The decoder of every op's request, made once (again after ``register``)."""
    global _request_decoder
    if _request_decoder is None:
        _request_decoder = msgspec.json.Decoder(Union[tuple(VERB_OF)])  # noqa: UP007
    return _request_decoder


def decode_request(line: bytes) -> Request:
    """Decode one request line; a bad one raises ``BadRequest`` or ``UnknownOp``."""
    if not line.strip():
        raise BadRequest("empty line: send one JSON object a line")
    try:
        request: Request = _requests().decode(line)
        return request
    except msgspec.ValidationError as exc:
        text = str(exc)
        if text.startswith("Invalid value") and text.endswith("at `$.op`"):
            raise UnknownOp(f"unknown op: {text}; known ops: {', '.join(OPS)}") from None
        raise BadRequest(f"bad request: {text}") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("bad request: JSON nested too deeply") from None


def request_id(line: bytes) -> RequestId:
    """The ``id`` of a line that failed to decode as a request, if it has one."""
    global _id_decoder
    if _id_decoder is None:
        _id_decoder = msgspec.json.Decoder(_IdOnly)
    try:
        return _id_decoder.decode(line).id
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return msgspec.UNSET


def encode(message: msgspec.Struct) -> bytes:
    return _encoder.encode(message) + b"\n"


def error(exc: ReplError, rid: RequestId = msgspec.UNSET) -> Error:
    return Error(id=rid, code=exc.code.value, message=exc.message)
