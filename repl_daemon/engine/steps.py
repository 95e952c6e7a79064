"""The engine's steps: for each request of the protocol, what the engine does with it.

``Engine.handle`` checks a request's token (the right its verb's row names,
``repl_daemon.protocol.VERB``), counts it, and hands it to its step, found here
by the request's class. A step turns the request into the core's operations,
run by the committer the token sees, and builds the answer. Each step is
registered beside the code it calls (``repl_daemon.engine.engine`` for most,
``repl_daemon.engine.claim`` for the steps of groups) with ``step``; a new verb
registers its own, and ``tests/daemon/test_verb_table.py`` checks that every
verb of the table has one.

What must not live here: the steps themselves; this module holds only the table,
so that it imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from repl_daemon import protocol as p
    from repl_daemon.engine.committer import Sessions
    from repl_daemon.engine.outcome import Outcome
    from session.scopes import TokenRecord

#: a step: ``(engine, request, committer, token)``, the request's answer (its
#: ``Outcome``); the engine is ``Any`` here, as this module may not import it
Step = Callable[[Any, Any, "Sessions", "TokenRecord | None"], "Outcome[p.Response]"]
S = TypeVar("S", bound=Callable[..., Any])

STEPS: dict[type[p.Request], Step] = {}


def step(*kinds: type[p.Request]) -> Callable[[S], S]:
    """Register the decorated function as the step of each request class in ``kinds``."""

    def registered(fn: S) -> S:
        for kind in kinds:
            STEPS[kind] = fn
        return fn

    return registered
