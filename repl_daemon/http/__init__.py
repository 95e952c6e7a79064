"""HTTP beside the line protocol (rules H1-H7): the same engine, the same state, one event loop.

``repl daemon --http HOST:PORT`` serves a Starlette app with uvicorn in the
daemon's own loop. Every route is a thin translation to a request of the
line protocol (``repl_daemon.protocol``) handled by the one ``Engine``, so
the checks, the errors and the durability are the same: a send is answered
once durable, a read touches no cursor, and an event stream is a wait like
any other (``wait`` with ``after``), blocked with no work until its session
has a new firing; a client that goes away ends its wait at once.

- ``POST /sessions/{id}/firings``: the body is the text (UTF-8, at most
  1 MiB); ``?handler=NAME``; ``?tag=KEY=VALUE`` (repeatable) its tags;
  ``Idempotency-Key`` is the dedup key. 201, or 200 for a duplicate.
- ``GET /sessions/{id}/firings?after=N&max=M``: ``{next, lost, firings}``;
  ``?match=KEY=VALUE`` / ``?match=KEY`` (repeatable) and ``?handler=NAME``
  keep only the firings that match, and without ``after`` look at the whole
  ring.
- ``GET /sessions/{id}/events``: Server-Sent Events (sse-starlette): ``event:
  firing``, ``id:`` the seq, ``data:`` the firing's JSON; ``event: lost``
  before a gap; from ``Last-Event-ID`` or ``?after=N``, else from the head;
  a comment line every 15 s; with a match, only the firings that match.
- The consumer's routes, so that a program in any language runs the loop
  ``repl wait`` runs: ``POST /sessions`` (start), ``DELETE /sessions/{id}``
  (stop), ``GET /sessions/{id}/wait`` (a long poll: ``?ack=SEQ`` first, then
  blocked like any wait until firings exist after the cursor or
  ``?timeout=`` passes; it acknowledges nothing it returns, and a client
  that goes away releases it at once), ``POST /sessions/{id}/cursors/{name}``
  (ack).
- ``POST /hooks/{id}``: a webhook's delivery, signed as GitHub signs it (no
  token: it carries its own secret); one 401 for a wrong signature, no
  webhook and no session alike. Its firing carries the tags ``event`` (the
  ``X-GitHub-Event`` header) and ``delivery`` (the delivery id).
- ``GET /sessions``, ``GET /metrics`` (Prometheus, prometheus_client), and
  ``GET /healthz`` (no token; 503 when the store fails).
- ``GET /`` and ``/static/...``: the page (``web/``); ``GET /favicon.ico`` its
  icon, which a browser asks for by itself (no token for any of them).

Every data route needs ``Authorization: Bearer TOKEN``: the daemon's root
token or a scoped one (rules K1-K5), checked by the engine as the line
protocol's ``auth`` is; without it, or with a wrong or revoked one, 401. A
scoped token sees only its sessions (``/sessions`` lists those, any other
answers 404 as a missing one), a right it lacks is 403, and ``/metrics``
(the whole daemon's figures) is the root's. A revocation ends the token's
blocked requests (a long poll: 401) and event streams at once (``event:
error``, code ``unauthorized``). Errors are JSON ``{"code",
"message"}`` with the wire code of ``session.errors``; a missing session is
404, a body over 1 MiB 413, a request the daemon cannot take 400. So are the
refusals the libraries would make in plain text: no route (404) or a method
its route does not serve (405) are ``unknown_op``, as an unknown op is over
the line protocol; a request uvicorn cannot parse is 400 ``bad_request``; a
connection past ``--max-connections`` 503 ``too_many``; a failure of the
daemon's own 500 ``internal``.

The extra ``repl[http]`` brings Starlette, uvicorn and sse-starlette; without
it ``--http`` stops the daemon at start with the ``pip install`` to run
(``extra``, the one module here that imports none of them: this package imports
nothing of its own, so that asking is possible; ``server`` is what serves).
"""
