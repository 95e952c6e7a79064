"""``session.approvals``: prompts and verdicts read from a session's firings, and which
verdict counts (docs/semantics.md P2), decided by the record alone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from session import approvals as ap
from session.errors import AlreadyAnswered, BadRequest, Forbidden, NoSuchPrompt
from session.firing import Firing

TS = "2026-12-06T09:00:00.000Z"


def prompt(seq: int, rid: str, approvers: str = "root", tool: str = "Bash") -> Firing:
    tags = ap.prompt_tags(rid, tool, "{}", approvers.split(",") if approvers else [])
    return Firing(seq, ap.PROMPT_HANDLER, None, ap.prompt_text(tool, f"do {rid}"), TS, tags, "root")


def verdict(seq: int, rid: str, behavior: str, by: str | None, reason: str = "") -> Firing:
    tags = ap.verdict_tags(rid, behavior)
    return Firing(seq, ap.VERDICT_HANDLER, None, reason, TS, tags, by)


def test_request_ids_are_claude_codes_five_letters_without_l() -> None:
    assert ap.check_request_id("tbxkq") == "tbxkq"
    for bad in ("tbxk", "tbxkqq", "tbxkl", "TBXKQ", "tbx1q", ""):
        with pytest.raises(BadRequest, match="five letters"):
            ap.check_request_id(bad)


def test_a_prompt_reads_back_as_it_was_recorded() -> None:
    firing = prompt(3, "abcde", approvers="alice,bob", tool="Write")
    read = ap.prompt_of(firing)
    assert read == ap.Prompt("abcde", "Write", "do abcde", "{}", ("alice", "bob"), 3, TS, "root")
    # a tool alone, a text that does not start with the tool, and no approvers named
    bare = Firing(4, ap.PROMPT_HANDLER, "Bash", None, TS, {"approval": "fghij"}, "root")
    assert ap.prompt_of(bare) == ap.Prompt("fghij", "", "Bash", "", ("root",), 4, TS, "root")
    assert ap.prompt_text("Bash", "") == "Bash"
    long = ap.prompt_tags("abcde", "T" * 2000, "p" * 2000, ["a"] * 1000)
    assert all(len(value) <= 1024 for value in long.values())


def test_what_is_no_prompt_or_no_verdict() -> None:
    plain = Firing(1, "on-message", "yes tbxkq", None, TS, {}, "root")
    assert ap.prompt_of(plain) is None and ap.verdict_of(plain) is None
    said = verdict(2, "tbxkq", "allow", "root", "fine")
    assert ap.prompt_of(said) is None
    assert ap.verdict_of(said) == ap.Verdict("tbxkq", "allow", "fine", "root", 2, TS)
    odd = Firing(
        3, ap.VERDICT_HANDLER, None, None, TS, {"approval": "tbxkq", "verdict": "yes"}, "x"
    )
    assert ap.verdict_of(odd) is None and ap.text_of(odd) == ""
    with pytest.raises(BadRequest, match="allow or deny"):
        ap.verdict_tags("tbxkq", "maybe")


def test_the_first_verdict_by_an_approver_counts_and_the_others_are_kept() -> None:
    firings = [
        verdict(1, "abcde", "allow", "alice"),  # before any prompt: not a verdict on one
        prompt(2, "abcde", approvers="alice"),
        verdict(3, "abcde", "allow", "mallory"),  # not an approver
        verdict(4, "abcde", "deny", "alice"),  # the one
        verdict(5, "abcde", "allow", "alice"),  # too late
        prompt(6, "fghij"),
        verdict(7, "zzzzz", "allow", "root"),  # on no prompt
    ]
    found = ap.answered(reversed(firings))  # in any order: by seq
    first = found["abcde"]
    assert first.verdict is not None and (first.verdict.seq, first.verdict.behavior) == (4, "deny")
    assert [v.seq for v in first.verdicts] == [3, 4, 5]
    assert found["fghij"].verdict is None
    assert [p.request_id for p in ap.pending(firings)] == ["fghij"]


def test_a_request_id_asked_again_is_the_new_prompts() -> None:
    firings = [prompt(1, "abcde"), verdict(2, "abcde", "allow", "root"), prompt(3, "abcde")]
    (entry,) = ap.answered(firings).values()
    assert (entry.prompt.seq, entry.verdict, entry.verdicts) == (3, None, [])


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["prompt", "verdict", "message"]),
            st.sampled_from(["abcde", "fghij"]),
            st.sampled_from(["root", "alice", None]),
        ),
        max_size=12,
    )
)
def test_the_verdict_that_counts_is_the_first_by_an_approver_after_its_prompt(
    steps: list[tuple[str, str, str | None]],
) -> None:
    """A model: walking the record in order, the verdict that counts for a prompt is the
    first later verdict on its id by ``root`` (its approver), until the id is asked
    again."""
    firings, expected = [], {}
    for seq, (kind, rid, by) in enumerate(steps, start=1):
        if kind == "prompt":
            firings.append(prompt(seq, rid))
            expected[rid] = None
        elif kind == "verdict":
            firings.append(verdict(seq, rid, "allow", by))
            if rid in expected and expected[rid] is None and by == "root":
                expected[rid] = seq
        else:
            firings.append(Firing(seq, "on-message", f"yes {rid}", None, TS, {}, by))
    found = ap.answered(firings)
    assert {rid: (a.verdict.seq if a.verdict else None) for rid, a in found.items()} == expected


def test_a_verdict_is_given_in_three_steps_each_refusing_by_the_record() -> None:
    """``prompt_in`` finds the prompt, ``unanswered`` refuses one that has its verdict,
    ``counted`` says whether the verdict recorded as a seq is the one that counts: the API
    and the daemon's HTTP route give a verdict with these, so they refuse alike."""
    asked = [prompt(1, "abcde", approvers="alice")]
    with pytest.raises(NoSuchPrompt, match="session 'asks' holds no approval request 'fghij'"):
        ap.prompt_in(asked, "asks", "fghij")
    entry = ap.unanswered(ap.prompt_in(asked, "asks", "abcde"))
    assert entry.verdict is None
    # a verdict by someone who is no approver is kept, and does not count
    tried = [*asked, verdict(2, "abcde", "allow", "mallory")]
    with pytest.raises(Forbidden, match="it is by mallory, and its approvers are alice"):
        ap.counted(ap.prompt_in(tried, "asks", "abcde"), 2)
    # ... nor one the record no longer holds (the ring let it go)
    with pytest.raises(Forbidden, match="it is by this token"):
        ap.counted(ap.prompt_in(asked, "asks", "abcde"), 9)
    given = [*tried, verdict(3, "abcde", "deny", "alice", "no")]
    after = ap.prompt_in(given, "asks", "abcde")
    assert ap.counted(after, 3) == ap.Verdict("abcde", "deny", "no", "alice", 3, TS)
    # a verdict recorded after it, meanwhile, lost: it names the one that counts
    late = ap.prompt_in([*given, verdict(4, "abcde", "allow", "alice")], "asks", "abcde")
    with pytest.raises(AlreadyAnswered, match=f"^abcde already answered: deny by alice at {TS}$"):
        ap.counted(late, 4)
    with pytest.raises(AlreadyAnswered, match="abcde already answered: deny by alice"):
        ap.unanswered(late)
