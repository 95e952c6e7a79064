"""Approvals through the inbox (SPEC §19): an agent's permission prompts and their
verdicts as firings of one session, and which verdict counts, decided by the record.

Claude Code relays a tool-permission prompt to a channel server that declares
``claude/channel/permission``; ``repl mcp --approvals SESSION`` records each as a
**prompt**, a firing of SESSION tagged ``approval=REQUEST_ID``, ``tool=TOOL``, its
``preview`` and the ``approvers`` whose verdict counts (as the server was told them).
``repl approve``/``deny`` record a **verdict**, a firing tagged ``approval=REQUEST_ID``
and ``verdict=allow|deny``. The daemon records who sent each (``by``): no client can
forge it. So the session is the audit, and what counts is a pure function of it:

- a verdict **counts** when its ``by`` is one of its prompt's approvers, and it is the
  first such verdict by seq for the request: a later one, or one by anybody else, or a
  plain message with the right words ("yes tbxkq": it has no ``verdict`` tag), never
  does;
- a prompt is **pending** while no verdict counts for it.

The server (``repl_cli.mcp.approvals``), the clients (``approve``, ``approvals``) and
the daemon's HTTP routes (``repl_daemon.http.approvals``) all read the session with these
functions, so they agree on every answer: ``prompt_in``, ``unanswered`` and ``counted``
are the three steps of giving a verdict (the prompt found, not answered yet; the verdict
recorded; then whether it is the one that counts), each refusal a typed error.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec

from session.errors import AlreadyAnswered, BadRequest, Forbidden, NoSuchPrompt
from session.firing import Firing
from session.tags import MAX_TAG_VALUE, ROOT

#: the tags of a prompt and of a verdict
APPROVAL, TOOL, PREVIEW, APPROVERS, VERDICT = "approval", "tool", "preview", "approvers", "verdict"
#: a prompt's handler, and a verdict's
PROMPT_HANDLER, VERDICT_HANDLER = "on-approval", "on-verdict"
#: what a verdict may say (Claude Code's ``behavior``)
ALLOW, DENY = "allow", "deny"
BEHAVIORS = (ALLOW, DENY)
#: Claude Code's request ids: five letters a-z without l (it never reads as a 1)
REQUEST_ID = re.compile(r"[a-km-z]{5}")
#: whose verdict counts when the server was given no approvers
DEFAULT_APPROVERS = (ROOT,)


class Prompt(msgspec.Struct, frozen=True):
    """A permission prompt as the session keeps it: its request id, tool, description,
    the preview of the tool's input, the approvers whose verdict counts, and the firing."""

    request_id: str
    tool: str
    description: str
    preview: str
    approvers: tuple[str, ...]
    seq: int
    ts: str
    by: str | None


class Verdict(msgspec.Struct, frozen=True):
    """A verdict as the session keeps it: the request id, ``allow`` or ``deny``, why (the
    firing's text, may be empty), who gave it and when."""

    request_id: str
    behavior: str
    reason: str
    by: str | None
    seq: int
    ts: str


class Answered(msgspec.Struct, frozen=True):
    """A prompt with the verdict that counts for it (None: still pending), and every
    verdict given for it, in seq order (the audit: the ones that did not count too)."""

    prompt: Prompt
    verdict: Verdict | None
    verdicts: list[Verdict]


def check_request_id(request_id: str) -> str:
    """``request_id`` when it is one of Claude Code's: five letters a-z without l."""
    if not REQUEST_ID.fullmatch(request_id):
        raise BadRequest(
            f"request id {request_id!r} is not one: five letters a-z without l (as tbxkq)"
        )
    return request_id


def prompt_tags(
    request_id: str, tool: str, preview: str, approvers: Iterable[str]
) -> dict[str, str]:
    """What a prompt's firing is tagged with; values cut to what a tag may hold."""
    return {
        APPROVAL: request_id,
        TOOL: tool[:MAX_TAG_VALUE],
        PREVIEW: preview[:MAX_TAG_VALUE],
        APPROVERS: ",".join(approvers)[:MAX_TAG_VALUE],
    }


def prompt_text(tool: str, description: str) -> str:
    """A prompt's text, as a person reads it in ``repl read``: the tool and what it does."""
    return f"{tool}: {description}" if description else tool


def verdict_tags(request_id: str, behavior: str) -> dict[str, str]:
    if behavior not in BEHAVIORS:
        raise BadRequest(f"a verdict is allow or deny, not {behavior!r}")
    return {APPROVAL: request_id, VERDICT: behavior}


def text_of(firing: Firing) -> str:
    """A prompt's or a verdict's text: its result, or its event (a session has no handler
    of their names, so the daemon keeps the text as the event)."""
    return firing.result if firing.result is not None else firing.event or ""


def prompt_of(firing: Firing) -> Prompt | None:
    """The prompt ``firing`` records, None when it is none (no ``approval`` tag, or a
    verdict)."""
    tags = firing.tags
    request_id = tags.get(APPROVAL)
    if request_id is None or VERDICT in tags:
        return None
    tool = tags.get(TOOL, "")
    said = text_of(firing)
    description = said[len(tool) + 2 :] if said.startswith(f"{tool}: ") else said
    approvers = tuple(a for a in tags.get(APPROVERS, "").split(",") if a)
    return Prompt(
        request_id,
        tool,
        description,
        tags.get(PREVIEW, ""),
        approvers or DEFAULT_APPROVERS,
        firing.seq,
        firing.ts,
        firing.by,
    )


def verdict_of(firing: Firing) -> Verdict | None:
    """The verdict ``firing`` records, None when it is none: a firing without a
    ``verdict`` tag of allow or deny is a message, whatever its words."""
    tags = firing.tags
    request_id, behavior = tags.get(APPROVAL), tags.get(VERDICT)
    if request_id is None or behavior not in BEHAVIORS:
        return None
    assert behavior is not None
    return Verdict(request_id, behavior, text_of(firing), firing.by, firing.seq, firing.ts)


def answered(firings: Iterable[Firing]) -> dict[str, Answered]:
    """Every prompt of ``firings`` (a session's, in any order) by request id, in seq
    order, with the verdict that counts for it: the first by seq whose ``by`` is one of
    the prompt's approvers, given after the prompt. A request id asked twice is the later
    prompt's (Claude Code's ids are short: one may come again, in a new conversation)."""
    ordered = sorted(firings, key=lambda f: f.seq)
    found: dict[str, Answered] = {}
    for firing in ordered:
        prompt = prompt_of(firing)
        if prompt is not None:
            found.pop(prompt.request_id, None)  # asked again: the new prompt's from now
            found[prompt.request_id] = Answered(prompt, None, [])
            continue
        verdict = verdict_of(firing)
        if verdict is None or verdict.request_id not in found:
            continue
        entry = found[verdict.request_id]
        entry.verdicts.append(verdict)
        if entry.verdict is None and verdict.by in entry.prompt.approvers:
            found[verdict.request_id] = Answered(entry.prompt, verdict, entry.verdicts)
    return found


def pending(firings: Iterable[Firing]) -> list[Prompt]:
    """The prompts no verdict counts for yet, oldest first."""
    return [a.prompt for a in answered(firings).values() if a.verdict is None]


def prompt_in(firings: Iterable[Firing], session: str, request_id: str) -> Answered:
    """Prompt ``request_id`` of ``firings`` (``session``'s, as a read matching
    ``approval=REQUEST_ID`` gives them) with its verdicts; ``NoSuchPrompt`` when none."""
    entry = answered(firings).get(request_id)
    if entry is None:
        raise NoSuchPrompt(f"session {session!r} holds no approval request {request_id!r}")
    return entry


def already_answered(entry: Answered) -> AlreadyAnswered:
    """The refusal of a verdict on a prompt that has one: which, by whom, when."""
    counts = entry.verdict
    assert counts is not None
    return AlreadyAnswered(
        f"{entry.prompt.request_id} already answered: {counts.behavior} by {counts.by} "
        f"at {counts.ts}"
    )


def unanswered(entry: Answered) -> Answered:
    """``entry`` while no verdict counts for it; ``AlreadyAnswered`` once one does (a
    verdict on it is then refused, and nothing recorded)."""
    if entry.verdict is not None:
        raise already_answered(entry)
    return entry


def counted(entry: Answered, seq: int) -> Verdict:
    """The verdict recorded as firing ``seq``, read back in ``entry`` (the prompt as the
    session holds it after): when it is the one that counts. ``AlreadyAnswered`` when
    another came first meanwhile; ``Forbidden`` when its sender is none of the prompt's
    approvers. Either way it stays in the session: the audit keeps the attempt."""
    counts = entry.verdict
    if counts is not None and counts.seq != seq:
        raise already_answered(entry)
    if counts is None:
        mine = next((v for v in entry.verdicts if v.seq == seq), None)
        by = mine.by if mine is not None else "this token"
        raise Forbidden(
            f"the verdict on {entry.prompt.request_id} is recorded but does not count: it is "
            f"by {by}, and its approvers are {', '.join(entry.prompt.approvers)}"
        )
    return counts
